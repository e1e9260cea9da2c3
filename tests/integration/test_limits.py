"""Limits by default: a pids cap, a memory cap with the sandbox's oom_score_adj raised, a
command timeout, and an upper-layer quota of bytes and inodes enforced by the filesystem
(ENOSPC inside, the workspace keeps working). Each is shown by info and can be changed or
turned off (0)."""

import errno
import json
import os
import subprocess
import unittest

from cbtest import COWBOX, CowboxTestCase

MiB = 1 << 20


class ExecLimitsTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.dir = os.path.join(self.tmp, "d")
        os.mkdir(self.dir)

    def run_dir(self, *args, timeout=120):
        return subprocess.run([COWBOX, "exec", "--dir", self.dir] + list(args),
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def test_defaults_are_shown_by_info(self):
        ref = self.create(None, "w")
        info = self.cowbox_json("info", "w")
        self.assertEqual(info["limits"]["timeout"], 600)
        self.assertEqual(info["limits"]["pids"], 1024)
        self.assertEqual(info["limits"]["memory_mb"], 4096)
        self.assertEqual(info["limits"]["oom_score_adj"], 500)
        self.assertEqual(info["limits"]["disk_bytes"], 10240 * MiB)
        self.assertEqual(info["limits"]["disk_inodes"], 1000000)
        human = self.cowbox("info", "w").stdout
        self.assertIn("limits:      timeout 600 s, memory 4096 MiB (oom_score_adj 500), "
                      "pids 1024", human)
        self.assertIn("disk quota:  10.0 GiB, 1000000 inodes", human)
        # the protocol's info says the same, with what the upper layer holds
        self.mount(ref)
        r = self.client(ref).request("info")
        self.assertEqual(r["limits"]["pids"], 1024, r)
        self.assertIn("disk_used_bytes", r["limits"])

    def test_fork_bomb_stops_at_the_pids_cap(self):
        # by default (1024), and with a small cap given: forks fail past it (EAGAIN)
        bomb = ("import os, signal, time\n"
                "pids = []\n"
                "while len(pids) < 3000:\n"
                "    try:\n"
                "        pid = os.fork()\n"
                "    except OSError:\n"
                "        break\n"
                "    if pid == 0:\n"
                "        time.sleep(60)\n"
                "        os._exit(0)\n"
                "    pids.append(pid)\n"
                "print(len(pids), flush=True)\n"
                "for p in pids:\n"
                "    os.kill(p, signal.SIGKILL)\n")
        for args, cap in (((), 1024), (("--pids", "50"), 50)):
            p = self.run_dir(*args, "--timeout", "90", "--", "python3", "-c", bomb)
            self.assertEqual(p.returncode, 0, p.stderr)
            started = int(p.stdout.split()[-1])
            self.assertLess(started, cap, p.stdout)
            self.assertGreater(started, cap // 2, p.stdout)

    def test_memory_cap_kills_and_oom_score_adj_is_raised(self):
        p = self.run_dir("--", "cat", "/proc/self/oom_score_adj")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreaterEqual(int(p.stdout), 500)
        p = self.run_dir("--memory", "64", "--", "python3", "-c",
                         "b = [bytearray(1 << 20) for _ in range(512)]")
        self.assertEqual(p.returncode, 137, p.stderr)
        self.assertIn("memory cap of 64 MB", p.stderr)
        # and the workspace's sandbox (exec REF) too
        ref = self.create(None, "w")
        self.mount(ref)
        p = subprocess.run([COWBOX, "exec", ref, "--", "cat",
                            "/proc/self/oom_score_adj"], env=self.env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertGreaterEqual(int(p.stdout), 500)

    def test_timeout_default_and_override(self):
        p = self.run_dir("--timeout", "0.5", "--", "sleep", "30")
        self.assertEqual(p.returncode, 124, p.stderr)
        # a workspace's option is its commands' default
        ref = self.create(None, "w")
        self.mount(ref)
        r = self.client(ref).request("configure", options={"backend": "ns", "timeout": 0.5})
        self.assertNotIn("error", r)
        self.assertEqual(self.cowbox_json("info", "w")["limits"]["timeout"], 0.5)
        p = subprocess.run([COWBOX, "exec", ref, "--", "sleep", "30"], env=self.env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 124, p.stderr)
        r = self.client(ref).request("run", cmd=["sleep", "30"])
        self.assertTrue(r.get("timed_out"), r)
        self.assertEqual(r.get("exit_code"), 124, r)

    def test_zero_turns_each_limit_off(self):
        ref = self.create(None, "w")
        self.mount(ref)
        opts = {"backend": "ns", "timeout": 0, "pids": 0, "memory_mb": 0, "disk_mb": 0,
                "disk_inodes": 0}
        r = self.client(ref).request("configure", options=opts)
        self.assertNotIn("error", r)
        lim = self.cowbox_json("info", "w")["limits"]
        for k in ("timeout", "pids", "memory_mb", "disk_bytes", "disk_inodes"):
            self.assertEqual(lim[k], 0, lim)
        self.assertIn("limits:      timeout none, memory none", self.cowbox("info", "w").stdout)
        p = self.run_dir("--pids", "0", "--memory", "0", "--", "sh", "-c",
                         "cat /proc/self/cgroup")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("/cowbox/", p.stdout)


class QuotaTest(CowboxTestCase):
    """The quota counted by the mount, without passthrough: what a daemon without loop
    devices does (test_upper_image covers the upper layer's own filesystem)."""

    def setUp(self):
        super().setUp()
        self.env["COWBOX_UPPER_IMAGE"] = "0"
        self.base = self.make_base({"base.txt": "b" * 100000})

    def make(self, *args):
        ref = self.cowbox("create", "--base", self.base, "--name", "q", *args).stdout.strip()
        self.mount(ref)
        self.ref = ref
        self.mnt = self.mountpoint(ref)
        self.upper = os.path.join(self.ws_dir(ref), "upper")
        return ref

    def used(self):
        return self.cowbox_json("info", "q")["limits"]

    def upper_bytes(self):
        total = 0
        for root, dirs, files in os.walk(self.upper):
            for n in dirs + files:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
        return total

    def test_dd_past_the_quota_fails_at_write_and_rm_frees(self):
        self.make("--disk-mb", "8")
        self.assertFalse(self.cowbox_json("info", "q")["fs"]["passthrough"])
        path = os.path.join(self.mnt, "big")
        p = subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=20"],
                           capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("No space left on device", p.stderr)
        size = os.path.getsize(path)
        self.assertLessEqual(size, 8 * MiB)
        self.assertGreater(size, 6 * MiB)
        # on disk, never past the quota (slack: directories and inodes of upper/ itself)
        self.assertLessEqual(self.upper_bytes(), 8 * MiB + 64 * 1024)
        lim = self.used()
        self.assertLessEqual(lim["disk_used_bytes"], 8 * MiB)
        # a sparse file past the quota is refused: it counts its length
        with self.assertRaises(OSError) as cm:
            os.truncate(os.path.join(self.mnt, "base.txt"), 100 * MiB)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        with self.assertRaises(OSError) as cm:
            with open(os.path.join(self.mnt, "sparse"), "wb") as f:
                f.truncate(100 * MiB)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        # deleting always works, and frees
        os.unlink(path)
        os.unlink(os.path.join(self.mnt, "base.txt"))  # a whiteout: counts nothing
        with open(os.path.join(self.mnt, "again"), "wb") as f:
            f.write(b"x" * (6 * MiB))
        self.assertEqual(os.path.getsize(os.path.join(self.mnt, "again")), 6 * MiB)

    def test_inode_quota_with_many_small_files(self):
        self.make("--disk-inodes", "50")
        made = 0
        with self.assertRaises(OSError) as cm:
            for i in range(200):
                with open(os.path.join(self.mnt, "f%d" % i), "w") as f:
                    f.write("x")
                made += 1
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertEqual(made, 50)
        for op in (lambda: os.mkdir(os.path.join(self.mnt, "d")),
                   lambda: os.symlink("x", os.path.join(self.mnt, "l")),
                   lambda: os.mkfifo(os.path.join(self.mnt, "p"))):
            with self.assertRaises(OSError) as cm:
                op()
            self.assertEqual(cm.exception.errno, errno.ENOSPC)
        # a copy-up is a new upper inode too
        with self.assertRaises(OSError) as cm:
            with open(os.path.join(self.mnt, "base.txt"), "a") as f:
                f.write("more")
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        self.assertEqual(self.used()["disk_used_inodes"], 50)
        for i in range(10):
            os.unlink(os.path.join(self.mnt, "f%d" % i))
        self.assertEqual(self.used()["disk_used_inodes"], 40)
        os.mkdir(os.path.join(self.mnt, "d"))
        with open(os.path.join(self.mnt, "base.txt"), "a") as f:
            f.write("more")

    def test_quota_survives_remount_and_usage_is_recomputed(self):
        self.make("--disk-mb", "8", "--disk-inodes", "1000")
        with open(os.path.join(self.mnt, "a"), "wb") as f:
            f.write(b"a" * (3 * MiB + 1))
        os.mkdir(os.path.join(self.mnt, "dir"))
        os.link(os.path.join(self.mnt, "a"), os.path.join(self.mnt, "dir", "hard"))
        before = self.used()
        self.assertEqual(before["disk_used_bytes"], 3 * MiB + 4096 + 4096)
        self.assertEqual(before["disk_used_inodes"], 2)
        self.cowbox("umount", "q")
        self.mount(self.ref)
        after = self.used()
        self.assertEqual(after["disk_used_bytes"], before["disk_used_bytes"])
        self.assertEqual(after["disk_used_inodes"], before["disk_used_inodes"])
        with self.assertRaises(OSError) as cm:
            with open(os.path.join(self.mnt, "b"), "wb") as f:
                f.write(b"b" * (5 * MiB))
        self.assertEqual(cm.exception.errno, errno.ENOSPC)

    def test_zero_means_no_quota_and_passthrough_stays(self):
        self.make("--disk-mb", "0", "--disk-inodes", "0")
        lim = self.used()
        self.assertEqual(lim["disk_bytes"], 0)
        self.assertEqual(lim["disk_inodes"], 0)
        fs = self.cowbox_json("info", "q")["fs"]
        version = tuple(int(x) for x in fs["libfuse"].split(".")[:2])
        if version >= (3, 17) and os.environ.get("COWBOX_FUSE_PASSTHROUGH") != "0":
            self.assertTrue(fs["passthrough"], fs)
        with open(os.path.join(self.mnt, "big"), "wb") as f:
            f.write(b"x" * (12 * MiB))

    def test_rollback_past_the_quota_is_an_honest_enospc(self):
        # 10 MiB recorded while there was no quota, then an 8 MiB one (configure, before the
        # backend exists; the mount had passthrough): restoring it goes through the mount
        # and meets the quota, named, not as a silent success
        self.make("--disk-mb", "0")
        with open(os.path.join(self.mnt, "a"), "wb") as f:
            f.write(b"a" * (10 * MiB))
        t1 = self.cowbox_json("snapshot", "q")["turn"]
        os.unlink(os.path.join(self.mnt, "a"))
        self.cowbox_json("snapshot", "q")
        r = self.client(self.ref).request("configure", options={"backend": "ns",
                                                                "disk_mb": 8})
        self.assertNotIn("error", r)
        p = self.cowbox("rollback", "q", str(t1), check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        self.assertIn("No space left on device", p.stderr)
        self.assertIn("copy a (blob", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.mnt, "a")))
        self.assertLessEqual(self.used()["disk_used_bytes"], 8 * MiB)
        # the workspace keeps working
        with open(os.path.join(self.mnt, "c"), "w") as f:
            f.write("ok")
        self.cowbox_json("snapshot", "q")


if __name__ == "__main__":
    unittest.main()
