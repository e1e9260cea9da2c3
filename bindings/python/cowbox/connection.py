"""One control-protocol connection to a workspace daemon: JSON lines over its unix socket,
requests matched to replies by id, stream frames handed to whoever started the request."""

import asyncio
import itertools
import json
import os
import socket

from .errors import WorkspaceUnavailableError, error_from_reply

LINE_LIMIT = 64 << 20  # replies carry read chunks of up to 4 MiB, base64


def _connect_unix(sock_path):
    """A connected blocking socket; long paths go through /proc/self/fd of the directory,
    since sun_path holds only 108 bytes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dfd = os.open(os.path.dirname(sock_path) or ".", os.O_PATH)
    try:
        sock.connect("/proc/self/fd/%d/%s" % (dfd, os.path.basename(sock_path)))
    except OSError:
        sock.close()
        raise
    finally:
        os.close(dfd)
    return sock


def request_sync(sock_path, op, timeout=30.0, **args):
    """A one-off blocking request (for the protocol's synchronous host_url)."""
    sock = _connect_unix(sock_path)
    sock.settimeout(timeout)
    try:
        f = sock.makefile("rwb")
        json.loads(f.readline())  # hello
        f.write(json.dumps(dict(args, id=1, op=op)).encode() + b"\n")
        f.flush()
        while True:
            line = f.readline()
            if not line:
                raise WorkspaceUnavailableError("the daemon closed the connection")
            msg = json.loads(line)
            if msg.get("id") == 1 and "stream" not in msg:
                break
    finally:
        sock.close()
    if "error" in msg:
        raise error_from_reply(msg["error"])
    return msg


class SendFailed(WorkspaceUnavailableError):
    """The request never reached the daemon (it had hung up): safe to send again."""


class Connection:
    """Use open(); then request() for ops with one reply, start() for streaming ones."""

    def __init__(self, reader, writer, hello):
        self.reader = reader
        self.writer = writer
        self.hello = hello
        self.closed = False
        self._ids = itertools.count(1)
        self._handlers = {}
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, sock_path):
        sock = _connect_unix(sock_path)
        sock.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=LINE_LIMIT)
        hello = json.loads(await reader.readline())
        if hello.get("hello") != "cowbox":
            writer.close()
            raise WorkspaceUnavailableError("%s: not a cowbox daemon" % sock_path)
        return cls(reader, writer, hello)

    async def _read_loop(self):
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                raw = msg.get("raw")
                if isinstance(raw, list):
                    # A frame whose line announces bytes after it (a whole map's "raw"
                    # columns): read them here, before the next line.
                    msg["raw"] = (await self.reader.readexactly(sum(raw)), raw)
                handler = self._handlers.get(msg.get("id"))
                if handler:
                    handler(msg)
        except (ConnectionError, ValueError, asyncio.LimitOverrunError,
                asyncio.IncompleteReadError):
            pass
        finally:
            self.closed = True
            gone = {"code": "unavailable", "message": "the workspace daemon went away"}
            for handler in list(self._handlers.values()):
                handler({"error": gone})
            self._handlers.clear()

    def next_id(self):
        return next(self._ids)

    def send(self, msg):
        """Queue one line (no wait); raises WorkspaceUnavailableError once closed."""
        if self.closed:
            raise WorkspaceUnavailableError("the workspace daemon went away")
        self.writer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")

    def start(self, op, handler, **args):
        """Send a request whose frames and final reply go to handler(msg); returns its id.
        The handler is dropped after the final reply (a line without "stream")."""
        rid = self.next_id()

        def route(msg):
            if "stream" not in msg:
                self._handlers.pop(rid, None)
            handler(msg)

        self._handlers[rid] = route
        try:
            self.send(dict(args, id=rid, op=op))
        except Exception:
            self._handlers.pop(rid, None)
            raise
        return rid

    async def request(self, op, kill_on_cancel=False, on_frame=None, **args):
        """Send a request and return its final reply; an error reply raises its exception.
        With kill_on_cancel, a cancelled caller (asyncio timeout, task cancel) kills the
        command the request runs before the cancellation goes on. on_frame(msg), if given,
        gets each stream frame before the reply."""
        fut = asyncio.get_running_loop().create_future()

        def done(msg):
            if fut.done():
                return
            if "stream" in msg:
                if on_frame:
                    on_frame(msg)
                return
            fut.set_result(msg)

        rid = self.start(op, done, **args)
        await self.drain(rid)
        try:
            msg = await asyncio.shield(fut)
        except asyncio.CancelledError:
            if kill_on_cancel and not self.closed and not fut.done():
                try:
                    self.send({"id": rid, "op": "kill", "signal": 9})
                except WorkspaceUnavailableError:
                    pass
            raise
        if "error" in msg:
            raise error_from_reply(msg["error"])
        return msg

    async def drain(self, rid=None):
        """Flush what was sent; SendFailed if the daemon had hung up, so nothing of it was
        read (a daemon that read a line answers it before it closes)."""
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as e:
            self.closed = True
            self._handlers.pop(rid, None)
            raise SendFailed("the workspace daemon went away: %s" % e) from None

    async def wait_closed(self, timeout):
        """Wait (at most timeout seconds) for the daemon to hang up, e.g. after close."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            pass

    async def close(self):
        self.closed = True
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
