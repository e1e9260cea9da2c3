"""Reading and writing workspace files straight through the mount, when this process can see
it: the Python mirror of util/beneath.c, the rule the daemon applies to every workspace path,
without base64 and JSON in the way. Both run the same cases (util/beneath_cases.json).

The rule: a path is relative to the root (refused: empty, absolute, any ".." component, a
name longer than NAME_MAX; a path longer than PATH_MAX is opened in pieces; "build..old" is a
name like any other); every directory on the way is reached with openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) and the last name is opened O_NOFOLLOW in its directory, so no symlink
is ever followed, inside or out; a FIFO, socket or device is refused at once (looked at through
an O_PATH fd first, then opened O_NONBLOCK and looked at again), never waited on."""

import ctypes
import errno
import os
import stat

from .errors import InvalidPathError, InvalidRequestError, WorkspaceNotFoundError

_SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
_RESOLVE = 0x08 | 0x04 | 0x02  # RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_PATH_MAX = 4096
_NAME_MAX = 255
_EAGAIN_TRIES = 64
_libc = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class Unsupported(Exception):
    """The direct path cannot serve this call; the caller uses the protocol."""


def _fail(err, op, path, why=None):
    """An OSError whose message names the path, in the words util/beneath.c uses."""
    if why is None:
        why = {errno.ELOOP: "a symlink on the way (symlinks in the workspace are not "
                            "followed by cowbox)",
               errno.EXDEV: "the path leaves the workspace root"}.get(err, os.strerror(err))
    return OSError(err, "%s %s: %s" % (op, path, why))


def check(path):
    """Raise OSError (EINVAL, EXDEV, ENAMETOOLONG) unless path obeys the rule."""
    if not path:
        raise OSError(errno.EINVAL, "empty path: give a path relative to the workspace root")
    raw = os.fsencode(path)
    if raw.startswith(b"/"):
        raise OSError(errno.EXDEV, "%s: absolute paths are refused; give a path relative to "
                                   "the workspace root" % path)
    for name in raw.split(b"/"):
        if name == b"..":
            raise OSError(errno.EXDEV, "%s: '..' is refused; give a path inside the "
                                       "workspace root" % path)
        if len(name) > _NAME_MAX:
            raise OSError(errno.ENAMETOOLONG, "%s...: a name longer than %d bytes"
                          % (path[:64], _NAME_MAX))


def _openat2(dirfd, path, flags, mode=0):
    """openat2 beneath dirfd through no symlink: the fd, or OSError with the bare errno. A
    path longer than PATH_MAX (a tree can be deeper than one syscall's path) is opened in
    pieces, each beneath the last."""
    raw = os.fsencode(path)
    held = None
    try:
        while len(raw) >= _PATH_MAX:
            cut = raw.rfind(b"/", 0, _PATH_MAX)
            if cut <= 0:
                raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
            nxt = _openat2_short(dirfd if held is None else held, raw[:cut],
                                 os.O_PATH | os.O_DIRECTORY)
            if held is not None:
                os.close(held)
            held = nxt
            raw = raw[cut:].lstrip(b"/") or b"."
        return _openat2_short(dirfd if held is None else held, raw, flags, mode)
    finally:
        if held is not None:
            os.close(held)


def _openat2_short(dirfd, path, flags, mode=0):
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, _RESOLVE)
    for _ in range(_EAGAIN_TRIES):
        fd = _libc.syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how),
                           ctypes.sizeof(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    raise OSError(err, os.strerror(err))


def _type_name(mode):
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def _want_file(path, mode):
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise _fail(errno.EISDIR, "open", path, "a directory, not a file")
    raise _fail(errno.EINVAL, "open", path, "%s; cowbox reads and writes regular files only"
                % _type_name(mode))


def _finish_open(fd, path):
    """Look again at what was opened (it may have been swapped meanwhile), then block."""
    try:
        _want_file(path, os.fstat(fd).st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_error(err, path):
    if err == errno.ENXIO:  # a FIFO with no reader (or a device) to a non-blocking open
        return _fail(errno.EINVAL, "open", path, "a FIFO or device; cowbox reads and writes "
                     "regular files only")
    return _fail(err, "open", path)


def open_file(rootfd, path, for_write=False):
    """An fd of the regular file path beneath rootfd, opened for reading, or for writing
    (created 0644 if missing, truncated); raises OSError naming the path."""
    check(path)
    extra = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not for_write:
        try:
            probe = _openat2(rootfd, path, os.O_PATH)
        except OSError as e:
            raise _fail(e.errno, "open", path) from None
        try:
            _want_file(path, os.fstat(probe).st_mode)
        finally:
            os.close(probe)
        try:
            fd = _openat2(rootfd, path, os.O_RDONLY | extra)
        except OSError as e:
            raise _open_error(e.errno, path) from None
        return _finish_open(fd, path)
    parent, name = _parent(rootfd, path)
    try:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise _fail(errno.ELOOP, "open", path)
        if st is not None:
            _want_file(path, st.st_mode)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | extra,
                         0o644, dir_fd=parent)
        except OSError as e:
            raise _open_error(e.errno, path) from None
    finally:
        os.close(parent)
    return _finish_open(fd, path)


def _parent(rootfd, path):
    """(O_PATH fd of path's directory, its last name)."""
    head, _, name = os.fsencode(path).rpartition(b"/")
    if not name or name == b".":
        raise _fail(errno.EINVAL, "open", path, "names no entry (ends with '/' or '.')")
    try:
        return _openat2(rootfd, head or b".", os.O_PATH | os.O_DIRECTORY), name
    except OSError as e:
        raise _fail(e.errno, "open", path) from None


def mkdirs(rootfd, path, mode=0o755):
    """mkdir -p of path beneath rootfd, one name at a time from a held directory fd."""
    check(path)
    fd = _openat2(rootfd, ".", os.O_PATH | os.O_DIRECTORY)
    try:
        for name in os.fsencode(path).split(b"/"):
            if name in (b"", b"."):
                continue
            try:
                nxt = _openat2(fd, name, os.O_PATH | os.O_DIRECTORY)
            except FileNotFoundError:
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise _fail(e.errno, "mkdir", path) from None
                nxt = None
            except OSError as e:
                raise _fail(e.errno, "mkdir", path) from None
            if nxt is None:
                try:
                    nxt = _openat2(fd, name, os.O_PATH | os.O_DIRECTORY)
                except OSError as e:
                    raise _fail(e.errno, "mkdir", path) from None
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def read_file(root, path):
    """The bytes of path beneath the directory root; OSError naming the path if refused."""
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_file(rfd, path)
    finally:
        os.close(rfd)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_file(root, path, data):
    """Replace path beneath the directory root with data, making its parents (0755)."""
    check(path)
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        head = path.rpartition("/")[0]
        if head:
            try:
                mkdirs(rfd, head)
            except OSError as e:
                raise OSError(e.errno, "write %s: %s" % (path, e.strerror)) from None
        fd = open_file(rfd, path, for_write=True)
    finally:
        os.close(rfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _client_error(op, path, e):
    """The client's exception for what the daemon would answer; Unsupported otherwise."""
    msg = "%s %s: %s" % (op, path, e.strerror or e)
    if e.errno == errno.ENOENT:
        return WorkspaceNotFoundError(msg)
    if e.errno in (errno.EXDEV, errno.ELOOP, errno.ENAMETOOLONG):
        return InvalidPathError(msg)
    if e.errno in (errno.EINVAL, errno.EISDIR):
        return InvalidRequestError(msg)
    return Unsupported(msg)


def read(root, path):
    """The bytes of path beneath root (blocking; run it in a thread)."""
    if not path:
        raise Unsupported("empty path")
    try:
        return read_file(root, path)
    except OSError as e:
        raise _client_error("read", path, e) from None


def write(root, path, data):
    """Replace path beneath root with data, making parents (blocking)."""
    if not path:
        raise Unsupported("empty path")
    try:
        write_file(root, path, data)
    except OSError as e:
        raise _client_error("write", path, e) from None
