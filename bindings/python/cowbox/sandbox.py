"""The cowbox Sandbox: the LiteLLM harness Sandbox protocol over a workspace daemon, plus
create/attach/destroy and the turn operations (diff, rollback, fork)."""

import asyncio
import base64
import json
import os
import re
import signal as _signal
from dataclasses import dataclass, field

from . import directio
from .connection import Connection, SendFailed, request_sync
from .errors import (InvalidRequestError, WorkspaceError, WorkspaceNotFoundError,
                     WorkspaceUnavailableError, error_from_reply)

CHUNK = 1 << 20  # bytes per read/write request; large files take several
_REF = re.compile(r"^cb-[0-9a-f]{32}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class CompletedRun:
    """What run() returns: exit_code (124 timed out, 127 not found, 128+n signal n)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    output_limited: bool = False
    duration: float = 0.0
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class FileChange:
    """One change between two snapshots: kind is added, modified or deleted."""

    path: str
    kind: str
    old_sha256: str = None
    new_sha256: str = None


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
                        bool(msg.get("output_limited")), msg.get("duration", 0.0), out, err)


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
    proc = await asyncio.create_subprocess_exec(
        binary, *args, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode().strip()


def _check_ref(ref):
    if not isinstance(ref, str) or not (_REF.match(ref) or (_NAME.match(ref)
                                                            and not ref.startswith("cb-"))):
        raise ValueError("%r is not a workspace ref cowbox made (cb- and 32 hex digits) "
                         "nor a workspace name" % (ref,))


class Sandbox:
    """A cowbox workspace as a harness sandbox. Build it with create() or attach(ref)."""

    def __init__(self, ref, *, cowbox=None, home=None):
        _check_ref(ref)
        self.ref = ref
        self.cowbox = cowbox or os.environ.get("COWBOX", "cowbox")
        self._env = dict(os.environ)
        if home:
            self._env["COWBOX_HOME"] = home
        self._conn = None
        self._sock = None
        self._lock = None
        self.mountpoint = None
        self.backend = "ns"
        self.workdir = "/workspace"
        self.last_turn = None
        # (turn, map_id, {path: sha256}) of the last snapshot(): what the next one asks
        # the changes against.
        self._map = None
        self._snapshot_lock = None
        # read/write go straight through the mount when this process sees it (same path
        # rules, no base64/JSON); COWBOX_DIRECT_IO=0 or direct_io = False forces the protocol.
        self.direct_io = os.environ.get("COWBOX_DIRECT_IO", "1") != "0"

    # --- lifecycle ---

    @classmethod
    async def create(cls, base=None, *, name=None, backend="ns", env=None, working_dir=None,
                     timeout=None, network=None, cpus=None, memory_mb=None, pids=None,
                     disk_mb=None, disk_inodes=None, image=None,
                     on_create=(), on_destroy=(), setup_script=None, setup_timeout=None,
                     privileged=False, cowbox=None, home=None):
        """A new workspace over base (a directory, or None for an empty one) with these
        backend options; the backend itself boots on first use. network is "none" (the
        default of ns and docker), "all" (outbound through user-mode networking, not the
        host's loopback) or "host" (the host's own namespace; what local always is), or a
        cowbox.Network: Network.public() or Network.allow(hosts=[...]) reach the network
        only through the workspace's egress proxy (docs/network.md).
        privileged=True (ns only) runs commands as the host's uid 0 (no capabilities)
        instead of in a user namespace with the workspace's own id range: warned, see
        docs/security.md. Limits (docs/security.md#limits) default to timeout=600 s per
        command, memory_mb=4096, pids=1024 (ns and docker) and an upper-layer quota of
        disk_mb=10240 and disk_inodes=1000000; None keeps the default, 0 turns one off."""
        options = {"backend": backend, "env": dict(env or {}),
                   "on_create": list(on_create), "on_destroy": list(on_destroy)}
        if network is not None and not isinstance(network, str):
            options.update(network.options())  # a cowbox.Network
            network = None
        for key, value in (("network", network), ("working_dir", working_dir),
                           ("timeout", timeout),
                           ("cpus", cpus), ("memory_mb", memory_mb), ("pids", pids),
                           ("disk_mb", disk_mb), ("disk_inodes", disk_inodes), ("image", image),
                           ("setup_script", setup_script), ("setup_timeout", setup_timeout)):
            if value is not None:
                options[key] = value
        if privileged:
            import warnings
            warnings.warn("cowbox: privileged=True: commands run as the host's uid 0, not in "
                          "a user namespace", RuntimeWarning, stacklevel=2)
            options["privileged"] = True
        tmp = cls.__new__(cls)
        Sandbox.__init__(tmp, "cb-" + "0" * 32, cowbox=cowbox, home=home)
        args = ["create"] + (["--base", str(base)] if base else []) + (
            ["--name", name] if name else [])
        rc, out, err = await _cowbox(tmp.cowbox, tmp._env, *args)
        if rc != 0:
            raise WorkspaceError("cowbox create: " + err, code="invalid_request")
        box = cls(out.strip().splitlines()[-1], cowbox=cowbox, home=home)
        try:
            box._apply_options((await box._request("configure", options=options))["options"])
        except BaseException:
            # Refused options (or a cancel): the fresh workspace is of no use to anyone.
            await box.close()
            await _cowbox(box.cowbox, box._env, "rm", box.ref)
            raise
        return box

    @classmethod
    async def attach(cls, ref, *, cowbox=None, home=None):
        """The workspace ref (or name) names, its daemon started if none runs; a ref that
        does not exist raises WorkspaceUnavailableError."""
        box = cls(ref, cowbox=cowbox, home=home)
        await box._connect()
        return box

    @classmethod
    async def destroy(cls, ref, *, cowbox=None, home=None):
        """Run the on_destroy hooks, remove the backend's resources and delete the
        workspace; a workspace that is already gone returns quietly."""
        box = cls(ref, cowbox=cowbox, home=home)
        rc, _, err = await _cowbox(box.cowbox, box._env, "info", ref, "--json")
        if rc != 0:
            if "no workspace" in err:
                return
            raise WorkspaceUnavailableError("cowbox info %s: %s" % (ref, err))
        try:
            await box._connect()
            await box._conn.request("destroy")
        except WorkspaceError:
            pass  # a broken daemon must not keep the disk alive; rm below still runs
        finally:
            if box._conn:
                await box._conn.close()
                box._conn = None
        rc, _, err = await _cowbox(box.cowbox, box._env, "rm", ref)
        if rc != 0:
            raise WorkspaceUnavailableError("cowbox rm %s: %s" % (ref, err))

    async def _connect(self):
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._conn and not self._conn.closed:
                return self._conn
            rc, out, err = await _cowbox(self.cowbox, self._env, "mount", self.ref, "--json")
            if rc != 0:
                raise WorkspaceUnavailableError("workspace %s: %s" % (self.ref, err))
            info = json.loads(out)
            self.ref = info.get("ref", self.ref)
            self.mountpoint = info["mountpoint"]
            self._sock = os.path.join(os.path.dirname(self.mountpoint), "control.sock")
            if not os.path.exists(self._sock):
                home = self._env.get("COWBOX_HOME")
                self._sock = os.path.join(home or "/var/lib/cowbox", "workspaces", self.ref,
                                          "control.sock")
            self._conn = await Connection.open(self._sock)
            self._apply_options((await self._conn.request("configure"))["options"])
            return self._conn

    def _apply_options(self, opts):
        self.backend = opts["backend"]
        wd = opts.get("working_dir") or ""
        root = self.mountpoint if self.backend == "local" else "/workspace"
        self.workdir = root + ("/" + wd if wd else "")

    async def _request(self, op, **args):
        """One request; if the daemon had gone (a crash, a close elsewhere) before it read
        it, the next daemon gets it: the next use boots the workspace again."""
        conn = await self._connect()
        try:
            return await conn.request(op, **args)
        except SendFailed:
            conn = await self._connect()
            return await conn.request(op, **args)

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
    def _cmd_args(cmd, env, cwd, timeout):
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
        return args

    async def exec(self, cmd, *, env=None, cwd=None, timeout=None):
        """Start cmd (a list, or a string for /bin/sh -c); returns a Process at once."""
        for attempt in (0, 1):
            conn = await self._connect()
            proc = Process(conn)
            proc._id = conn.start("exec", proc._on_message, stdin=True,
                                  **self._cmd_args(cmd, env, cwd, timeout))
            try:
                await conn.drain(proc._id)
                return proc
            except SendFailed:
                if attempt:
                    raise

    async def run(self, cmd, *, env=None, cwd=None, timeout=None, input=None, strict=False):
        """Run cmd to completion. A timeout or the output cap shows in timed_out and
        output_limited; with strict=True they raise WorkspaceTimeoutError and
        WorkspaceOutputLimitError instead, the partial CompletedRun in .result. Cancelling
        the caller (e.g. asyncio.wait_for) kills the command and everything it started."""
        args = self._cmd_args(cmd, env, cwd, timeout)
        if input:
            args["stdin"] = base64.b64encode(input).decode()
        try:
            msg = await self._request("run", kill_on_cancel=True, strict=strict, **args)
        except WorkspaceError as e:
            if isinstance(e.result, dict):
                e.result = _result(e.result)
            raise
        return _result(msg)

    async def _direct(self, fn, *args):
        if not self.direct_io or not self.mountpoint:
            return False, None
        try:
            return True, await asyncio.get_running_loop().run_in_executor(
                None, fn, self.mountpoint, *args)
        except (directio.Unsupported, PermissionError):
            return False, None

    async def read(self, path):
        """The bytes of path (relative to the workspace root), read in chunks."""
        conn = await self._connect()
        done, data = await self._direct(directio.read, path)
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
        """Replace path's content with data (parents made), sent in pipelined chunks."""
        if isinstance(data, str):
            data = data.encode()
        await self._connect()
        if (await self._direct(directio.write, path, bytes(data)))[0]:
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
        if not self._sock:
            # Not started yet: boot the daemon the blocking way (the protocol's host_url is
            # synchronous), as the first async operation would.
            import subprocess
            proc = subprocess.run([self.cowbox, "mount", self.ref, "--json"], env=self._env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise WorkspaceUnavailableError("workspace %s: %s" % (self.ref,
                                                                      proc.stderr.strip()))
            mnt = json.loads(proc.stdout)["mountpoint"]
            self._sock = os.path.join(os.path.dirname(mnt), "control.sock")
        return request_sync(self._sock, "host_url", port=int(port))["url"]

    async def which(self, binary):
        """The path of binary on the sandbox's PATH, or None."""
        try:
            return (await self._request("which", binary=binary))["path"]
        except WorkspaceNotFoundError:
            return None

    async def snapshot(self):
        """Record a turn; every regular file's relative path -> SHA-256 (lowercase hex), a
        new dict each call that the caller may keep or change. After the first call only
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
            args = {"files": True, "stream": True}
            held = self._map
            self._map = None  # being changed: unusable if this raises half-way
            whole = {}
            if held is not None:
                args.update(since=held[0], map_id=held[1])

            def apply(files, msg):
                for path in msg.get("deleted", ()):
                    files.pop(path, None)
                files.update(msg.get("changed", {}))

            def frame(msg):
                if msg.get("stream") == "changes" and held is not None:
                    apply(held[2], msg)
                elif msg.get("stream") == "files":
                    whole.update(msg.get("files", {}))

            msg = await self._request("snapshot", on_frame=frame, **args)
            self.last_turn = msg.get("turn")
            if held is not None and msg.get("full") is False:
                files = held[2]
                apply(files, msg)  # a daemon that does not stream puts them in the reply
            else:
                files = whole
                files.update(msg.get("files", {}))
            if msg.get("map_id"):
                self._map = (msg["turn"], msg["map_id"], files)
            return dict(files)

    # --- turns ---

    async def diff(self, a, b=None):
        """The FileChange events from turn a to turn b (None: the live tree now)."""
        args = {"a": a}
        if b is not None:
            args["b"] = b
        msg = await self._request("diff", **args)
        kinds = {"created": "added", "deleted": "deleted"}
        out = []
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

    async def rollback(self, turn):
        """Make the live workspace what it was at turn."""
        return await self._request("rollback", turn=turn)

    async def fsck(self, repair=False):
        """Check the workspace's stored state (every blob and base file its turns need, the
        base cache, meta.db; nothing through the mount). Returns {"ref", "clean",
        "problems": [{"kind", "path", "object", "first_turn", "last_turn", "repaired",
        "detail"}], "blobs_checked", "base_files_checked", "base_cache_rows"};
        last_turn -1 means every turn from first_turn on. repair drops unusable base-cache
        rows."""
        msg = await self._request("fsck", repair=bool(repair))
        return {k: v for k, v in msg.items() if k not in ("id", "ok")}

    async def fork(self, turn, name=None):
        """A new workspace starting at turn, attached."""
        args = {"turn": turn}
        if name:
            args["name"] = name
        msg = await self._request("fork", **args)
        return await Sandbox.attach(msg["ref"], cowbox=self.cowbox,
                                    home=self._env.get("COWBOX_HOME"))


__all__ = ["Sandbox", "Process", "CompletedRun", "FileChange", "file_changes",
           "InvalidRequestError"]
