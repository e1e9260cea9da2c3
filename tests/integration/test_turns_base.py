"""Rollback gives the base back: undoing an rm -rf of base files, or an edit of one, drops the
whiteout or the copy from the upper layer instead of writing the base's bytes into it again,
so the upper layer (du) and the quota (info) return to what they held before; the tree is
byte for byte the turn's, and the snapshot after the rollback records exactly its map. A
file whose turn recorded other metadata than the base's (a time) gets a copy of its own."""

import os
import subprocess

from cbtest import CowboxTestCase
from turnutil import tree_state

MiB = 1 << 20


def du_kib(path):
    out = subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


class RollbackToBaseTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        # a 50 MB subtree (generated, incompressible), and a few small files around it
        files = {"README": "hello\n", "keep/k.txt": "k\n"}
        for d in range(5):
            for i in range(10):
                files["big/d%d/f%d.bin" % (d, i)] = None
        self.base = self.make_base({k: v for k, v in files.items() if v is not None})
        for path in files:
            if files[path] is None:
                full = os.path.join(self.base, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "wb") as f:
                    f.write(os.urandom(MiB))
        os.symlink("README", os.path.join(self.base, "big", "link"))
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.upper = os.path.join(self.ws_dir(self.ref), "upper")

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def used(self):
        return self.cowbox_json("info", "w")["limits"]["disk_used_bytes"]

    def assert_map_is(self, turn):
        """The snapshot the rollback recorded holds exactly turn's map: no event between."""
        latest = max(t["turn"] for t in self.cowbox_json("turns", "w")["turns"])
        events = self.cowbox_json("diff", "w", str(turn), str(latest))["events"]
        self.assertEqual(events, [], "turn %d vs %d" % (turn, latest))

    def test_rm_rf_of_a_base_subtree_undone_costs_no_upper(self):
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state, du_before, used_before = tree_state(self.mnt), du_kib(self.upper), self.used()
        subprocess.run(["rm", "-rf", self.p("big")], check=True)
        self.cowbox_json("snapshot", "w")
        self.assertFalse(os.path.exists(self.p("big")))

        r = self.cowbox_json("rollback", "w", str(t1))
        self.assertGreater(r["restored"], 0, r)
        self.assertEqual(tree_state(self.mnt), state)
        self.assertLessEqual(abs(du_kib(self.upper) - du_before), 1024,
                             (du_kib(self.upper), du_before))
        self.assertLessEqual(abs(self.used() - used_before), MiB, (self.used(), used_before))
        self.assert_map_is(t1)
        # what the kernel cached of the deleted names is forgotten: the files read back
        with open(self.p("big/d3/f7.bin"), "rb") as f, \
                open(os.path.join(self.base, "big/d3/f7.bin"), "rb") as g:
            self.assertEqual(f.read(), g.read())
        # and the tree stays writable where it was given back
        with open(self.p("big/d0/new"), "w") as f:
            f.write("new\n")
        self.cowbox_json("snapshot", "w")

    def test_unsnapshotted_rm_rf_and_a_recreated_directory(self):
        # rm -rf then mkdir of the same name (an opaque directory with a new file), and an
        # edited base file (a copy in upper), none of it snapshotted: the kept turn holds them
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state, du_before = tree_state(self.mnt), du_kib(self.upper)
        subprocess.run(["rm", "-rf", self.p("big")], check=True)
        os.makedirs(self.p("big/d1"))
        with open(self.p("big/d1/other"), "w") as f:
            f.write("other\n")
        with open(self.p("README"), "a") as f:
            f.write("edited\n")
        edited = tree_state(self.mnt)

        r = self.cowbox_json("rollback", "w", str(t1))
        self.assertGreater(r["kept_turn"], 0, r)
        self.assertEqual(tree_state(self.mnt), state)
        self.assertLessEqual(abs(du_kib(self.upper) - du_before), 1024)
        self.assert_map_is(t1)
        # the kept turn still gives every byte back
        self.cowbox_json("rollback", "w", str(r["kept_turn"]))
        self.assertEqual(tree_state(self.mnt), edited)
        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(tree_state(self.mnt), state)

    def test_a_recorded_time_gets_a_copy_of_its_own(self):
        # turn 1 recorded big/d2/f0.bin with the base's bytes but another time: given back
        # to the base it would show the base's time, so that one file is copied
        os.utime(self.p("big/d2/f0.bin"), ns=(1577836800 * 10**9, 1577836800 * 10**9 + 7))
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state = tree_state(self.mnt)
        subprocess.run(["rm", "-rf", self.p("big")], check=True)
        self.cowbox_json("snapshot", "w")

        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(tree_state(self.mnt), state)
        self.assertEqual(os.stat(self.p("big/d2/f0.bin")).st_mtime_ns, 1577836800 * 10**9 + 7)
        self.assertEqual(os.stat(self.p("big/d2/f1.bin")).st_mtime_ns,
                         os.stat(os.path.join(self.base, "big/d2/f1.bin")).st_mtime_ns)
        # one file's copy, not the subtree's
        self.assertLess(du_kib(self.upper), 4 * 1024)
        self.assert_map_is(t1)

    def test_an_open_copy_keeps_reading_its_own_bytes(self):
        # a program holds the edited copy open while the rollback gives the name back to the
        # base: it keeps its file, the name shows the base's
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        with open(self.p("README"), "w") as f:
            f.write("mine\n")
        self.cowbox_json("snapshot", "w")
        with open(self.p("README")) as held:
            self.cowbox_json("rollback", "w", str(t1))
            self.assertEqual(held.read(), "mine\n")
            with open(self.p("README")) as f:
                self.assertEqual(f.read(), "hello\n")
        self.assertFalse(os.path.exists(os.path.join(self.upper, "README")))
        self.assert_map_is(t1)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
