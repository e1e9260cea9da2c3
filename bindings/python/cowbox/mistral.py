"""Mistral agents SDK sandbox spellings over cowbox.Sandbox: Network, EgressPolicy, the header
bindings, SandboxHook and GitIdentity, SandboxExecutionResult, and the sandboxes
DangerousLocalSandbox, LocalDockerSandbox and CowboxSandbox, each a configuration whose
session(...) is one cowbox workspace (hooks on_create at start, on_destroy at close)."""

import inspect
import ipaddress
import os
import re
import shlex
import shutil
import uuid
from dataclasses import dataclass
from typing import Literal

from . import network as _cbnet
from .errors import AccessDeniedError, WorkspaceError
from .sandbox import ACCESS_LEVELS
from .sandbox import Sandbox as _Workspace

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")


def _split_entry(entry):
    """(host, port) of a host[:port] entry; port 443 when none is given."""
    entry = str(entry).strip()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:
        host, port = entry, ""
    if port and not port.isdigit():
        raise ValueError("network entry %r: the port is not a number" % entry)
    return host.lower(), int(port) if port else 443


def _check_host_entry(entry):
    if "*" in str(entry):
        raise ValueError("Network.allow: %r: wildcards are not accepted" % (entry,))
    if "/" in str(entry) or "://" in str(entry):
        raise ValueError("Network.allow: %r is not a host or host:port entry" % (entry,))
    host, port = _split_entry(entry)
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST.match(host):
            raise ValueError("Network.allow: %r is not a host or host:port entry" % (entry,))
    if not 0 < port < 65536:
        raise ValueError("Network.allow: %r: port out of range" % (entry,))


class Network(_cbnet.Network):
    """Outbound network of a sandbox: none(), all() or allow(hosts=...) (only HTTPS to the
    listed host or host:port entries, no wildcards). A cowbox.Network, so it goes to
    cowbox.Sandbox.create(network=) too."""

    def __init__(self, *, mode: Literal["none", "all", "allow"] = "none", hosts=()):
        if mode not in ("none", "all", "allow"):
            raise ValueError("Network mode: none, all or allow, not %r" % (mode,))
        if isinstance(hosts, str):
            raise TypeError("hosts is a sequence of entries, not one string")
        hosts = tuple(str(h) for h in hosts)
        for h in hosts:
            _check_host_entry(h)
        super().__init__(mode, hosts)
        self.hosts = hosts

    @classmethod
    def none(cls):
        return cls(mode="none")

    @classmethod
    def all(cls):
        return cls(mode="all")

    @classmethod
    def allow(cls, *, hosts):
        return cls(mode="allow", hosts=tuple(hosts))

    def reaches(self, host):
        """Whether this network opens connections to host, a host[:port] entry (443 when
        no port is given): no daemon needed."""
        if self.mode == "all":
            return True
        if self.mode == "none":
            return False
        want = _split_entry(host)
        return any(_split_entry(h) == want for h in self.hosts)

    def options(self):
        opts = {"network": self.mode}
        if self.mode == "allow":
            # A bare host opens HTTPS only (cowbox's own bare entry also opens 80).
            opts["allow"] = [_https_only(h) for h in self.hosts]
        return opts

    def __eq__(self, other):
        return isinstance(other, _cbnet.Network) and (self.mode, list(self.hosts)) == (
            other.mode, list(other.hosts))

    def __hash__(self):
        return hash((self.mode, tuple(self.hosts)))

    def __repr__(self):
        return "Network(mode=%r, hosts=%r)" % (self.mode, self.hosts)


def _https_only(entry):
    """entry with its port spelled out: 443 when it names none."""
    entry = str(entry).strip()
    host, port = _split_entry(entry)
    if entry.endswith("]") or (":" not in entry) or ":" in host:
        if entry.startswith("[") and not entry.endswith("]"):
            return entry  # [v6]:port
        return ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)
    return entry


class EgressPolicy:
    """The IP addresses a sandbox opens connections to on top of its network: block_all(),
    allow_all(), custom(allow_cidrs=...)."""

    def __init__(self, *, mode: Literal["block_all", "allow_all", "custom"] = "block_all",
                 allow_cidrs=()):
        if mode not in ("block_all", "allow_all", "custom"):
            raise ValueError("EgressPolicy mode: block_all, allow_all or custom, not %r" %
                             (mode,))
        if isinstance(allow_cidrs, str):
            raise TypeError("allow_cidrs is a sequence of CIDRs, not one string")
        allow_cidrs = tuple(str(ipaddress.ip_network(c, strict=False)) for c in allow_cidrs)
        if allow_cidrs and mode != "custom":
            raise ValueError("EgressPolicy %s takes no allow_cidrs" % mode)
        self.mode = mode
        self.allow_cidrs = allow_cidrs

    @classmethod
    def block_all(cls):
        return cls(mode="block_all")

    @classmethod
    def allow_all(cls):
        return cls(mode="allow_all")

    @classmethod
    def custom(cls, *, allow_cidrs):
        return cls(mode="custom", allow_cidrs=tuple(allow_cidrs))

    def __eq__(self, other):
        return isinstance(other, EgressPolicy) and (self.mode, self.allow_cidrs) == (
            other.mode, other.allow_cidrs)

    def __repr__(self):
        return "EgressPolicy(mode=%r, allow_cidrs=%r)" % (self.mode, self.allow_cidrs)


def _secrets_dir():
    return os.environ.get("COWBOX_SECRETS_DIR") or os.path.join(
        os.path.expanduser("~"), ".config", "cowbox", "secrets")


class HeaderBinding:
    """A secret added by the sandbox's egress proxy to its HTTPS requests to host (under
    path_prefix) as header: prefix + value + suffix, never entering the sandbox. The secret
    named secret_name comes from the sandbox's secrets= mapping, else the environment
    variable of that name, else the file $COWBOX_SECRETS_DIR/secret_name
    (~/.config/cowbox/secrets/ by default), read when the session starts."""

    def __init__(self, *, host, header, secret_name, path_prefix="/", prefix="", suffix=""):
        if not path_prefix.startswith("/"):
            raise ValueError("HeaderBinding: path_prefix starts with /")
        self.host, self.header, self.secret_name = host, header, secret_name
        self.path_prefix, self.prefix, self.suffix = path_prefix, prefix, suffix

    def binding(self, secrets=None):
        """The cowbox.HeaderBinding with the secret looked up by name."""
        common = dict(host=self.host, header=self.header, path_prefix=self.path_prefix,
                      prefix=self.prefix, suffix=self.suffix)
        if secrets and self.secret_name in secrets:
            return _cbnet.HeaderBinding(value=secrets[self.secret_name], **common)
        if self.secret_name in os.environ:
            return _cbnet.HeaderBinding(env=self.secret_name, **common)
        path = os.path.join(_secrets_dir(), self.secret_name)
        if os.path.isfile(path):
            return _cbnet.HeaderBinding(file=path, **common)
        raise ValueError("HeaderBinding for %s: no secret named %r (not in secrets=, not in "
                         "the environment, no file %s)" % (self.host, self.secret_name, path))

    def __repr__(self):
        return "HeaderBinding(host=%r, header=%r, secret_name=%r)" % (
            self.host, self.header, self.secret_name)


class GitHubBinding:
    """Git and GitHub access as the session user through Mistral's Sandbox Proxy. Locally
    there is no Sandbox Proxy to mint the token: no cowbox sandbox takes it (use a
    HeaderBinding with your own token)."""

    def __init__(self, *, repos, ttl_seconds=3600, host="github.com"):
        if repos != "all" and isinstance(repos, str):
            raise TypeError("repos is a tuple of owner/repository names or 'all'")
        self.repos = repos if repos == "all" else tuple(repos)
        self.ttl_seconds, self.host = ttl_seconds, host


class MistralApiBinding:
    """Mistral API access as the session user through Sandbox Proxy; no local sandbox takes
    it (there is no Sandbox Proxy here)."""

    run_as = "auto"

    def __init__(self, *, ttl_seconds=3600):
        self.ttl_seconds = ttl_seconds


class WorkspaceHeaderBindings:
    """The rules a workspace admin stored in Sandbox Proxy; no local sandbox takes it."""


@dataclass
class SandboxExecutionResult:
    """Output of a command run in the session's sandbox."""

    exit_code: int
    stdout: str
    stderr: str


class SandboxCallbackContext:
    """What hooks get: ctx.sandbox (the session: execute, read_file, write_file) and
    ctx.session_id."""

    def __init__(self, sandbox, session_id):
        self.sandbox = sandbox
        self.session_id = session_id


class SandboxHook:
    """Code that runs when the sandbox is created (on_create) and when the session closes
    (on_destroy). The arguments a subclass is constructed with are recorded (JSON values);
    to_unified_state returns them and from_unified_state rebuilds the hook from them."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        def recording(self, *args, **kwargs):
            if not hasattr(self, "_unified_state"):
                bound = inspect.signature(init).bind(self, *args, **kwargs)
                state = dict(bound.arguments)
                state.pop(next(iter(state)))  # self
                self._unified_state = state
            init(self, *args, **kwargs)

        recording.__wrapped__ = init
        recording.__signature__ = inspect.signature(init)
        cls.__init__ = recording

    def to_unified_state(self):
        return dict(getattr(self, "_unified_state", {}))

    @classmethod
    def from_unified_state(cls, state):
        return cls(**state)

    async def on_create(self, ctx):
        return None

    async def on_destroy(self, ctx):
        return None


class GitIdentity(SandboxHook):
    """Set the sandbox's global git user.name and user.email when it is created."""

    def __init__(self, *, name, email):
        self.name, self.email = name, email

    async def on_create(self, ctx):
        for key, value in (("user.name", self.name), ("user.email", self.email)):
            r = await ctx.sandbox.execute("git config --global %s %s" % (
                key, shlex.quote(value)))
            if r.exit_code != 0:
                raise WorkspaceError("GitIdentity: git config %s failed: %s" %
                                     (key, r.stderr.strip()), code="invalid_request")


class SandboxSession:
    """One session of a sandbox: a cowbox workspace (self.cowbox). execute runs a command,
    read_file / write_file the file tools; close runs the on_destroy hooks first."""

    def __init__(self, owner, session_id):
        self.owner = owner
        self.session_id = session_id
        self.cowbox = None
        self.folder = None  # DangerousLocalSandbox's host folder
        self._closed = False

    def _check(self, level):
        if ACCESS_LEVELS.index(self.owner.access_level) < ACCESS_LEVELS.index(level):
            raise AccessDeniedError("this sandbox's access is %s; the tool needs %s" %
                                    (self.owner.access_level, level), code="access_denied")

    async def execute(self, command, *, timeout_seconds=None, cwd=None, env=None):
        """Run command (a string for the sandbox's shell, or a list); a command without
        timeout_seconds gets the sandbox's default_exec_timeout_seconds and ends with exit
        code 124 when it runs out."""
        timeout = timeout_seconds if timeout_seconds is not None else \
            self.owner.default_exec_timeout_seconds
        cmd, cwd = self.owner._cmd(command, cwd, self)
        r = await self.cowbox.run(cmd, cwd=cwd, env=env, timeout=timeout)
        return SandboxExecutionResult(r.exit_code, r.stdout, r.stderr)

    async def read_file(self, path):
        return (await self.cowbox.read(self.owner._path(path, self))).decode("utf-8", "replace")

    async def write_file(self, path, content):
        await self.cowbox.write(self.owner._path(path, self), content)

    async def close(self):
        """Run each hook's on_destroy, then stop (or remove) the workspace."""
        if self._closed:
            return
        self._closed = True
        ctx = SandboxCallbackContext(self, self.session_id)
        try:
            for hook in self.owner.hooks:
                await hook.on_destroy(ctx)
        finally:
            await self.owner._end(self)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


class Sandbox:
    """The options every sandbox takes (network, header_bindings, hooks, access);
    session() starts one. The types below are the ones to build."""

    supported_access = "full"
    supported_network = ("none", "all", "allow")
    supported_header_bindings = (HeaderBinding,)
    supports_background_processes = True

    def __init__(self, *, network=None, header_bindings=(), hooks=(), access=None):
        self._init(network=network, header_bindings=header_bindings, hooks=hooks,
                   access=access)

    def _init(self, *, network, header_bindings, hooks, access):
        if access is not None and access not in ACCESS_LEVELS:
            raise ValueError("access %r: none, files or full" % (access,))
        if access is not None and ACCESS_LEVELS.index(access) > ACCESS_LEVELS.index(
                self.supported_access):
            raise ValueError("%s serves access up to %s, not %s" % (
                type(self).__name__, self.supported_access, access))
        network = Network.none() if network is None else network
        if not isinstance(network, _cbnet.Network):
            raise TypeError("network is a Network (Network.none(), .all(), .allow(hosts=))")
        if network.mode not in self.supported_network:
            raise ValueError("%s takes network %s, not %s" % (
                type(self).__name__, " or ".join(self.supported_network), network.mode))
        for b in header_bindings:
            if not isinstance(b, self.supported_header_bindings):
                raise ValueError("%s does not take %s: %s" % (
                    type(self).__name__, type(b).__name__,
                    "only HeaderBinding works without Mistral's Sandbox Proxy"
                    if self.supported_header_bindings else "it has no egress proxy"))
        if header_bindings and network.mode != "allow":
            raise ValueError("header_bindings need Network.allow(hosts=...): the proxy that "
                             "adds them serves only that")
        self.network = network
        self.header_bindings = tuple(header_bindings)
        self.hooks = tuple(hooks)
        for h in self.hooks:
            if not isinstance(h, SandboxHook):
                raise TypeError("hooks: %r is not a SandboxHook" % (h,))
        self.access = access
        self.access_level = access or self.supported_access

    def _cmd(self, command, cwd, session):
        return command, cwd

    def _path(self, path, session):
        return path

    def _create_args(self, session_id):
        raise TypeError("%s is the options every sandbox takes: build a "
                        "DangerousLocalSandbox, LocalDockerSandbox or CowboxSandbox" %
                        type(self).__name__)

    def session(self, session_id=None, *, cowbox=None, home=None):
        """A session: `async with sandbox.session() as s:` (or await it) creates the
        workspace and runs each hook's on_create; closing runs on_destroy."""
        return _Opening(self, session_id or uuid.uuid4().hex, cowbox, home)

    async def _start(self, session_id, cowbox, home):
        s = SandboxSession(self, session_id)
        s._cowbox_bin, s._home = cowbox, home
        s.cowbox = await self._open(s, session_id, cowbox, home)
        ctx = SandboxCallbackContext(s, session_id)
        try:
            for hook in self.hooks:
                await hook.on_create(ctx)
        except BaseException:
            await self._end(s)
            raise
        return s

    async def _open(self, s, session_id, cowbox, home):
        return await _Workspace.create(cowbox=cowbox, home=home, **self._create_args(session_id))

    async def _end(self, s):
        await s.cowbox.close()
        await _Workspace.destroy(s.cowbox.ref, cowbox=s._cowbox_bin, home=s._home)


class _Opening:
    """session(...): awaitable, and an async context manager that closes the session."""

    def __init__(self, owner, session_id, cowbox, home):
        self._args = (session_id, cowbox, home)
        self._owner = owner
        self._session = None

    def __await__(self):
        return self._owner._start(*self._args).__await__()

    async def __aenter__(self):
        self._session = await self._owner._start(*self._args)
        return self._session

    async def __aexit__(self, *exc):
        await self._session.close()


def _background(flag):
    return None if flag is None else ("keep" if flag else "kill")


class LocalDockerSandbox(Sandbox):
    """A sandbox in a container of the docker engine ($DOCKER_HOST), one per session (removed
    at close). network defaults to Network.none(); a command without a timeout of its own
    gets default_exec_timeout_seconds (600) and ends with exit code 124."""

    supported_header_bindings = ()

    def __init__(self, *, image=None, supports_background_processes=None, shell=None,
                 default_exec_timeout_seconds=None, setup_script=None,
                 setup_script_timeout_seconds=None, network=None, hooks=(), access=None):
        self._init(network=network, header_bindings=(), hooks=hooks, access=access)
        self.image = image
        self.supports_background_processes = supports_background_processes is not False
        self._background = supports_background_processes
        self.shell = shell
        self.default_exec_timeout_seconds = default_exec_timeout_seconds or 600
        self.setup_script = setup_script
        self.setup_script_timeout_seconds = setup_script_timeout_seconds

    def _create_args(self, session_id):
        args = {"backend": "docker", "image": self.image, "network": self.network,
                "shell": self.shell, "timeout": self.default_exec_timeout_seconds,
                "setup_script": self.setup_script,
                "setup_timeout": self.setup_script_timeout_seconds,
                "background": _background(self._background)}
        if self.access:
            args["access"] = self.access
        return {k: v for k, v in args.items() if v is not None}


class CowboxSandbox(Sandbox):
    """LocalDockerSandbox's shape on any cowbox backend (ns by default), plus what cowbox
    enforces: Network.allow with HeaderBinding secrets, egress=EgressPolicy.custom(...)
    (the CIDRs opened through the egress proxy on top of Network.none()), instance_id
    (the workspace of (instance_id, session) is found again by a later session) and
    secrets= (the values HeaderBinding's secret_name picks)."""

    def __init__(self, *, backend="ns", image=None, instance_id=None,
                 supports_background_processes=None, shell=None,
                 default_exec_timeout_seconds=None, setup_script=None,
                 setup_script_timeout_seconds=None, network=None, egress=None,
                 header_bindings=(), secrets=None, hooks=(), access=None):
        if egress is not None:
            if not isinstance(egress, EgressPolicy) or egress.mode != "custom":
                raise ValueError("egress takes only EgressPolicy.custom(allow_cidrs=...)")
            if network is not None and network.mode != "none":
                raise ValueError("egress opens addresses on top of Network.none()")
            network = Network.none()
        self._egress_network = None
        if egress is not None and egress.allow_cidrs:
            self._egress_network = _cbnet.Network("allow", list(egress.allow_cidrs))
        self._init(network=network, header_bindings=header_bindings, hooks=hooks,
                   access=access)
        self.egress = egress
        self.backend = backend
        self.image = image
        self.instance_id = instance_id
        self.supports_background_processes = supports_background_processes is not False
        self._background = supports_background_processes
        self.shell = shell
        self.default_exec_timeout_seconds = default_exec_timeout_seconds or 600
        self.setup_script = setup_script
        self.setup_script_timeout_seconds = setup_script_timeout_seconds
        self._secrets = dict(secrets or {})

    @property
    def egress_policy(self):
        if self.egress is not None:
            return self.egress
        return EgressPolicy.allow_all() if self.network.mode == "all" else \
            EgressPolicy.block_all()

    def _name(self, session_id):
        name = "%s-%s" % (self.instance_id, session_id) if self.instance_id else session_id
        name = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64]
        return name if not name.startswith("cb-") else "s" + name[:63]

    def _create_args(self, session_id):
        args = {"backend": self.backend, "image": self.image,
                "network": self._egress_network or self.network, "shell": self.shell,
                "timeout": self.default_exec_timeout_seconds,
                "setup_script": self.setup_script,
                "setup_timeout": self.setup_script_timeout_seconds,
                "background": _background(self._background), "name": self._name(session_id)}
        if self.header_bindings:
            args["header_bindings"] = [b.binding(self._secrets) for b in self.header_bindings]
        if self.access:
            args["access"] = self.access
        return {k: v for k, v in args.items() if v is not None}

    async def _open(self, s, session_id, cowbox, home):
        name = self._name(session_id)
        for ws in await _Workspace.list(cowbox=cowbox, home=home):
            if ws.get("name") == name:  # a reopened session finds its workspace
                return await _Workspace.attach(ws["ref"], cowbox=cowbox, home=home)
        return await super()._open(s, session_id, cowbox, home)

    async def _end(self, s):
        await s.cowbox.close()  # kept: the same instance_id and session find it again


class DangerousLocalSandbox(Sandbox):
    """Commands run on this machine as your user, with no isolation, in workspace (a host
    folder; by default a new one under ~/.cache/mistral-vibe-harness-local-host/). The
    network is always Network.all(). Edits are journaled (an in-place cowbox workspace)."""

    supported_network = ("all",)
    supported_header_bindings = ()

    def __init__(self, *, shell=None, default_exec_timeout_seconds=None, workspace=None,
                 delete_on_cleanup=None, hooks=(), access=None):
        for h in hooks:
            if isinstance(h, GitIdentity):
                raise ValueError("DangerousLocalSandbox refuses GitIdentity: on your machine "
                                 "it would overwrite your ~/.gitconfig")
        self._init(network=Network.all(), header_bindings=(), hooks=hooks, access=access)
        self.shell = shell
        self.default_exec_timeout_seconds = default_exec_timeout_seconds
        self.workspace = workspace
        self.delete_on_cleanup = (workspace is None) if delete_on_cleanup is None else \
            bool(delete_on_cleanup)

    def _resolve(self, session_id):
        if self.workspace is None:
            folder = os.path.join(os.path.expanduser("~"), ".cache",
                                  "mistral-vibe-harness-local-host", session_id)
        else:
            folder = self.workspace
        if self.delete_on_cleanup:
            if not os.path.isabs(folder):
                raise ValueError("DangerousLocalSandbox: a workspace to delete must be "
                                 "absolute, not %r" % folder)
            real = os.path.realpath(folder)
            for keep, what in ((os.path.expanduser("~"), "your home folder"),
                               (os.getcwd(), "the working folder")):
                k = os.path.realpath(keep)
                if k == real or k.startswith(real.rstrip("/") + "/"):
                    raise ValueError("DangerousLocalSandbox: the workspace to delete %s "
                                     "contains %s" % (real, what))
        return os.path.realpath(os.path.abspath(folder))

    async def _open(self, s, session_id, cowbox, home):
        folder = self._resolve(session_id)
        os.makedirs(folder, exist_ok=True)
        s.folder = folder
        args = {"base": folder, "in_place": True, "backend": "local", "shell": self.shell,
                "timeout": self.default_exec_timeout_seconds}
        if self.access:
            args["access"] = self.access
        return await _Workspace.create(cowbox=cowbox, home=home,
                                    **{k: v for k, v in args.items() if v is not None})

    def _cmd(self, command, cwd, session):
        # Commands start in the folder itself, as a process of the agent's would.
        folder = session.folder
        where = folder if cwd is None else os.path.join(folder, str(cwd))
        if isinstance(command, str):
            command = [self.shell or "sh", "-c", command]
        return ["env", "-C", where, "--", "PWD=" + where] + [str(c) for c in command], None

    def _path(self, path, session):
        path = str(path)
        if os.path.isabs(path):
            return os.path.relpath(path, session.folder)
        return path

    async def _end(self, s):
        await s.cowbox.close()
        await _Workspace.destroy(s.cowbox.ref, cowbox=s._cowbox_bin, home=s._home)
        if self.delete_on_cleanup and s.folder:
            shutil.rmtree(s.folder, ignore_errors=True)


__all__ = ["Network", "EgressPolicy", "HeaderBinding", "GitHubBinding", "MistralApiBinding",
           "WorkspaceHeaderBindings", "Sandbox", "SandboxHook", "GitIdentity",
           "SandboxExecutionResult", "SandboxCallbackContext", "SandboxSession", "DangerousLocalSandbox",
           "LocalDockerSandbox", "CowboxSandbox"]
