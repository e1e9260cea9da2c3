"""fsck and logical damage: a mark log with a flipped byte, journal and turn rows deleted behind
cowbox's back. Each fault is injected by hand into a real workspace (real FUSE, real SQLite);
fsck must name it and never exit 0 over it, and the repair (or the next mount) must leave the
next snapshot recording the tree as it is, losing no good turn."""

import errno
import json
import os
import random
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import unittest

from cbtest import COWBOX, CowboxTestCase, pid_alive, reap_children, wait_for
from turnutil import files_of, tree_state

SEED = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 31))


def record_starts(data):
    """Offsets of the records of a mark log (db/marklog.c: magic, body length, checksum)."""
    starts, off = [], 0
    while off + 16 <= len(data):
        _magic, body = struct.unpack_from("<II", data, off)
        starts.append(off)
        off += 16 + body
    return starts


class MarkLogDamageTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.rng = random.Random(SEED)
        sys.stderr.write("\ntest_fsck_logical: COWBOX_SEED=%d\n" % SEED)
        self.ref = self.create(self.make_base({"src/keep.txt": "base\n"}), "m")
        self.pid = self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.marks = os.path.join(self.ws_dir(self.ref), "meta.db-marks")
        self.cowbox_json("snapshot", self.ref)

    def kill9(self):
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            reap_children()
            if not os.path.exists("/proc/%d" % self.pid) and not self.daemon_pid(self.ref):
                return
            time.sleep(0.02)
        self.fail("the daemon is still there after kill -9")

    def damage_log(self):
        """41 new files after the last turn, the daemon killed with its marks only in the
        log, then one byte in the middle of the log flipped. Returns (tree, first bad offset)."""
        os.makedirs(os.path.join(self.mnt, "out"))
        for i in range(41):
            with open(os.path.join(self.mnt, "out", "f%02d.txt" % i), "w") as f:
                f.write("file %d\n" % i)
        after = tree_state(self.mnt)
        self.kill9()
        with open(self.marks, "rb") as f:
            data = bytearray(f.read())
        starts = record_starts(bytes(data))
        self.assertGreater(len(starts), 40, "the marks are in the log")
        at = self.rng.randrange(len(data) // 3, 2 * len(data) // 3)
        data[at] ^= 1 << self.rng.randrange(8)
        with open(self.marks, "wb") as f:
            f.write(data)
        first_bad = max(s for s in starts if s <= at)
        return after, first_bad

    def test_flipped_byte_is_named_by_fsck_and_the_next_mount_journals_the_tree(self):
        after, bad = self.damage_log()
        proc = self.cowbox("fsck", self.ref, check=False)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("PROBLEM marks", proc.stdout)
        self.assertIn("meta.db-marks", proc.stdout)
        self.assertIn("at offset %d" % bad, proc.stdout)
        # still a problem on a second look: fsck never forgets it by itself
        self.assertEqual(self.cowbox("fsck", self.ref, check=False).returncode, 1)
        self.pid = self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after), "seed %d" % SEED)
        self.assertEqual(tree_state(self.mnt), after)
        # the loss was made good by the mount, and fsck still says so until --repair
        proc = self.cowbox("fsck", self.ref, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("journaled since", proc.stdout)
        rep = self.cowbox_json("fsck", self.ref, "--repair")
        self.assertTrue(rep["ok"], rep)
        self.assertEqual([p["kind"] for p in rep["problems"]], ["marks"])
        self.assertTrue(rep["problems"][0]["repaired"])
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])

    def test_fsck_repair_journals_what_the_lost_marks_held(self):
        after, bad = self.damage_log()
        # deleted after the last turn with no whiteout: only the map knows the path
        rep = self.cowbox_json("fsck", self.ref, "--repair")
        self.assertTrue(rep["ok"], rep)
        marks = [p for p in rep["problems"] if p["kind"] == "marks"]
        self.assertEqual(len(marks), 1, rep)
        self.assertTrue(marks[0]["repaired"])
        self.assertIn("offset %d" % bad, marks[0]["detail"])
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])
        self.pid = self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after), "seed %d" % SEED)

    def test_a_path_deleted_with_no_whiteout_is_found_by_the_map(self):
        with open(os.path.join(self.mnt, "made.txt"), "w") as f:
            f.write("made in turn 2\n")
        os.makedirs(os.path.join(self.mnt, "gone", "deep"))
        with open(os.path.join(self.mnt, "gone", "deep", "x"), "w") as f:
            f.write("x\n")
        self.cowbox_json("snapshot", self.ref)
        os.unlink(os.path.join(self.mnt, "made.txt"))
        import shutil
        shutil.rmtree(os.path.join(self.mnt, "gone"))
        after, _bad = self.damage_log()
        # the damage may have hit any record: make sure the deletes' own marks are lost too
        with open(self.marks, "r+b") as f:
            f.seek(0)
            f.write(b"\xff")
        self.pid = self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after), "seed %d" % SEED)
        self.assertNotIn("made.txt", snap["files"])
        self.assertNotIn("gone/deep/x", snap["files"])


class JournalRowsTest(CowboxTestCase):
    """Rows deleted from `journal` and `turn_delta` with SQLite behind cowbox's back."""

    def fsck_json(self, *args):
        """fsck --json, which exits 1 while a problem is left."""
        proc = self.cowbox("fsck", self.ref, *args, "--json", check=False)
        rep = json.loads(proc.stdout)
        self.assertEqual(proc.returncode, 0 if rep["ok"] else 1)
        return rep

    def setUp(self):
        super().setUp()
        self.ref = self.create(self.make_base({"src/a.txt": "base a\n",
                                               "src/b.txt": "base b\n"}), "j")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.db = os.path.join(self.ws_dir(self.ref), "meta.db")

    def write(self, rel, text):
        path = os.path.join(self.mnt, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def sql(self, query, *args):
        con = sqlite3.connect(self.db)
        try:
            n = con.execute(query, args).rowcount
            con.commit()
        finally:
            con.close()
        return n

    def test_deleted_journal_rows_are_found_and_journaled_again(self):
        self.cowbox_json("snapshot", self.ref)
        self.write("new/kept.txt", "kept\n")
        self.write("new/lost.txt", "lost\n")
        self.write("src/a.txt", "changed a\n")
        os.unlink(os.path.join(self.mnt, "src", "b.txt"))
        after = tree_state(self.mnt)
        self.cowbox("umount", self.ref)  # the log folded into the table
        # the new directory's own row too: a new directory is walked whole by the snapshot
        self.assertGreaterEqual(self.sql(
            "DELETE FROM journal WHERE path IN ('new', 'new/lost.txt', 'src/a.txt', "
            "'src/b.txt')"), 4)
        proc = self.cowbox("fsck", self.ref, check=False)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        rep = self.fsck_json()
        self.assertFalse(rep["ok"])
        found = {p["path"] for p in rep["problems"] if p["kind"] == "journal"}
        self.assertEqual(found, {"new", "new/lost.txt", "src/a.txt", "src/b.txt"}, rep)
        rep = self.cowbox_json("fsck", self.ref, "--repair")
        self.assertTrue(rep["ok"], rep)
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])
        self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after))

    def test_deleted_journal_rows_are_found_while_mounted(self):
        self.cowbox_json("snapshot", self.ref)
        self.write("x/one.txt", "one\n")
        self.write("x/two.txt", "two\n")
        after = tree_state(self.mnt)
        self.cowbox("umount", self.ref)  # folded, so the rows are in the table
        self.assertGreaterEqual(self.sql("DELETE FROM journal WHERE path IN ('x', 'x/two.txt')"),
                                2)
        self.mount(self.ref)
        rep = self.cowbox_json("fsck", self.ref, "--repair")
        self.assertEqual([(p["kind"], p["path"], p["repaired"]) for p in rep["problems"]],
                         [("journal", "x", True), ("journal", "x/two.txt", True)], rep)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after))

    def test_deleted_turn_rows_are_named_with_their_turn(self):
        self.write("t1.txt", "one\n")
        self.cowbox_json("snapshot", self.ref)
        self.write("t2.txt", "two\n")
        self.cowbox_json("snapshot", self.ref)
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])
        self.assertEqual(self.sql("DELETE FROM turn_delta WHERE turn = 1 AND path = 't1.txt'"),
                         1)
        proc = self.cowbox("fsck", self.ref, check=False)
        self.assertEqual(proc.returncode, 1, proc.stdout)
        self.assertIn("PROBLEM turn_rows: turn 1 recorded", proc.stdout)
        rep = self.fsck_json("--repair")
        self.assertFalse(rep["ok"], "lost turn rows cannot be made up")
        rows = [p for p in rep["problems"] if p["kind"] == "turn_rows"]
        self.assertEqual([(p["first_turn"], p["last_turn"]) for p in rows], [(1, -1)])

    def test_a_busy_clean_workspace_is_clean(self):
        self.cowbox_json("snapshot", self.ref)
        for i in range(30):
            self.write("d%d/f%d.txt" % (i % 3, i), "x" * i)
        os.unlink(os.path.join(self.mnt, "src", "a.txt"))
        os.rename(os.path.join(self.mnt, "d0"), os.path.join(self.mnt, "moved"))
        os.chmod(os.path.join(self.mnt, "src", "b.txt"), 0o600)
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])
        self.cowbox_json("snapshot", self.ref)
        self.write("moved/again.txt", "again\n")
        self.cowbox("umount", self.ref)
        self.assertTrue(self.cowbox_json("fsck", self.ref)["ok"])


class ApplyTempTest(CowboxTestCase):
    """`apply` killed with -9 while it writes a file: its temporary file, named for its
    origin, is removed by fsck or by the daemon's next start, never left in the folder."""

    def setUp(self):
        super().setUp()
        self.ref = self.create(self.make_base({"a.txt": "a\n"}), "ap")
        self.pid = self.mount(self.ref)
        mnt = self.mountpoint(self.ref)
        chunk = os.urandom(1 << 20)
        for i in range(6):
            with open(os.path.join(mnt, "big%d.bin" % i), "wb") as f:
                for _ in range(24):
                    f.write(chunk)
        self.dst = tempfile.mkdtemp(prefix="dst-", dir=self.tmp)
        with open(os.path.join(self.dst, "a.txt"), "w") as f:
            f.write("a\n")
        with open(os.path.join(self.dst, "mine.txt"), "w") as f:
            f.write("the user's own file\n")

    def temps(self):
        return [n for n in os.listdir(self.dst) if ".cowbox-apply" in n]

    def kill_apply_midway(self):
        proc = subprocess.Popen([COWBOX, "apply", self.ref, "--to", self.dst], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(proc.wait)
        deadline = time.monotonic() + 60
        while not self.temps():
            self.assertLess(time.monotonic(), deadline, "apply made no temporary file")
            self.assertIsNone(proc.poll(), "apply ended before a temporary file was seen")
            time.sleep(0.001)
        os.kill(self.pid, signal.SIGKILL)
        proc.wait(60)
        wait_for(lambda: not pid_alive(self.pid), what="the killed daemon gone")
        reap_children()
        left = self.temps()
        self.assertEqual(len(left), 1, left)
        self.assertRegex(left[0], r"^big\d\.bin\.cowbox-apply-%s$" % self.ref)
        return left[0]

    def test_fsck_removes_a_killed_applys_temporary_file(self):
        left = self.kill_apply_midway()
        rep = json.loads(self.cowbox("fsck", self.ref, "--json").stdout)
        self.assertTrue(rep["ok"], rep)
        self.assertEqual([(p["kind"], p["path"], p["repaired"]) for p in rep["problems"]],
                         [("apply_temp", os.path.join(self.dst, left), True)])
        self.assertEqual(self.temps(), [])
        with open(os.path.join(self.dst, "mine.txt")) as f:
            self.assertEqual(f.read(), "the user's own file\n")
        self.assertEqual(json.loads(self.cowbox("fsck", self.ref, "--json").stdout)["problems"],
                         [])

    def test_the_daemons_next_start_removes_it(self):
        self.kill_apply_midway()
        self.pid = self.mount(self.ref)
        self.assertEqual(self.temps(), [])
        with open(os.path.join(self.ws_dir(self.ref), "daemon.log")) as f:
            self.assertIn("removed 1 temporary file of an apply that was killed", f.read())
        self.cowbox_json("apply", self.ref, "--to", self.dst)
        self.assertEqual(self.temps(), [])
        self.assertEqual(sorted(os.listdir(self.dst)),
                         ["a.txt"] + ["big%d.bin" % i for i in range(6)] + ["mine.txt"])


class StagingSweepTest(CowboxTestCase):
    """A fork's staging directory (workspaces/.unpublished-PID-REF) whose daemon was killed:
    swept by every command that opens COWBOX_HOME, also while the killed daemon is still a
    zombie (its parent has not waited for it: kill(pid, 0) still succeeds), and named by
    fsck. One whose builder is alive stays."""

    def zombie(self):
        p = subprocess.Popen(["true"])
        self.addCleanup(p.wait)
        wait_for(lambda: open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()[0]
                 == "Z", what="a zombie")
        return p.pid

    def staging(self, pid):
        d = os.path.join(self.home, "workspaces",
                         ".unpublished-%d-cb-%s" % (pid, os.urandom(16).hex()))
        os.makedirs(os.path.join(d, "upper", "src"))
        with open(os.path.join(d, "upper", "src", "big"), "wb") as f:
            f.write(os.urandom(1 << 20))
        return d

    def test_dead_builders_staging_is_swept_and_named(self):
        ref = self.create(name="s")
        other = self.create(name="t")
        live = self.staging(os.getpid())
        gone = subprocess.Popen(["true"])
        gone.wait()
        dead = self.staging(gone.pid)
        zombie = self.staging(self.zombie())
        rep = json.loads(self.cowbox("fsck", ref, "--json").stdout)
        self.assertTrue(rep["ok"], rep)
        self.assertEqual(sorted((p["kind"], p["path"], p["repaired"]) for p in rep["problems"]),
                         sorted([("staging", dead, True), ("staging", zombie, True)]))
        self.assertFalse(os.path.exists(dead))
        self.assertFalse(os.path.exists(zombie))
        self.assertTrue(os.path.exists(live), "a live builder's staging stays")
        for args in (["create"], ["info", ref], ["ls"], ["rm", other]):
            with self.subTest(args=args):
                left = self.staging(self.zombie())
                self.cowbox(*args)
                self.assertFalse(os.path.exists(left), args)
        self.assertTrue(os.path.exists(live))


class MetaDbPagesTest(CowboxTestCase):
    """meta.db with a damaged page (the last leaf of turn_delta, which holds turn 3's rows):
    fsck names it, every open that reads it says to run fsck --repair, and --repair keeps
    turns 1 and 2 exactly, names turn 3 as lost, and the next snapshot records the tree."""

    def test_damaged_page_is_named_and_repair_keeps_the_good_turns(self):
        ref = self.create(self.make_base({"keep.txt": "base\n"}), "p")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        states = {}
        for turn, d in ((1, "a"), (2, "b"), (3, "z")):
            os.makedirs(os.path.join(mnt, d))
            for i in range(150):
                with open(os.path.join(mnt, d, "file-with-a-longer-name-%03d.txt" % i),
                          "w") as f:
                    f.write("%s %d\n" % (d, i))
            self.assertEqual(self.cowbox_json("snapshot", ref)["turn"], turn)
            states[turn] = files_of(tree_state(mnt))
        self.cowbox("umount", ref)
        db = os.path.join(self.ws_dir(ref), "meta.db")
        con = sqlite3.connect(db)
        leaves = [r[0] for r in con.execute(
            "SELECT pageno FROM dbstat WHERE name = 'turn_delta' AND pagetype = 'leaf' "
            "ORDER BY path DESC")]
        page = con.execute("PRAGMA page_size").fetchone()[0]
        con.close()
        self.assertGreater(len(leaves), 3, "turn_delta spans pages")
        with open(db, "r+b") as f:
            f.seek((leaves[0] - 1) * page)
            f.write(b"\xff" * 64)
        proc = self.cowbox("fsck", ref, check=False)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("PROBLEM meta.db", proc.stdout)
        self.assertIn("damaged", proc.stdout)
        proc = self.cowbox("diff", ref, "2", "3", check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("run `cowbox fsck --repair %s`" % ref, proc.stderr)
        self.cowbox("umount", ref, check=False)  # diff may have started the daemon
        proc = self.cowbox("fsck", ref, "--repair", "--json", check=False)
        rep = json.loads(proc.stdout)
        self.assertEqual(proc.returncode, 1, "turn 3 is lost: not all repaired: " + proc.stdout)
        meta = [p for p in rep["problems"] if p["kind"] == "meta.db"]
        self.assertEqual(len(meta), 1, rep)
        self.assertIn("turns 1-2 kept", meta[0]["detail"])
        self.assertIn("turn 3 could not be recovered", meta[0]["detail"])
        self.assertEqual(meta[0]["first_turn"], 3)
        self.mount(ref)
        snap = self.cowbox_json("snapshot", ref)
        self.assertEqual(snap["files"], states[3])
        for turn in (1, 2):
            self.cowbox("rollback", ref, turn)
            self.assertEqual(files_of(tree_state(mnt)), states[turn], "turn %d" % turn)
        self.cowbox("rollback", ref, snap["turn"])
        self.assertEqual(files_of(tree_state(mnt)), states[3])


class QuotaAccountingTest(CowboxTestCase):
    """The disk quota counts extended attributes (names and values), and a resize past the
    upper filesystem's largest file is EFBIG, as the filesystem says, not the quota's ENOSPC.
    The quota as the mount counts it, where the upper layer cannot be its own filesystem."""

    def setUp(self):
        super().setUp()
        self.env["COWBOX_UPPER_IMAGE"] = "0"
        self.ref = self.cowbox("create", "--base", self.make_base({"a.txt": "a\n"}), "--name",
                               "q", "--disk-mb", "4").stdout.strip()
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def used(self):
        return self.cowbox_json("info", self.ref)["limits"]["disk_used_bytes"]

    def test_xattrs_count_toward_the_quota(self):
        value = b"v" * 3000
        name = "user.big"
        before = self.used()
        made = 0
        with self.assertRaises(OSError) as cm:
            for i in range(1600):  # 4.8 MB of values against a 4 MiB quota
                path = os.path.join(self.mnt, "x%04d" % i)
                open(path, "w").close()
                os.setxattr(path, name, value)
                made += 1
        self.assertEqual(cm.exception.errno, errno.ENOSPC)
        cost = len(name) + len(value)
        self.assertLessEqual(made * cost, 4 << 20)
        self.assertGreater(made * cost, (4 << 20) - 2 * cost)
        used = self.used()
        self.assertGreaterEqual(used - before, made * cost)
        # removing gives it back, replacing costs only the difference
        for i in range(10):
            os.removexattr(os.path.join(self.mnt, "x%04d" % i), name)
        self.assertEqual(self.used(), used - 10 * cost)
        os.setxattr(os.path.join(self.mnt, "x%04d" % 20), name, b"w" * 1000)
        self.assertEqual(self.used(), used - 10 * cost - 2000)
        # deleting a file, or renaming another over it, gives its xattrs back
        now = self.used()
        os.unlink(os.path.join(self.mnt, "x%04d" % 30))
        os.rename(os.path.join(self.mnt, "x%04d" % 5), os.path.join(self.mnt, "x%04d" % 31))
        self.assertEqual(self.used(), now - 2 * cost)
        os.mkdir(os.path.join(self.mnt, "d"))
        os.setxattr(os.path.join(self.mnt, "d"), name, value)
        os.rmdir(os.path.join(self.mnt, "d"))
        self.assertEqual(self.used(), now - 2 * cost)
        # the count at the next mount (a walk of upper/) sees the same bytes
        now = self.used()
        self.cowbox("umount", self.ref)
        self.mount(self.ref)
        self.assertEqual(self.used(), now)

    def test_base_xattrs_count_once_copied_up(self):
        value = b"b" * 3000
        base = self.make_base({"f.txt": "f\n", "d/in.txt": "i\n"})
        for rel in ("f.txt", "d"):
            os.setxattr(os.path.join(base, rel), "user.big", value)
        ref = self.cowbox("create", "--base", base, "--name", "qb", "--disk-mb", "4").stdout
        ref = ref.strip()
        self.mount(ref)
        mnt = self.mountpoint(ref)

        def used():
            return self.cowbox_json("info", ref)["limits"]["disk_used_bytes"]

        before = used()
        os.chmod(os.path.join(mnt, "f.txt"), 0o600)  # a copy-up of the file
        with open(os.path.join(mnt, "d", "new.txt"), "w"):  # of its directory
            pass
        now = used()
        self.assertGreaterEqual(now - before, 2 * (len("user.big") + len(value)))
        # the count the next mount's walk makes is the same: nothing was left out
        self.cowbox("umount", ref)
        self.mount(ref)
        self.assertEqual(used(), now)

    def test_truncate_past_the_largest_file_is_efbig(self):
        path = os.path.join(self.mnt, "far")
        open(path, "w").close()
        with self.assertRaises(OSError) as cm:
            os.truncate(path, 1 << 62)
        self.assertEqual(cm.exception.errno, errno.EFBIG)
        # within the filesystem's largest size, the quota still says ENOSPC
        with self.assertRaises(OSError) as cm:
            os.truncate(path, 1 << 40)
        self.assertEqual(cm.exception.errno, errno.ENOSPC)


if __name__ == "__main__":
    unittest.main()
