"""Faults in the data cowbox keeps: damaged or missing blobs, a base changed behind cowbox's
back, a damaged meta.db, a full disk, huge sparse files and out-of-range requests. Each must
fail naming what is wrong (or give the right bytes), never report success over wrong bytes.
Random choices are seeded: COWBOX_SEED=N replays a run."""

import errno
import hashlib
import os
import re
import random
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest

from cbtest import CowboxTestCase, fuse_mounts, wait_for

SEED = int(os.environ.get("COWBOX_SEED", str(int(time.time()) % 100000)))
print("test_faults_data: COWBOX_SEED=%d" % SEED, flush=True)


def blob_holding(blob_dir, data):
    """The name of the blob whose bytes are data (blobs are named by xxh3, not computable
    here without xxhash)."""
    for name in os.listdir(blob_dir):
        path = os.path.join(blob_dir, name)
        if len(name) == 32 and os.path.getsize(path) == len(data):
            with open(path, "rb") as f:
                if f.read() == data:
                    return name
    raise AssertionError("no blob holds %r" % data[:40])


def damage(path, how, rng):
    """Damage the file at path: truncated, bit_flipped, emptied or missing."""
    if how == "missing":
        os.unlink(path)
        return
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if how == "truncated":
        data = data[:rng.randrange(1, len(data))]
    elif how == "bit_flipped":
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
    elif how == "emptied":
        data = b""
    os.chmod(path, 0o644)
    with open(path, "wb") as f:
        f.write(data)


class BlobCase(CowboxTestCase):
    """A workspace "w" over a small base, mounted, with helpers to write and read it."""

    def setUp(self):
        super().setUp()
        self.rng = random.Random(SEED)
        self.base = self.make_base({"a.txt": "base a\n", "keep.txt": "kept\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.blobs = os.path.join(self.ws_dir(self.ref), "blobs")

    def put(self, rel, data):
        with open(os.path.join(self.mnt, rel), "wb") as f:
            f.write(data)

    def get(self, rel, root=None):
        with open(os.path.join(root or self.mnt, rel), "rb") as f:
            return f.read()

    def two_turns(self):
        """Turn 1 has a.txt = one (a blob); turn 2 has a.txt = two."""
        one = b"turn one content " * (1 + self.rng.randrange(4000))
        self.put("a.txt", one)
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        self.put("a.txt", b"turn two\n")
        self.cowbox_json("snapshot", "w")
        return t1, one


class BlobFaultsTest(BlobCase):
    def test_damaged_blob_fails_rollback_and_fork_naming_it(self):
        # each kind of damage once per round (COWBOX_FAULT_ROUNDS; the soak runs 100)
        kinds = []
        for _ in range(int(os.environ.get("COWBOX_FAULT_ROUNDS", "1"))):
            kinds += self.rng.sample(["truncated", "bit_flipped", "emptied", "missing"], 4)
        for n, how in enumerate(kinds):
            with self.subTest(how=how, n=n):
                t1, one = self.two_turns()
                blob = blob_holding(self.blobs, one)
                damage(os.path.join(self.blobs, blob), how, self.rng)
                proc = self.cowbox("rollback", "w", str(t1), check=False)
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn("a.txt", proc.stderr)
                self.assertIn(blob, proc.stderr)
                # nothing half-restored: the live file is untouched
                self.assertEqual(self.get("a.txt"), b"turn two\n")
                self.assertFalse([n for n in os.listdir(self.mnt) if "cowbox-rollback" in n])
                proc = self.cowbox("fork", "w", str(t1), "--name", "f%d" % n, check=False)
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn("a.txt", proc.stderr)
                self.assertIn(blob, proc.stderr)
                # a good turn still restores
                self.cowbox("rollback", "w", "0")
                self.assertEqual(self.get("a.txt"), b"base a\n")
                # put a good copy back for the next round (the same bytes make the same blob)
                path = os.path.join(self.blobs, blob)
                if os.path.exists(path):
                    os.unlink(path)

    def test_snapshot_after_rollback_records_what_is_there(self):
        t1, one = self.two_turns()
        self.cowbox("rollback", "w", str(t1))
        self.assertEqual(self.get("a.txt"), one)
        snap = self.cowbox_json("snapshot", "w")
        import hashlib
        self.assertEqual(snap["files"]["a.txt"], hashlib.sha256(one).hexdigest())

    def test_base_replaced_behind_our_back_is_noticed(self):
        # turn 1 changes only keep.txt; a.txt stays the base's
        self.put("keep.txt", b"agent\n")
        self.cowbox_json("snapshot", "w")
        self.put("a.txt", b"agent a\n")
        self.cowbox_json("snapshot", "w")
        self.cowbox("umount", "w")
        # same name, size and mtime; a new inode (and new bytes)
        path = os.path.join(self.base, "a.txt")
        st = os.stat(path)
        os.unlink(path)
        with open(path, "w") as f:
            f.write("BASE A\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.assertEqual(os.path.getsize(path), st.st_size)
        self.mount(self.ref)

        def noticed():
            with open(os.path.join(self.ws_dir(self.ref), "daemon.log")) as f:
                log = f.read()
            log = log[log.rfind("serving"):]
            # a.txt is hidden by the agent's own a.txt: rehashed, nothing to record
            return "1 files rehashed, 0 paths changed" in log
        wait_for(noticed, what="the base check to rehash a.txt")
        # turn 1's a.txt was the old base content, which nothing holds any more
        proc = self.cowbox("rollback", "w", "1", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("a.txt", proc.stderr)
        self.assertEqual(self.get("a.txt"), b"agent a\n")

    def test_base_rewritten_in_place_with_old_mtime_is_not_trusted(self):
        self.put("a.txt", b"agent a\n")
        self.cowbox_json("snapshot", "w")
        # same inode, same size, mtime put back: only ctime says it changed
        path = os.path.join(self.base, "a.txt")
        st = os.stat(path)
        with open(path, "r+") as f:
            f.write("BASE A\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.assertEqual(os.stat(path).st_ino, st.st_ino)
        proc = self.cowbox("rollback", "w", "0", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("a.txt", proc.stderr)
        self.assertEqual(self.get("a.txt"), b"agent a\n")


def tree_sha256(root):
    """{path: SHA-256} of every regular file below root (what sha256sum of the tree says)."""
    import hashlib
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


class BaseWatchTest(CowboxTestCase):
    """A base changed behind cowbox's back (modified with its stat put back, replaced,
    added, deleted) is noticed on mount and before a rollback or fork, recorded truthfully
    by the next snapshot, and never restored under an old hash."""

    def setUp(self):
        super().setUp()
        self.maxDiff = None
        self.rng = random.Random(SEED)
        files = {"d/f%02d.txt" % i: "base file %d\n" % i for i in range(12)}
        files.update({"same.txt": "x" * 32, "gone.txt": "to be deleted\n",
                      "old/x.txt": "old dir\n", "hidden.txt": "base hidden\n"})
        self.base = self.make_base(files)
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def snap(self):
        return self.cowbox_json("snapshot", "w")

    def rewrite_in_place(self, rng):
        """Rewrite a base file in place with its size and mtime put back (only ctime moves);
        its path."""
        name = "d/f%02d.txt" % rng.randrange(12)
        p = os.path.join(self.base, name)
        st = os.stat(p)
        with open(p) as f:
            data = f.read()
        with open(p, "r+") as f:
            f.write(data.upper())
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        return name

    def change_base(self, rng):
        """Change the base in every way at once; returns {path: event} that the next
        snapshot must record and the bytes now at each changed file."""
        b = self.base
        # same name, size and mtime, new inode and new bytes
        p = os.path.join(b, "same.txt")
        st = os.stat(p)
        os.unlink(p)
        with open(p, "w") as f:
            f.write("y" * 32)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        name = self.rewrite_in_place(rng)
        os.unlink(os.path.join(b, "gone.txt"))
        shutil.rmtree(os.path.join(b, "old"))
        os.makedirs(os.path.join(b, "new"))
        with open(os.path.join(b, "new", "n.txt"), "w") as f:
            f.write("added behind our back\n")
        # the agent's own hidden.txt hides this one: nothing to record for it
        with open(os.path.join(b, "hidden.txt"), "w") as f:
            f.write("base changed under the agent's file\n")
        return {"same.txt": "modified", name: "modified", "gone.txt": "deleted",
                "old/x.txt": "deleted", "old": "deleted", "new": "created",
                "new/n.txt": "created"}

    def test_base_changed_while_unmounted_is_recorded_by_the_next_snapshot(self):
        with open(os.path.join(self.mnt, "hidden.txt"), "w") as f:
            f.write("agent\n")
        t1 = self.snap()["turn"]
        self.cowbox("umount", "w")
        want = self.change_base(self.rng)
        self.mount(self.ref)
        snap = self.snap()
        t2 = snap["turn"]
        self.assertEqual(snap["files"], tree_sha256(self.mnt))
        events = {e["path"]: e["event"] for e in
                  self.cowbox_json("diff", "w", str(t1), str(t2))["events"]}
        self.assertEqual(events, want)
        # unchanged after that: the next start stats, rehashes nothing, records nothing (the
        # snapshot finds no change: no new turn, turn t2 and its map are the answer)
        self.cowbox("umount", "w")
        self.mount(self.ref)
        snap = self.snap()
        self.assertEqual((snap["turn"], snap["files"]), (t2, tree_sha256(self.mnt)))
        # turn 1 had the old base bytes, which nothing holds: refused, naming a path, and
        # nothing restored under the old hash
        before = tree_sha256(self.mnt)
        proc = self.cowbox("rollback", "w", str(t1), check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertTrue(any(p in proc.stderr for p in want), proc.stderr)
        self.assertEqual(tree_sha256(self.mnt), before)
        proc = self.cowbox("fork", "w", str(t1), "--name", "f1", check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertTrue(any(p in proc.stderr for p in want), proc.stderr)
        # the NAME column (a temporary path in the table may hold "f1" too)
        names = [line.split()[1] for line in self.cowbox("ls").stdout.splitlines()[1:]]
        self.assertNotIn("f1", names)
        # the turn that noticed the change still restores and forks exactly
        self.cowbox("rollback", "w", str(t2))
        self.assertEqual(tree_sha256(self.mnt), snap["files"])
        ref = self.cowbox("fork", "w", str(t2), "--name", "f2").stdout.split()[0]
        self.mount("f2")
        self.assertEqual(tree_sha256(self.mountpoint(ref)), snap["files"])

    def test_old_base_bytes_held_by_a_blob_are_restored(self):
        # the agent copied same.txt elsewhere: a blob holds the old base bytes
        old = self.get_bytes("same.txt")
        with open(os.path.join(self.mnt, "copy.txt"), "wb") as f:
            f.write(old)
        t1 = self.snap()["turn"]
        self.cowbox("umount", "w")
        self.change_base(self.rng)
        self.mount(self.ref)
        self.snap()
        self.assertNotEqual(self.get_bytes("same.txt"), old)
        # rollback of turn 1 cannot bring back the other old files...
        proc = self.cowbox("rollback", "w", str(t1), check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        # ... until the other changed paths are back in the base (unmounted: the overlay
        # looks up a base changed under a live mount as it can); same.txt's old bytes come
        # from their blob
        self.cowbox("umount", "w")
        for i in range(12):
            with open(os.path.join(self.base, "d/f%02d.txt" % i), "w") as f:
                f.write("base file %d\n" % i)
        os.makedirs(os.path.join(self.base, "old"))
        with open(os.path.join(self.base, "old/x.txt"), "w") as f:
            f.write("old dir\n")
        with open(os.path.join(self.base, "gone.txt"), "w") as f:
            f.write("to be deleted\n")
        with open(os.path.join(self.base, "hidden.txt"), "w") as f:
            f.write("base hidden\n")
        shutil.rmtree(os.path.join(self.base, "new"))
        self.mount(self.ref)
        self.cowbox("rollback", "w", str(t1))
        self.assertEqual(self.get_bytes("same.txt"), old)
        snap = self.snap()
        self.assertEqual(snap["files"], tree_sha256(self.mnt))

    def test_base_changed_while_mounted_is_seen_by_rollback_and_fork(self):
        t1 = self.snap()["turn"]
        with open(os.path.join(self.mnt, "hidden.txt"), "w") as f:
            f.write("agent\n")
        self.snap()
        name = self.rewrite_in_place(self.rng)
        # turn 1 says name has the old bytes: never restored under that hash
        proc = self.cowbox("rollback", "w", str(t1), check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn(name, proc.stderr)
        proc = self.cowbox("fork", "w", str(t1), "--name", "f", check=False)
        self.assertNotEqual(proc.returncode, 0, proc.stdout)
        self.assertIn(name, proc.stderr)
        # the check journaled it: the next snapshot records the tree as it is
        snap = self.snap()
        self.assertEqual(snap["files"], tree_sha256(self.mnt))

    def fork_tree(self, turn, name):
        """Fork turn as name, mount it and return (the fork op's reply, its tree's map)."""
        r = self.cowbox_json("fork", "w", str(turn), "--name", name)
        self.mount(r["ref"])
        tree = tree_sha256(self.mountpoint(r["ref"]))
        self.cowbox("umount", name)
        return r, tree

    def test_fork_keeps_what_moved_in_the_base_since_turn_0(self):
        # A fork looks at the whole base only when the watch saw it move since the last
        # look (or after a restart); the drift it found is kept for the next fork. Every
        # fork of turn 1 must be turn 1's tree, before and after the base moved.
        t1 = self.snap()
        # the old bytes of what the base will lose, kept as blobs by the agent's copies
        for src, dst in (("same.txt", "copy-same.txt"), ("gone.txt", "copy-gone.txt"),
                         ("old/x.txt", "copy-x.txt")):
            with open(os.path.join(self.mnt, dst), "wb") as f:
                f.write(self.get_bytes(src))
        self.snap()
        r, tree = self.fork_tree(t1["turn"], "f1")
        self.assertEqual(tree, t1["files"])
        self.assertFalse(r["looked_at_base"], r)  # nothing moved since turn 0 was frozen
        # the base moves while mounted: replaced, deleted, a directory gone, one added
        p = os.path.join(self.base, "same.txt")
        os.unlink(p)
        with open(p, "w") as f:
            f.write("y" * 32)
        os.unlink(os.path.join(self.base, "gone.txt"))
        shutil.rmtree(os.path.join(self.base, "old"))
        os.makedirs(os.path.join(self.base, "new"))
        with open(os.path.join(self.base, "new", "n.txt"), "w") as f:
            f.write("added behind our back\n")
        r, tree = self.fork_tree(t1["turn"], "f2")
        self.assertEqual(tree, t1["files"])
        self.assertTrue(r["looked_at_base"], r)
        # nothing moved since that look: the drift it found serves the next fork
        r, tree = self.fork_tree(t1["turn"], "f3")
        self.assertEqual(tree, t1["files"])
        self.assertFalse(r["looked_at_base"], r)
        # after a restart the daemon knows nothing of the drift: it looks again
        self.cowbox("umount", "w")
        with open(os.path.join(self.base, "new", "m.txt"), "w") as f:
            f.write("added while unmounted\n")
        self.mount(self.ref)
        r, tree = self.fork_tree(t1["turn"], "f4")
        self.assertEqual(tree, t1["files"])
        self.assertTrue(r["looked_at_base"], r)
        # and the latest turn, which recorded the base as it is now
        snap = self.snap()
        self.assertEqual(snap["files"], tree_sha256(self.mnt))
        r, tree = self.fork_tree(snap["turn"], "f5")
        self.assertEqual(tree, snap["files"])

    def test_base_changed_while_mounted_is_seen_by_the_next_snapshot(self):
        # The watch on the base's directories (inotify) makes the next snapshot look, with no
        # rollback or remount; a new directory in the base is watched too.
        t1 = self.snap()
        self.assertEqual(t1["files"], tree_sha256(self.mnt))
        for rnd in range(3):
            # a file of its own each round, new bytes, size and mtime put back
            name = "d/f%02d.txt" % rnd
            p = os.path.join(self.base, name)
            st = os.stat(p)
            with open(p, "r+") as f:
                f.write("round %d" % rnd)
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
            snap = self.snap()
            self.assertEqual(snap["files"], tree_sha256(self.mnt), name)
            self.assertNotEqual(snap["files"][name], t1["files"][name], name)
            ev = self.cowbox_json("diff", "w", str(snap["turn"] - 1), str(snap["turn"]))
            self.assertIn(name, [e["path"] for e in ev["events"]], (rnd, ev))
        # a directory made in the base, then a file written below it later
        os.makedirs(os.path.join(self.base, "late/sub"))
        self.snap()
        time.sleep(0.2)  # the watch thread adds the new directories' watches
        p = os.path.join(self.base, "late/sub/old.txt")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write("one\n")
        self.snap()
        with open(p, "r+") as f:
            f.write("two\n")
        snap = self.snap()
        self.assertEqual(snap["files"], tree_sha256(self.mnt))
        self.assertEqual(snap["files"]["late/sub/old.txt"],
                         hashlib.sha256(b"two\n").hexdigest())
        # nothing moved: a snapshot does not look at the base (no check logged)
        log = os.path.join(self.ws_dir(self.ref), "daemon.log")
        with open(log) as f:
            before = f.read().count("base check (snapshot)")
        self.snap()
        with open(log) as f:
            self.assertEqual(f.read().count("base check (snapshot)"), before)

    def test_random_base_changes_never_give_wrong_bytes(self):
        # COWBOX_FAULT_ROUNDS rounds (the soak runs 100): the agent and the base both
        # change at random, the base while unmounted or mounted; every snapshot must equal
        # the tree, and a rollback to any turn gives exactly that turn's files or fails
        # naming a path with the tree left as it was.
        rng, b = self.rng, self.base
        turns, done = {}, []
        for rnd in range(int(os.environ.get("COWBOX_FAULT_ROUNDS", "2"))):
            with self.subTest(round=rnd):
                for _ in range(rng.randrange(1, 4)):
                    rel = "d/f%02d.txt" % rng.randrange(12) if rng.random() < 0.5 else \
                        "agent%d.txt" % rng.randrange(4)
                    with open(os.path.join(self.mnt, rel), "w") as f:
                        f.write("agent %d %d\n" % (rnd, rng.randrange(1000)))
                    done.append("agent wrote " + rel)
                snap = self.snap()
                done.append("turn %d" % snap["turn"])
                turns[snap["turn"]] = snap["files"]
                mounted = rng.random() < 0.5
                touched = set()
                if not mounted:
                    self.cowbox("umount", "w")
                for _ in range(rng.randrange(1, 4)):
                    files = [os.path.relpath(os.path.join(d, n), b)
                             for d, _, ns in os.walk(b) for n in ns]
                    # names added or deleted under a live mount show as the kernel's
                    # caches allow until the next mount: only contents change then
                    how = rng.choice(["inplace", "replace"] +
                                     ([] if mounted else ["delete", "add"]))
                    if how == "add" or not files:
                        rel = "add%d/n%d.txt" % (rng.randrange(3), rng.randrange(5))
                        os.makedirs(os.path.dirname(os.path.join(b, rel)), exist_ok=True)
                        with open(os.path.join(b, rel), "w") as f:
                            f.write("added %d\n" % rnd)
                        continue
                    p = os.path.join(b, rng.choice(sorted(files)))
                    touched.add(os.path.relpath(p, b))
                    done.append("base %s %s%s" % (how, p, "" if mounted else " (unmounted)"))
                    st = os.stat(p)
                    with open(p, "rb") as f:
                        data = f.read()
                    new = bytes(c ^ 0x20 for c in data) or b"x"
                    if how == "delete":
                        os.unlink(p)
                        continue
                    if how == "replace":
                        os.unlink(p)
                    with open(p, "r+b" if how == "inplace" else "wb") as f:
                        f.write(new[:len(data)] if data else new)
                    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
                if not mounted:
                    self.mount(self.ref)
                # a rollback first when mounted (its own base check must see the change),
                # else a snapshot (the start's check journaled it)
                if mounted:
                    to = rng.choice(sorted(turns))
                    before = tree_sha256(self.mnt)
                    proc = self.cowbox("rollback", "w", str(to), check=False)
                    if proc.returncode == 0:
                        self.assertEqual(tree_sha256(self.mnt), turns[to],
                                         proc.stdout + "\n".join(done))
                    else:
                        # nothing restored; the base's new bytes show now (the check told
                        # the kernel to forget the old ones it had cached)
                        self.assertIn(" at turn %d" % to, proc.stderr)
                        after = tree_sha256(self.mnt)
                        for rel in set(before) | set(after):
                            if rel not in touched:
                                self.assertEqual(after.get(rel), before.get(rel), rel)
                snap = self.snap()
                turns[snap["turn"]] = snap["files"]
                self.assertEqual(snap["files"], tree_sha256(self.mnt), "\n".join(done))

    def get_bytes(self, rel):
        with open(os.path.join(self.mnt, rel), "rb") as f:
            return f.read()


class FsckTest(BlobCase):
    def fsck(self, *args):
        proc = self.cowbox("fsck", "w", "--json", *args, check=False)
        return proc.returncode, __import__("json").loads(proc.stdout)

    def test_fsck_finds_every_bad_blob_and_the_turns_it_breaks(self):
        status, rep = self.fsck()
        self.assertEqual((status, rep["problems"]), (0, []), rep)
        contents = {}
        for i in range(1, 5):
            data = ("content %d " % i).encode() * (1 + self.rng.randrange(1000))
            self.put("f%d.txt" % (i % 2), data)
            contents[i] = data
            self.cowbox_json("snapshot", "w")
        ways = ["truncated", "bit_flipped", "emptied", "missing"]
        self.rng.shuffle(ways)
        bad = {}
        for turn in (1, 2):
            blob = blob_holding(self.blobs, contents[turn])
            damage(os.path.join(self.blobs, blob), ways[turn], self.rng)
            bad[blob] = turn
        status, rep = self.fsck()
        self.assertEqual(status, 1)
        found = {p["object"]: p for p in rep["problems"] if p["kind"] == "blob"}
        self.assertEqual(set(found), set(bad), rep)
        for blob, turn in bad.items():
            # f1 is written at turns 1 and 3, f0 at 2 and 4: a bad blob breaks its turn
            # and the next one (where the file was written again)
            self.assertEqual(found[blob]["path"], "f%d.txt" % (turn % 2))
            self.assertEqual((found[blob]["first_turn"], found[blob]["last_turn"]),
                             (turn, turn + 1))
        # repair cannot invent lost content: still reported, never claimed fixed
        status, rep = self.fsck("--repair")
        self.assertEqual(status, 1)
        self.assertFalse([p for p in rep["problems"] if p["kind"] == "blob" and p["repaired"]])

    def test_fsck_reports_changed_base_and_drops_stale_cache_rows(self):
        self.put("keep.txt", b"agent\n")
        self.cowbox_json("snapshot", "w")
        self.cowbox("umount", "w")
        path = os.path.join(self.base, "a.txt")
        with open(path, "w") as f:
            f.write("other bytes, other size\n")
        status, rep = self.fsck()
        self.assertEqual(status, 1)
        kinds = {(p["kind"], p["path"]) for p in rep["problems"]}
        self.assertIn(("base", "a.txt"), kinds)
        self.assertIn(("base_cache", "a.txt"), kinds)
        status, rep = self.fsck("--repair")
        self.assertTrue([p for p in rep["problems"] if p["kind"] == "base_cache" and
                         p["repaired"]])
        status, rep = self.fsck()
        self.assertEqual({p["kind"] for p in rep["problems"]}, {"base"})


    def test_fsck_op_through_the_protocol_and_python(self):
        import asyncio
        import cbtest
        import cowbox
        contents = {}
        for i in range(1, 4):
            data = ("op content %d " % i).encode() * (1 + self.rng.randrange(1000))
            self.put("g.txt", data)
            contents[i] = data
            self.cowbox_json("snapshot", "w")
        c = self.client(self.ref)
        rep = c.request("fsck")
        self.assertTrue(rep["ok"] and rep["clean"], rep)
        self.assertEqual(rep["problems"], [])
        self.assertEqual(rep["blobs_checked"], 3)
        turn = self.rng.choice([1, 2])
        blob = blob_holding(self.blobs, contents[turn])
        damage(os.path.join(self.blobs, blob),
               self.rng.choice(["truncated", "bit_flipped", "emptied", "missing"]), self.rng)
        c.send({"id": "f", "op": "fsck"})
        # the connection goes on answering while the check runs on its own thread
        c.send({"id": "p", "op": "ping"})
        replies = {}
        while len(replies) < 2:
            r = c.recv()
            replies[r["id"]] = r
        rep = replies["f"]
        self.assertTrue(rep["ok"] and not rep["clean"], rep)
        found = [(p["kind"], p["object"], p["path"], p["first_turn"], p["last_turn"])
                 for p in rep["problems"]]
        # g.txt is written again at the next turn: the bad blob breaks exactly its turn
        self.assertEqual(found, [("blob", blob, "g.txt", turn, turn)], rep)
        self.assertTrue(replies["p"]["ok"])
        # a rollback to a good turn still works with fsck's findings standing
        self.cowbox("rollback", "w", "3")

        async def main():
            box = await cowbox.Sandbox.attach("w", cowbox=cbtest.COWBOX, home=self.home)
            try:
                return await box.fsck(), await box.fsck(repair=True)
            finally:
                await box.close()
        rep, rep2 = asyncio.run(main())
        for r in (rep, rep2):
            self.assertFalse(r["clean"], r)
            self.assertEqual([(p["kind"], p["object"], p["path"], p["first_turn"],
                               p["last_turn"], p["repaired"]) for p in r["problems"]],
                             [("blob", blob, "g.txt", turn, turn, False)], r)


class MetaDbFaultsTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base({"a.txt": "base a\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        with open(os.path.join(self.mnt, "work.txt"), "w") as f:
            f.write("the agent's work\n")
        self.cowbox_json("snapshot", "w")
        self.db = os.path.join(self.ws_dir(self.ref), "meta.db")

    def test_missing_table_fails_clearly(self):
        self.cowbox("umount", "w")
        con = sqlite3.connect(self.db)
        con.execute("DROP TABLE turn_delta")
        con.commit()
        con.close()
        proc = self.cowbox("mount", "w", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("turn_delta", proc.stderr)
        self.assertIn("meta.db", proc.stderr)
        self.assertIn("fsck", proc.stderr)
        self.repair_and_check(lost_turn=True)

    def repair_and_check(self, kept=True, lost_turn=False):
        """fsck --repair rebuilds the database; the agent's file is there and recorded. A
        turn whose rows were lost is named, and the repair then exits 1."""
        proc = self.cowbox("fsck", self.ref, "--repair", check=False)
        self.assertEqual(proc.returncode, 1 if lost_turn else 0, proc.stdout + proc.stderr)
        if lost_turn:
            self.assertIn("turn 1 could not be recovered", proc.stdout)
        self.assertEqual(self.cowbox("fsck", self.ref, check=False).returncode, 0)
        # the damaged file itself (its -wal, -shm and mark log may go aside beside it)
        self.assertEqual(kept, bool([n for n in os.listdir(self.ws_dir(self.ref))
                                     if re.fullmatch(r"meta\.db\.damaged-\d+", n)]))
        self.mount(self.ref)
        with open(os.path.join(self.mnt, "work.txt")) as f:
            self.assertEqual(f.read(), "the agent's work\n")
        snap = self.cowbox_json("snapshot", self.ref)
        self.assertEqual(snap["turn"], 1)
        self.assertIn("work.txt", snap["files"])
        self.assertIn("a.txt", snap["files"])
        self.cowbox("rollback", self.ref, "0")
        self.assertFalse(os.path.exists(os.path.join(self.mnt, "work.txt")))
        self.cowbox("rollback", self.ref, "1")
        with open(os.path.join(self.mnt, "work.txt")) as f:
            self.assertEqual(f.read(), "the agent's work\n")

    def test_empty_or_deleted_meta_db_is_named_and_repaired(self):
        for how in ("empty", "deleted"):
            with self.subTest(how=how):
                if how == "deleted":
                    self.setUp()
                self.cowbox("umount", self.ref)
                if how == "empty":
                    open(self.db, "w").close()
                else:
                    os.unlink(self.db)
                for cmd in ("info", "mount", "snapshot"):
                    proc = self.cowbox(cmd, self.ref, check=False)
                    self.assertNotEqual(proc.returncode, 0)
                    self.assertIn("meta.db", proc.stderr)
                    self.assertIn("empty" if how == "empty" else "missing", proc.stderr)
                    self.assertIn("cowbox fsck %s --repair" % self.ref, proc.stderr)
                    self.assertNotIn("not fully created", proc.stderr)
                    self.assertNotIn("rm %s" % self.ref, proc.stderr)
                status = self.cowbox("fsck", self.ref, check=False).returncode
                self.assertEqual(status, 1)
                self.repair_and_check(kept=how == "empty")

    def test_upper_deleted_while_mounted_fails_the_snapshot(self):
        import shutil
        upper = os.path.join(self.ws_dir(self.ref), "upper")
        # under the quota, upper/ is its own filesystem: taken away first, as a user could
        if os.path.ismount(upper):
            subprocess.run(["umount", "-l", upper], check=True)
        shutil.rmtree(upper)
        proc = self.cowbox("snapshot", "w", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("upper", proc.stderr)
        self.assertIn("deleted", proc.stderr)


class SparseFilesTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base({"a.txt": "base a\n"})
        # sparse files past the upper-layer quota are refused (test_limits): none here
        self.ref = self.cowbox("create", "--base", self.base, "--name", "w",
                               "--disk-mb", "0").stdout.strip()

    def start(self, bound=None):
        if bound is not None:
            self.env["COWBOX_SNAPSHOT_MAX_BYTES"] = bound
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.blobs = os.path.join(self.ws_dir(self.ref), "blobs")
        self.cowbox_json("snapshot", "w")

    def blob_bytes(self):
        return sum(os.lstat(os.path.join(self.blobs, n)).st_blocks * 512
                   for n in os.listdir(self.blobs))

    def test_one_tib_sparse_file_fails_the_snapshot_at_once(self):
        self.start()
        before = self.blob_bytes()
        subprocess.run(["truncate", "-s", "1T", os.path.join(self.mnt, "huge")], check=True)
        t0 = time.monotonic()
        proc = self.cowbox("snapshot", "w", check=False)
        took = time.monotonic() - t0
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("huge", proc.stderr)
        self.assertIn("bound", proc.stderr)
        self.assertLess(took, 30)
        self.assertLess(self.blob_bytes() - before, 1 << 20)
        # the workspace goes on: without the file the snapshot succeeds (nothing changed
        # since turn 1, its answer), and the next change records turn 2
        os.unlink(os.path.join(self.mnt, "huge"))
        self.assertEqual(self.cowbox_json("snapshot", "w")["turn"], 1)
        with open(os.path.join(self.mnt, "small"), "w") as f:
            f.write("small\n")
        self.assertEqual(self.cowbox_json("snapshot", "w")["turn"], 2)

    def test_sparse_file_is_kept_and_restored_sparse(self):
        self.start("1G")
        rng = random.Random(SEED)
        path = os.path.join(self.mnt, "sparse")
        data = bytes(rng.randrange(256) for _ in range(4096)) * 64
        at = (64 + rng.randrange(128)) << 20
        with open(path, "wb") as f:
            f.truncate(256 << 20)
            f.seek(at)
            f.write(data)
        before = self.blob_bytes()
        snap = self.cowbox_json("snapshot", "w")
        self.assertLess(self.blob_bytes() - before, 8 << 20)  # not 256 MiB
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"x" * 100)
        self.cowbox("rollback", "w", str(snap["turn"]))
        import hashlib
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
        self.assertEqual(h.hexdigest(), snap["files"]["sparse"])
        upper = os.path.join(self.ws_dir(self.ref), "upper", "sparse")
        self.assertLess(os.stat(upper).st_blocks * 512, 8 << 20)

    def test_a_slow_snapshot_does_not_block_turns_and_diff(self):
        self.start("64G")
        with open(os.path.join(self.mnt, "f.txt"), "w") as f:
            f.write("one\n")
        self.cowbox_json("snapshot", "w")
        subprocess.run(["truncate", "-s", "8G", os.path.join(self.mnt, "big")], check=True)
        slow = subprocess.Popen([os.environ.get("COWBOX", "cowbox"), "snapshot", "w"],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: [n for n in os.listdir(self.blobs) if n.startswith("tmp.")],
                     what="the snapshot to start hashing")
            t0 = time.monotonic()
            turns = self.cowbox_json("turns", "w")
            diff = self.cowbox_json("diff", "w", "1", "2")
            info = self.cowbox_json("info", "w")
            took = time.monotonic() - t0
            still = slow.poll() is None
        finally:
            slow.communicate(timeout=600)
        self.assertEqual([t["turn"] for t in turns["turns"]], [1, 2])
        self.assertEqual([e["path"] for e in diff["events"]], ["f.txt"])
        self.assertEqual(info["ref"], self.ref)
        if still:
            self.assertLess(took, 20)
        else:
            self.skipTest("the snapshot finished before turns/diff/info returned (%.1fs)"
                          % took)


class DiskFullTest(CowboxTestCase):
    """COWBOX_HOME on a 64 MiB tmpfs: the upper layer, meta.db and the blobs share it."""

    def setUp(self):
        self.small = tempfile.mkdtemp(prefix="cbtest-small-")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", self.small],
                       check=True)
        # registered first, so it runs last: after the daemons are stopped
        self.addCleanup(self._unmount_small)
        super().setUp()
        self.home = os.path.join(self.small, "home")
        self.env["COWBOX_HOME"] = self.home
        self.base = self.make_base({"a.txt": "base a\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def _unmount_small(self):
        for mnt in fuse_mounts():
            if mnt.startswith(self.small):
                subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        subprocess.run(["umount", "-l", self.small], stderr=subprocess.DEVNULL)
        os.rmdir(self.small)

    def fill(self, name, mib=256):
        """Write up to mib MiB to name in 1 MiB writes; the error write(2) raised, or None."""
        fd = os.open(os.path.join(self.mnt, name), os.O_WRONLY | os.O_CREAT, 0o644)
        chunk = b"\xa5" * (1 << 20)
        written, err = 0, None
        try:
            for _ in range(mib):
                written += os.write(fd, chunk)
        except OSError as e:
            err = e
        try:
            os.close(fd)
        except OSError:
            pass
        return written, err

    def test_write_reports_enospc_and_unlink_frees_space(self):
        written, err = self.fill("big")
        self.assertIsNotNone(err, "256 MiB accepted by write(2) on a 64 MiB disk")
        self.assertEqual(err.errno, errno.ENOSPC, err)
        self.assertLess(written, 64 << 20)
        # namespace operations on the full disk: done, or ENOSPC; never EIO
        for name, op in (("create", lambda: open(os.path.join(self.mnt, "new"), "w").close()),
                         ("mkdir", lambda: os.mkdir(os.path.join(self.mnt, "d"))),
                         ("symlink", lambda: os.symlink("x", os.path.join(self.mnt, "l"))),
                         ("append", lambda: self.fill("a.txt", 4))):
            try:
                op()
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC, "%s: %s" % (name, e))
        # the agent that filled the disk can clean it up from inside
        os.unlink(os.path.join(self.mnt, "big"))
        # the blocks go once the kernel releases the file (asynchronous in FUSE)
        wait_for(lambda: shutil.disk_usage(self.small).free > 16 << 20, 10,
                 what="the unlinked file's space to come back")
        written, err = self.fill("after", 4)
        self.assertEqual((written, err), (4 << 20, None))
        snap = self.cowbox_json("snapshot", "w")
        self.assertIn("after", snap["files"])
        self.assertNotIn("big", snap["files"])


class SmallLimitsTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        # the upper filesystem's own limits, without the upper-layer quota (test_limits)
        self.ref = self.cowbox("create", "--base", self.make_base({"a.txt": "a\n"}),
                               "--name", "w", "--disk-mb", "0").stdout.strip()
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def test_host_url_port_out_of_range_names_the_value(self):
        c = self.client(self.ref)
        for port in (2 ** 63 - 1, -(2 ** 63), 65536, 0):
            r = c.request("host_url", port=port)
            self.assertEqual(r["error"]["code"], "invalid_request", r)
            self.assertIn("port %d is not in 1-65535" % port, r["error"]["message"])

    def test_a_file_past_the_largest_size_is_efbig(self):
        # Past the upper filesystem's largest file (ext4: 16 TiB): EFBIG, never EIO. With
        # FUSE passthrough (the default) write(2) itself says so. Through the writeback cache
        # (COWBOX_FUSE_PASSTHROUGH=0) the kernel acknowledges the write (FUSE's superblock
        # admits any 63-bit size and the protocol has no way to lower it) and fsync says
        # EFBIG; close after it reports nothing more.
        for passthrough in ("1", "0"):
            with self.subTest(passthrough=passthrough):
                self.cowbox("umount", self.ref)
                self.env["COWBOX_FUSE_PASSTHROUGH"] = passthrough
                self.mount(self.ref)
                self.check_efbig(passthrough == "1")

    def check_efbig(self, passthrough):
        path = os.path.join(self.mnt, "far")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            with self.assertRaises(OSError) as cm:
                os.pwrite(fd, b"x", 1 << 62)
                self.assertFalse(passthrough, "write(2) at 2^62 succeeded with passthrough")
                os.fsync(fd)
            self.assertEqual(cm.exception.errno, errno.EFBIG)
        finally:
            os.close(fd)  # no EIO either, once the error was reported
        with self.assertRaises(OSError) as cm:
            os.truncate(path, 1 << 62)
        self.assertEqual(cm.exception.errno, errno.EFBIG)
        os.unlink(path)
        # the workspace is fine afterwards
        with open(os.path.join(self.mnt, "near"), "w") as f:
            f.write("ok\n")
        self.cowbox_json("snapshot", "w")

    def test_pipelined_requests_are_all_answered_in_order(self):
        n = int(os.environ.get("COWBOX_PIPELINE", "50000"))
        c = self.client(self.ref)
        c.sock.settimeout(120)
        lines = b"".join(b'{"id":%d,"op":"ping"}\n' % i for i in range(n))
        sender = threading.Thread(target=c.send_raw, args=(lines,))
        sender.start()
        try:
            for i in range(n):
                r = c.recv()
                self.assertEqual((r.get("id"), r.get("ok")), (i, True), r)
        finally:
            sender.join()


if __name__ == "__main__":
    unittest.main(verbosity=2)
