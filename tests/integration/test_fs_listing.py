"""Directory listings with the kernel opening directories itself (no OPENDIR or RELEASEDIR
round trips; the daemon keeps each pass's merged listing on the directory's inode): a large
merged directory lists as it should, a pass that another pass overtakes still sees every
entry once, walking a tree sends no OPENDIR, and the same with OPENDIR answered
(COWBOX_FUSE_NO_OPENDIR=0, what older kernels and libfuse get). READDIRPLUS answers a name
the kernel already holds without looking it up again: a listing after every name was
lstat'ed (what git status does) still gives each name's current inode and type, after an
unlink and a create of the same name in upper, after a rename exchange, and a changed name
is looked up afresh."""

import ctypes
import os
import signal
import unittest

import fsharness

NBASE = 2000


class Listing(unittest.TestCase):
    no_opendir = True

    def setUp(self):
        saved = os.environ.get("COWBOX_FUSE_NO_OPENDIR")
        self.addCleanup(lambda: os.environ.pop("COWBOX_FUSE_NO_OPENDIR", None) if saved is None
                        else os.environ.__setitem__("COWBOX_FUSE_NO_OPENDIR", saved))
        if self.no_opendir:
            os.environ.pop("COWBOX_FUSE_NO_OPENDIR", None)
        else:
            os.environ["COWBOX_FUSE_NO_OPENDIR"] = "0"
        self.dirs = fsharness.TempDirs()
        self.addCleanup(self.dirs.cleanup)
        big = os.path.join(self.dirs.base, "big")
        os.mkdir(big)
        for i in range(NBASE):
            with open(os.path.join(big, "b%04d" % i), "w") as f:
                f.write("x" * (i % 7))
        for d in ("t/a/b", "t/c"):
            os.makedirs(os.path.join(self.dirs.base, d))
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)
        self.big = os.path.join(self.dirs.mnt, "big")

    def tearDown(self):
        if self.mount:
            fsharness.close_checked(self, self.mount)

    def stats(self):
        """The daemon's request counts so far, by opcode."""
        self.mount.proc.send_signal(signal.SIGUSR1)
        counts = {}
        while True:
            line = self.mount.proc.stdout.readline().decode().split()
            if line[:2] == ["stats", "end"]:
                return counts
            if len(line) == 4 and line[0] == "stats" and line[1] != "transport":
                counts[line[1]] = int(line[2])

    def test_large_merged_directory(self):
        # upper entries beside base ones, base entries whited out, one replaced
        for i in range(0, NBASE, 4):
            os.unlink(os.path.join(self.big, "b%04d" % i))
        for i in range(1000):
            open(os.path.join(self.big, "u%04d" % i), "w").close()
        with open(os.path.join(self.big, "b0001"), "w") as f:
            f.write("new")
        want = {"b%04d" % i for i in range(NBASE) if i % 4} | {"u%04d" % i for i in range(1000)}
        for _ in range(2):  # the second pass may come from the kernel's cache
            names = os.listdir(self.big)
            self.assertEqual(len(names), len(want))
            self.assertEqual(set(names), want)
        sizes = {e.name: e.stat().st_size for e in os.scandir(self.big)}
        self.assertEqual(sizes["b0001"], 3)
        self.assertEqual(sizes["b0002"], 2)
        self.assertEqual(sizes["u0007"], 0)

    def test_overtaken_pass_sees_each_entry_once(self):
        want = {"b%04d" % i for i in range(NBASE)}
        it = os.scandir(self.big)
        first = [next(it).name for _ in range(10)]
        # the directory changes (the kernel drops its cached listing) and a second pass reads
        # it whole while the first is still open, then a third starts and stops early
        open(os.path.join(self.big, "new"), "w").close()
        self.assertEqual(set(os.listdir(self.big)), want | {"new"})
        with os.scandir(self.big) as third:
            next(third)
        rest = [e.name for e in it]
        it.close()
        names = first + rest
        self.assertEqual(len(names), len(set(names)), "an entry came twice")
        self.assertEqual(set(names) - {"new"}, want)

    def test_walk_sends_no_opendir(self):
        before = self.stats()
        walked = sum(1 for _ in os.walk(self.dirs.mnt))
        after = self.stats()
        self.assertEqual(walked, 6)  # /, big, t, t/a, t/a/b, t/c
        opened = after.get("OPENDIR", 0) - before.get("OPENDIR", 0)
        released = after.get("RELEASEDIR", 0) - before.get("RELEASEDIR", 0)
        if self.no_opendir:
            # the first OPENDIR of the mount is answered ENOSYS, then the kernel stops asking
            self.assertLessEqual(opened + before.get("OPENDIR", 0), 1)
            self.assertEqual(released, 0)
        else:
            self.assertEqual(opened, walked)


    def assert_listing_matches_lstat(self, d):
        """Every entry of a listing has the inode number and type lstat gives its name."""
        for e in os.scandir(d):
            st = os.lstat(e.path)
            self.assertEqual(e.inode(), st.st_ino, e.name)
            self.assertEqual(e.is_dir(follow_symlinks=False), os.path.isdir(e.path), e.name)
            self.assertEqual(e.is_symlink(), os.path.islink(e.path), e.name)

    def test_listing_after_lookups(self):
        t = os.path.join(self.dirs.mnt, "t")
        for i in range(50):
            with open(os.path.join(self.dirs.base, "t", "f%02d" % i), "w") as f:
                f.write("base")
        os.symlink("f00", os.path.join(self.dirs.base, "t", "link"))
        for name in os.listdir(t):  # the kernel holds every name of t now
            os.lstat(os.path.join(t, name))
        for name in os.listdir(self.big):
            os.lstat(os.path.join(self.big, name))
        before = self.stats()
        self.assert_listing_matches_lstat(self.big)
        self.assert_listing_matches_lstat(t)
        after = self.stats()
        self.assertEqual(after.get("LOOKUP", 0), before.get("LOOKUP", 0),
                         "a name the kernel held was looked up again")
        # a base file replaced in upper (unlink, then a new file of the same name), a base
        # directory replaced by an upper file, a new upper name: the listing shows them
        os.unlink(os.path.join(t, "f01"))
        with open(os.path.join(t, "f01"), "w") as f:
            f.write("upper")
        os.rmdir(os.path.join(t, "c"))
        open(os.path.join(t, "c"), "w").close()
        open(os.path.join(t, "new"), "w").close()
        self.assert_listing_matches_lstat(t)
        with open(os.path.join(t, "f01")) as f:
            self.assertEqual(f.read(), "upper")
        self.assertFalse(os.path.isdir(os.path.join(t, "c")))

    def test_listing_after_rename_exchange(self):
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        t = os.path.join(self.dirs.mnt, "t")
        with open(os.path.join(self.dirs.base, "t", "file"), "w") as f:
            f.write("file")
        for name in ("a", "c", "file"):
            os.lstat(os.path.join(t, name))
        ino = {n: os.lstat(os.path.join(t, n)).st_ino for n in ("a", "file")}
        r = libc.renameat2(at_fdcwd, os.path.join(t, "a").encode(), at_fdcwd,
                           os.path.join(t, "file").encode(), rename_exchange)
        self.assertEqual(r, 0, os.strerror(ctypes.get_errno()))
        self.assert_listing_matches_lstat(t)
        entries = {e.name: e for e in os.scandir(t)}
        self.assertTrue(entries["file"].is_dir(follow_symlinks=False))
        self.assertFalse(entries["a"].is_dir(follow_symlinks=False))
        self.assertEqual(entries["file"].inode(), ino["a"])
        self.assertEqual(entries["a"].inode(), ino["file"])
        self.assertEqual(os.listdir(os.path.join(t, "file")), ["b"])


class ListingWithOpendir(Listing):
    no_opendir = False


if __name__ == "__main__":
    unittest.main()
