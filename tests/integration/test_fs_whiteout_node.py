# A 0/0 character device is what a whiteout is in the upper layer: the mount must refuse to
# make one (EPERM, as kernel overlayfs does) or copy one up from base, so no name can hide itself.
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
