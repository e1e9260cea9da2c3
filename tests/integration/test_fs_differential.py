# Differential test of the workspace filesystem: one long random sequence of file operations
# (and their errors) on a native directory and on a cowbox mount over a copy of the same base.
import ctypes
import errno
import fcntl
import mmap
import os
import random
import stat
import sys
import time
import unittest

import fsharness

SEED = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 31))
NOPS = int(os.environ.get("COWBOX_FS_OPS", "2500"))
NAMES = ["a", "b", "c", "dir", "e.txt", "f"]
NB = os.O_NONBLOCK  # never block on a fifo the sequence created
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags):
    if _libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def make_base(root, rng):
    """A base tree of directories, files (some with xattrs), symlinks and empty dirs."""
    def fill(d, depth):
        for name in rng.sample(NAMES, rng.randint(2, 5)):
            p = os.path.join(d, name)
            kind = rng.random()
            if kind < 0.3 and depth < 3:
                os.mkdir(p, rng.choice([0o755, 0o700, 0o775]))
                fill(p, depth + 1)
            elif kind < 0.85:
                with open(p, "wb") as f:
                    f.write(rng.randbytes(rng.choice([0, 10, 1000, 70000])))
                os.chmod(p, rng.choice([0o644, 0o600, 0o755, 0o444]))
                if rng.random() < 0.3:
                    os.setxattr(p, "user.base", b"v%d" % rng.randint(0, 9))
            else:
                # targets stay inside the tree: both sides must not reach one outside file
                os.symlink(rng.choice(["a", "b", "dir/x", "missing"]), p)
    fill(root, 0)


class Ops:
    """Each op takes a root and its arguments and returns a comparable result."""

    @staticmethod
    def create_excl(root, p, data):
        fd = os.open(os.path.join(root, p), os.O_CREAT | os.O_EXCL | os.O_WRONLY | NB, 0o640)
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)

    @staticmethod
    def overwrite(root, p, data):
        fd = os.open(os.path.join(root, p), os.O_CREAT | os.O_WRONLY | os.O_TRUNC | NB, 0o644)
        try:
            return os.write(fd, data)
        finally:
            os.close(fd)

    @staticmethod
    def append(root, p, data):
        fd = os.open(os.path.join(root, p), os.O_WRONLY | os.O_APPEND | NB)
        try:
            os.write(fd, data)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    @staticmethod
    def pwrite(root, p, off, data):
        fd = os.open(os.path.join(root, p), os.O_RDWR | NB)
        try:
            os.pwrite(fd, data, off)
            os.fsync(fd) if off % 2 else os.fdatasync(fd)
            return os.pread(fd, len(data) + 10, off)
        finally:
            os.close(fd)

    @staticmethod
    def read(root, p):
        fd = os.open(os.path.join(root, p), os.O_RDONLY | NB | NB)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                return fsharness.hashlib.sha256(f.read()).hexdigest()
        finally:
            os.close(fd)

    @staticmethod
    def mkdir(root, p, mode):
        os.mkdir(os.path.join(root, p), mode)

    @staticmethod
    def rmdir(root, p):
        os.rmdir(os.path.join(root, p))

    @staticmethod
    def unlink(root, p):
        os.unlink(os.path.join(root, p))

    @staticmethod
    def rename(root, a, b, flags):
        if flags:
            renameat2(os.path.join(root, a), os.path.join(root, b), flags)
        else:
            os.rename(os.path.join(root, a), os.path.join(root, b))

    @staticmethod
    def link(root, a, b):
        os.link(os.path.join(root, a), os.path.join(root, b), follow_symlinks=False)
        return os.lstat(os.path.join(root, b)).st_nlink

    @staticmethod
    def symlink(root, target, p):
        os.symlink(target, os.path.join(root, p))
        return os.readlink(os.path.join(root, p))

    @staticmethod
    def readlink(root, p):
        return os.readlink(os.path.join(root, p))

    @staticmethod
    def mknod(root, p, fifo):
        if fifo:
            os.mkfifo(os.path.join(root, p), 0o620)
        else:
            os.mknod(os.path.join(root, p), stat.S_IFCHR | 0o600, os.makedev(1, 3))

    @staticmethod
    def chmod(root, p, mode):
        os.chmod(os.path.join(root, p), mode)
        return oct(os.stat(os.path.join(root, p)).st_mode)

    @staticmethod
    def chown(root, p, uid, gid):
        os.chown(os.path.join(root, p), uid, gid, follow_symlinks=False)
        st = os.lstat(os.path.join(root, p))
        return (st.st_uid, st.st_gid, oct(st.st_mode))

    @staticmethod
    def utime(root, p, ns):
        os.utime(os.path.join(root, p), ns=(ns, ns + 7), follow_symlinks=False)
        st = os.lstat(os.path.join(root, p))
        return (st.st_atime_ns, st.st_mtime_ns)

    @staticmethod
    def truncate(root, p, size, use_fd):
        if use_fd:
            fd = os.open(os.path.join(root, p), os.O_WRONLY | NB)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        else:
            os.truncate(os.path.join(root, p), size)
        return os.stat(os.path.join(root, p)).st_size

    @staticmethod
    def fallocate(root, p, off, length):
        fd = os.open(os.path.join(root, p), os.O_RDWR | NB)
        try:
            os.posix_fallocate(fd, off, length)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    @staticmethod
    def setxattr(root, p, name, value):
        os.setxattr(os.path.join(root, p), name, value, follow_symlinks=False)

    @staticmethod
    def getxattr(root, p, name):
        return os.getxattr(os.path.join(root, p), name, follow_symlinks=False)

    @staticmethod
    def listxattr(root, p):
        return sorted(os.listxattr(os.path.join(root, p), follow_symlinks=False))

    @staticmethod
    def removexattr(root, p, name):
        os.removexattr(os.path.join(root, p), name, follow_symlinks=False)

    @staticmethod
    def locks(root, p):
        fd = os.open(os.path.join(root, p), os.O_RDWR | NB)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
            fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
        finally:
            os.close(fd)

    @staticmethod
    def mmap_write(root, p, off, data):
        fd = os.open(os.path.join(root, p), os.O_RDWR | NB)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return 0
            m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            off %= size
            chunk = data[: size - off]
            m[off:off + len(chunk)] = chunk
            m.flush()
            m.close()
            return os.pread(fd, len(chunk), off)
        finally:
            os.close(fd)

    @staticmethod
    def stat(root, p):
        st = os.lstat(os.path.join(root, p))
        nlink = st.st_nlink if not stat.S_ISDIR(st.st_mode) else 0
        size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        return (oct(st.st_mode), size, nlink, st.st_uid, st.st_gid)

    @staticmethod
    def listdir(root, p):
        return sorted(os.listdir(os.path.join(root, p)))

    @staticmethod
    def open_dir_for_writing(root, p):
        os.close(os.open(os.path.join(root, p), os.O_WRONLY | NB))


OPENS_FILE = {"create_excl", "overwrite", "append", "pwrite", "read", "truncate", "fallocate",
              "locks", "mmap_write", "open_dir_for_writing"}


def is_device(root, path):
    """Whether opening path reaches a device node: the path itself, or a symlink to one."""
    for look in (os.lstat, os.stat):
        try:
            if stat.S_ISCHR(look(os.path.join(root, path)).st_mode):
                return True
        except OSError:
            pass
    return False


def run(fn, root, args):
    try:
        return ("ok", fn(root, *args))
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, e.errno))


class Differential(unittest.TestCase):
    def setUp(self):
        print("test_fs_differential: COWBOX_SEED=%d" % SEED, file=sys.stderr)
        self.rng = random.Random(SEED)
        self.dirs = fsharness.TempDirs("native")
        make_base(self.dirs.base, self.rng)
        fsharness.shutil.copytree(self.dirs.base, self.dirs.native, symlinks=True,
                                  dirs_exist_ok=True)
        self.base_digest = fsharness.tree_digest(self.dirs.base)
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)

    def tearDown(self):
        if self.mount:
            fsharness.close_checked(self, self.mount)
        self.dirs.cleanup()

    def known_paths(self):
        out = []
        for dirpath, dirnames, filenames in os.walk(self.dirs.native):
            for n in dirnames + filenames:
                out.append(os.path.relpath(os.path.join(dirpath, n), self.dirs.native))
        return [p for p in out if p != "big"]  # reading 5 GiB would take all the time

    def pick(self, paths):
        if paths and self.rng.random() < 0.75:
            return self.rng.choice(paths)
        depth = self.rng.randint(1, 3)
        return "/".join(self.rng.choice(NAMES) for _ in range(depth))

    def next_op(self, paths):
        r = self.rng
        p, q = self.pick(paths), self.pick(paths)
        data = r.randbytes(r.choice([1, 100, 5000, 200000]))
        choices = [
            (6, Ops.create_excl, (p, data)), (4, Ops.overwrite, (p, data)),
            (4, Ops.append, (p, data)), (4, Ops.pwrite, (p, r.randint(0, 300000), data)),
            (5, Ops.read, (p,)), (5, Ops.mkdir, (p, r.choice([0o755, 0o700]))),
            (4, Ops.rmdir, (p,)), (5, Ops.unlink, (p,)),
            (6, Ops.rename, (p, q, r.choice([0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))),
            (3, Ops.link, (p, q)), (3, Ops.symlink, (r.choice(["a", "dir/c", "f/./b", "nowhere"]), q)),
            (2, Ops.readlink, (p,)), (2, Ops.mknod, (p, r.random() < 0.7)),
            (3, Ops.chmod, (p, r.choice([0o600, 0o644, 0o755, 0o4755, 0o1777]))),
            (2, Ops.chown, (p, r.choice([0, 1000, 65534]), r.choice([0, 100, 1000]))),
            (2, Ops.utime, (p, r.randint(0, 2 * 10 ** 18))),
            (3, Ops.truncate, (p, r.choice([0, 1, 4096, 100000]), r.random() < 0.5)),
            (2, Ops.fallocate, (p, r.randint(0, 10000), r.randint(1, 70000))),
            (3, Ops.setxattr, (p, "user.k%d" % r.randint(0, 2), data[:50])),
            (2, Ops.getxattr, (p, "user.k%d" % r.randint(0, 2))),
            (2, Ops.listxattr, (p,)), (2, Ops.removexattr, (p, "user.k%d" % r.randint(0, 2))),
            (2, Ops.locks, (p,)), (2, Ops.mmap_write, (p, r.randint(0, 100000), data[:3000])),
            (4, Ops.stat, (p,)), (3, Ops.listdir, (p,)), (1, Ops.open_dir_for_writing, (p,)),
        ]
        # a directory renamed into itself (EINVAL) and over a non-empty one (ENOTEMPTY)
        dirs = [x for x in paths if os.path.isdir(os.path.join(self.dirs.native, x))
                and not os.path.islink(os.path.join(self.dirs.native, x))]
        if dirs:
            d = r.choice(dirs)
            choices.append((2, Ops.rename, (d, d + "/" + r.choice(NAMES), 0)))
            choices.append((2, Ops.rename, (r.choice(dirs), r.choice(dirs), 0)))
        total = sum(c[0] for c in choices)
        x = r.uniform(0, total)
        for w, fn, args in choices:
            x -= w
            if x <= 0:
                return fn, args
        return choices[-1][1], choices[-1][2]

    def compare_trees(self, when):
        native = fsharness.tree_state(self.dirs.native)
        mounted = fsharness.tree_state(self.dirs.mnt)
        self.assertEqual(sorted(native[0]), sorted(mounted[0]), "paths differ %s" % when)
        for path in native[0]:
            self.assertEqual(native[0][path], mounted[0][path], "%s differs %s" % (path, when))
        self.assertEqual(native[1], mounted[1], "hard links differ %s" % when)

    def test_random_sequence_matches_native(self):
        mnt, native = self.dirs.mnt, self.dirs.native
        fds_before = self.mount.fd_count()
        # a file over 4 GiB, sparse
        for root in (native, mnt):
            with open(os.path.join(root, "big"), "wb") as f:
                f.seek(5 << 30)
                f.write(b"end")
        self.assertEqual(os.stat(os.path.join(mnt, "big")).st_size, (5 << 30) + 3)
        with open(os.path.join(mnt, "big"), "rb") as f:
            f.seek(5 << 30)
            self.assertEqual(f.read(), b"end")
        paths = self.known_paths()
        for i in range(NOPS):
            fn, args = self.next_op(paths)
            if fn.__name__ in OPENS_FILE and is_device(native, args[0]):
                continue  # FUSE mounts are nodev: device nodes exist but do not open
            if os.environ.get("COWBOX_FS_TRACE"):
                print(i, fn.__name__, tuple(a[:8] if isinstance(a, bytes) else a
                                            for a in args), file=sys.stderr)
            want = run(fn, native, args)
            if os.environ.get("COWBOX_FS_TRACE"):
                print("   ", want, file=sys.stderr)
            got = run(fn, mnt, args)
            if want != got:
                shown = tuple(a[:20] if isinstance(a, bytes) else a for a in args)
                self.fail("op %d %s%r: native %r, cowbox %r (seed %d)"
                          % (i, fn.__name__, shown, str(want)[:200], str(got)[:200], SEED))
            if i % 50 == 0 or want[0] == "ok":
                paths = self.known_paths()
            if os.environ.get("COWBOX_FS_PARANOID"):
                self.compare_trees("after op %d %s%r" % (i, fn.__name__, tuple(
                    a[:20] if isinstance(a, bytes) else a for a in args)))
            if i == NOPS // 2:
                self.compare_trees("halfway")
        os.statvfs(mnt)
        self.compare_trees("at the end")
        # every file is closed: the daemon holds no more fds than at the start
        deadline = time.time() + 5
        while self.mount.fd_count() > fds_before and time.time() < deadline:
            time.sleep(0.1)
        self.assertLessEqual(self.mount.fd_count(), fds_before, self.mount.fd_list())
        # unmount, mount again: the same tree; the base was never written
        if os.environ.get("COWBOX_FS_PAUSE"):
            print("PAUSED", self.dirs.mnt, file=sys.stderr, flush=True)
            time.sleep(int(os.environ["COWBOX_FS_PAUSE"]))
        mount, self.mount = self.mount, None
        fsharness.close_checked(self, mount)
        self.assertEqual(fsharness.tree_digest(self.dirs.base), self.base_digest)
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)
        self.compare_trees("after a remount")


class DifferentialNoFastPaths(Differential):
    """The same sequence with passthrough, io_uring and kernel-opened directories forced off
    (COWBOX_FUSE_PASSTHROUGH=0, COWBOX_FUSE_URING=0, COWBOX_FUSE_NO_OPENDIR=0): the writeback
    cache over /dev/fuse and OPENDIR answered, the fallback on older kernels and libfuse."""

    def setUp(self):
        saved = {k: os.environ.get(k) for k in ("COWBOX_FUSE_PASSTHROUGH", "COWBOX_FUSE_URING",
                                                 "COWBOX_FUSE_NO_OPENDIR")}

        def restore():
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(restore)
        for k in saved:
            os.environ[k] = "0"
        super().setUp()


if __name__ == "__main__":
    unittest.main()
