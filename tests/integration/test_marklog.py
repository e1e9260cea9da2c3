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
import threading
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

    def test_kill9_amid_background_folds_loses_no_answered_create(self):
        # Long names: about 250 bytes a mark, so the log passes 1 MiB every ~4,000 creates and
        # the folder rotates and folds it while the creates go on; the kill lands amid that.
        first = self.cowbox_json("snapshot", self.ref)
        d = os.path.join(self.mnt, "storm")
        os.mkdir(d)
        answered = []
        stop = threading.Event()

        def create():
            try:
                for i in range(40000):
                    if stop.is_set():
                        return
                    name = "%05d-%s" % (i, "x" * 200)
                    os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY, 0o644))
                    answered.append(name)
            except OSError:
                pass  # the daemon is gone: this create was never answered

        t = threading.Thread(target=create)
        t.start()
        deadline = time.monotonic() + 120
        while len(answered) < 9000 + self.rng.randrange(2000) and t.is_alive():
            self.assertLess(time.monotonic(), deadline, "the creates are too slow")
            time.sleep(0.01)
        # kill while a rotated log is there (being folded) if that comes soon enough
        while (not os.path.exists(self.marks + ".fold") and len(answered) < 16000
               and t.is_alive() and time.monotonic() < deadline):
            time.sleep(0.0005)
        rotated = os.path.exists(self.marks + ".fold")
        self.kill9()
        stop.set()
        t.join(30)
        self.assertFalse(t.is_alive())
        sys.stderr.write("test_marklog: killed after %d creates (a fold in flight: %s)\n"
                         % (len(answered), rotated))
        self.pid = self.mount(self.ref)
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertFalse(os.path.exists(self.marks + ".fold"), "folded at the remount")
        got = {p for p in snap["files"] if p.startswith("storm/")}
        missing = {"storm/" + n for n in answered} - got
        self.assertEqual(missing, set(), "answered creates missing from the snapshot")
        rows = [r for r in self.log(self.ref) if r["turn"] == first["turn"] + 1]
        paths = [(r["path"], r["kind"]) for r in rows]
        self.assertEqual(len(paths), len(set(paths)), "a mark twice in the journal")

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
