"""Trees deeper than PATH_MAX from the mount root: the kernel limits only the path one syscall
is given, so a tree made from a deep working directory (or openat chains) can be 8 KB deep.
Every name operation works at that depth and at a 4,095-byte path, and snapshot, diff,
rollback and fork serve the tree exactly, also with a deep tree in the base."""

import errno
import hashlib
import os
import stat
import unittest

from cbtest import CowboxTestCase

NAME = "n" * 200  # 40 of them: about 8 KB from the root
DEPTH = 40
BASE_DEPTH = 25  # about 5 KB in the base itself
TOPDIR = "deep-test-dir-24-bytes_"  # the 4,095-byte path lives under this (24 bytes with "/")


def deep_dir(rootfd, names):
    """An fd (O_RDONLY directory) of rootfd/names..., reached one openat at a time."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=rootfd)
    for name in names:
        nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def make_deep(rootfd, names):
    """mkdir -p of names under rootfd, one mkdirat at a time; returns the last one's fd."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=rootfd)
    for name in names:
        try:
            os.mkdir(name, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def write_at(dirfd, name, data, mode=0o644):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, dir_fd=dirfd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_at(dirfd, name):
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
    try:
        out = b""
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return out
            out += chunk
    finally:
        os.close(fd)


def tree_state_fd(dirfd, prefix="", out=None):
    """turnutil.tree_state through directory fds, so any depth works:
    {relative path: ("file", mode, sha256) | ("dir", mode) | ("symlink", target)}."""
    out = {} if out is None else out
    for name in sorted(os.listdir(dirfd)):
        rel = prefix + name
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("symlink", os.readlink(name, dir_fd=dirfd))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
            try:
                tree_state_fd(sub, rel + "/", out)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            out[rel] = ("file", stat.S_IMODE(st.st_mode),
                        hashlib.sha256(read_at(dirfd, name)).hexdigest())
    return out


def tree_of(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return tree_state_fd(fd)
    finally:
        os.close(fd)


class DeepPaths(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.cwd = os.getcwd()
        self.addCleanup(os.chdir, self.cwd)
        self.base = self.make_base({"README": "hello\n"})
        bfd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY)
        fd = make_deep(bfd, ["basedeep"] + [NAME] * BASE_DEPTH)
        write_at(fd, "bfile", b"from the base\n")
        os.symlink("bfile", "blink", dir_fd=fd)
        os.mkdir("bsub", 0o750, dir_fd=fd)
        write_at(fd, "bsub/inner", b"inner\n")
        os.close(fd)
        os.close(bfd)
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def snapshot(self):
        return self.cowbox_json("snapshot", "w")

    def ops_in(self, d, tag):
        """Every name operation in directory fd d, with dir_fd and with d as the cwd."""
        write_at(d, "f" + tag, b"first\n")
        os.chmod("f" + tag, 0o600, dir_fd=d)
        self.assertEqual(stat.S_IMODE(os.stat("f" + tag, dir_fd=d).st_mode), 0o600)
        # the mount shows ids as it stores them (the workspace's id range): compare with a
        # shallow file chowned the same way
        shallow = os.path.join(self.mnt, "shallow" + tag)
        open(shallow, "w").close()
        os.chown(shallow, 1234, 5678)
        os.chown("f" + tag, 1234, 5678, dir_fd=d, follow_symlinks=False)
        st, want = os.stat("f" + tag, dir_fd=d), os.stat(shallow)
        self.assertEqual((st.st_uid, st.st_gid), (want.st_uid, want.st_gid))
        self.assertNotEqual(st.st_uid, 0)
        os.unlink(shallow)
        os.chown("f" + tag, 0, 0, dir_fd=d, follow_symlinks=False)
        os.fchdir(d)  # the path-only calls, relative to a deep cwd
        os.truncate("f" + tag, 3)
        self.assertEqual(read_at(d, "f" + tag), b"fir")
        os.link("f" + tag, "hard" + tag)
        self.assertEqual(os.stat("hard" + tag).st_nlink, 2)
        os.mkdir("dir" + tag, 0o700)
        os.mkfifo("fifo" + tag)
        os.mknod("null" + tag, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        self.assertTrue(stat.S_ISFIFO(os.lstat("fifo" + tag).st_mode))
        self.assertEqual(os.lstat("null" + tag).st_rdev, os.makedev(1, 3))
        os.symlink("f" + tag, "sym" + tag)
        self.assertEqual(os.readlink("sym" + tag), "f" + tag)
        os.rename("hard" + tag, "moved" + tag)
        os.setxattr("f" + tag, "user.deep", b"yes")
        self.assertEqual(os.getxattr("f" + tag, "user.deep"), b"yes")
        os.removexattr("f" + tag, "user.deep")
        os.unlink("moved" + tag)
        os.rmdir("dir" + tag)
        os.unlink("fifo" + tag)
        os.unlink("null" + tag)
        os.chdir(self.cwd)
        write_at(d, "f" + tag, b"final content " + tag.encode() + b"\n")
        self.assertEqual(sorted(n for n in os.listdir(d) if n.endswith(tag)),
                         ["f" + tag, "sym" + tag])

    def test_4095_byte_path(self):
        # a path of 4,095 bytes under a 24-byte directory: longer than PATH_MAX from the root
        os.mkdir(os.path.join(self.mnt, TOPDIR))
        os.chdir(os.path.join(self.mnt, TOPDIR))
        dirs = "/".join(["p" * 200] * 20)
        leaf = "q" * (4095 - len(dirs) - 1)
        path = dirs + "/" + leaf
        self.assertEqual(len(path), 4095)
        os.makedirs(dirs)
        other = path[:-1] + "r"
        with open(path, "w") as f:
            f.write("long\n")
        os.chmod(path, 0o640)
        os.chown(path, 1, 2)
        os.truncate(path, 2)
        os.link(path, other)
        os.unlink(other)
        os.rename(path, other)
        os.rename(other, path)
        os.symlink("target", other)
        os.unlink(other)
        os.mkfifo(other)
        os.unlink(other)
        os.mknod(other, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.unlink(other)
        os.mkdir(other)
        os.rmdir(other)
        with open(path) as f:
            self.assertEqual(f.read(), "lo")
        os.chdir(self.cwd)
        snap = self.snapshot()
        self.assertEqual(snap["files"].get(TOPDIR + "/" + path), hashlib.sha256(b"lo").hexdigest())
        self.assertEqual(snap["files"], {p: v[2] for p, v in tree_of(self.mnt).items()
                                         if v[0] == "file"})

    def test_deeper_than_path_max(self):
        root = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, root)
        deep = make_deep(root, ["top"] + [NAME] * DEPTH)
        self.addCleanup(os.close, deep)
        self.ops_in(deep, "1")
        # in the base's deep tree: copy-up at depth
        bdeep = deep_dir(root, ["basedeep"] + [NAME] * BASE_DEPTH)
        self.addCleanup(os.close, bdeep)
        self.assertEqual(read_at(bdeep, "bfile"), b"from the base\n")
        self.assertEqual(os.readlink("blink", dir_fd=bdeep), "bfile")
        self.ops_in(bdeep, "2")
        os.chmod("bsub", 0o700, dir_fd=bdeep)
        write_at(bdeep, "bfile", b"changed in the mount\n")
        # the snapshot maps every file, at any depth, as a walk of the tree finds it
        t1 = self.snapshot()
        want1 = tree_of(self.mnt)
        self.assertEqual(t1["files"], {p: v[2] for p, v in want1.items() if v[0] == "file"})
        deepfile = "top/" + "/".join([NAME] * DEPTH) + "/f1"
        self.assertGreater(len(deepfile), 8000)
        self.assertIn(deepfile, t1["files"])
        # change things at depth; diff names them
        write_at(deep, "f1", b"second version\n")
        os.unlink("bfile", dir_fd=bdeep)
        os.rename("sym1", "sym1b", src_dir_fd=deep, dst_dir_fd=deep)
        os.mkdir("later", dir_fd=deep)
        t2 = self.snapshot()
        want2 = tree_of(self.mnt)
        d = self.cowbox_json("diff", "w", str(t1["turn"]), str(t2["turn"]))
        events = {e["path"]: e["event"] for e in d["events"]}
        bpath = "basedeep/" + "/".join([NAME] * BASE_DEPTH)
        self.assertEqual(events.get(deepfile), "modified")
        self.assertEqual(events.get(bpath + "/bfile"), "deleted")
        self.assertEqual(events.get(deepfile[:-2] + "sym1"), "deleted")
        self.assertEqual(events.get(deepfile[:-2] + "sym1b"), "created")
        self.assertEqual(events.get(deepfile[:-2] + "later"), "created")
        # rollback to turn 1: the tree is exactly what it was
        self.cowbox_json("rollback", "w", str(t1["turn"]))
        self.assertEqual(tree_of(self.mnt), want1)
        # fork of turn 2: the fork's tree is exactly turn 2's
        fork = self.cowbox_json("fork", "w", str(t2["turn"]), "--name", "w2")
        self.mount("w2")
        self.assertEqual(tree_of(self.mountpoint(fork["ref"])), want2)
        # and the fork's own snapshot maps its deep files
        s2 = self.cowbox_json("snapshot", "w2")
        self.assertEqual(s2["files"], {p: v[2] for p, v in want2.items() if v[0] == "file"})
        # fsck finds nothing wrong with a deep workspace
        self.cowbox("fsck", "w")

    def test_path_too_long_for_a_name_is_still_refused(self):
        # NAME_MAX still holds for one name
        root = os.open(self.mnt, os.O_RDONLY | os.O_DIRECTORY)
        self.addCleanup(os.close, root)
        with self.assertRaises(OSError) as cm:
            os.mkdir("x" * 256, dir_fd=root)
        self.assertEqual(cm.exception.errno, errno.ENAMETOOLONG)


if __name__ == "__main__":
    unittest.main()
