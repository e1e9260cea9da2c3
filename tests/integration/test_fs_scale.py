# Scale and sharing of the workspace filesystem: 100k files under a 1,024-fd limit, several
# writer processes at once through one mount, and a process under another uid using it.
import os
import subprocess
import sys
import unittest

import fsharness

WRITER = r"""
import os, sys
mnt, me = sys.argv[1], int(sys.argv[2])
d = os.path.join(mnt, "w%d" % me)
os.mkdir(d)
for i in range(300):
    p = os.path.join(d, "f%d" % i)
    with open(p, "w") as f:
        f.write(("%d-%d\n" % (me, i)) * 50)
    if i % 3 == 0:
        os.rename(p, p + ".r")
    with open(os.path.join(mnt, "shared", "s%d" % (i % 20)), "a") as f:
        f.write("%d\n" % me)
    with open(os.path.join(mnt, "tree", "d%d" % (i % 10), "f%d" % me), "a") as f:
        f.write("x")
"""


class Scale(fsharness.MountTestCase):
    def test_100k_files_under_1024_fds(self):
        base = self.dirs.base
        for d in range(100):
            os.mkdir(os.path.join(base, "d%02d" % d))
            for i in range(1000):
                with open(os.path.join(base, "d%02d" % d, "f%d" % i), "w") as f:
                    f.write("%d/%d" % (d, i))
        self.mount = fsharness.Mount(base, self.dirs.upper, self.dirs.mnt, nofile=1024)
        count = 0
        for dirpath, dirnames, filenames in os.walk(self.dirs.mnt):
            for n in filenames:
                os.lstat(os.path.join(dirpath, n))
                count += 1
        self.assertEqual(count, 100000)
        self.assertLess(self.mount.fd_count(), 50)
        # every 100th file read, then written (copy-up), all while 100k inodes are known
        for d in range(100):
            for i in range(0, 1000, 100):
                p = os.path.join(self.dirs.mnt, "d%02d" % d, "f%d" % i)
                with open(p) as f:
                    self.assertEqual(f.read(), "%d/%d" % (d, i))
                with open(p, "a") as f:
                    f.write("+")
        with open(os.path.join(self.dirs.mnt, "d42", "f500")) as f:
            self.assertEqual(f.read(), "42/500+")
        self.assertLess(self.mount.fd_count(), 50)

    def test_concurrent_writers(self):
        os.mkdir(os.path.join(self.dirs.base, "tree"))
        for d in range(10):
            os.mkdir(os.path.join(self.dirs.base, "tree", "d%d" % d))
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)
        os.mkdir(os.path.join(self.dirs.mnt, "shared"))
        n = 4
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, self.dirs.mnt, str(k)])
                 for k in range(n)]
        for p in procs:
            self.assertEqual(p.wait(timeout=300), 0)
        for k in range(n):
            names = os.listdir(os.path.join(self.dirs.mnt, "w%d" % k))
            self.assertEqual(len(names), 300)
            for i in range(300):
                name = "f%d" % i + (".r" if i % 3 == 0 else "")
                with open(os.path.join(self.dirs.mnt, "w%d" % k, name)) as f:
                    self.assertEqual(f.read(), ("%d-%d\n" % (k, i)) * 50)
        total = 0
        for s in range(20):
            with open(os.path.join(self.dirs.mnt, "shared", "s%d" % s)) as f:
                lines = f.read().split()
            total += len(lines)
        self.assertEqual(total, n * 300)
        for d in range(10):
            for k in range(n):
                with open(os.path.join(self.dirs.mnt, "tree", "d%d" % d, "f%d" % k)) as f:
                    self.assertEqual(f.read(), "x" * 30)
        # the same tree after a remount
        fsharness.close_checked(self, self.mount)
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)
        self.assertEqual(len(os.listdir(os.path.join(self.dirs.mnt, "w3"))), 300)

    def test_another_uid_uses_the_mount(self):
        # allow_other lets a sandboxed uid in; default_permissions keeps the modes in force
        os.chmod(self.dirs.top, 0o755)
        with open(os.path.join(self.dirs.base, "pub"), "w") as f:
            f.write("open")
        with open(os.path.join(self.dirs.base, "priv"), "w") as f:
            f.write("secret")
        os.chmod(os.path.join(self.dirs.base, "priv"), 0o600)
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt)
        m = self.dirs.mnt
        os.mkdir(os.path.join(m, "shared"))
        os.chmod(os.path.join(m, "shared"), 0o1777)
        script = ("cat {m}/pub; cat {m}/priv 2>/dev/null && echo LEAK; "
                  "echo hi > {m}/shared/x && mkdir {m}/shared/d; "
                  "echo no > {m}/top 2>/dev/null && echo LEAK; true").format(m=m)
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            "sh", "-c", script], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout, "open", r.stderr)
        for name in ("x", "d"):
            st = os.lstat(os.path.join(m, "shared", name))
            self.assertEqual((st.st_uid, st.st_gid), (65534, 65534))
            st = os.lstat(os.path.join(self.dirs.upper, "shared", name))
            self.assertEqual((st.st_uid, st.st_gid), (65534, 65534))
        self.assertFalse(os.path.exists(os.path.join(m, "top")))


if __name__ == "__main__":
    unittest.main()
