"""The persistent home against the host's disk (issue 30, 2 and 8): under a disk quota
/home/cowbox is a filesystem of its own capped at the quota (home.img on a loop device), so a
sandbox cannot fill the host's disk through it; df inside shows the cap, info says it, what is
written there survives a daemon restart, an older plain home's files are carried in, rm
leaves no mount, and /proc/self/mountinfo inside names no host path behind the home."""

import json
import os
import signal

from cbtest import CowboxTestCase, wait_for


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(path)]


class HomeQuotaTest(CowboxTestCase):

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the home's own filesystem is mounted by the root daemon")
        super().setUp()
        self.ref = self.cowbox("create", "--disk-mb", "16").stdout.strip()

    def sh(self, script, check=True):
        return self.cowbox("exec", self.ref, "--", "sh", "-c", script, check=check)

    def restart(self):
        pid = self.daemon_pid(self.ref)
        if pid:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not self.daemon_pid(self.ref), 20, what="the daemon to stop")

    def test_home_is_capped_and_df_shows_it(self):
        p = self.sh("dd if=/dev/zero of=/home/cowbox/big bs=1M count=64 2>&1; "
                    "echo status=$?; df -P -k /home/cowbox | tail -1", check=False)
        self.assertIn("No space left on device", p.stdout)
        self.assertIn("status=1", p.stdout)
        size_kib = int(p.stdout.strip().splitlines()[-1].split()[1])
        self.assertLessEqual(size_kib, 16 * 1024, p.stdout)
        self.assertGreater(size_kib, 8 * 1024, p.stdout)
        # what the host's disk holds for it: the image, at most the cap
        img = os.path.join(self.ws_dir(self.ref), "home.img")
        self.assertLessEqual(os.stat(img).st_blocks * 512, 16 << 20)
        info = json.loads(self.cowbox("info", self.ref, "--json").stdout)
        self.assertEqual(info["limits"]["home_bytes"], 16 << 20)
        self.assertIn("home cap:    16.0 MiB", self.cowbox("info", self.ref).stdout)

    def test_home_persists_across_restarts_and_rm_leaves_no_mount(self):
        self.sh("echo kept > ~/note")
        self.restart()
        home = os.path.join(os.path.realpath(self.ws_dir(self.ref)), "home")
        self.assertEqual(mounts_under(home), [], "a stopped daemon leaves its home mounted")
        self.assertEqual(self.sh("cat ~/note").stdout, "kept\n")
        self.assertNotEqual(mounts_under(home), [])
        self.cowbox("rm", self.ref)
        self.assertEqual(mounts_under(home), [])

    def test_a_killed_daemons_home_is_reused_then_removed_with_the_workspace(self):
        self.sh("echo kept > ~/note")
        home = os.path.join(os.path.realpath(self.ws_dir(self.ref)), "home")
        pid = self.daemon_pid(self.ref)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.daemon_pid(self.ref), 20, what="the daemon to die")
        self.assertEqual(len(mounts_under(home)), 1)
        # the next daemon finds it mounted and uses it (no second mount on top)
        self.assertEqual(self.sh("cat ~/note").stdout, "kept\n")
        self.assertEqual(len(mounts_under(home)), 1)
        pid = self.daemon_pid(self.ref)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.daemon_pid(self.ref), 20, what="the daemon to die")
        self.cowbox("rm", self.ref)
        self.assertEqual(mounts_under(home), [])
        self.assertFalse(os.path.exists(self.ws_dir(self.ref)))

    def test_an_older_plain_home_is_carried_in(self):
        other = self.cowbox("create", "--disk-mb", "16").stdout.strip()
        home = os.path.join(self.ws_dir(other), "home")
        os.makedirs(os.path.join(home, ".cache"))
        with open(os.path.join(home, ".cache", "old"), "w") as f:
            f.write("from before\n")
        p = self.cowbox("exec", other, "--", "cat", "/home/cowbox/.cache/old")
        self.assertEqual(p.stdout, "from before\n")
        self.assertFalse(os.path.exists(os.path.join(self.ws_dir(other), "home.old")))

    def test_mountinfo_names_no_host_path_behind_the_home(self):
        p = self.sh("cat /proc/self/mountinfo")
        home_line = [line for line in p.stdout.splitlines() if " /home/cowbox " in line]
        self.assertEqual(len(home_line), 1, p.stdout)
        self.assertNotIn(self.tmp, p.stdout)
        self.assertNotIn(os.path.realpath(self.tmp), p.stdout)


if __name__ == "__main__":
    import unittest
    unittest.main()
