"""The cowbox Sandbox: the LiteLLM harness Sandbox protocol over a workspace daemon, plus
create/attach/destroy and the turn operations (diff, rollback, fork)."""

import asyncio
import base64
import json
import logging
import os
import re
import signal as _signal
from dataclasses import dataclass, field

from . import directio
from .connection import Connection, SendFailed, request_sync
from .errors import (AccessDeniedError, InvalidRequestError, WorkspaceError, WorkspaceNotFoundError,
                     WorkspaceUnavailableError, cli_error, error_from_reply,
                     BaseNotADirectoryError, BaseNotFoundError, CowboxBinaryNotFoundError)

CHUNK = 1 << 20  # bytes per read/write request; large files take several
# A whole map frame's budget asked of the daemon (under LINE_LIMIT): ~12k files a frame, so
# that the client turns one frame into a dict while the daemon writes the next.
FRAME_BYTES = 1 << 20
_REF = re.compile(r"^cb-[0-9a-f]{32}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
log = logging.getLogger("cowbox")
# host_url's wait for the daemon's answer (the backend's boot): inside a running event loop,
# which it must not hold, and outside one.
HOST_URL_LOOP_WAIT = 2.0
HOST_URL_WAIT = 300.0
ACCESS_LEVELS = ("none", "files", "full")  # narrowest first


def _check_access(access):
    if access is not None and access not in ACCESS_LEVELS:
        raise ValueError("access %r: expected 'none', 'files' or 'full'" % (access,))


@dataclass
class CompletedRun:
    """What run() returns: exit_code (124 timed out, 127 not found, 128+n signal n), and
    what ended it: signal (the signal that ended it, 0 if it exited), killed (a kill, or a
    cancelled caller, ended it), oom_killed (the memory cap did, exit code 137)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    output_limited: bool = False
    duration: float = 0.0
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    killed: bool = False
    oom_killed: bool = False
    signal: int = 0


@dataclass(frozen=True)
class FileChange:
    """One change between two snapshots: kind is added, modified or deleted."""

    path: str
    kind: str
    old_sha256: str = None
    new_sha256: str = None


class Changes(list):
    """The FileChange events of diff(); with diff(..., network=True), network holds the
    egress proxy's rows (as net_log gives them) of the turns the diff spans, else None."""

    network = None


def file_changes(before, after):
    """The FileChange events between two snapshot() maps, sorted by path."""
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        kind = "added" if old is None else "deleted" if new is None else "modified"
        out.append(FileChange(path, kind, old, new))
    return out


def _result(msg):
    out = base64.b64decode(msg.get("stdout", ""))
    err = base64.b64decode(msg.get("stderr", ""))
    return CompletedRun(msg["exit_code"], out.decode("utf-8", "replace"),
                        err.decode("utf-8", "replace"), bool(msg.get("timed_out")),
                        bool(msg.get("output_limited")), msg.get("duration", 0.0), out, err,
                        bool(msg.get("killed")), bool(msg.get("oom_killed")),
                        int(msg.get("signal") or 0))


class _Stdin:
    """The write end of a running command's stdin, sent as stdin frames."""

    def __init__(self, proc):
        self._proc = proc
        self._closed = False

    def write(self, data):
        if self._closed:
            raise BrokenPipeError("stdin is closed")
        for i in range(0, len(data), CHUNK):
            self._proc._send(op="stdin",
                             data=base64.b64encode(data[i:i + CHUNK]).decode())

    async def drain(self):
        await self._proc._conn.writer.drain()

    def close(self):
        if not self._closed:
            self._closed = True
            try:
                self._proc._send(op="stdin", eof=True)
            except WorkspaceError:
                pass

    def is_closing(self):
        return self._closed


class Process:
    """A command started by exec(): stdout/stderr are asyncio.StreamReaders, stdin a writer;
    wait() returns the exit code (like asyncio.subprocess.Process)."""

    def __init__(self, conn):
        self._conn = conn
        self._id = None
        self._done = asyncio.get_running_loop().create_future()
        self.stdout = asyncio.StreamReader(limit=1 << 24)
        self.stderr = asyncio.StreamReader(limit=1 << 24)
        self.stdin = _Stdin(self)
        self.returncode = None
        self.timed_out = False
        self.output_limited = False
        self.killed = False
        self.oom_killed = False
        self.signal = 0

    def _send(self, **msg):
        self._conn.send(dict(msg, id=self._id))

    def _on_message(self, msg):
        if "stream" in msg:
            data = base64.b64decode(msg.get("data", ""))
            (self.stderr if msg["stream"] == "stderr" else self.stdout).feed_data(data)
            return
        self.stdout.feed_eof()
        self.stderr.feed_eof()
        if self._done.done():
            return
        if "error" in msg:
            self._done.set_exception(error_from_reply(msg["error"]))
        else:
            self.returncode = msg["exit_code"]
            self.timed_out = bool(msg.get("timed_out"))
            self.output_limited = bool(msg.get("output_limited"))
            self.killed = bool(msg.get("killed"))
            self.oom_killed = bool(msg.get("oom_killed"))
            self.signal = int(msg.get("signal") or 0)
            self._done.set_result(self.returncode)

    @property
    def pid(self):
        return self._id  # the request id: processes live in the sandbox's pid namespace

    async def wait(self):
        return await asyncio.shield(self._done)

    def send_signal(self, sig):
        if not self._done.done():
            self._send(op="kill", signal=int(sig))

    def kill(self):
        self.send_signal(_signal.SIGKILL)

    def terminate(self):
        self.send_signal(_signal.SIGTERM)

    async def communicate(self, input=None):
        if input:
            self.stdin.write(input)
        self.stdin.close()
        out, err = await asyncio.gather(self.stdout.read(), self.stderr.read())
        await self.wait()
        return out, err


async def _cowbox(binary, env, *args):
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except FileNotFoundError:
        raise CowboxBinaryNotFoundError(
            "the cowbox binary %r was not found: set COWBOX_BIN to it (a build's "
            "build/cowbox) or put cowbox on PATH" % (binary,)) from None
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode().strip()


def _check_ref(ref):
    if not isinstance(ref, str) or not (_REF.match(ref) or (_NAME.match(ref)
                                                            and not ref.startswith("cb-"))):
        raise ValueError("%r is not a workspace ref cowbox made (cb- and 32 hex digits) "
                         "nor a workspace name" % (ref,))


class Sandbox:
    """A cowbox workspace as a harness sandbox. Build it with create() or attach(ref)."""

    def __init__(self, ref, *, cowbox=None, home=None, access=None):
        _check_ref(ref)
        _check_access(access)
        self.ref = ref
        # The level asked for (None: every level the workspace serves); what the daemon
        # grants is self.access, and self.supported_access the workspace's widest.
        self._access = access
        self.access = None
        self.supported_access = None
        # the binary: cowbox=, else $COWBOX_BIN (what the C library and the daemon's own
        # start read too), else $COWBOX (the tests' older name), else cowbox on PATH
        self.cowbox = (cowbox or os.environ.get("COWBOX_BIN") or os.environ.get("COWBOX")
                       or "cowbox")
        self._env = dict(os.environ)
        if home:
            self._env["COWBOX_HOME"] = home
        self._conn = None
        self._sock = None
        self._lock = None
        self.mountpoint = None
        # True when the workspace is in place (create(in_place=True)): its edits land in
        # the base folder itself. Known once connected (None before).
        self.in_place = None
        self.backend = None
        self.workdir = None  # where commands start: the daemon's answer, once connected
        self.last_turn = None
        # The turn that recorded what the on_create hooks and setup script did at create
        # (None: there were none): the baseline, not the agent's first turn.
        self.baseline_turn = None
        # (turn, map_id, {path: sha256}) of the last snapshot(): what the next one asks
        # the changes against.
        self._map = None
        self._snapshot_lock = None
        # read/write go straight through the mount when this process sees it (same path
        # rules, no base64/JSON); COWBOX_DIRECT_IO=0 or direct_io = False forces the protocol.
        self.direct_io = os.environ.get("COWBOX_DIRECT_IO", "1") != "0"
        self._working_dir = ""  # the option: where relative read/write paths start

    # --- lifecycle ---

    @classmethod
    async def create(cls, base=None, *, name=None, backend="ns", env=None, working_dir=None,
                     timeout=None, network=None, cpus=None, memory_mb=None, pids=None,
                     disk_mb=None, disk_inodes=None, image=None,
                     on_create=(), on_destroy=(), setup_script=None, setup_timeout=None,
                     privileged=False, shell=None, user=None, background=None, volumes=None,
                     access=None, idle_timeout=None, in_place=False, cowbox=None, home=None,
                     header_bindings=None, proxy_conns=None, from_=None, from_turn=None):
        """A new workspace over base (a directory, or None for an empty one) with these
        backend options; the backend itself boots on first use. network is "none" (the
        default of ns and docker), "all" (outbound through user-mode networking, not the
        host's loopback) or "host" (the host's own namespace; what local always is), or a
        cowbox.Network: Network.public() or Network.allow(hosts=[...]) reach the network
        only through the workspace's egress proxy (docs/network.md); there,
        header_bindings (cowbox.HeaderBinding) set secret headers on HTTPS requests to
        their hosts without the secret entering the sandbox; proxy_conns caps the proxy's
        connections open at once (default 256; past it the longest idle one is closed).
        image is the commands' root: for ns a directory, "oci:PATH[:TAG]" (an OCI image
        layout) or an image in the local podman store ("containers-storage:NAME" or NAME,
        never pulled), unpacked once into a root cached under COWBOX_HOME/images that later
        workspaces of the same image reuse (None: the host's /usr, /etc, ...); for docker the
        engine's image (None: $COWBOX_DOCKER_IMAGE, else cowbox-debian:bookworm, which
        scripts/setup-podman builds); for vm a directory or image as for ns (None: the
        debootstrap tree scripts/setup-podman makes). backend "vm" boots a qemu VM under its
        own kernel on first use (scripts/setup-vm), network "none", "all" (passt), public or
        allow (no NIC: the egress proxy over the guest agent's port; no header_bindings
        yet), host_url under any of them. A bad image fails
        the create, naming it.
        shell is "sh" (the default) or "bash": what runs command strings and hooks. user
        (ns, docker, vm) runs commands as that user inside: a name, a uid, or "NAME:GROUP".
        background "keep" (the default) lets jobs a command starts with &, nohup or setsid
        run on until the workspace closes (the call still returns at most 2 s after the
        command exits); "kill" ends them with the command. volumes (ns, docker, vm) binds host
        directories in: [(host_dir, sandbox_path, "ro" | "rw")], read-only unless asked;
        none under COWBOX_HOME. Commands get HOME=/home/cowbox, the workspace's persistent
        home (outside /workspace: snapshots do not cover it), removed with the workspace.
        privileged=True (ns only) runs commands as the host's uid 0 (no capabilities)
        instead of in a user namespace with the workspace's own id range: warned, see
        docs/security.md. Limits (docs/security.md#limits) default to timeout=600 s per
        command, memory_mb=4096, pids=1024 (ns and docker) and an upper-layer quota of
        disk_mb=10240 and disk_inodes=1000000; None keeps the default, 0 turns one off.
        access ("none", "files" or "full", like Mistral's supported_access) is the widest
        level the workspace serves, to every client: files gives read, write and the turn
        operations but no command; none only what the owner uses (snapshot, diff, turns,
        close, destroy). None: full. on_create lists shell commands (str) and async
        callables that get the sandbox (Mistral's code hooks): all run here, before create
        returns (shell ones first, in the daemon, then the setup script, then the callables,
        in order), and what they changed is recorded as the turn labelled on_create
        (baseline_turn): the baseline, not the agent's first turn. A failing hook fails the
        create, which removes the workspace. idle_timeout (seconds, default 600, 0: never):
        the workspace's daemon, mount and container stop once no Sandbox object holds it
        for that long, keeping its disk; the next use boots it again.
        in_place=True (LiteLLM's sandbox.local(path)): the agent's edits land in base
        itself, the mount's upper layer being that folder; base is recorded as turn 0
        first (its files kept as blobs in the workspace), every change is journaled as
        usual, so snapshot, diff and rollback (which writes the old bytes back into base)
        work; destroy leaves base's content as it is.
        from_ rebuilds the workspace from an image that export() wrote ("oci:DIR[:TAG]" or
        "docker://HOST/REPO:TAG"): the same turns and maps, up to from_turn (None: all);
        base then is a local directory to use as the image's base (its digest must match)
        instead of the one unpacked from the image."""
        _check_access(access)
        if from_ is not None and in_place:
            raise ValueError("from_ and in_place exclude each other")
        if from_turn is not None and from_ is None:
            raise ValueError("from_turn needs from_: the image to import")
        if in_place and not base:
            raise ValueError("in_place=True needs base: the folder to work in")
        if base is not None and not os.path.exists(base):
            raise BaseNotFoundError("base %s: no such directory" % (base,))
        if base is not None and not os.path.isdir(base):
            raise BaseNotADirectoryError("base %s: not a directory" % (base,))
        on_create = list(on_create)
        hooks = [h for h in on_create if not isinstance(h, str)]
        for h in hooks:
            if not callable(h):
                raise TypeError("on_create: %r is neither a shell command (str) nor an "
                                "async callable taking the sandbox" % (h,))
        options = {"backend": backend, "env": dict(env or {}),
                   "on_create": [h for h in on_create if isinstance(h, str)],
                   "on_destroy": list(on_destroy)}
        if network is not None and not isinstance(network, str):
            options.update(network.options())  # a cowbox.Network
            network = None
        for key, value in (("network", network), ("working_dir", working_dir),
                           ("timeout", timeout),
                           ("cpus", cpus), ("memory_mb", memory_mb), ("pids", pids),
                           ("disk_mb", disk_mb), ("disk_inodes", disk_inodes), ("image", image),
                           ("setup_script", setup_script), ("setup_timeout", setup_timeout),
                           ("shell", shell), ("user", user), ("background", background),
                           ("proxy_conns", proxy_conns)):
            if value is not None:
                options[key] = value
        if header_bindings:
            options["secrets"] = [b.option() for b in header_bindings]
        if volumes:
            options["volumes"] = [[str(v[0]), str(v[1])] + ([str(v[2])] if len(v) > 2 else [])
                                  for v in volumes]
        if privileged:
            import warnings
            warnings.warn("cowbox: privileged=True: commands run as the host's uid 0, not in "
                          "a user namespace", RuntimeWarning, stacklevel=2)
            options["privileged"] = True
        tmp = cls.__new__(cls)
        Sandbox.__init__(tmp, "cb-" + "0" * 32, cowbox=cowbox, home=home)
        args = ["create"] + ([("--in-place" if in_place else "--base"), str(base)]
                             if base else []) + (
            ["--name", name] if name else []) + (
            ["--from", str(from_)] if from_ is not None else []) + (
            ["--turn", str(int(from_turn))] if from_turn is not None else [])
        rc, out, err = await _cowbox(tmp.cowbox, tmp._env, *args)
        if rc != 0:
            raise cli_error(WorkspaceError, "create", err, code="invalid_request")
        box = cls(out.strip().splitlines()[-1], cowbox=cowbox, home=home)
        # On record before its daemon boots (BoxLite logs the id before it starts), so a
        # workspace left by a caller that died half-way can be found and destroyed.
        log.info("Creating cowbox workspace %s", box.ref)
        try:
            # Shell hooks and the setup script run in the daemon at configure, which
            # records them as a turn labelled on_create; code hooks run next, here.
            reply = await box._request("configure", options=options)
            box._apply_options(reply)
            box.baseline_turn = reply.get("baseline_turn")
            if idle_timeout is not None:
                await box._request("idle", timeout=float(idle_timeout))
            for hook in hooks:
                await hook(box)
            if hooks:
                box.baseline_turn = (await box._request("snapshot", label="on_create"))["turn"]
            if access:  # once configured: configure with options needs full
                await box.set_access(access, workspace=True)
        except BaseException:
            # Refused options (or a cancel): the fresh workspace is of no use to anyone.
            await box.close()
            await _cowbox(box.cowbox, box._env, "rm", "-f", box.ref)
            raise
        return box

    @classmethod
    async def attach(cls, ref, *, access=None, cowbox=None, home=None):
        """The workspace ref (or name) names, its daemon started if none runs; a ref that
        does not exist raises WorkspaceUnavailableError. access lowers what this object
        may do, for its life ("files": no commands; "none": only snapshot, diff, turns,
        close); a level wider than the workspace serves raises AccessDeniedError."""
        box = cls(ref, cowbox=cowbox, home=home, access=access)
        await box._connect()
        return box

    @classmethod
    async def list(cls, *, cowbox=None, home=None):
        """Every workspace of this COWBOX_HOME (BoxLite's list_info): a list of dicts with
        ref, name, base, dir, mountpoint, state (mounted, unmounted, stale), pid (its
        daemon's, 0 if none) and upper_bytes. A workspace left without a stored ref is
        found here."""
        tmp = cls.__new__(cls)
        Sandbox.__init__(tmp, "cb-" + "0" * 32, cowbox=cowbox, home=home)
        rc, out, err = await _cowbox(tmp.cowbox, tmp._env, "ls", "--json")
        if rc != 0:
            raise cli_error(WorkspaceUnavailableError, "ls", err)
        return json.loads(out)

    @classmethod
    async def destroy(cls, ref, *, cowbox=None, home=None):
        """Run the on_destroy hooks, remove the backend's resources and delete the
        workspace; a workspace that is already gone returns quietly. Once started, the
        deletion finishes even if the caller is cancelled (the cancel comes after it)."""
        _check_ref(ref)
        task = asyncio.ensure_future(cls._destroy(ref, cowbox, home))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                try:
                    await task
                except Exception:
                    pass
            raise

    @classmethod
    async def _destroy(cls, ref, cowbox, home):
        box = cls(ref, cowbox=cowbox, home=home)
        rc, _, err = await _cowbox(box.cowbox, box._env, "info", ref, "--json")
        if rc != 0:
            if "no workspace" in err:
                return
            raise cli_error(WorkspaceUnavailableError, "info", err)
        try:
            await box._connect()
            await box._conn.request("destroy")
        except WorkspaceError:
            pass  # a broken daemon must not keep the disk alive; rm below still runs
        finally:
            if box._conn:
                await box._conn.close()
                box._conn = None
        rc, _, err = await _cowbox(box.cowbox, box._env, "rm", "-f", ref)
        if rc != 0:
            raise cli_error(WorkspaceUnavailableError, "rm", err)

    async def _connect(self):
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn and not self._conn.closed:
                return self._conn
            rc, out, err = await _cowbox(self.cowbox, self._env, "mount", self.ref, "--json", "--idle")
            if rc != 0:
                raise WorkspaceUnavailableError("workspace %s: %s" % (self.ref, err))
            info = json.loads(out)
            self.ref = info.get("ref", self.ref)
            self.mountpoint = info["mountpoint"]
            self.in_place = bool(info.get("in_place"))
            self._sock = os.path.join(os.path.dirname(self.mountpoint), "control.sock")
            if not os.path.exists(self._sock):
                home = self._env.get("COWBOX_HOME")
                self._sock = os.path.join(home or "/var/lib/cowbox", "workspaces", self.ref,
                                          "control.sock")
            conn = await Connection.open(self._sock)
            try:
                # Every connection asks for the level first (also after a restart).
                args = {"level": self._access} if self._access else {}
                granted = await conn.request("access", **args)
                self._apply_options(await conn.request("configure"))
            except BaseException:
                await conn.close()
                raise
            self.access = granted["access"]
            self.supported_access = granted["supported_access"]
            self._conn = conn
            return self._conn

    async def set_access(self, access, *, workspace=False):
        """Lower this sandbox to access for its life (every connection it makes asks for
        it); workspace=True lowers the widest level the workspace serves, for every client.
        A wider level than it has raises AccessDeniedError."""
        _check_access(access)
        conn = await self._connect()
        granted = await conn.request("access", level=access, workspace=bool(workspace))
        self._access = access
        self.access = granted["access"]
        self.supported_access = granted["supported_access"]

    def _apply_options(self, reply):
        """The backend and where its commands start, as configure's reply says: the daemon
        knows where each backend shows the workspace."""
        opts = reply["options"]
        self.backend = opts["backend"]
        self._working_dir = opts.get("working_dir") or ""
        self.workdir = reply["workdir"]

    async def _request(self, op, **args):
        """One request; if the daemon had gone (a crash, a close elsewhere) before it read
        it, the next daemon gets it: the next use boots the workspace again."""
        conn = await self._connect()
        try:
            return await conn.request(op, **args)
        except SendFailed:
            conn = await self._connect()
            return await conn.request(op, **args)

    async def detach(self):
        """Let go of the workspace without stopping it: other clients keep using it, and
        with none left its daemon stops after its idle_timeout (keeping the disk)."""
        if self._conn:
            await self._conn.close()
        self._conn = None

    async def close(self):
        """Stop the workspace's daemon (and its container); the disk stays for attach."""
        if self._conn and not self._conn.closed:
            try:
                await self._conn.request("close")
                # The daemon hangs up once it has unmounted: closed means closed.
                await self._conn.wait_closed(30)
            except WorkspaceError:
                pass
        elif self._conn is None and self._sock:
            try:  # only host_url (synchronous) started it
                request_sync(self._sock, "close")
            except (WorkspaceError, OSError):
                pass
        if self._conn:
            await self._conn.close()
        self._conn = None
        self._sock = None  # the next use boots the daemon again

    async def __aenter__(self):
        await self._connect()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # --- the harness protocol ---

    @staticmethod
    def _cmd_args(cmd, env, cwd, timeout, user=None, background=None):
        if isinstance(cmd, str):
            args = {"shell": cmd}
        else:
            args = {"cmd": [str(c) for c in cmd]}
        if env:
            args["env"] = {str(k): str(v) for k, v in env.items()}
        if cwd is not None:
            args["cwd"] = str(cwd)
        if timeout is not None:
            args["timeout"] = float(timeout)
        if user is not None:
            args["user"] = user if isinstance(user, int) else str(user)
        if background is not None:
            args["background"] = str(background)
        return args

    async def exec(self, cmd, *, env=None, cwd=None, timeout=None, user=None,
                   background=None):
        """Start cmd (a list, or a string for the workspace's shell -c); returns a Process
        at once. user: this command's user (default: the workspace's). A Process ended by
        a close or destroy from elsewhere raises WorkspaceUnavailableError from wait()."""
        for attempt in (0, 1):
            conn = await self._connect()
            if self.access != "full":  # refused at once, not at wait()
                raise AccessDeniedError("exec refused: this sandbox has access %s, and exec "
                                        "needs full" % self.access)
            proc = Process(conn)
            proc._id = conn.start("exec", proc._on_message, stdin=True,
                                  **self._cmd_args(cmd, env, cwd, timeout, user,
                                                   background))
            try:
                await conn.drain(proc._id)
                return proc
            except SendFailed:
                if attempt:
                    raise

    async def run(self, cmd, *, env=None, cwd=None, timeout=None, input=None, strict=False,
                  user=None, background=None):
        """Run cmd to completion. A timeout or the output cap shows in timed_out and
        output_limited; with strict=True they raise WorkspaceTimeoutError and
        WorkspaceOutputLimitError instead, the partial CompletedRun in .result. Cancelling
        the caller (e.g. asyncio.wait_for) kills the command and everything it started.
        A command ended by a close or destroy from elsewhere (or a daemon that went away)
        raises WorkspaceUnavailableError, its partial CompletedRun in .result when the
        daemon sent one, rather than returning a plain exit 137."""
        args = self._cmd_args(cmd, env, cwd, timeout, user, background)
        if input:
            args["stdin"] = base64.b64encode(input).decode()
        try:
            msg = await self._request("run", kill_on_cancel=True, strict=strict, **args)
        except WorkspaceError as e:
            if isinstance(e.result, dict):
                e.result = _result(e.result)
            if isinstance(e, WorkspaceUnavailableError) and self._conn:
                # The daemon is stopping (or gone): its hang-up may not have reached us yet;
                # the next call must boot the workspace again, not talk to a closing socket.
                conn, self._conn = self._conn, None
                await conn.close()
            raise
        return _result(msg)

    async def _direct(self, fn, *args):
        # Below files the daemon refuses it, with its reason.
        if not self.direct_io or not self.mountpoint or self.access not in ("files", "full"):
            return False, None
        try:
            return True, await asyncio.get_running_loop().run_in_executor(
                None, fn, self.mountpoint, *args)
        except (directio.Unsupported, PermissionError):
            return False, None

    def _root_path(self, path):
        """The root-relative path the daemon resolves path to (cb_backend_api_path): one
        under /workspace as the sandbox sees it, a relative one under working_dir."""
        path = str(path)
        if path.startswith("/workspace/") and path[len("/workspace/"):].lstrip("/"):
            return path[len("/workspace/"):].lstrip("/")
        wd = getattr(self, "_working_dir", "")
        if not path.startswith("/") and wd:
            return wd + "/" + path
        return path

    async def read(self, path):
        """The bytes of path, read in chunks: relative to working_dir (the root without
        one), or absolute under /workspace as commands see it."""
        conn = await self._connect()
        done, data = await self._direct(directio.read, self._root_path(path))
        if done:
            return data
        parts, offset = [], 0
        while True:
            msg = await self._request("read", path=path, offset=offset, length=CHUNK)
            data = base64.b64decode(msg["data"])
            parts.append(data)
            offset += len(data)
            if msg["eof"] or not data:
                return b"".join(parts)

    async def write(self, path, data):
        """Replace path's content with data (parents made), sent in pipelined chunks; path
        as read() takes it."""
        if isinstance(data, str):
            data = data.encode()
        await self._connect()
        if (await self._direct(directio.write, self._root_path(path), bytes(data)))[0]:
            return
        # The first chunk truncates, so the rest must come after it; those are pipelined.
        await self._request("write", path=path, offset=0, data=base64.b64encode(
            data[:CHUNK]).decode(), truncate=True)
        conn, futs = self._conn, []
        for off in range(CHUNK, len(data), CHUNK):
            chunk = base64.b64encode(data[off:off + CHUNK]).decode()
            futs.append(asyncio.ensure_future(
                conn.request("write", path=path, offset=off, data=chunk, truncate=False)))
        await asyncio.gather(*futs)

    def host_url(self, port):
        """A URL that code inside the sandbox reaches the host's port with (only that port,
        even under network none). Synchronous, as the protocol has it."""
        if self._access not in (None, "full") or self.access not in (None, "full"):
            raise AccessDeniedError("host_url refused: this sandbox has access %s, and "
                                    "host_url needs full" % (self.access or self._access))
        if not self._sock:
            # Not started yet: boot the daemon the blocking way (the protocol's host_url is
            # synchronous), as the first async operation would.
            import subprocess
            proc = subprocess.run([self.cowbox, "mount", self.ref, "--json", "--idle"], env=self._env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise WorkspaceUnavailableError("workspace %s: %s" % (self.ref,
                                                                      proc.stderr.strip()))
            mnt = json.loads(proc.stdout)["mountpoint"]
            self._sock = os.path.join(os.path.dirname(mnt), "control.sock")
        try:
            asyncio.get_running_loop()
            in_loop = True
        except RuntimeError:
            in_loop = False
        # The daemon answers once the backend is up: at once when it runs, after its boot
        # otherwise (a vm's takes tens of seconds under TCG). Inside a running event loop
        # this call may not hold the loop for that: it waits HOST_URL_LOOP_WAIT seconds at
        # most, the boot going on in the daemon, and then says so; host_url_async awaits it.
        try:
            return request_sync(self._sock, "host_url", port=int(port),
                                timeout=HOST_URL_LOOP_WAIT if in_loop else HOST_URL_WAIT)["url"]
        except WorkspaceError:
            raise
        except TimeoutError:
            raise WorkspaceUnavailableError(
                "host_url: workspace %s is still booting%s" % (
                    self.ref, "; await box.host_url_async(port), or call host_url again once "
                    "it is up (this call does not hold the event loop)" if in_loop else
                    " after %d s" % HOST_URL_WAIT)) from None
        except OSError as e:
            raise WorkspaceUnavailableError("host_url: workspace %s: %s" % (self.ref, e)) from None

    async def host_url_async(self, port):
        """host_url, awaiting the backend's boot without holding the event loop."""
        if self._access not in (None, "full") or self.access not in (None, "full"):
            raise AccessDeniedError("host_url refused: this sandbox has access %s, and "
                                    "host_url needs full" % (self.access or self._access))
        return (await self._request("host_url", port=int(port)))["url"]

    async def which(self, binary):
        """The path of binary on the sandbox's PATH, or None."""
        try:
            return (await self._request("which", binary=binary))["path"]
        except WorkspaceNotFoundError:
            return None

    async def snapshot(self):
        """Record a turn; every regular file's relative path -> SHA-256 (lowercase hex), a
        new dict each call that the caller may keep or change. Nothing changed since the
        latest turn: no turn is recorded and the map is that turn's (docs/turns.md). After the first call only
        what changed since the previous one travels: the daemon sends the changed and
        deleted paths since the turn this object last saw, and the client applies them to
        its own copy of that map (the whole map comes again when that turn was pruned or
        belongs to another database)."""
        if self._snapshot_lock is None:
            self._snapshot_lock = asyncio.Lock()
        # One at a time: each reply is applied to the map of the turn it was asked against.
        async with self._snapshot_lock:
            # Streamed: the daemon sends the changes (or the whole map) in frames of a few
            # thousand rows, applied as they come, and never builds one reply of them all.
            # A whole map comes in frames of up to FRAME_BYTES: the first frame's dict is
            # kept as the map and the others merged into it as they come (a daemon that
            # ignores frame_bytes sends 2048 rows a frame). In columns (map_form) a frame's
            # paths come as one string joined by "//" (which no path holds) and its hashes
            # as another: split and zipped into a dict in C, faster than the JSON reader
            # builds one; a daemon that ignores map_form sends a "files" object. In "raw"
            # the two columns come as bytes after the frame's line (no JSON text to scan);
            # a daemon that does not know "raw" sends a "files" object.
            args = {"files": True, "stream": True, "frame_bytes": FRAME_BYTES,
                    "map_form": "raw"}
            held = self._map
            self._map = None  # being changed: unusable if this raises half-way
            whole = []
            columns = ([], [])  # raw frames' paths and hashes, zipped into one dict at the end
            if held is not None:
                args.update(since=held[0], map_id=held[1])

            def apply(files, msg):
                for path in msg.get("deleted", ()):
                    files.pop(path, None)
                files.update(msg.get("changed", {}))

            def take(files):
                if not whole:
                    whole.append(files)
                else:
                    whole[0].update(files)

            def frame(msg):
                if msg.get("stream") == "changes" and held is not None:
                    apply(held[2], msg)
                elif msg.get("stream") == "files" and "raw" in msg:
                    data, (npaths, _) = msg["raw"]
                    columns[0].extend(data[:npaths].decode().split("\0"))
                    columns[1].extend(data[npaths:].decode("ascii").split(" "))
                elif msg.get("stream") == "files" and "paths" in msg:
                    take(dict(zip(msg["paths"].split("//"), msg["sha256"].split(" "))))
                elif msg.get("stream") == "files":
                    take(msg.get("files", {}))

            msg = await self._request("snapshot", on_frame=frame, **args)
            if columns[0]:
                take(dict(zip(*columns)))
            self.last_turn = msg.get("turn")
            if held is not None and msg.get("full") is False:
                files = held[2]
                apply(files, msg)  # a daemon that does not stream puts them in the reply
            else:
                take(msg.get("files", {}))
                files = whole[0]
            if msg.get("map_id"):
                self._map = (msg["turn"], msg["map_id"], files)
            # copy(), not dict(): once a path was deleted from the kept map, dict() takes
            # the slow path (every row inserted again: ~11 ms for 100k rows against ~2.5)
            return files.copy()

    # --- turns ---

    async def diff(self, a, b=None, network=False):
        """The FileChange events from turn a to turn b (None: the live tree now), a list
        (Changes); network=True also fetches what the egress proxy let through or refused
        in those turns (a < turn <= b) into its .network (needs access full)."""
        args = {"a": a}
        if b is not None:
            args["b"] = b
        if network:
            args["network"] = True
        msg = await self._request("diff", **args)
        kinds = {"created": "added", "deleted": "deleted"}
        out = Changes()
        if network:
            out.network = msg.get("network", [])
        for ev in msg.get("events", []):
            kind = kinds.get(ev["event"], "modified" if ev["event"] == "modified"
                             else ev["event"])
            out.append(FileChange(ev["path"], kind, ev.get("old", {}).get("sha256"),
                                  ev.get("new", {}).get("sha256")))
        return out

    async def reaches(self, host):
        """Whether the workspace's network policy opens host ("name", "name:port",
        "[v6]:port"; 443 when no port is given). Names are not resolved here: the proxy
        still refuses an allowed name whose address is private."""
        return (await self._request("reaches", dest=host))["allowed"]

    async def net_log(self, turn=None):
        """What the egress proxy saw, oldest first: dicts with turn, time, proto, name,
        address, port, allowed, rule, bytes_up, bytes_down, duration and secret."""
        args = {} if turn is None else {"turn": turn}
        return (await self._request("net_log", **args))["rows"]

    async def publish(self, port):
        """A host address ("127.0.0.1:PORT") that reaches a server listening on port inside
        the sandbox (ns, docker); open until unpublish(port) or the workspace closes."""
        return (await self._request("publish", port=port))["address"]

    async def unpublish(self, port):
        await self._request("unpublish", port=port)

    async def rollback(self, turn):
        """Make the live workspace what it was at turn. Changes made since the last snapshot
        are recorded first as a turn of their own ("before rollback to T": the reply's
        kept_turn, 0 if there were none), so rolling back to it gives them back."""
        return await self._request("rollback", turn=turn)

    async def apply(self, turn=None, to=None):
        """Write turn's changes (from turn - 1), or with turn=None everything since the base
        (a snapshot is recorded first), onto the base folder or the directory to. Every path
        is checked first: where the folder no longer holds what the workspace recorded,
        nothing is written and ConflictError lists them (.conflicts). Returns {"from_turn",
        "to_turn", "to", "written", "deleted", "unchanged"}."""
        args = {}
        if turn is not None:
            args["turn"] = int(turn)
        if to is not None:
            args["to"] = os.path.realpath(str(to))
        msg = await self._request("apply", **args)
        return {k: v for k, v in msg.items() if k not in ("id", "ok")}

    async def merge(self, source, turn=None, strategy="merge", dry_run=False):
        """Bring source's changes (a workspace ref or name, or a Sandbox: a fork of this one,
        this one's origin, or a fork of the same turn) since their common ancestor up to its
        turn (None: its latest) into this live workspace, recorded as one turn. Three-way per
        path; text both sides changed is merged line by line (conflicting hunks between
        markers under strategy "merge", resolved toward this workspace with "ours" or toward
        source with "theirs"). Returns {"turn" (None when nothing was written or dry_run),
        "merged": [paths], "conflicts": [{"path", "kind", "resolution"}], "source",
        "source_turn", "ancestor_turn", "written", "dry_run"}. Raises ConflictError
        (.conflicts), nothing written, when a path it would touch changed here since the
        latest turn."""
        args = {"source": getattr(source, "ref", source), "strategy": strategy,
                "dry_run": bool(dry_run)}
        if turn is not None:
            args["turn"] = int(turn)
        msg = await self._request("merge", **args)
        return {k: v for k, v in msg.items() if k not in ("id", "ok")}

    async def fsck(self, repair=False):
        """Check the workspace's stored state (every blob and base file its turns need, the
        base cache, meta.db; nothing through the mount). Returns {"ref", "clean",
        "problems": [{"kind", "path", "object", "first_turn", "last_turn", "repaired",
        "detail"}], "blobs_checked", "base_files_checked", "base_cache_rows"};
        last_turn -1 means every turn from first_turn on. repair drops unusable base-cache
        rows."""
        msg = await self._request("fsck", repair=bool(repair))
        return {k: v for k, v in msg.items() if k not in ("id", "ok")}

    async def export(self, dest, turn=None, *, image=None, insecure=False):
        """Write the workspace as an OCI image to dest ("oci:DIR[:TAG]", or
        "docker://HOST/REPO:TAG" pushed through skopeo): the base as one layer, each turn up
        to turn (None: the latest) as one more; a layer dest already holds is not written
        again. image (an image reference skopeo reads) puts a runtime's layers under them,
        so that the image also runs as a container. Returns {"ref", "turn", "destination",
        "layers_written", "layers_reused", "bytes_written", "files_trusted",
        "files_hashed", "manifest"}. Sandbox.create(from_=dest) rebuilds it."""
        args = ["export", self.ref, str(dest), "--json"]
        if turn is not None:
            args += ["--turn", "last" if turn == "last" else str(int(turn))]
        if image:
            args += ["--image", str(image)]
        if insecure:
            args.append("--insecure")
        rc, out, err = await _cowbox(self.cowbox, self._env, *args)
        if rc != 0:
            raise cli_error(WorkspaceError, "export", err)
        return json.loads(out)

    async def fork(self, turn, name=None):
        """A new workspace starting at turn, attached."""
        args = {"turn": turn}
        if name:
            args["name"] = name
        msg = await self._request("fork", **args)
        return await Sandbox.attach(msg["ref"], cowbox=self.cowbox, access=self._access,
                                    home=self._env.get("COWBOX_HOME"))


__all__ = ["Sandbox", "Process", "CompletedRun", "FileChange", "file_changes",
           "InvalidRequestError"]
