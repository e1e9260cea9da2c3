#!/usr/bin/env python3
"""Turns under races.

The turn boundary loses nothing: threads create, rewrite (distinct and shared files) and
delete files through the mount, each change acknowledged by close (some fsync'd first),
while snapshots run in a loop; every acknowledged change must be in the turn of the first
snapshot requested after it (so: in the turn of the snapshot running when it was acknowledged,
or in the next one). Times are taken so that a late thread switch can only make the check
laxer, never report a change that was not lost. The daemon holds each change for a few
milliseconds after its journal mark (COWBOX_TEST_FS_STALL_US) so that changes in flight
while a snapshot advances the turn are the rule, not a rare event. Prints its seed;
COWBOX_SEED=N replays the same choices.

A turn is a tree: a command in the sandbox swaps a directory and a symlink with
renameat2(RENAME_EXCHANGE) in a loop while it rewrites files under the directory, and
snapshots run in a loop meanwhile; every snapshot must succeed and every recorded turn must
have no entry below a path it records as something other than a directory.

A rollback that gives a base directory back (the daemon drops the upper layer's whiteout,
symlink or opaque directory there, cb_overlay_revert) acts on paths the sandbox swaps with a
symlink to a host directory meanwhile: the host directory is never touched, and the last
rollback leaves the turn's tree."""

import hashlib
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import unittest

from cbtest import COWBOX, CowboxTestCase

THREADS = 6
SECONDS = float(os.environ.get("COWBOX_FENCE_SECONDS", "8"))
STALL_US = 3000
EMPTY = hashlib.sha256(b"").hexdigest()


class Path:
    """One path's versions, in order: (sha256 or None for a delete, start, ack)."""

    def __init__(self, name):
        self.name, self.lock, self.versions, self.deleted = name, threading.Lock(), [], False


class FenceTest(CowboxTestCase):
    maxDiff = None

    def setUp(self):
        super().setUp()
        self.env["COWBOX_TEST_FS_STALL_US"] = str(STALL_US)
        self.ref = self.create(name="fence")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def writer(self, rng, idx, paths, shared, stop, errors):
        own = []
        n = 0
        try:
            while not stop.is_set():
                r = rng.random()
                if r < 0.35 or not own:
                    p = Path("t%d/f%d" % (idx, n))
                    n += 1
                    paths.append(p)
                    own.append(p)
                elif r < 0.45:
                    p = own.pop(rng.randrange(len(own)))
                    with p.lock:
                        start = time.monotonic()
                        os.unlink(os.path.join(self.mnt, p.name))
                        p.versions.append((None, start, time.monotonic()))
                        p.deleted = True
                    continue
                elif r < 0.75:
                    p = rng.choice(own)
                else:
                    p = rng.choice(shared)
                with p.lock:
                    v = len(p.versions) + 1
                    data = ("%s v%d by %d %d\n" % (p.name, v, idx, rng.randrange(1 << 30))
                            ).encode() * rng.randrange(1, 40)
                    start = time.monotonic()
                    fd = os.open(os.path.join(self.mnt, p.name),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        os.write(fd, data)
                        if rng.random() < 0.3:
                            os.fsync(fd)
                    finally:
                        os.close(fd)
                    p.versions.append((hashlib.sha256(data).hexdigest(), start,
                                       time.monotonic()))
        except Exception as e:  # reported by the main thread
            errors.append("writer %d: %r" % (idx, e))

    def test_every_acknowledged_change_is_in_its_turn_or_the_next(self):
        seed = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 30))
        print("COWBOX_SEED=%d" % seed, file=sys.stderr)
        for i in range(THREADS):
            os.mkdir(os.path.join(self.mnt, "t%d" % i))
        shared = [Path("shared%d" % k) for k in range(4)]
        paths = list(shared)
        stop, errors = threading.Event(), []
        threads = [threading.Thread(target=self.writer,
                                    args=(random.Random(seed * 100 + i), i, paths, shared,
                                          stop, errors))
                   for i in range(THREADS)]
        c = self.client(self.ref)
        c.sock.settimeout(120)
        snaps = []  # (turn, requested at, returned at, {path: sha256})

        def snapshot():
            requested = time.monotonic()
            reply = c.request("snapshot", files=True)
            self.assertTrue(reply.get("ok"), reply)
            snaps.append((reply["turn"], requested, time.monotonic(), reply["files"]))

        snapshot()
        for t in threads:
            t.start()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline and not errors:
            snapshot()
        stop.set()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        snapshot()  # nothing runs now: this one must equal the tree
        # each snapshot records the next turn, or, when nothing changed since the latest one,
        # answers that turn and its map (no new turn)
        for (t0, _, _, f0), (t1, _, _, f1) in zip(snaps, snaps[1:]):
            self.assertIn(t1 - t0, (0, 1))
            if t1 == t0:
                self.assertEqual(f1, f0)
        self.assertGreater(len(snaps), 2, "too few snapshots to race anything")

        def version(p, files, returned):
            """The version number of p that files hold (0: absent and never deleted), given
            the snapshot returned at returned: a delete or a truncating open that started
            after that cannot explain what the snapshot holds."""
            sha = files.get(p.name)
            if sha is None:
                return len(p.versions) if p.deleted and p.versions[-1][1] < returned else 0
            for i, (s, start, ack) in enumerate(p.versions):
                if s == sha:
                    return i + 1
            if sha == EMPTY:  # truncated by an open whose write was still to come
                started = [i + 1 for i, v in enumerate(p.versions) if v[1] < returned]
                return max(started, default=0) - 0.5
            return -1

        missed = []
        checked = 0
        for p in paths:
            for v, (sha, start, ack) in enumerate(p.versions, 1):
                # the first snapshot requested after the change was acknowledged
                k = next((i for i, s in enumerate(snaps) if s[1] > ack), None)
                self.assertIsNotNone(k, "the final snapshot came after every change")
                got = version(p, snaps[k][3], snaps[k][2])
                checked += 1
                if got < v:
                    t0 = snaps[0][1]
                    missed.append(
                        "%s v%d (%s) acknowledged before turn %d was asked for; it holds v%s"
                        " (versions: %s; turns: %s)" % (
                            p.name, v, "delete" if sha is None else sha[:12], snaps[k][0],
                            got, ["%.4f-%.4f" % (x[1] - t0, x[2] - t0) for x in p.versions],
                            ["%d %.4f-%.4f v%s" % (x[0], x[1] - t0, x[2] - t0,
                                                  version(p, x[3], x[2]))
                             for x in snaps[max(0, k - 3):k + 2]]))
        print("%d snapshots, %d acknowledged changes checked, %d paths" % (
            len(snaps), checked, len(paths)), file=sys.stderr)
        if missed:
            db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.ws_dir(self.ref),
                                                                 "meta.db"), uri=True)
            for p in paths:
                if any(m.startswith(p.name + " ") for m in missed):
                    missed.append("%s: journal %s; turn_delta %s" % (p.name, db.execute(
                        "SELECT turn, kind, subtree, time FROM journal WHERE path=? ORDER BY id",
                        (p.name,)).fetchall(), db.execute(
                        "SELECT turn, type, size FROM turn_delta WHERE path=? ORDER BY turn",
                        (p.name,)).fetchall()))
            db.close()
        self.assertEqual(missed, [], "seed %d" % seed)
        # the last turn is the tree
        live = {}
        for dirpath, _, names in os.walk(self.mnt):
            for name in names:
                full = os.path.join(dirpath, name)
                with open(full, "rb") as f:
                    live[os.path.relpath(full, self.mnt)] = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(snaps[-1][3], live, "seed %d" % seed)


RACER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
os.mkdir("d")
os.symlink("nowhere", "s")
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    if libc.renameat2(-100, b"d", -100, b"s", 2) != 0:
        sys.exit("renameat2: %s" % os.strerror(ctypes.get_errno()))
    for name in ("d/x", "d/y", "s/x"):
        try:
            with open(name, "w") as f:
                f.write("%d\n" % n)
        except OSError:
            pass  # through the symlink: nowhere
    n += 1
print(n)
"""

DIR = 2


class TreeRaceTest(CowboxTestCase):
    def turns_of(self, db):
        """{turn: {path: type}} for every recorded turn, rebuilt from the base's map (turn
        0) and turn_delta."""
        rows = db.execute("SELECT path, turn, type FROM turn_delta ORDER BY turn").fetchall()
        turns = [r[0] for r in db.execute("SELECT turn FROM turns ORDER BY turn")]
        state, out, i = dict(db.execute("SELECT path, type FROM base_map")), {}, 0
        for turn in turns:
            while i < len(rows) and rows[i][1] <= turn:
                path, _, typ = rows[i]
                if typ:
                    state[path] = typ
                else:
                    state.pop(path, None)
                i += 1
            out[turn] = dict(state)
        return out

    def not_a_tree(self, entries):
        bad = []
        for path in entries:
            parts = path.split("/")
            for k in range(1, len(parts)):
                parent = "/".join(parts[:k])
                if entries.get(parent) != DIR:
                    bad.append("%s under %s (%s)" % (path, parent, entries.get(parent)))
                    break
        return bad

    def test_snapshots_under_a_rename_exchange_race_are_trees(self):
        ref = self.create(name="tree")
        self.mount(ref)
        seconds = 6
        racer = subprocess.Popen([COWBOX, "exec", ref, "--", "python3", "-c", RACER,
                                  str(seconds)], env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        self.addCleanup(racer.kill)
        c = self.client(ref)
        c.sock.settimeout(120)
        failed, ok = [], 0
        while racer.poll() is None:
            reply = c.request("snapshot")
            if reply.get("ok"):
                ok += 1
            else:
                failed.append(reply)
        out, err = racer.communicate()
        self.assertEqual(racer.returncode, 0, err)
        reply = c.request("snapshot")
        self.assertTrue(reply.get("ok"), reply)
        print("%d snapshots during %s exchanges" % (ok, out.strip()), file=sys.stderr)
        # A file the racer rewrites without pause may never hold still for the ten reads a
        # hash gets: that snapshot says so (in_use, "still being written") and the next one
        # goes on; any other failure (a type change while read: "readlink: Invalid
        # argument") is a bug.
        other = [r for r in failed if r.get("error", {}).get("code") != "in_use" or
                 "still being written" not in r["error"].get("message", "")]
        self.assertEqual(other, [])
        self.assertGreater(ok, 3)
        self.assertLess(len(failed), ok, failed[:3])
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.ws_dir(ref), "meta.db"),
                             uri=True)
        self.addCleanup(db.close)
        for turn, entries in self.turns_of(db).items():
            self.assertEqual(self.not_a_tree(entries), [], "turn %d: %s" % (turn, entries))
        live = dict(db.execute("SELECT path, type FROM turn_map"))
        self.assertEqual(self.not_a_tree(live), [], "turn_map: %s" % live)


ROLLBACK_RACER = r"""
import ctypes, os, shutil, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir("/workspace")
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    # the base's directory d goes (a whiteout), comes back as a new one (opaque), and
    # swaps with a symlink to a host directory while rollbacks give d back
    try:
        if os.path.islink("d"):
            os.unlink("d")
        else:
            shutil.rmtree("d")
    except OSError:
        pass
    for make in (lambda: os.mkdir("d"), lambda: os.symlink(sys.argv[2], "s")):
        try:
            make()
        except OSError:
            pass
    for name in ("d/x", "d/new"):
        try:
            with open(name, "w") as f:
                f.write("%d\n" % n)
        except OSError:
            pass
    for _ in range(20):
        libc.renameat2(-100, b"d", -100, b"s", 2)
    n += 1
print(n)
"""


class RollbackRaceTest(CowboxTestCase):
    def test_giving_the_base_back_under_a_rename_exchange_race(self):
        base = self.make_base({"d/x": "base x\n", "d/y": "base y\n", "keep": "k\n"})
        victim = os.path.join(self.tmp, "victim")
        os.mkdir(victim)
        for name in ("x", "y", "new"):
            with open(os.path.join(victim, name), "w") as f:
                f.write("host %s\n" % name)
        ref = self.create(base, "rb")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        c = self.client(ref)
        c.sock.settimeout(120)
        t1 = c.request("snapshot")["turn"]
        seconds = 6
        racer = subprocess.Popen([COWBOX, "exec", ref, "--", "python3", "-c", ROLLBACK_RACER,
                                  str(seconds), victim], env=self.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(racer.kill)
        ok, failed = 0, []
        while racer.poll() is None:
            reply = c.request("rollback", turn=t1)
            if reply.get("ok"):
                ok += 1
            else:
                failed.append(reply)
        out, err = racer.communicate()
        self.assertEqual(racer.returncode, 0, err)
        print("%d rollbacks (%d failed: %s) during %s rounds" %
              (ok, len(failed), [f["error"]["message"] for f in failed], out.strip()), file=sys.stderr)
        # the host directory behind the symlink: as it was, nothing added, nothing marked
        self.assertEqual(sorted(os.listdir(victim)), ["new", "x", "y"])
        for name in ("x", "y", "new"):
            with open(os.path.join(victim, name)) as f:
                self.assertEqual(f.read(), "host %s\n" % name)
        self.assertNotIn("trusted.overlay.opaque", os.listxattr(victim))
        # the last rollback leaves the turn's tree, and records a tree
        reply = c.request("rollback", turn=t1)
        self.assertTrue(reply.get("ok"), reply)
        live = {}
        for dirpath, dirs, names in os.walk(mnt):
            for name in dirs + names:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, mnt)
                if os.path.islink(full) or not os.path.isfile(full):
                    live[rel] = "symlink" if os.path.islink(full) else "dir"
                else:
                    with open(full) as f:
                        live[rel] = f.read()
        self.assertEqual(live, {"d": "dir", "d/x": "base x\n", "d/y": "base y\n",
                                "keep": "k\n"})
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.ws_dir(ref), "meta.db"),
                             uri=True)
        self.addCleanup(db.close)
        tree = TreeRaceTest("test_snapshots_under_a_rename_exchange_race_are_trees")
        for turn, entries in tree.turns_of(db).items():
            self.assertEqual(tree.not_a_tree(entries), [], "turn %d: %s" % (turn, entries))


if __name__ == "__main__":
    unittest.main(verbosity=2)
