"""Directory listings with the kernel opening directories itself (no OPENDIR or RELEASEDIR
round trips; the daemon keeps each pass's merged listing on the directory's inode): a large
merged directory lists as it should, a pass that another pass overtakes still sees every
entry once, walking a tree sends no OPENDIR, and the same with OPENDIR answered
(COWBOX_FUSE_NO_OPENDIR=0, what older kernels and libfuse get)."""

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


class ListingWithOpendir(Listing):
    no_opendir = False


if __name__ == "__main__":
    unittest.main()
