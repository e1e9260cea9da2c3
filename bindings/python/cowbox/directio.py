"""Reading and writing workspace files straight through the mount, when this process can see
it: the same openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) rule the daemon applies, without
base64 and JSON in the way. Anything unexpected falls back to the protocol (None returned)."""

import ctypes
import errno
import os

from .errors import InvalidPathError, WorkspaceNotFoundError

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
_RESOLVE = 0x08 | 0x02  # RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
_libc = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class Unsupported(Exception):
    """The direct path cannot serve this call; the caller uses the protocol."""


def _openat2(dirfd, path, flags, mode=0):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    while True:
        fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                           ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)


def _map(op, path, e):
    if e.errno in (errno.EXDEV, errno.ELOOP):
        return InvalidPathError("%s %s: the path leaves the workspace root" % (op, path))
    if e.errno == errno.ENOENT:
        return WorkspaceNotFoundError("%s %s: No such file or directory" % (op, path))
    return Unsupported(str(e))


def _check(path):
    if not path:
        raise Unsupported("empty path")
    if path.startswith("/"):
        raise InvalidPathError("%s: absolute paths are refused; give a path relative to the "
                               "workspace root" % path)


def read(root, path):
    """The bytes of path beneath root (blocking; run it in a thread)."""
    _check(path)
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _openat2(rfd, path, os.O_RDONLY)
    except OSError as e:
        raise _map("read", path, e) from None
    finally:
        os.close(rfd)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            if not os.path.stat.S_ISREG(os.fstat(fd).st_mode):
                raise Unsupported("not a regular file")
            return f.read()
    finally:
        os.close(fd)


def write(root, path, data):
    """Replace path beneath root with data, making parents (blocking)."""
    _check(path)
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = [p for p in path.split("/")[:-1] if p]
        for i in range(len(parts)):
            sub = "/".join(parts[:i + 1])
            try:
                os.close(_openat2(rfd, sub, os.O_PATH | os.O_DIRECTORY))
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise _map("write", path, e) from None
                pfd = _openat2(rfd, "/".join(parts[:i]), os.O_PATH | os.O_DIRECTORY) if i \
                    else os.dup(rfd)
                try:
                    os.mkdir(parts[i], 0o755, dir_fd=pfd)
                except FileExistsError:
                    pass
                finally:
                    os.close(pfd)
        try:
            fd = _openat2(rfd, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise _map("write", path, e) from None
    finally:
        os.close(rfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
