"""Network policies for Sandbox.create(network=...): Network.none(), .all(), .public() and
.allow(hosts=[...]); the plain strings "none", "all", "host" and "public" keep working."""


class Network:
    """What a workspace's commands may reach. Under public and allow they have no route but
    the workspace's egress proxy (HTTP_PROXY, HTTPS_PROXY and ALL_PROXY are set), which
    refuses private, loopback, link-local and metadata addresses unless an entry names them.
    Entries: "host", "host:port", "*.domain" (subdomains only), an IPv4 or IPv6 address
    ("[v6]:port" with a port), or a CIDR; no port means 443 and 80."""

    def __init__(self, mode, hosts=()):
        if mode not in ("none", "all", "host", "public", "allow"):
            raise ValueError("network: none, all, host, public or allow, not %r" % (mode,))
        if hosts and mode != "allow":
            raise ValueError("network %s takes no hosts" % mode)
        if isinstance(hosts, str):
            raise TypeError("hosts is a list of entries, not one string")
        self.mode = mode
        self.hosts = list(hosts)

    @classmethod
    def none(cls):
        return cls("none")

    @classmethod
    def all(cls):
        return cls("all")

    @classmethod
    def public(cls):
        return cls("public")

    @classmethod
    def allow(cls, hosts):
        return cls("allow", hosts)

    def options(self):
        """The backend options this policy is (checked again by the daemon)."""
        opts = {"network": self.mode}
        if self.mode == "allow":
            opts["allow"] = list(self.hosts)
        return opts

    def __repr__(self):
        return "Network.%s(%s)" % (self.mode, "hosts=%r" % self.hosts if self.hosts else "")


class HeaderBinding:
    """A header secret for Sandbox.create(header_bindings=[...]) under Network.public() or
    .allow(): HTTPS requests to host whose path starts with path_prefix get
    "header: prefix + secret + suffix" from the workspace's egress proxy, replacing what the
    sandbox sent; the secret never enters the sandbox (docs/network.md#header-secrets).
    The secret is value=, env= (read from this process's environment now, then kept by
    cowbox in a 0600 file outside the workspace) or file= (a host path the daemon reads each
    time the proxy starts). repr() never shows it."""

    def __init__(self, host, header, value=None, env=None, file=None, path_prefix="/",
                 prefix="", suffix=""):
        if sum(x is not None for x in (value, env, file)) != 1:
            raise ValueError("HeaderBinding: give one of value, env or file")
        if not path_prefix.startswith("/"):
            raise ValueError("HeaderBinding: path_prefix starts with /")
        self.host, self.header = host, header
        self._value, self.env, self.file = value, env, file
        self.path_prefix, self.prefix, self.suffix = path_prefix, prefix, suffix

    def option(self):
        """The entry of the backend option secrets (an env secret's value read now)."""
        entry = {"host": self.host, "header": self.header, "path_prefix": self.path_prefix,
                 "prefix": self.prefix, "suffix": self.suffix}
        if self.file is not None:
            import os
            entry["file"] = os.path.abspath(str(self.file))
        elif self.env is not None:
            import os
            if self.env not in os.environ:
                raise ValueError("HeaderBinding for %s: $%s is not set" % (self.host, self.env))
            entry["value"] = os.environ[self.env]
        else:
            entry["value"] = str(self._value)
        return entry

    def __repr__(self):
        src = ("env=%r" % self.env if self.env is not None else
               "file=%r" % str(self.file) if self.file is not None else "value=<hidden>")
        return "HeaderBinding(host=%r, header=%r, %s, path_prefix=%r)" % (
            self.host, self.header, src, self.path_prefix)
