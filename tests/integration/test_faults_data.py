"""Faults in the data cowbox keeps: damaged or missing blobs, a base changed behind cowbox's
back, a damaged meta.db, a full disk, huge sparse files and out-of-range requests. Each must
fail naming what is wrong (or give the right bytes), never report success over wrong bytes.
Random choices are seeded: COWBOX_SEED=N replays a run."""

import os
import random
import sqlite3
import subprocess
import time
import unittest

from cbtest import CowboxTestCase, wait_for

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


class BlobFaultsTest(CowboxTestCase):
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

    def test_damaged_blob_fails_rollback_and_fork_naming_it(self):
        for how in ("truncated", "bit_flipped", "emptied", "missing"):
            with self.subTest(how=how):
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
                proc = self.cowbox("fork", "w", str(t1), "--name", "f-" + how, check=False)
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
            return "a.txt" in log and "changed behind" in log
        wait_for(noticed, what="the base check to log a.txt")
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
