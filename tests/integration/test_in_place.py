"""In-place workspaces (`cowbox create --in-place DIR`, LiteLLM's sandbox.local(path)): the
mount's upper layer is DIR itself, so the agent's edits land there; DIR is turn 0 (its files
kept as blobs), every change is journaled, and snapshot, diff and rollback work on DIR. A
kill -9 keeps the journal's promise, a sandbox racing symlinks never makes the daemon write
outside DIR, changes made to DIR behind the mount's back are found, and rm leaves DIR."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import cbtest
from cbtest import COWBOX, SWAP_LOOP, CowboxTestCase, wait_for
from turnutil import files_of, tree_state


class InPlaceTest(CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.folder = self.make_base({"keep.txt": "keep\n", "edit.txt": "old\n",
                                      "sub/gone.txt": "bye\n", "sub/deep/x.txt": "x\n"})
        os.symlink("keep.txt", os.path.join(self.folder, "link"))
        os.chmod(os.path.join(self.folder, "edit.txt"), 0o640)
        self.before = tree_state(self.folder)
        self.ref = self.cowbox("create", "--in-place", self.folder, "--name", "ip").stdout.strip()

    def sh(self, script, check=True):
        return self.cowbox("exec", self.ref, "--", "sh", "-c", script, check=check)

    def snapshot(self):
        c = self.client(self.ref)
        try:
            reply = c.request("snapshot", files=True)
        finally:
            c.close()
        self.assertTrue(reply.get("ok"), reply)
        return reply

    def events(self, a, b):
        out = json.loads(self.cowbox("diff", self.ref, str(a), str(b), "--json").stdout)
        return {e["path"]: (e["event"], e.get("old", {}).get("sha256"),
                            e.get("new", {}).get("sha256")) for e in out["events"]}

    def test_create_records_the_folder_and_info_says_in_place(self):
        info = json.loads(self.cowbox("info", "ip", "--json").stdout)
        self.assertTrue(info["in_place"])
        self.assertEqual(info["base"], os.path.realpath(self.folder))
        self.assertIn("mode:        in place", self.cowbox("info", "ip").stdout)
        # Every file of turn 0 is kept as a blob before anything can change it.
        self.assertEqual(info["blob_count"], 4)
        self.mount(self.ref)
        self.assertEqual(files_of(tree_state(self.mountpoint(self.ref))), files_of(self.before))

    def test_edits_land_snapshot_diff_and_rollback(self):
        self.mount(self.ref)
        self.sh("echo new > edit.txt; rm sub/gone.txt; echo hi > made.txt; mkdir -p n/m; "
                "echo z > n/m/z.txt; rm -r sub/deep; ln -sf made.txt link")
        now = tree_state(self.folder)
        self.assertEqual(now, tree_state(self.mountpoint(self.ref)))
        self.assertEqual(open_text(self.folder, "edit.txt"), "new\n")
        self.assertFalse(os.path.exists(os.path.join(self.folder, "sub/gone.txt")))
        reply = self.snapshot()
        self.assertEqual(reply["files"], files_of(now))
        ev = self.events(0, reply["turn"])
        self.assertEqual(ev["edit.txt"], ("modified", self.before["edit.txt"][2],
                                          now["edit.txt"][2]))
        self.assertEqual(ev["sub/gone.txt"], ("deleted", self.before["sub/gone.txt"][2], None))
        self.assertEqual(ev["made.txt"], ("created", None, now["made.txt"][2]))
        self.assertEqual(ev["n/m/z.txt"][0], "created")
        self.assertEqual(ev["sub/deep/x.txt"][0], "deleted")
        self.assertEqual(ev["link"][0], "modified")
        # Rollback writes the old bytes back into the folder: the edit undone, the deleted
        # files back, the new ones gone, modes and the symlink as they were.
        self.cowbox("rollback", self.ref, "0")
        self.assertEqual(tree_state(self.folder), self.before)
        # ... and forward again to the turn after the edits.
        self.cowbox("rollback", self.ref, str(reply["turn"]))
        self.assertEqual(tree_state(self.folder), now)
        fsck = json.loads(self.cowbox("fsck", self.ref, "--json").stdout)
        self.assertEqual(fsck["problems"], [])
        # Turn 0's bytes live only in blobs: a prune keeps them, and turn 0 still restores.
        self.cowbox("prune", self.ref, "--keep", "1")
        self.cowbox("rollback", self.ref, "0")
        self.assertEqual(tree_state(self.folder), self.before)

    def test_changes_behind_the_mounts_back_are_found(self):
        self.mount(self.ref)
        self.sh("echo one > edit.txt")
        self.snapshot()
        self.cowbox("umount", self.ref)
        # The user edits the folder while nothing is mounted: the next mount looks.
        with open(os.path.join(self.folder, "keep.txt"), "w") as f:
            f.write("edited by hand\n")
        os.unlink(os.path.join(self.folder, "sub/gone.txt"))
        self.mount(self.ref)
        reply = self.snapshot()
        self.assertEqual(reply["files"], files_of(tree_state(self.folder)))
        # ... and while it is mounted: the watch on the folder makes the snapshot look.
        with open(os.path.join(self.folder, "sub/deep/x.txt"), "w") as f:
            f.write("edited while mounted\n")
        time.sleep(0.2)
        reply = self.snapshot()
        self.assertEqual(reply["files"], files_of(tree_state(self.folder)))
        self.assertEqual(self.events(reply["turn"] - 1, reply["turn"])["sub/deep/x.txt"][0],
                         "modified")

    def test_start_look_racing_the_mounts_own_changes_credits_their_writer(self):
        # In place the folder is the upper layer, so the look at start (which runs while
        # the mount already serves) sees the mount's own new files as changed: they were
        # marked under their writer before they were made, and are not marked again as
        # "(base)" (a mark that would credit the change to no one).
        self.env["COWBOX_TEST_START_LOOK_STALL"] = "1.0"
        try:
            self.mount(self.ref)
        finally:
            del self.env["COWBOX_TEST_START_LOOK_STALL"]
        mnt = self.mountpoint(self.ref)
        for i in range(5):
            with open(os.path.join(mnt, "early%d.txt" % i), "w") as f:
                f.write("before the look\n")
        log = os.path.join(self.ws_dir(self.ref), "daemon.log")
        wait_for(lambda: "base check (start)" in open(log).read(), 20, interval=0.1,
                 what="the start's look")
        rows = json.loads(self.cowbox("log", self.ref, "--json").stdout)
        for i in range(5):
            mine = [r for r in rows if r["path"] == "early%d.txt" % i]
            self.assertTrue(mine, rows)
            self.assertEqual({r["pid"] for r in mine}, {os.getpid()}, mine)

    def test_kill_9_mid_turn_keeps_the_journal_promise(self):
        pid = self.mount(self.ref)
        mnt = self.mountpoint(self.ref)
        # Changes acknowledged by close() (some fsync'ed) through the mount, then kill -9.
        for i in range(20):
            with open(os.path.join(mnt, "w%02d.txt" % i), "w") as f:
                f.write("v%d\n" % i)
                if i % 5 == 0:
                    f.flush()
                    os.fsync(f.fileno())
        os.unlink(os.path.join(mnt, "keep.txt"))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cbtest.pid_alive(pid), 10, what="the daemon to die")
        # Each change was in the journal before it was answered, under its writer's pid.
        rows = json.loads(self.cowbox("log", self.ref, "--json").stdout)
        marked = {r["path"]: r["pid"] for r in rows}
        for i in range(20):
            self.assertEqual(marked.get("w%02d.txt" % i), os.getpid())
        self.assertEqual(marked.get("keep.txt"), os.getpid())
        self.mount(self.ref)
        reply = self.snapshot()
        state = tree_state(self.folder)
        self.assertEqual(reply["files"], files_of(state))
        self.assertEqual(sum(1 for p in state if p.startswith("w")), 20)
        self.cowbox("rollback", self.ref, "0")
        self.assertEqual(tree_state(self.folder), self.before)

    def test_symlink_race_during_rollback_stays_inside(self):
        outside = os.path.join(self.tmp, "outside")
        os.mkdir(outside)
        with open(os.path.join(outside, "secret"), "w") as f:
            f.write("host\n")
        want = tree_state(outside)
        self.mount(self.ref)
        self.sh("mkdir d; for i in 0 1 2 3 4 5 6 7; do echo $i > d/f$i; done; "
                "ln -s %s x" % outside)
        turn = self.snapshot()["turn"]
        self.sh("rm -r d; mkdir d; echo later > d/f0")
        # The sandbox swaps d and x (a symlink to the host's outside/) while the rollbacks
        # restore d's files.
        racer = subprocess.Popen(
            [COWBOX, "exec", self.ref, "--", "python3", "-c", SWAP_LOOP, outside, "4",
             "/workspace"], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.addCleanup(racer.kill)
        self.assertEqual(racer.stdout.readline().strip(), "ready")
        tries = 0
        while racer.poll() is None:
            # A rollback may fail (a path changed type under it, naming it); it never
            # writes through the symlink.
            self.cowbox("rollback", self.ref, str(turn), check=False)
            tries += 1
            self.assertEqual(tree_state(outside), want)
        out, err = racer.communicate()
        self.assertEqual(racer.returncode, 0, err)
        print("%d rollbacks during %s" % (tries, out.strip()), file=sys.stderr)
        self.assertGreater(tries, 1)
        self.assertEqual(tree_state(outside), want)
        self.cowbox("rollback", self.ref, str(turn))
        self.assertEqual(os.readlink(os.path.join(self.folder, "x")), outside)
        self.assertEqual(sorted(os.listdir(os.path.join(self.folder, "d"))),
                         ["f%d" % i for i in range(8)])
        self.assertEqual(tree_state(outside), want)

    def test_files_keep_the_folders_owner(self):
        # The sandbox's root is the folder's owner: what it makes or rolls back in the
        # user's folder stays the user's, not an id of the sandbox's host range.
        for dirpath, dirs, files in os.walk(self.folder):
            for name in [dirpath] + [os.path.join(dirpath, f) for f in files]:
                os.lchown(name, 1234, 1235)
        self.mount(self.ref)
        r = self.sh("echo hi > made.txt; mkdir m; echo x > edit.txt; stat -c '%u:%g' made.txt "
                    "keep.txt")
        self.assertEqual(r.stdout.split(), ["0:0", "0:0"])
        for name in ("made.txt", "m", "edit.txt"):
            st = os.lstat(os.path.join(self.folder, name))
            self.assertEqual((st.st_uid, st.st_gid), (1234, 1235), name)
        self.snapshot()
        self.cowbox("rollback", self.ref, "0")
        for name in ("edit.txt", "sub/gone.txt"):
            st = os.lstat(os.path.join(self.folder, name))
            self.assertEqual((st.st_uid, st.st_gid), (1234, 1235), name)
        # No set-id bit for an owner outside the sandbox's range.
        self.sh("chmod u+s,g+s edit.txt")
        self.assertFalse(os.stat(os.path.join(self.folder, "edit.txt")).st_mode & 0o6000)

    def test_lost_database_is_rebuilt_in_place(self):
        # fsck --repair of a lost meta.db: still in place, turn 0 the folder as it is now.
        self.mount(self.ref)
        self.sh("echo new > edit.txt")
        self.snapshot()
        self.cowbox("umount", self.ref)
        now = tree_state(self.folder)
        os.unlink(os.path.join(self.ws_dir(self.ref), "meta.db"))
        self.assertIn("rebuilt as an in-place workspace",
                      self.cowbox("fsck", self.ref, "--repair").stdout)
        self.assertTrue(json.loads(self.cowbox("info", self.ref, "--json").stdout)["in_place"])
        self.mount(self.ref)
        self.sh("echo again > edit.txt; echo more > more.txt")
        self.assertEqual(open_text(self.folder, "edit.txt"), "again\n")
        self.snapshot()
        self.cowbox("rollback", self.ref, "0")
        self.assertEqual(tree_state(self.folder), now)

    def test_rm_leaves_the_folder(self):
        self.mount(self.ref)
        self.sh("echo new > edit.txt; echo hi > made.txt")
        self.snapshot()
        now = tree_state(self.folder)
        self.cowbox("rm", self.ref)
        self.assertFalse(os.path.exists(self.ws_dir(self.ref)))
        self.assertEqual(tree_state(self.folder), now)

    def test_refusals(self):
        self.assert_fails(["create", "--in-place", "/"], "refusing /")
        self.assert_fails(["create", "--in-place", self.tmp], "holds cowbox's own state")
        os.makedirs(os.path.join(self.home, "x"))
        self.assert_fails(["create", "--in-place", os.path.join(self.home, "x")],
                          "is inside cowbox's own state")
        self.assert_fails(["create", "--in-place", self.folder, "--base", self.folder],
                          "exclude each other", status=2)
        self.assert_fails(["create", "--in-place", self.folder],
                          "is already the folder of workspace %s (ip)" % self.ref)
        # Another sandbox may not write the folder past its mount, nor bind a path in it that
        # the folder's own sandbox could swap for a symlink (issue 30, 1: read-only too).
        self.assert_fails(["create", "--volume", "%s/sub:/data:rw" % self.folder],
                          "an in-place folder")
        self.assert_fails(["create", "--volume", "%s/sub:/data:ro" % self.folder],
                          "an in-place folder")
        self.mount(self.ref)
        self.snapshot()
        # The folder is the live tree: apply onto it, or a fork over it, makes no sense.
        self.assert_fails(["apply", self.ref, "--turn", "1"], "in place")
        self.assert_fails(["fork", self.ref, "1", "--name", "f"], "in place")
        other = os.path.join(self.tmp, "copy")
        os.mkdir(other)
        shutil.copy(os.path.join(self.folder, "keep.txt"), other)
        self.cowbox("apply", self.ref, "--turn", "1", "--to", other)


def open_text(root, name):
    with open(os.path.join(root, name)) as f:
        return f.read()




if __name__ == "__main__":
    import unittest
    unittest.main()
