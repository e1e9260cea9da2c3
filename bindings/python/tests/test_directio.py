"""The Python mirror of util/beneath.c (cowbox/directio.py) against the case table the C unit
test runs too (util/beneath_cases.json): the same paths, the same outcomes, nothing made or
read outside the root, and no FIFO or device ever waited on."""

import errno
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from cowbox import directio  # noqa: E402

CASES = os.path.join(os.environ.get("COWBOX_SRCDIR", os.path.join(HERE, "..", "..", "..")),
                     "util", "beneath_cases.json")
OUTCOMES = {"ok": 0, "symlink": errno.ELOOP, "escape": errno.EXDEV, "invalid": errno.EINVAL,
            "not_regular": errno.EINVAL, "directory": errno.EISDIR, "not_found": errno.ENOENT,
            "not_dir": errno.ENOTDIR, "too_long": errno.ENAMETOOLONG}


def tree_state(top):
    """Everything an escape could change under top: names, types, modes, owners, times, bytes."""
    out = []
    for dirpath, dirs, files in os.walk(top):
        for name in sorted(dirs + files) + ["."]:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            data = b""
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = f.read()
            out.append((p, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, data))
    return sorted(out)


class BeneathCasesTest(unittest.TestCase):
    def setUp(self):
        self.top = tempfile.mkdtemp(prefix="cowbox-directio-")
        self.addCleanup(shutil.rmtree, self.top, True)
        self.root = os.path.join(self.top, "root")
        self.outside = os.path.join(self.top, "outside")
        os.mkdir(self.root)
        os.mkdir(self.outside)
        with open(CASES) as f:
            self.doc = json.load(f)

    def sub(self, s):
        return s.replace("@OUTSIDE@", self.outside)

    def make_tree(self):
        for name, data in self.doc["outside"].items():
            with open(os.path.join(self.outside, name), "w") as f:
                f.write(data)
            os.chmod(os.path.join(self.outside, name), 0o600)
        socks = []
        for entry in self.doc["tree"]:
            path, kind = os.path.join(self.root, entry[0]), entry[1]
            if kind == "dir":
                os.mkdir(path)
            elif kind == "file":
                with open(path, "w") as f:
                    f.write(entry[2])
            elif kind == "symlink":
                os.symlink(self.sub(entry[2]), path)
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "chardev":
                try:
                    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
                except PermissionError:
                    os.mkfifo(path)  # not root: a FIFO stands in, refused the same way
            elif kind == "socket":
                s = socket.socket(socket.AF_UNIX)
                s.bind(path)
                socks.append(s)
            else:
                self.fail("unknown tree type %s" % kind)
        for s in socks:
            s.close()

    def test_case_table(self):
        self.make_tree()
        before = tree_state(self.outside)
        for case in self.doc["cases"]:
            op, path, want = case["op"], self.sub(case["path"]), OUTCOMES[case["expect"]]
            data = case.get("data") or "x"
            with self.subTest(op=op, path=path[:60]):
                t0 = time.monotonic()
                got, err = None, 0
                try:
                    if op == "write":
                        directio.write_file(self.root, path, data.encode())
                    got = directio.read_file(self.root, path)
                except OSError as e:
                    err = e.errno
                    if path:
                        self.assertIn(path[:48], str(e))
                self.assertLess(time.monotonic() - t0, 2.0, "took too long")
                self.assertEqual(err, want, "%s %s: got %s, want %s" % (
                    op, path[:60], errno.errorcode.get(err, err), case["expect"]))
                if not want:
                    self.assertEqual(got, data.encode())
        self.assertEqual(tree_state(self.outside), before, "the outside directory changed")
        self.assertFalse(os.path.lexists(os.path.join(self.root, "nope")))
        self.assertFalse(os.path.lexists("/tmp/cowbox-pwned"))

    def test_fifo_never_waits(self):
        # A FIFO swapped in for a file between the look and the open: O_NONBLOCK, then
        # refused. Run in a thread so a regression shows as a failure, not a hang.
        os.mkfifo(os.path.join(self.root, "p"))
        result = []

        def go():
            for fn in (lambda: directio.read_file(self.root, "p"),
                       lambda: directio.write_file(self.root, "p", b"x")):
                try:
                    fn()
                    result.append(0)
                except OSError as e:
                    result.append(e.errno)
        th = threading.Thread(target=go, daemon=True)
        th.start()
        th.join(10)
        self.assertFalse(th.is_alive(), "directio blocked on a FIFO")
        self.assertEqual(result, [errno.EINVAL, errno.EINVAL])

    def test_swap_race(self):
        # A directory swapped for a symlink to the outside (renameat2 RENAME_EXCHANGE) while
        # reads and writes run: nothing outside is read or changed.
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        d, x = os.path.join(self.root, "d"), os.path.join(self.root, "x")
        os.mkdir(d)
        with open(os.path.join(d, "f"), "w") as f:
            f.write("INSIDE")
        with open(os.path.join(self.outside, "f"), "w") as f:
            f.write("SECRET")
        os.symlink(self.outside, x)
        before = tree_state(self.outside)
        stop, swaps = threading.Event(), [0]

        def swapper():
            while not stop.is_set():
                if libc.renameat2(-100, d.encode(), -100, x.encode(), 2) == 0:
                    swaps[0] += 1
        th = threading.Thread(target=swapper, daemon=True)
        th.start()
        reads = 0
        try:
            for i in range(1500):
                try:
                    self.assertEqual(directio.read_file(self.root, "d/f"), b"INSIDE")
                    reads += 1
                except OSError as e:
                    self.assertIn(e.errno, (errno.ELOOP, errno.ENOENT, errno.ENOTDIR), str(e))
                try:
                    directio.write_file(self.root, "d/w/new", b"INSIDE")
                except OSError as e:
                    self.assertIn(e.errno, (errno.ELOOP, errno.ENOENT, errno.ENOTDIR), str(e))
        finally:
            stop.set()
            th.join()
        self.assertGreater(swaps[0], 10)
        self.assertEqual(tree_state(self.outside), before)


if __name__ == "__main__":
    unittest.main()
