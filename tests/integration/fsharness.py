# Shared helpers for the fs integration tests: mount an overlay with fs/cb-overlay-mount,
# unmount it (also after a failure), kill it, and compare directory trees.
import ctypes
import hashlib
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest


def mount_tool():
    build = os.environ.get("COWBOX_BUILDDIR")
    if not build:
        cowbox = os.environ.get("COWBOX", "")
        build = os.path.dirname(cowbox) if cowbox else os.getcwd()
    return os.path.join(build, "fs", "cb-overlay-mount")


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == path:
                return True
    return False


def syncfs(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # the daemon is gone
    try:
        ctypes.CDLL(None, use_errno=True).syncfs(fd)
    finally:
        os.close(fd)


def umount(path):
    """Unmounts path if it is a mount. EBUSY right after a workload is transient (the kernel
    holds the mount until pending async RELEASE requests are answered), so retry a while;
    lazily at last (a daemon that is gone)."""
    # Files closed while their mmap'd pages are still dirty are released only after
    # writeback, and until then the kernel counts them as using the mount: sync first.
    if is_mounted(path):
        syncfs(path)
    for _ in range(20):
        if not is_mounted(path):
            return
        r = subprocess.run(["fusermount3", "-u", path], capture_output=True)
        if r.returncode == 0 or b"busy" not in r.stderr:
            break
        time.sleep(0.1)
    if is_mounted(path):
        subprocess.run(["umount", "-l", path], capture_output=True)


class Mount:
    """A running cb-overlay-mount. base may be None (empty workspace)."""

    def __init__(self, base, upper, mnt, db=None, nofile=None, threads=None, debug=False):
        self.mnt = mnt
        self.log = tempfile.NamedTemporaryFile(prefix="cb-mount-", suffix=".log", delete=False)
        argv = [mount_tool(), base or "-", upper, mnt]
        if db:
            argv += ["--db", db]
        if threads:
            argv += ["--threads", str(threads)]
        if debug or os.environ.get("COWBOX_FS_DEBUG"):
            argv += ["--debug"]

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     preexec_fn=limit)
        line = self.proc.stdout.readline().decode()
        if line.strip() != "mounted":
            self.proc.wait(timeout=10)
            raise RuntimeError("mount failed: %s" % self.stderr())
        deadline = time.time() + 10
        while not is_mounted(mnt):
            if time.time() > deadline:
                raise RuntimeError("mount did not appear: %s" % self.stderr())
            time.sleep(0.01)

    @property
    def pid(self):
        return self.proc.pid

    def fd_count(self):
        """Open fds of the daemon, not counting libfuse's per-thread splice pipes (bounded by
        the number of worker threads, so not a leak)."""
        return len([f for f in self.fd_list() if not f.startswith("pipe:")])

    def fd_list(self):
        d = "/proc/%d/fd" % self.proc.pid
        out = []
        for n in os.listdir(d):
            try:
                out.append(os.readlink(os.path.join(d, n)))
            except OSError:
                pass
        return sorted(out)

    def stderr(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        """Unmounts cleanly; returns the daemon's exit status."""
        if self.proc.poll() is None:
            umount(self.mnt)
            # A mount namespace created meanwhile by another program keeps a copy of the
            # mount (and the connection) alive after our umount: then ask the daemon to stop.
            for sig, wait in ((None, 3), (signal.SIGTERM, 30), (signal.SIGKILL, 30)):
                if sig:
                    self.proc.send_signal(sig)
                try:
                    t0 = time.time()
                    self.proc.wait(timeout=wait)
                    if os.environ.get("COWBOX_FS_TRACE"):
                        print("daemon exit after", sig, time.time() - t0, file=sys.stderr)
                    break
                except subprocess.TimeoutExpired:
                    pass
        umount(self.mnt)
        self.proc.stdout.close()
        return self.proc.returncode

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        umount(self.mnt)
        self.proc.stdout.close()
        os.unlink(self.log.name)

    def close(self):
        status = self.stop()
        log = self.stderr()
        if not os.environ.get("COWBOX_FS_DEBUG"):
            os.unlink(self.log.name)
        return status, log


SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def close_checked(testcase, mount):
    """Unmount; fail testcase if the mount process exited non-zero or a sanitizer spoke."""
    status, log = mount.close()
    testcase.assertEqual(status, 0, log)
    for marker in SANITIZER_MARKERS:
        testcase.assertNotIn(marker, log)


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def user_xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    return {n: os.getxattr(path, n, follow_symlinks=False) for n in sorted(names)
            if n.startswith("user.")}


def tree_state(root, owners=True):
    """Everything the mount must agree with a native directory on, keyed by relative path:
    type, mode, owner, size, content hash, link target, xattrs; plus hard-link groups."""
    state = {}
    inodes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st = os.lstat(full)
            entry = {"mode": oct(st.st_mode), "xattrs": user_xattrs(full)}
            if owners:
                entry["owner"] = (st.st_uid, st.st_gid)
            if stat.S_ISREG(st.st_mode):
                entry["size"] = st.st_size
                entry["nlink"] = st.st_nlink
                entry["sha"] = file_digest(full) if st.st_size < (1 << 30) else "big"
                inodes.setdefault(st.st_ino, []).append(rel)
            elif stat.S_ISLNK(st.st_mode):
                entry["target"] = os.readlink(full)
            state[rel] = entry
    links = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return state, links


def tree_digest(root):
    """A digest of a tree including mtimes, to check that the base was never touched."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            h.update(("%s %o %d %d %d %d\n" % (os.path.relpath(full, root), st.st_mode,
                                               st.st_size, st.st_mtime_ns, st.st_ino,
                                               st.st_nlink)).encode())
            h.update(repr(user_xattrs(full)).encode())
            if stat.S_ISREG(st.st_mode):
                h.update(file_digest(full).encode())
    return h.hexdigest()


class TempDirs:
    """A temporary directory with base/, upper/, mnt/ (and more on request)."""

    def __init__(self, *extra):
        self.top = tempfile.mkdtemp(prefix="cb-fs-test-")
        for name in ("base", "upper", "mnt") + extra:
            os.mkdir(os.path.join(self.top, name))

    def __getattr__(self, name):
        return os.path.join(self.top, name)

    def cleanup(self):
        for name in os.listdir(self.top):
            umount(os.path.join(self.top, name))
        shutil.rmtree(self.top, ignore_errors=True)


class MountTestCase(unittest.TestCase):
    """Fresh base/upper/mnt folders per test (self.dirs); self.mount, if a test sets it, is
    closed and checked (exit status, no sanitizer report) after it."""

    def setUp(self):
        self.dirs = TempDirs()
        self.mount = None

    def tearDown(self):
        if self.mount:
            close_checked(self, self.mount)
        self.dirs.cleanup()
