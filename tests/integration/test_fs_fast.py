"""The kernel's FUSE fast paths on a real workspace: a file held open for writing and a shared
writable mapping are journaled in the turn where they are written even though, with
passthrough, their writes never reach the daemon; set-id bits are cleared when another user
writes (FUSE_HANDLE_KILLPRIV_V2 leaves that to us); `cowbox info` names the transport; and
the same holds with passthrough and io_uring forced off."""

import mmap
import os
import subprocess
import unittest

from cbtest import CowboxTestCase


def uring_allowed():
    try:
        with open("/sys/module/fuse/parameters/enable_uring") as f:
            return f.read().strip() in ("Y", "1")
    except OSError:
        return False


class FastPathsTest(CowboxTestCase):
    fast = True

    def setUp(self):
        super().setUp()
        for k in ("COWBOX_FUSE_PASSTHROUGH", "COWBOX_FUSE_URING", "COWBOX_FUSE_NO_OPENDIR"):
            if self.fast:
                self.env.pop(k, None)
            else:
                self.env[k] = "0"
        self.base = self.make_base({"held.txt": "base\n", "mapped.bin": "\0" * 8192})
        # passthrough needs the upper-layer quota off (a byte quota keeps it off: the
        # daemon must see every write); test_limits checks that side
        self.ref = self.cowbox("create", "--base", self.base, "--name", "w",
                               "--disk-mb", "0").stdout.strip()
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def changes(self):
        snap = self.cowbox_json("snapshot", "w", "--changes")
        return {e["path"]: e["event"] for e in snap["changes"]}

    def fs_info(self):
        return self.cowbox_json("info", "w")["fs"]

    def test_file_open_for_writing_is_marked_in_each_turn(self):
        fd = os.open(os.path.join(self.mnt, "held.txt"), os.O_RDWR)
        try:
            os.pwrite(fd, b"one!\n", 0)
            self.assertEqual(self.changes(), {"held.txt": "modified"})
            # written in the next turn through the same open file, never reopened
            os.pwrite(fd, b"two!\n", 0)
            self.assertEqual(self.changes(), {"held.txt": "modified"})
            # a turn where it stays untouched records nothing new
            self.assertEqual(self.changes(), {})
        finally:
            os.close(fd)
        with open(os.path.join(self.mnt, "held.txt")) as f:
            self.assertEqual(f.read(), "two!\n")

    def test_shared_writable_mapping_is_marked_in_each_turn(self):
        path = os.path.join(self.mnt, "mapped.bin")
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fd)  # the mapping keeps the file open
        try:
            m[0:5] = b"first"
            m.flush()
            self.assertEqual(self.changes(), {"mapped.bin": "modified"})
            m[4096:4102] = b"second"
            m.flush()
            self.assertEqual(self.changes(), {"mapped.bin": "modified"})
        finally:
            m.close()
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[0:5], b"first")
        self.assertEqual(data[4096:4102], b"second")

    def test_set_id_bits_cleared_when_another_user_writes(self):
        path = os.path.join(self.mnt, "tool")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chown(path, 1000, 1000)
        os.chmod(path, 0o6775)
        # a writer without CAP_FSETID: both bits go (sgid too, the group may execute)
        subprocess.run(["setpriv", "--bounding-set=-fsetid", "sh", "-c",
                        "echo 'echo hi' >> \"$1\"", "sh", path], check=True)
        self.assertEqual(os.stat(path).st_mode & 0o7777, 0o775)
        with open(path) as f:
            self.assertEqual(f.read(), "#!/bin/sh\necho hi\n")

    def test_info_names_transport_and_passthrough(self):
        fs = self.fs_info()
        self.assertRegex(fs["libfuse"], r"^3\.\d+")
        version = tuple(int(x) for x in fs["libfuse"].split(".")[:2])
        new_fuse = version >= (3, 17)  # passthrough; io_uring is built in from 3.18
        # a request the daemon serves, so the transport is known
        os.listdir(self.mnt)
        fs = self.fs_info()
        if self.fast and version >= (3, 18) and uring_allowed():
            self.assertEqual(fs["transport"], "io_uring")
        else:
            self.assertEqual(fs["transport"], "/dev/fuse")
        self.assertEqual(fs["passthrough"], self.fast and new_fuse)
        self.assertEqual(fs["writeback_cache"], not fs["passthrough"])
        human = self.cowbox("info", "w").stdout
        self.assertIn("transport:   " + fs["transport"], human)


class FastPathsOffTest(FastPathsTest):
    """The same with COWBOX_FUSE_PASSTHROUGH=0 and COWBOX_FUSE_URING=0: the writeback cache
    and /dev/fuse, as with Debian 12's libfuse."""

    fast = False


if __name__ == "__main__":
    unittest.main()
