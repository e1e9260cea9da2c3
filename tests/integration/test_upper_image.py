"""The upper layer under a byte quota (issue 32, 2): its own ext4 of the quota's size on a
loop device (upper.img), so the mount keeps FUSE passthrough and the kernel says ENOSPC at
write(2); a delete frees at once, df shows the cap, a fork and a killed daemon's workspace
are capped the same way, and rm leaves no mount and no loop device behind."""

import errno
import glob
import json
import os
import signal
import subprocess

from cbtest import CowboxTestCase, wait_for

MiB = 1 << 20


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


def loops_under(path):
    """Loop devices whose backing file is below path."""
    found = []
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(f) as fh:
                if fh.read().strip().startswith(path):
                    found.append(f)
        except OSError:
            pass
    return found


class UpperImageTest(CowboxTestCase):

    def setUp(self):
        if os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
            self.skipTest("the upper layer's own filesystem is mounted by the root daemon")
        super().setUp()
        self.env.pop("COWBOX_UPPER_IMAGE", None)
        self.base = self.make_base({"base.txt": "b" * 1000})

    def make(self, *args):
        ref = self.cowbox("create", "--base", self.base, *args).stdout.strip()
        self.mount(ref)
        return ref

    def info(self, ref, *args):
        return json.loads(self.cowbox("info", ref, "--json", *args).stdout)

    def passthrough_expected(self, ref):
        fs = self.info(ref)["fs"]
        version = tuple(int(x) for x in fs["libfuse"].split(".")[:2])
        return version >= (3, 17) and os.environ.get("COWBOX_FUSE_PASSTHROUGH") != "0"

    def wdir(self, ref):
        return os.path.realpath(self.ws_dir(ref))

    def kill_daemon(self, ref):
        pid = self.daemon_pid(ref)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.daemon_pid(ref), 20, what="the daemon to die")

    def test_write_meets_the_cap_with_passthrough_and_delete_frees(self):
        ref = self.make("--disk-mb", "16")
        info = self.info(ref)
        self.assertEqual(info["limits"]["disk_enforced_by"], "filesystem", info["limits"])
        upper = os.path.join(self.wdir(ref), "upper")
        self.assertEqual(len(mounts_under(upper)), 1)
        if self.passthrough_expected(ref):
            self.assertTrue(info["fs"]["passthrough"], info["fs"])
        mnt = self.mountpoint(ref)
        path = os.path.join(mnt, "big")
        before = self.info(ref, "--stats")["fs"].get("ops", {}).get("WRITE", {}).get("count", 0)
        written = 0
        with self.assertRaises(OSError) as cm:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                chunk = b"x" * MiB
                for _ in range(64):
                    written += os.write(fd, chunk)
            finally:
                os.close(fd)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertLessEqual(written, 16 * MiB)
        self.assertGreater(written, 12 * MiB)
        if self.passthrough_expected(ref):
            # the bytes went to upper.img by the kernel: the daemon saw no WRITE request
            ops = self.info(ref, "--stats")["fs"].get("ops", {})
            self.assertEqual(ops.get("WRITE", {}).get("count", 0), before, ops)
        # the host's disk holds at most the cap for it (the image is sparse)
        img = os.path.join(self.wdir(ref), "upper.img")
        self.assertLessEqual(os.stat(img).st_blocks * 512, 17 * MiB)
        used = self.info(ref)["limits"]["disk_used_bytes"]
        self.assertGreater(used, 12 * MiB)
        # deleting frees at once: the same amount fits again
        os.unlink(path)
        self.assertLess(self.info(ref)["limits"]["disk_used_bytes"], 2 * MiB)
        with open(os.path.join(mnt, "again"), "wb") as f:
            f.write(b"y" * (12 * MiB))
        self.assertEqual(os.path.getsize(os.path.join(mnt, "again")), 12 * MiB)
        # a sparse file is free on ext4; writing into it meets the cap
        with open(os.path.join(mnt, "sparse"), "wb") as f:
            f.truncate(100 * MiB)
            f.seek(50 * MiB)
            with self.assertRaises(OSError) as cm:
                f.write(b"z" * (8 * MiB))
                f.flush()
        self.assertEqual(cm.exception.errno, errno.ENOSPC)

    def test_df_inside_shows_the_cap(self):
        ref = self.make("--disk-mb", "64")
        for st in (os.statvfs(self.mountpoint(ref)),):
            size = st.f_blocks * st.f_frsize
            self.assertLessEqual(abs(size - 64 * MiB), MiB, size)
        p = self.cowbox("exec", ref, "--", "sh", "-c", "df -P -k . | tail -1")
        size_kib = int(p.stdout.split()[1])
        self.assertLessEqual(abs(size_kib - 64 * 1024), 1024, p.stdout)
        # what the host's ext4 gave the layer, a small image gives too: 4 KiB of xattrs,
        # nanosecond times
        path = os.path.join(self.mountpoint(ref), "f")
        open(path, "w").close()
        os.setxattr(path, "user.big", b"v" * 3000)
        os.utime(path, ns=(1700000000123456789, 1700000000123456789))
        self.assertEqual(os.stat(path).st_mtime_ns, 1700000000123456789)
        self.assertEqual(len(os.getxattr(path, "user.big")), 3000)

    def test_fork_is_capped_and_rm_frees_mounts_and_loop_devices(self):
        ref = self.make("--disk-mb", "32")
        mnt = self.mountpoint(ref)
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("kept\n")
        turn = self.cowbox_json("snapshot", ref)["turn"]
        child = self.cowbox_json("fork", ref, str(turn), "--name", "child")
        cref = child["ref"]
        self.mount(cref)
        cmnt = self.mountpoint(cref)
        with open(os.path.join(cmnt, "a.txt")) as f:
            self.assertEqual(f.read(), "kept\n")
        cinfo = self.info(cref)
        self.assertEqual(cinfo["limits"]["disk_enforced_by"], "filesystem", cinfo)
        cdir = self.wdir(cref)
        self.assertFalse(os.path.exists(os.path.join(cdir, "upper.old")))
        self.assertEqual(len(mounts_under(os.path.join(cdir, "upper"))), 1)
        # a fork has the options of a new workspace (the default quota): df shows its cap
        st = os.statvfs(cmnt)
        cap = cinfo["limits"]["disk_bytes"]
        self.assertGreater(cap, 0)
        self.assertLessEqual(abs(st.f_blocks * st.f_frsize - cap), cap // 100 + MiB)
        pdir = self.wdir(ref)
        for r, d in ((cref, cdir), (ref, pdir)):
            self.cowbox("rm", r)
            self.assertEqual(mounts_under(d), [])
            self.assertEqual(loops_under(d), [])

    def test_a_killed_daemons_upper_is_reused_then_removed(self):
        ref = self.make("--disk-mb", "16")
        d = self.wdir(ref)
        upper = os.path.join(d, "upper")
        with open(os.path.join(self.mountpoint(ref), "note"), "w") as f:
            f.write("kept\n")
        self.kill_daemon(ref)
        self.assertEqual(len(mounts_under(upper)), 1)
        # fsck reads the image that stays mounted; the next daemon uses it, no second mount
        self.cowbox("fsck", ref)
        self.mount(ref)
        self.assertEqual(len(mounts_under(upper)), 1)
        with open(os.path.join(self.mountpoint(ref), "note")) as f:
            self.assertEqual(f.read(), "kept\n")
        self.kill_daemon(ref)
        self.cowbox("rm", ref)
        self.assertEqual(mounts_under(d), [])
        self.assertEqual(loops_under(d), [])
        self.assertFalse(os.path.exists(d))

    def test_a_stopped_workspace_is_read_from_its_image(self):
        ref = self.make("--disk-mb", "16")
        with open(os.path.join(self.mountpoint(ref), "note"), "w") as f:
            f.write("kept\n")
        self.cowbox("snapshot", ref)
        self.cowbox("umount", ref)
        d = self.wdir(ref)
        self.assertEqual(mounts_under(d), [], "a stopped daemon leaves its upper mounted")
        self.assertEqual(loops_under(d), [])
        # fsck mounts the image for its reading, and lets it go
        p = self.cowbox("fsck", ref)
        self.assertNotIn("missing", p.stdout)
        self.assertEqual(mounts_under(d), [])
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "note")) as f:
            self.assertEqual(f.read(), "kept\n")

    def test_a_plain_upper_is_carried_in_and_a_new_cap_remade(self):
        ref = self.make("--disk-mb", "0")
        mnt = self.mountpoint(ref)
        with open(os.path.join(mnt, "data"), "wb") as f:
            f.write(b"d" * (3 * MiB))
        os.mkdir(os.path.join(mnt, "dir"))
        os.link(os.path.join(mnt, "data"), os.path.join(mnt, "dir", "hard"))
        os.unlink(os.path.join(mnt, "base.txt"))  # a whiteout
        self.assertEqual(self.info(ref)["fs"]["passthrough"], self.passthrough_expected(ref))
        # the API's way: the running daemon configured with a cap counts it on this mount,
        # and the next start makes the image, the files carried in
        r = self.client(ref).request("configure", options={"backend": "ns", "disk_mb": 24})
        self.assertNotIn("error", r)
        self.assertEqual(self.info(ref)["limits"]["disk_enforced_by"], "mount")
        self.cowbox("umount", ref)
        self.mount(ref)
        info = self.info(ref)
        self.assertEqual(info["limits"]["disk_enforced_by"], "filesystem", info["limits"])
        st = os.stat(os.path.join(mnt, "data"))
        self.assertEqual(st.st_size, 3 * MiB)
        self.assertEqual(st.st_nlink, 2)
        self.assertFalse(os.path.exists(os.path.join(mnt, "base.txt")))
        self.assertNotIn("lost+found", os.listdir(mnt))
        self.assertFalse(os.path.exists(os.path.join(self.wdir(ref), "upper.old")))
        # a smaller cap: counted now, remade at the next start, the files carried again
        r = self.client(ref).request("configure", options={"backend": "ns", "disk_mb": 12})
        self.assertNotIn("error", r)
        self.assertEqual(self.info(ref)["limits"]["disk_enforced_by"], "mount")
        self.cowbox("umount", ref)
        self.mount(ref)
        self.assertEqual(self.info(ref)["limits"]["disk_enforced_by"], "filesystem")
        st = os.statvfs(mnt)
        self.assertLessEqual(abs(st.f_blocks * st.f_frsize - 12 * MiB), MiB)
        with open(os.path.join(mnt, "dir", "hard"), "rb") as f:
            self.assertEqual(f.read(), b"d" * (3 * MiB))
        self.assertFalse(os.path.exists(os.path.join(self.wdir(ref), "upper.img.new")))

    def test_counting_fallback_when_asked(self):
        self.env["COWBOX_UPPER_IMAGE"] = "0"
        ref = self.make("--disk-mb", "8")
        info = self.info(ref)
        self.assertEqual(info["limits"]["disk_enforced_by"], "mount", info["limits"])
        self.assertFalse(info["fs"]["passthrough"])
        self.assertFalse(os.path.exists(os.path.join(self.wdir(ref), "upper.img")))
        with self.assertRaises(OSError) as cm:
            with open(os.path.join(self.mountpoint(ref), "big"), "wb") as f:
                f.write(b"x" * (20 * MiB))
        self.assertEqual(cm.exception.errno, errno.ENOSPC)


if __name__ == "__main__":
    import unittest
    unittest.main()
