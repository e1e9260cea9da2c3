"""The journal's mark log across a kill -9 of the daemon: every change answered before the
kill is in the next snapshot after the remount (the log is replayed as the workspace opens),
and a torn or foreign tail appended to the log while unmounted is reported and dropped,
never applied, while the whole records before it are kept.

COWBOX_SEED replays a run (the seed is printed)."""

import os
import random
import signal
import struct
import sys
import time
import unittest

from cbtest import CowboxTestCase, reap_children
from turnutil import expected_events, files_of, tree_state

SEED = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 31))


def fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def record(path, turn=1, kind=1):
    """One mark log record as db/marklog.c writes it (host byte order: little endian here)."""
    p = path.encode()
    body = struct.pack("<qdiBBHB", turn, time.time(), 1, kind, 0, len(p), 0) + p
    return struct.pack("<IIQ", 0x314D4243, len(body), fnv1a64(body)) + body


class TestMarkLog(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.rng = random.Random(SEED)
        sys.stderr.write("\ntest_marklog: COWBOX_SEED=%d\n" % SEED)
        files = {"src/f%03d.txt" % i: "base %d\n" % i for i in range(300)}
        self.ref = self.create(base=self.make_base(files), name="m")
        self.pid = self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.marks = os.path.join(self.ws_dir(self.ref), "meta.db-marks")

    def kill9(self):
        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            reap_children()
            if not os.path.exists("/proc/%d" % self.pid) and not self.daemon_pid(self.ref):
                return
            time.sleep(0.02)
        self.fail("the daemon is still there after kill -9")

    def churn(self, n):
        """n changes of every kind the journal records, each answered before the next."""
        m = self.mnt
        names = sorted(os.listdir(os.path.join(m, "src")))
        os.makedirs(os.path.join(m, "new", "deep"), exist_ok=True)
        for i in range(n):
            op = self.rng.randrange(7)
            victim = os.path.join(m, "src", self.rng.choice(names))
            if op == 0 or not os.path.exists(victim):
                with open(os.path.join(m, "new", "deep", "c%05d" % i), "w") as f:
                    f.write("created %d\n" % i)
            elif op == 1:
                with open(victim, "a") as f:
                    f.write("appended %d\n" % i)
            elif op == 2:
                os.chmod(victim, 0o600 if i % 2 else 0o640)
            elif op == 3:
                os.unlink(victim)
            elif op == 4:
                os.rename(victim, os.path.join(m, "new", "r%05d" % i))
            elif op == 5:
                os.truncate(victim, 2)
            else:
                os.symlink("src/f000.txt", os.path.join(m, "new", "l%05d" % i))

    def test_every_answered_change_is_in_the_next_snapshot_after_kill9(self):
        first = self.cowbox_json("snapshot", self.ref)
        before = tree_state(self.mnt)
        self.churn(1500)
        after = tree_state(self.mnt)
        self.assertGreater(os.path.getsize(self.marks), 0, "the marks are in the log")
        self.kill9()
        self.pid = self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(tree_state(self.mnt), after)
        self.assertEqual(snap["files"], files_of(after), "seed %d" % SEED)
        events = {e["path"]: e["event"] for e in self.cowbox_json(
            "diff", self.ref, str(first["turn"]), str(snap["turn"]))["events"]}
        want = expected_events(before, after)
        self.assertEqual({p: k for p, k in events.items() if p in want}, want,
                         "seed %d" % SEED)
        self.assertEqual(os.path.getsize(self.marks), 0, "folded before the snapshot")

    def test_torn_tail_is_dropped_and_the_marks_before_it_kept(self):
        first = self.cowbox_json("snapshot", self.ref)
        before = tree_state(self.mnt)
        self.churn(200)
        after = tree_state(self.mnt)
        self.kill9()
        kept = os.path.getsize(self.marks)
        self.assertGreater(kept, 0)
        foreign = record("never-applied", turn=first["turn"] + 1)
        with open(self.marks, "ab") as f:
            f.write(foreign[:-3])  # a write torn by the crash
            f.write(foreign)  # a whole record after it: never trusted
        mount = self.cowbox("mount", self.ref, "--json")
        self.pid = self.daemon_pid(self.ref)
        with open(os.path.join(self.ws_dir(self.ref), "daemon.log"), errors="replace") as f:
            said = mount.stderr + f.read()
        self.assertIn("dropped %d bytes at offset %d" % (2 * len(foreign) - 3, kept), said)
        self.assertIn("meta.db-marks", said)
        rows = self.log(self.ref)
        self.assertEqual([r for r in rows if r["path"] == "never-applied"], [])
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["files"], files_of(after), "seed %d" % SEED)
        events = {e["path"]: e["event"] for e in self.cowbox_json(
            "diff", self.ref, str(first["turn"]), str(snap["turn"]))["events"]}
        want = expected_events(before, after)
        self.assertEqual({p: k for p, k in events.items() if p in want}, want,
                         "seed %d" % SEED)


if __name__ == "__main__":
    unittest.main()
