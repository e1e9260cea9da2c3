"""A volume's host path against a sandbox that can write one of its parents (issue 30, 1).

Workspace A (the attacker) has a read-write volume of a host folder; workspace B has a volume
of a directory inside that folder. A's sandbox swaps the volume's parent for a symlink to
another host directory, once and then in a rename-exchange loop: no command of B, before or
after its daemon restarts, may see that other directory (each is refused, or sees the real
volume). A volume inside a read-write volume of its own workspace, or in an in-place folder,
is refused when given."""

import os
import signal
import subprocess
import time

from cbtest import COWBOX, SWAP_LOOP, CowboxTestCase, wait_for

REAL, EVIL = "real volume\n", "EVIL host dir\n"


class VolumeSwapTest(CowboxTestCase):

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the attacker's volume needs the root daemon's sandbox")
        super().setUp()
        self.shared = os.path.join(self.tmp, "shared")  # A's read-write volume
        os.makedirs(os.path.join(self.shared, "d", "vol"))
        with open(os.path.join(self.shared, "d", "vol", "f"), "w") as f:
            f.write(REAL)
        # writable by the sandbox's ids (a user namespace's range of host ids)
        for d in (self.shared, os.path.join(self.shared, "d")):
            os.chmod(d, 0o777)
        self.evil = os.path.join(self.tmp, "evil")  # what the swap points at
        os.makedirs(os.path.join(self.evil, "vol"))
        with open(os.path.join(self.evil, "vol", "f"), "w") as f:
            f.write(EVIL)
        self.a = self.cowbox("create", "--name", "a", "--volume",
                             self.shared + ":/data:rw").stdout.strip()
        self.b = self.cowbox("create", "--name", "b", "--volume",
                             os.path.join(self.shared, "d", "vol") + ":/vol").stdout.strip()

    def read_b(self):
        return self.cowbox("exec", self.b, "--", "cat", "/vol/f", check=False)

    def restart_b(self):
        pid = self.daemon_pid(self.b)
        if pid:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not self.daemon_pid(self.b), 20, what="b's daemon to stop")

    def test_parent_swapped_for_symlink_is_refused_also_after_restart(self):
        self.assertEqual(self.read_b().stdout, REAL)
        # A's sandbox puts a symlink to the other host directory in the parent's place.
        self.cowbox("exec", self.a, "--", "sh", "-c",
                    "mv /data/d /data/d.real && ln -s %s /data/d" % self.evil)
        for when in ("next command", "after a daemon restart"):
            p = self.read_b()
            self.assertNotIn("EVIL", p.stdout + p.stderr, when)
            self.assertNotEqual(p.returncode, 0, when)
            self.assertIn("volume /vol", p.stderr, when)
            self.restart_b()
        # cowbox exec REF in the CLI's own process (join) is refused the same way
        p = self.cowbox("exec", self.b, "--", "ls", "/vol", check=False)
        self.assertNotEqual(p.returncode, 0)
        # Put back, the volume works again: the refusal was the path, not the workspace.
        self.cowbox("exec", self.a, "--", "sh", "-c", "rm /data/d && mv /data/d.real /data/d")
        self.assertEqual(self.read_b().stdout, REAL)

    def test_another_directory_in_its_place_is_refused(self):
        # Not a symlink: a directory of A's own, with the same name, replaces the volume.
        self.cowbox("exec", self.a, "--", "sh", "-c",
                    "mv /data/d/vol /data/d/old && mkdir /data/d/vol && "
                    "echo EVIL > /data/d/vol/f")
        p = self.read_b()
        self.assertNotIn("EVIL", p.stdout)
        self.assertIn("no longer the directory it named", p.stderr)

    def test_rename_exchange_race_never_shows_the_other_directory(self):
        # A's sandbox swaps /data/d (the volume's parent) with a symlink to evil/ in a loop
        # while B starts commands; each must be refused or see the real volume.
        # scripts/soak-volume-swap runs this for minutes
        seconds = float(os.environ.get("COWBOX_VOLUME_RACE_SECONDS", "5"))
        loop = subprocess.Popen(
            [COWBOX, "exec", self.a, "--timeout", str(int(seconds) + 60), "--", "python3",
             "-c", SWAP_LOOP, self.evil, str(seconds + 1), "/data"], env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(loop.stdout.readline().strip(), "ready")
            seen = {"real": 0, "refused": 0}
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                p = self.read_b()
                self.assertNotIn("EVIL", p.stdout + p.stderr)
                if p.returncode == 0:
                    self.assertEqual(p.stdout, REAL)
                    seen["real"] += 1
                else:
                    seen["refused"] += 1
            out, err = loop.communicate(timeout=60)
        finally:
            if loop.poll() is None:
                loop.kill()
                loop.wait()
        self.assertIn("swaps", out, err)
        self.assertGreater(int(out.split()[-1]), 100, "the loop swapped")
        self.assertGreater(seen["real"] + seen["refused"], 3, seen)
        print("race: %s, %s" % (seen, out.strip()))

    def test_nested_and_in_place_volumes_are_refused(self):
        inner = os.path.join(self.shared, "d")
        self.assert_fails(["create", "--volume", self.shared + ":/data:rw", "--volume",
                           inner + ":/inner"], "read-write volume")
        self.assert_fails(["create", "--volume", inner + ":/inner", "--volume",
                           self.shared + ":/data:rw"], "read-write volume")
        folder = self.make_base({"sub/x": "x\n"})
        self.cowbox("create", "--in-place", folder, "--name", "ip")
        self.assert_fails(["create", "--volume", os.path.join(folder, "sub") + ":/s"],
                          "an in-place folder")
        # an in-place workspace's volume of its own subfolder
        own = self.make_base({"sub/y": "y\n"})
        self.assert_fails(["create", "--in-place", own, "--volume",
                           os.path.join(own, "sub") + ":/s"], "an in-place folder")
        # two read-only volumes may nest: neither is written
        self.cowbox("create", "--volume", self.shared + ":/data", "--volume",
                    inner + ":/inner")


if __name__ == "__main__":
    import unittest
    unittest.main()
