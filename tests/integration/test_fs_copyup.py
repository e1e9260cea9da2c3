# Copy-up of base files by opens for writing (fs/copyup.c): mode, owner, times and xattrs
# arrive exactly, file capabilities still fall on a write, the copy-up's own fd serves the open
# (plain, truncating, O_SYNC), copy-ups racing rename-exchanges of their parents lose nothing,
# and a kill -9 in the middle of copy-ups never leaves a half-copied file visible; with the
# kernel's fast paths and without.
import ctypes
import errno
import os
import random
import stat
import struct
import threading
import time
import unittest

import fsharness

RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a, b):
    if _libc.renameat2(-100, a.encode(), -100, b.encode(), RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


# a version 2 file capability: cap_net_bind_service, effective
CAPS = struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0)


def meta(path):
    st = os.lstat(path)
    xattrs = {n: os.getxattr(path, n, follow_symlinks=False)
              for n in sorted(os.listxattr(path, follow_symlinks=False))}
    return (stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_atime_ns,
            st.st_mtime_ns, xattrs)


def read(path):
    with open(path, "rb") as f:
        return f.read()


class CopyUp(fsharness.MountTestCase):
    def start(self):
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)

    def base_file(self, rel, data, mode=0o644, owner=(0, 0), times=None, xattrs=()):
        p = os.path.join(self.dirs.base, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chown(p, *owner)
        os.chmod(p, mode)
        for k, v in xattrs:
            os.setxattr(p, k, v)
        if times:
            os.utime(p, ns=times)
        return p

    def test_metadata_arrives_exactly(self):
        t = (1_600_000_000_123_456_789, 1_500_000_000_987_654_321)
        files = {
            "plain.txt": dict(data=b"plain\n", times=t),
            "d/private": dict(data=b"x" * 70000, mode=0o600, owner=(1000, 100), times=t,
                              xattrs=[("user.a", b"1"), ("user.big", b"v" * 3000),
                                      ("trusted.note", b"t")]),
            "d/e/setuid": dict(data=b"#!/bin/sh\n", mode=0o4755, owner=(1000, 1000), times=t),
            "setgid": dict(data=b"g", mode=0o2750, owner=(65534, 100), times=t),
            "empty": dict(data=b"", mode=0o640, owner=(1000, 1000), times=t,
                          xattrs=[("user.e", b"")]),
            "readonly": dict(data=b"ro\n", mode=0o444, times=t),
        }
        for rel, kw in files.items():
            self.base_file(rel, **kw)
        d = os.path.join(self.dirs.base, "d")
        os.chmod(d, 0o750)
        os.chown(d, 1000, 100)
        os.setxattr(d, "user.dir", b"yes")
        want = {rel: meta(os.path.join(self.dirs.base, rel)) for rel in files}
        self.start()
        base_before = {rel: meta(os.path.join(self.dirs.base, rel)) for rel in files}
        for rel in files:
            # opened for writing and closed unwritten: a copy-up that changes nothing
            os.close(os.open(os.path.join(self.dirs.mnt, rel), os.O_WRONLY | os.O_APPEND))
            for root in (self.dirs.upper, self.dirs.mnt):
                self.assertEqual(meta(os.path.join(root, rel)), want[rel], (root, rel))
            self.assertEqual(read(os.path.join(self.dirs.upper, rel)), files[rel]["data"])
        # the parent directories came up with their mode, owner and xattrs (their times
        # are those of a directory a name was just linked into)
        for rel in ("d", "d/e"):
            up, base = (meta(os.path.join(r, rel)) for r in (self.dirs.upper, self.dirs.base))
            self.assertEqual(up[:3] + up[6:], base[:3] + base[6:], rel)
        # reading the base to copy it changed nothing there, not even an access time
        self.assertEqual({rel: meta(os.path.join(self.dirs.base, rel)) for rel in files},
                         base_before)
        # nothing else in upper: no temporary file left beside them
        found = sorted(os.path.relpath(os.path.join(d, n), self.dirs.upper)
                       for d, dn, fn in os.walk(self.dirs.upper) for n in dn + fn)
        self.assertEqual(found, ["d", "d/e", "d/e/setuid", "d/private", "empty", "plain.txt",
                                 "readonly", "setgid"])

    def test_file_capabilities_fall_on_write_as_natively(self):
        native = os.path.join(self.dirs.top, "native")
        for root in (self.dirs.base, native):
            os.makedirs(root, exist_ok=True)
            for name in ("capped", "plain"):
                with open(os.path.join(root, name), "wb") as f:
                    f.write(b"elf\n")
            os.setxattr(os.path.join(root, "capped"), "security.capability", CAPS)
        self.start()

        def caps(root, name):
            try:
                return os.getxattr(os.path.join(root, name), "security.capability")
            except OSError as e:
                return e.errno

        for root in (native, self.dirs.mnt):
            # the copy-up carries the capability; the write then takes it away
            with open(os.path.join(root, "capped"), "ab") as f:
                self.assertEqual(caps(root, "capped"), CAPS)
                f.write(b"more\n")
            # a file copied up without one, then given one: the next write takes it away
            with open(os.path.join(root, "plain"), "ab") as f:
                f.write(b"more\n")
            os.setxattr(os.path.join(root, "plain"), "security.capability", CAPS)
            with open(os.path.join(root, "plain"), "ab") as f:
                f.write(b"again\n")
            # a file made here has none (the mount knows without asking), then given one:
            # it shows, and the next write takes it away
            with open(os.path.join(root, "new"), "wb") as f:
                f.write(b"new\n")
                self.assertEqual(caps(root, "new"), errno.ENODATA)
            os.setxattr(os.path.join(root, "new"), "security.capability", CAPS)
            self.assertEqual(caps(root, "new"), CAPS)
            with open(os.path.join(root, "new"), "ab") as f:
                f.write(b"again\n")
        for name in ("capped", "plain", "new"):
            self.assertEqual(caps(self.dirs.mnt, name), caps(native, name), name)
            self.assertEqual(read(os.path.join(self.dirs.mnt, name)),
                             read(os.path.join(native, name)))
        self.assertEqual(caps(self.dirs.base, "capped"), CAPS)

    def test_opens_served_by_the_copy_ups_fd(self):
        for name in ("rw", "trunc", "sync", "rdonly-trunc"):
            self.base_file(name, b"base bytes\n" * 100)
        self.start()
        m = self.dirs.mnt
        # plain read-write: the copy-up's fd reads the copied bytes and writes in place
        fd = os.open(os.path.join(m, "rw"), os.O_RDWR)
        self.assertEqual(os.pread(fd, 10, 0), b"base bytes")
        os.pwrite(fd, b"BASE", 0)
        os.close(fd)
        self.assertEqual(read(os.path.join(m, "rw")), b"BASE bytes\n" + b"base bytes\n" * 99)
        # truncating: nothing copied, nothing to cut
        fd = os.open(os.path.join(m, "trunc"), os.O_WRONLY | os.O_TRUNC)
        os.write(fd, b"new\n")
        os.close(fd)
        self.assertEqual(read(os.path.join(m, "trunc")), b"new\n")
        # O_SYNC: an fd of its own, appending after the copied bytes
        fd = os.open(os.path.join(m, "sync"), os.O_WRONLY | os.O_APPEND | os.O_SYNC)
        os.write(fd, b"end\n")
        os.close(fd)
        self.assertEqual(read(os.path.join(m, "sync")), b"base bytes\n" * 100 + b"end\n")
        fd = os.open(os.path.join(m, "rdonly-trunc"), os.O_RDONLY | os.O_TRUNC)
        self.assertEqual(os.read(fd, 10), b"")
        os.close(fd)
        for name, size in (("rw", 1100), ("trunc", 4), ("sync", 1104), ("rdonly-trunc", 0)):
            self.assertEqual(os.stat(os.path.join(self.dirs.upper, name)).st_size, size)
        self.assertEqual(read(os.path.join(self.dirs.base, "sync")), b"base bytes\n" * 100)

    def test_a_base_file_of_several_names_is_copied_up_under_each_one_looked_up(self):
        # The base's names of one inode are one file to the kernel: a write through one name
        # reaches the others the mount has looked up (linked in upper), never lands under
        # another name only; a name never looked up keeps the base's file, as overlayfs.
        first = self.base_file("e/c", b"base\n")
        os.mkdir(os.path.join(self.dirs.base, "d"))
        os.link(first, os.path.join(self.dirs.base, "d", "a"))
        os.link(first, os.path.join(self.dirs.base, "d", "b"))
        self.start()
        m = self.dirs.mnt
        held = os.open(os.path.join(m, "e/c"), os.O_RDONLY)  # looked up first, kept
        try:
            self.assertEqual(os.stat(os.path.join(m, "d/a")).st_ino, os.fstat(held).st_ino)
            with open(os.path.join(m, "d/a"), "ab") as f:
                f.write(b"more\n")
            for name in ("d/a", "e/c"):
                self.assertEqual(read(os.path.join(m, name)), b"base\nmore\n", name)
                self.assertEqual(read(os.path.join(self.dirs.upper, name)), b"base\nmore\n")
            self.assertEqual(os.stat(os.path.join(self.dirs.upper, "d/a")).st_ino,
                             os.stat(os.path.join(self.dirs.upper, "e/c")).st_ino)
            self.assertEqual(read(os.path.join(m, "d/b")), b"base\n")
            self.assertFalse(os.path.lexists(os.path.join(self.dirs.upper, "d/b")))
            self.assertEqual(read(first), b"base\n")
        finally:
            os.close(held)

    def test_copy_ups_racing_rename_exchange_of_their_parents(self):
        groups, files = 12, 25
        for g in range(groups):
            for side in ("a", "b"):
                for n in range(files):
                    self.base_file("g%d/%s/f%d" % (g, side, n),
                                   ("%s-%d\n" % (side, n)).encode() * (1 + n * 100))
        base_digest = fsharness.tree_digest(self.dirs.base)
        self.start()
        m = self.dirs.mnt
        errors = []

        def renamer():
            rng = random.Random(1)
            try:
                for g in range(groups):
                    for _ in range(rng.randint(1, 3)):
                        exchange(os.path.join(m, "g%d/a" % g), os.path.join(m, "g%d/b" % g))
            except OSError as e:
                errors.append(e)

        def appender(side):
            try:
                for g in range(groups):
                    for n in range(files):
                        with open(os.path.join(m, "g%d/%s/f%d" % (g, side, n)), "a") as f:
                            f.write("x\n")
            except OSError as e:
                errors.append(e)

        threads = [threading.Thread(target=renamer), threading.Thread(target=appender, args=("a",)),
                   threading.Thread(target=appender, args=("b",))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        self.assertEqual(errors, [])

        def check(root):
            for g in range(groups):
                for side in ("a", "b"):
                    origins = set()
                    for n in range(files):
                        data = read(os.path.join(root, "g%d/%s/f%d" % (g, side, n)))
                        first = data.split(b"\n", 1)[0].decode()
                        origin, num = first.split("-")
                        self.assertEqual(int(num), n)
                        origins.add(origin)
                        body = ("%s-%d\n" % (origin, n)).encode() * (1 + n * 100)
                        self.assertTrue(data.startswith(body), (g, side, n))
                        # one append per side: both landed on one of the two, whole
                        self.assertIn(data[len(body):], (b"", b"x\n", b"x\nx\n"))
                    self.assertEqual(len(origins), 1, (g, side, origins))
                for n in range(files):
                    both = b"".join(read(os.path.join(root, "g%d/%s/f%d" % (g, s, n)))
                                    for s in "ab")
                    self.assertEqual(both.count(b"x\n"), 2, (g, n))

        check(m)
        state = fsharness.tree_state(m)
        mount, self.mount = self.mount, None
        fsharness.close_checked(self, mount)
        self.assertEqual(fsharness.tree_digest(self.dirs.base), base_digest)
        self.start()
        self.assertEqual(fsharness.tree_state(m), state)
        check(m)

    def test_kill9_during_copy_ups_shows_no_half_copied_file(self):
        size = 3 << 20
        for n in range(16):
            self.base_file("big%d" % n, bytes([n]) * size)
        self.start()
        m = self.dirs.mnt
        done = []

        def appender():
            try:
                for n in range(16):
                    with open(os.path.join(m, "big%d" % n), "ab") as f:
                        f.write(b"tail")
                    done.append(n)
            except OSError:
                pass  # the daemon is gone

        th = threading.Thread(target=appender)
        th.start()
        deadline = time.time() + 60
        while len(done) < 3 and th.is_alive() and time.time() < deadline:
            time.sleep(0.001)
        self.mount.kill9()
        th.join()
        self.mount = None
        for n in range(16):
            p = os.path.join(self.dirs.upper, "big%d" % n)
            if os.path.exists(p):
                # in upper only once whole; the append itself may or may not have landed
                self.assertIn(os.stat(p).st_size, (size, size + 4), n)
        self.start()
        for n in range(16):
            data = read(os.path.join(m, "big%d" % n))
            self.assertIn(data, (bytes([n]) * size, bytes([n]) * size + b"tail"), n)
            if n in done:
                self.assertTrue(data.endswith(b"tail"), n)


class CopyUpNoFastPaths(CopyUp):
    """The same with passthrough and io_uring off: the copy-up's fd then takes the open's
    reads and writes itself (cached mode over /dev/fuse)."""

    def setUp(self):
        saved = dict(os.environ)

        def restore():
            os.environ.clear()
            os.environ.update(saved)
        self.addCleanup(restore)
        os.environ.update(COWBOX_FUSE_PASSTHROUGH="0", COWBOX_FUSE_URING="0")
        super().setUp()


if __name__ == "__main__":
    unittest.main()
