# A 0/0 character device is what a whiteout is in the upper layer: the mount must refuse to
# make one (EPERM, as kernel overlayfs does) or copy one up from base, so no name can hide itself.
# A creation of every kind where a removed base entry left a whiteout replaces the whiteout (a
# creation looks for one only when its call finds the name taken), and a directory made there
# is opaque.
import errno
import os
import stat
import unittest

import fsharness


class WhiteoutNode(unittest.TestCase):
    def setUp(self):
        self.dirs = fsharness.TempDirs("state")
        os.mkdir(os.path.join(self.dirs.base, "d"))
        os.mknod(os.path.join(self.dirs.base, "d", "dev0"), stat.S_IFCHR | 0o600, os.makedev(0, 0))
        with open(os.path.join(self.dirs.base, "d", "keep"), "w") as f:
            f.write("keep\n")
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt,
                                     db=os.path.join(self.dirs.state, "meta.db"))

    def tearDown(self):
        if self.mount.proc.poll() is None:
            self.mount.close()
        self.dirs.cleanup()

    def upper_nodes(self):
        out = []
        for root, _, files in os.walk(self.dirs.upper):
            for name in files:
                st = os.lstat(os.path.join(root, name))
                if stat.S_ISCHR(st.st_mode):
                    out.append((os.path.relpath(os.path.join(root, name), self.dirs.upper),
                                os.major(st.st_rdev), os.minor(st.st_rdev)))
        return sorted(out)

    def test_mknod_0_0_is_refused_and_leaves_nothing(self):
        m = self.dirs.mnt
        os.mkdir(os.path.join(m, "new"))
        for parent in ("new", "d", ""):
            p = os.path.join(m, parent, "x")
            with self.assertRaises(OSError) as cm:
                os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            self.assertEqual(cm.exception.errno, errno.EPERM, parent)
            self.assertFalse(os.path.lexists(p), parent)
            self.assertFalse(os.path.lexists(os.path.join(self.dirs.upper, parent, "x")), parent)
            # the name is still free: a real node (and a plain file) can be made and removed
            os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            self.assertIn("x", os.listdir(os.path.join(m, parent)))
            os.unlink(p)
            self.assertNotIn("x", os.listdir(os.path.join(m, parent)))
        # "d" was copied up to hold the refused attempt's sibling; nothing hides "keep"
        self.assertEqual(sorted(os.listdir(os.path.join(m, "d"))), ["dev0", "keep"])
        os.rmdir(os.path.join(m, "new"))
        self.assertFalse(os.path.lexists(os.path.join(m, "new")))
        # every 0/0 left in upper is a whiteout of a removed base entry, none of a refused name
        self.assertEqual([n for n in self.upper_nodes() if n[0].endswith("x")], [])
        fsharness.close_checked(self, self.mount)

    def test_creation_over_a_whiteout(self):
        m, b = self.dirs.mnt, self.dirs.base

        def write(p):
            with open(p, "w") as f:
                f.write("new")
        kinds = {
            "file": write,
            "excl": lambda p: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)),
            "dir": lambda p: os.mkdir(p, 0o750),
            "link": lambda p: os.symlink("keep", p),
            "fifo": lambda p: os.mkfifo(p, 0o600),
            "hard": lambda p: os.link(os.path.join(m, "d", "keep"), p),
        }
        for name in kinds:
            os.mkdir(os.path.join(b, "d", "dir-" + name))
            with open(os.path.join(b, "d", "dir-" + name, "inside"), "w") as f:
                f.write("base")
            with open(os.path.join(b, "d", name), "w") as f:
                f.write("base")
        for name, make in kinds.items():
            for victim in (name, "dir-" + name):
                p = os.path.join(m, "d", victim)
                if victim == name:
                    os.unlink(p)
                else:
                    os.unlink(os.path.join(p, "inside"))
                    os.rmdir(p)
                self.assertFalse(os.path.lexists(p), victim)
                make(p)
        want = {"file": stat.S_ISREG, "excl": stat.S_ISREG, "dir": stat.S_ISDIR,
                "link": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "hard": stat.S_ISREG}
        for _ in range(2):  # this mount, then the next one over the same upper
            d = os.path.join(m, "d")
            for name, is_kind in want.items():
                for victim in (name, "dir-" + name):
                    st = os.lstat(os.path.join(d, victim))
                    self.assertTrue(is_kind(st.st_mode), (victim, oct(st.st_mode)))
                    if stat.S_ISDIR(st.st_mode):  # opaque: nothing of the base's shows
                        self.assertEqual(os.listdir(os.path.join(d, victim)), [])
            with open(os.path.join(d, "file")) as f:
                self.assertEqual(f.read(), "new")
            self.assertEqual(os.readlink(os.path.join(d, "link")), "keep")
            # keep, hard and dir-hard
            self.assertEqual(os.lstat(os.path.join(d, "hard")).st_nlink, 3)
            fsharness.close_checked(self, self.mount)
            self.mount = fsharness.Mount(b, self.dirs.upper, m,
                                         db=os.path.join(self.dirs.state, "meta.db"))

    def test_base_0_0_device_is_not_copied_up(self):
        m = self.dirs.mnt
        dev0 = os.path.join(m, "d", "dev0")
        st = os.lstat(dev0)
        self.assertTrue(stat.S_ISCHR(st.st_mode))
        for change in (lambda: os.chmod(dev0, 0o640),
                       lambda: os.chown(dev0, 1, 1),
                       lambda: os.utime(dev0, (1, 1), follow_symlinks=False),
                       lambda: os.rename(dev0, os.path.join(m, "d", "moved")),
                       lambda: os.link(dev0, os.path.join(m, "d", "linked"))):
            with self.assertRaises(OSError) as cm:
                change()
            self.assertEqual(cm.exception.errno, errno.EPERM)
            self.assertEqual(sorted(os.listdir(os.path.join(m, "d"))), ["dev0", "keep"])
            self.assertTrue(stat.S_ISCHR(os.lstat(dev0).st_mode))
        self.assertEqual(self.upper_nodes(), [])
        # it can still be removed: then its whiteout hides it, as a removal should
        os.unlink(dev0)
        self.assertEqual(os.listdir(os.path.join(m, "d")), ["keep"])
        self.assertEqual(self.upper_nodes(), [("d/dev0", 0, 0)])
        fsharness.close_checked(self, self.mount)


if __name__ == "__main__":
    unittest.main()
