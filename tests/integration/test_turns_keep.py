"""Nothing unrecorded is lost by a rollback: the open turn's changes (edits, deletes, renames,
a new directory) become a turn of their own first, and rolling back to it gives back every
byte; an empty open turn records nothing."""

import os
import unittest

import cbtest  # noqa: E402
from cbtest import CowboxTestCase
from turnutil import tree_state


class KeepOpenTurnTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base({"README": "hello\n", "src/a.c": "int a;\n",
                                    "src/b.c": "int b;\n", "docs/x.md": "x\n",
                                    "docs/deep/y.md": "y\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def read(self, rel):
        with open(self.p(rel)) as f:
            return f.read()

    def labels(self):
        return {t["turn"]: t["label"] for t in self.cowbox_json("turns", "w")["turns"]}

    def test_rollback_keeps_every_unsnapshotted_change(self):
        with open(self.p("src/a.c"), "w") as f:
            f.write("int a = 1;\n")
        self.cowbox_json("snapshot", "w")  # turn 1
        at_turn1 = tree_state(self.mnt)
        # after the last snapshot: an edit, a delete, a rename, a new directory with files,
        # a mode change, a directory deleted whole, a symlink
        with open(self.p("README"), "a") as f:
            f.write("edited after the snapshot\n")
        os.unlink(self.p("src/b.c"))
        os.rename(self.p("src/a.c"), self.p("src/renamed.c"))
        os.makedirs(self.p("new/dir"))
        with open(self.p("new/dir/f.bin"), "wb") as f:
            f.write(os.urandom(300000))
        os.chmod(self.p("docs/x.md"), 0o600)
        os.unlink(self.p("docs/deep/y.md"))
        os.rmdir(self.p("docs/deep"))
        os.symlink("../README", self.p("new/link"))
        before = tree_state(self.mnt)
        self.assertNotEqual(before, at_turn1)

        r = self.cowbox_json("rollback", "w", "1")
        self.assertEqual(r["kept_turn"], 2, r)
        self.assertEqual(r["turn"], 3, r)
        self.assertEqual(tree_state(self.mnt), at_turn1)
        labels = self.labels()
        self.assertEqual(labels[2], "before rollback to 1")
        self.assertEqual(labels[3], "rollback to 1")

        # the kept turn gives back every byte (sha256 of every file), mode and target
        r = self.cowbox_json("rollback", "w", "2")
        self.assertEqual(r["kept_turn"], 0, r)  # nothing changed since the rollback's turn
        self.assertEqual(tree_state(self.mnt), before)
        self.assertEqual(tree_state(self.mnt)["new/dir/f.bin"], before["new/dir/f.bin"])

    def test_empty_open_turn_records_nothing(self):
        with open(self.p("README"), "w") as f:
            f.write("changed\n")
        self.cowbox_json("snapshot", "w")  # turn 1
        self.cowbox_json("snapshot", "w")  # turn 2
        r = self.cowbox_json("rollback", "w", "0")
        self.assertEqual(r["kept_turn"], 0, r)
        self.assertEqual(r["turn"], 3, r)
        self.assertNotIn("before rollback to 0", self.labels().values())
        self.assertEqual(self.read("README"), "hello\n")

    def test_cli_names_the_kept_turn_and_first_rollback_keeps_too(self):
        # no snapshot at all yet: the open turn 1 is kept as turn 1 before rolling back to 0
        with open(self.p("src/new.c"), "w") as f:
            f.write("int n;\n")
        out = self.cowbox("rollback", "w", "0").stdout
        self.assertIn("kept as turn 1", out)
        self.assertFalse(os.path.exists(self.p("src/new.c")))
        self.cowbox("rollback", "w", "1")
        self.assertEqual(self.read("src/new.c"), "int n;\n")


if __name__ == "__main__":
    unittest.main()
