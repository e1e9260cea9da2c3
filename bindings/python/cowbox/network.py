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
