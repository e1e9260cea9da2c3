"""Pydantic AI Harness's BoxLite spellings over cowbox.Sandbox: BoxLiteSandbox (the capability:
options, backend(ref), destroy(ref), get_workspace), BoxLiteSandboxBackend, WorkspaceRef and the
page's exceptions, each box one cowbox workspace named pydantic-ai- and 32 hex digits.

The box is the `vm` backend (a micro-VM under its own kernel) where /dev/kvm works and the VM
kernel is set up, else `ns`; backend= or $COWBOX_BOXLITE_BACKEND picks another."""

import asyncio
import fcntl
import logging
import os
import re
import secrets as _secrets
import shlex
import shutil
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .errors import (WorkspaceError, WorkspaceOutputLimitError, WorkspaceTimeoutError,
                     WorkspaceUnavailableError)
from .network import HeaderBinding, Network
from .sandbox import Sandbox

log = logging.getLogger("pydantic_ai_harness.boxlite_sandbox")
PROVIDER = "boxlite"
_OWN_NAME = re.compile(r"^pydantic-ai-[0-9a-f]{32}$")
# BoxLiteSandbox's own settings: box_options may not set them.
_OWNED = ("image", "cpus", "memory_mib", "network", "working_dir", "env", "auto_delete",
          "auto_remove")
_BOX_OPTIONS = ("volumes", "ports", "secrets", "disk_size_gb", "user")
_KVM_GET_API_VERSION = 0xAE00
_KVM_CREATE_VM = 0xAE01


class UserError(RuntimeError):
    """A usage error: an option BoxLiteSandbox owns passed in box_options, a box from another
    runtime, a value cowbox cannot honour."""


@dataclass(frozen=True)
class WorkspaceRef:
    """The identity of a box: provider 'boxlite' and its name (or its cowbox ref)."""

    provider: str
    id: str


@dataclass
class CommandResult:
    """What run() returns."""

    exit_code: int
    stdout: str
    stderr: str


def kvm_works():
    """Whether the vm backend would boot with KVM (backends/vm_boot.c, vm_kvm_usable):
    COWBOX_VM_ACCEL=kvm|tcg decides; else /dev/kvm opens read-write, answers
    KVM_GET_API_VERSION and makes a VM, and no daemon since the host's boot marked KVM
    broken (vm/kvm.broken in the image cache)."""
    want = os.environ.get("COWBOX_VM_ACCEL")
    if want in ("kvm", "tcg"):
        return want == "kvm"
    cache = os.environ.get("COWBOX_IMAGE_CACHE", "/var/cache/cowbox")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        with open(os.path.join(cache, "vm", "kvm.broken")) as f:
            if f.read().strip() == boot_id:
                return False
    except OSError:
        pass
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if fcntl.ioctl(fd, _KVM_GET_API_VERSION) != 12:
            return False
        os.close(fcntl.ioctl(fd, _KVM_CREATE_VM, 0))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def default_backend():
    """$COWBOX_BOXLITE_BACKEND, else vm where /dev/kvm works and the VM kernel is set up
    (scripts/setup-vm), else ns."""
    chosen = os.environ.get("COWBOX_BOXLITE_BACKEND")
    if chosen:
        return chosen
    cache = os.environ.get("COWBOX_IMAGE_CACHE", "/var/cache/cowbox")
    if kvm_works() and os.path.exists(os.path.join(cache, "vm", "vmlinuz")) and \
            shutil.which("qemu-system-x86_64"):
        return "vm"
    return "ns"


def _check_box_options(box_options):
    for key in box_options or {}:
        if key in _OWNED:
            raise UserError("box_options[%r]: BoxLiteSandbox's own settings set it (image, "
                            "cpus, memory_mb, allow_internet_access, working_dir, env)" % key)
        if key not in _BOX_OPTIONS:
            raise UserError("box_options[%r]: cowbox takes volumes, ports, secrets, "
                            "disk_size_gb and user" % key)
    for port in (box_options or {}).get("ports", ()):
        if isinstance(port, (tuple, list)) and port and port[0] not in (None, 0):
            raise UserError("box_options ports %r: cowbox picks the host port (see "
                            "backend.published), give the guest port or (None, guest)" %
                            (port,))


def _check_working_dir(working_dir):
    if working_dir is None:
        return
    wd = os.path.normpath(working_dir)
    if not wd.startswith("/"):
        raise UserError("working_dir %r is not absolute" % working_dir)
    if wd != "/workspace" and not wd.startswith("/workspace/"):
        raise UserError("working_dir %r: a cowbox box's files are under /workspace" %
                        working_dir)


def _check_own_ref(ref):
    if not isinstance(ref, WorkspaceRef) or ref.provider != PROVIDER or \
            not _OWN_NAME.match(str(ref.id)):
        raise ValueError("%r is not a box BoxLiteSandbox created (provider %r, id "
                         "pydantic-ai- and 32 hex digits)" % (ref, PROVIDER))


# Creations in progress in this process, by box name: destroy(ref) waits for them.
_creating = {}
# Backends of this process: destroy(ref) lets go of the box in those that hold it.
_live = weakref.WeakSet()


def _create_options(image, cpus, memory_mb, allow_internet_access, allowed_hosts,
                    working_dir, env, box_options):
    opts = {"image": image, "cpus": cpus, "memory_mb": memory_mb}
    bo = dict(box_options or {})
    header_bindings = []
    for s in bo.get("secrets", ()) or ():
        header_bindings.append(s if isinstance(s, HeaderBinding) else HeaderBinding(**s))
    if not allow_internet_access:
        opts["network"] = "none"
    elif allowed_hosts is not None:
        opts["network"] = Network.allow(hosts=[str(h) for h in allowed_hosts])
    else:
        # Anywhere this machine reaches. Secrets need the egress proxy: public then.
        opts["network"] = Network.public() if header_bindings else "all"
    if header_bindings:
        opts["header_bindings"] = header_bindings
    if working_dir is not None and os.path.normpath(working_dir) != "/workspace":
        opts["working_dir"] = os.path.normpath(working_dir)
    if env:
        opts["env"] = dict(env)
    vols = []
    for v in bo.get("volumes", ()) or ():
        host, guest = v[0], v[1]
        ro = v[2] if len(v) > 2 else False
        vols.append((str(host), str(guest), "ro" if ro else "rw"))
    if vols:
        opts["volumes"] = vols
    if bo.get("disk_size_gb") is not None:
        opts["disk_mb"] = int(bo["disk_size_gb"] * 1024)
    if bo.get("user") is not None:
        opts["user"] = bo["user"]
    return {k: v for k, v in opts.items() if v is not None}


class BoxLiteSandboxBackend:
    """A box as a workspace backend. Building one does no I/O: the first operation creates a
    box (named pydantic-ai- and 32 hex digits), or attaches to the one sandbox= or ref=
    names. The backend never deletes the box; whoever holds backend.ref does."""

    def __init__(self, *, sandbox=None, ref=None, image=None, cpus=None, memory_mb=None,
                 allow_internet_access=False, allowed_hosts=None, working_dir="/workspace",
                 env=None, box_options=None, backend=None, cowbox=None, home=None):
        _check_box_options(box_options)
        _check_working_dir(working_dir)
        if sandbox is not None and ref is not None:
            raise UserError("give sandbox= or ref=, not both")
        if sandbox is not None:
            if not isinstance(sandbox, Sandbox):
                raise UserError("sandbox=%r is not a box of this runtime (a cowbox.Sandbox)" %
                                (sandbox,))
            mine = home or os.environ.get("COWBOX_HOME")
            if sandbox._env.get("COWBOX_HOME") != mine:
                raise UserError("sandbox=%s is a box of another runtime (COWBOX_HOME %s, not "
                                "%s)" % (sandbox.ref, sandbox._env.get("COWBOX_HOME"), mine))
            ref = WorkspaceRef(PROVIDER, sandbox.ref)
        if ref is not None and (not isinstance(ref, WorkspaceRef) or ref.provider != PROVIDER):
            raise ValueError("%r is not a boxlite WorkspaceRef" % (ref,))
        self._box = sandbox
        self.ref = ref
        self._attach = ref is not None
        self._options = _create_options(image, cpus, memory_mb, allow_internet_access,
                                        allowed_hosts, working_dir, env, box_options)
        self._ports = [p[1] if isinstance(p, (tuple, list)) else p
                       for p in (box_options or {}).get("ports", ()) or ()]
        self.published = {}  # guest port -> "127.0.0.1:HOSTPORT", once the box exists
        self._backend = backend or default_backend()
        self._working_dir = working_dir
        self._env = dict(env or {})
        self._cowbox, self._home = cowbox, home
        self._lock = None
        _live.add(self)

    def __repr__(self):  # env and box_options are kept out, as the page's repr does
        return "BoxLiteSandboxBackend(ref=%r, backend=%r)" % (self.ref, self._backend)

    async def get_sandbox(self):
        """The cowbox.Sandbox of the box, creating or attaching to it as the first operation
        does. Attaching to a deleted box raises WorkspaceUnavailableError."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._box is not None:
                return self._box
            if self._attach:
                self._box = await Sandbox.attach(self.ref.id, cowbox=self._cowbox,
                                                 home=self._home)
                return self._box
            name = "pydantic-ai-" + _secrets.token_hex(16)
            self.ref = WorkspaceRef(PROVIDER, name)  # set before the creation finishes
            log.info("Creating BoxLite box %s", name)
            task = asyncio.ensure_future(Sandbox.create(
                name=name, backend=self._backend, cowbox=self._cowbox, home=self._home,
                **self._options))
            _creating[name] = task
            try:
                box = await asyncio.shield(task)
            except asyncio.CancelledError:
                # A run cancelled before its box booted deletes that box itself.
                try:
                    await (await task).detach()
                except BaseException:
                    pass
                await Sandbox.destroy(name, cowbox=self._cowbox, home=self._home)
                raise
            finally:
                _creating.pop(name, None)
            self._attach = True
            for port in self._ports:
                self.published[int(port)] = await box.publish(int(port))
            self._box = box
            return box

    async def working_dir(self):
        """The canonical absolute directory commands start in."""
        box = await self.get_sandbox()
        return box.workdir

    async def run(self, command, *, shell=False, env=None, timeout=None):
        """Run command (a list, or with shell=True a string for /bin/sh -c). On a timeout
        or the 10 MiB output cap the command's tree is killed and WorkspaceTimeoutError /
        WorkspaceOutputLimitError carry the output so far (.result)."""
        box = await self.get_sandbox()
        if shell:
            if not isinstance(command, str):
                command = " ".join(shlex.quote(str(c)) for c in command)
        elif isinstance(command, str):
            command = shlex.split(command)
        return _command_result(await box.run(command, env={**self._env, **(env or {})},
                                             timeout=timeout, strict=True))

    async def read_bytes(self, path):
        return await (await self.get_sandbox()).read(path)

    async def write_bytes(self, path, data):
        await (await self.get_sandbox()).write(path, data)

    async def read_text(self, path):
        return (await self.read_bytes(path)).decode()

    async def write_text(self, path, text):
        await self.write_bytes(path, text.encode())

    async def close(self):
        """Let go of the box (it stops once nothing uses it, keeping its disk)."""
        if self._box is not None:
            await self._box.detach()


def _command_result(r):
    return CommandResult(r.exit_code, r.stdout, r.stderr)


class Workspace:
    """The few calls the page's examples make on pydantic_ai.workspaces.Workspace(backend):
    run, read_text/write_text, read_bytes/write_bytes."""

    def __init__(self, backend):
        self.backend = backend

    async def run(self, command, *, shell=False, env=None, timeout=None):
        return await self.backend.run(command, shell=shell, env=env, timeout=timeout)

    async def read_text(self, path):
        return await self.backend.read_text(path)

    async def write_text(self, path, text):
        await self.backend.write_text(path, text)

    async def read_bytes(self, path):
        return await self.backend.read_bytes(path)

    async def write_bytes(self, path, data):
        await self.backend.write_bytes(path, data)

    @property
    def ref(self):
        return self.backend.ref


@dataclass
class BoxLiteSandbox:
    """The capability: a box per run, created on first use, or the box a ref names (only
    boxes it created). Its settings shape a new box; working_dir and env every command."""

    image: Optional[str] = None
    cpus: Optional[int] = None
    memory_mb: Optional[int] = None
    allow_internet_access: bool = False
    allowed_hosts: Optional[Sequence[str]] = None
    working_dir: Optional[str] = "/workspace"
    env: Optional[Mapping[str, str]] = field(default=None, repr=False)
    box_options: Optional[Mapping[str, Any]] = field(default=None, repr=False)
    backend_name: Optional[str] = field(default=None, repr=False)
    cowbox: Optional[str] = field(default=None, repr=False)
    home: Optional[str] = field(default=None, repr=False)

    def __post_init__(self):
        _check_box_options(self.box_options)
        _check_working_dir(self.working_dir)

    def _new(self, ref=None):
        return BoxLiteSandboxBackend(
            ref=ref, image=self.image, cpus=self.cpus, memory_mb=self.memory_mb,
            allow_internet_access=self.allow_internet_access, allowed_hosts=self.allowed_hosts,
            working_dir=self.working_dir, env=self.env, box_options=self.box_options,
            backend=self.backend_name, cowbox=self.cowbox, home=self.home)

    def backend(self, ref):
        """Attach lazily to a box BoxLiteSandbox created; anything else raises ValueError."""
        _check_own_ref(ref)
        return self._new(ref)

    def get_workspace(self, ctx=None, *, ref):
        """The backend for a run: a new box (ref None or 'new'), or the one ref names. No
        I/O here."""
        if ref is None or ref == "new":
            return self._new()
        if isinstance(ref, BoxLiteSandboxBackend):
            return ref
        return self.backend(ref)

    async def destroy(self, ref):
        """Delete a box by ref; quiet when it is gone. Waits for a creation of it still in
        progress here; once started, a cancelled caller waits for the deletion to end."""
        _check_own_ref(ref)
        pending = _creating.get(ref.id)
        if pending is not None:
            try:
                await asyncio.shield(pending)
            except (Exception, asyncio.CancelledError):
                pass
        for backend in list(_live):  # let go first: the deletion ends their daemon
            if backend.ref == ref and backend._box is not None:
                await backend._box.detach()
        await Sandbox.destroy(ref.id, cowbox=self.cowbox, home=self.home)

    async def list_info(self):
        """Every box of this runtime (COWBOX_HOME), as cowbox.Sandbox.list() gives them."""
        return await list_info(cowbox=self.cowbox, home=self.home)


async def list_info(*, cowbox=None, home=None):
    """Every box of this runtime: boxlite.Boxlite.default().list_info()."""
    return await Sandbox.list(cowbox=cowbox, home=home)


__all__ = ["BoxLiteSandbox", "BoxLiteSandboxBackend", "WorkspaceRef", "CommandResult",
           "Workspace", "UserError", "WorkspaceError", "WorkspaceUnavailableError",
           "WorkspaceTimeoutError", "WorkspaceOutputLimitError", "list_info", "kvm_works",
           "default_backend"]
