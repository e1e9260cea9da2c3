"""The base hash cache shared by the workspaces over one base directory, and the base hashed in
the background from the mount on: reuse (a second workspace hashes no base file), a base file
changed between two workspaces (rehashed, also by a first snapshot taken at once), a damaged
shared cache (hashing without it, the right map), progress in info, a snapshot while the
background pass runs, a kill -9 in it, the threaded walk of a wide base under a low fd limit."""

import glob
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cbtest  # noqa: E402
from cbtest import CowboxTestCase, pid_alive, wait_for  # noqa: E402


def rewrite_keeping_mtime(path, data):
    """Overwrite the start of path with data, its size and mtime put back: only its ctime
    (and its bytes) tell that it changed."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data[:max(st.st_size, 1)])
    os.truncate(path, st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def base_map(base):
    """{relative path: sha256 hex} of every regular file under base, as sha256sum sees it."""
    out = {}
    for dirpath, _, files in os.walk(base):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, base)] = hashlib.sha256(f.read()).hexdigest()
    return out


class BaseCacheTest(CowboxTestCase):
    def make_tree(self, n, size_max=4096, seed=None):
        seed = seed if seed is not None else int(os.environ.get("COWBOX_SEED", "0")) or \
            random.randrange(1 << 30)
        print("seed", seed, file=sys.stderr)
        rng = random.Random(seed)
        base = self.make_base()
        for i in range(n):
            d = os.path.join(base, "d%03d" % (i % 37))
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "f%05d" % i), "wb") as f:
                f.write(rng.randbytes(rng.randrange(0, size_max)))
        return base

    def info(self, ref):
        return self.cowbox_json("info", ref).get("base_hash")

    def wait_hashed(self, ref, timeout=120):
        """The background pass's final info once it ended."""
        wait_for(lambda: (self.info(ref) or {}).get("state") in ("done", "taken", "failed"),
                 timeout, interval=0.1, what="the background base hash of %s" % ref)
        return self.info(ref)

    def snapshot_map(self, ref):
        return self.cowbox_json("snapshot", ref)["files"]

    def daemon_log(self, ref):
        with open(os.path.join(self.ws_dir(ref), "daemon.log")) as f:
            return f.read()

    def snapshot_stats(self, ref):
        """(from meta.db's cache, from the shared cache, hashed) of the first snapshot (logged
        when its rows are written, a moment after the reply of a first map)."""
        pat = (r"snapshot: base files: (\d+) from meta.db's cache, (\d+) from the "
               r"shared cache, (\d+) hashed")
        try:
            wait_for(lambda: re.search(pat, self.daemon_log(ref)), 10, interval=0.05,
                     what="the first snapshot's base stats in the log")
        except Exception:
            pass
        m = re.search(pat, self.daemon_log(ref))
        self.assertTrue(m, self.daemon_log(ref))
        return tuple(int(x) for x in m.groups())

    def assert_base_changes_seen(self, ref, base, paths, data):
        """Append data to each of the base's paths: ref's snapshots soon show it."""
        for p in paths:
            with open(os.path.join(base, p), "ab") as f:
                f.write(data)
        real = base_map(base)
        wait_for(lambda: self.snapshot_map(ref) == real, 10, interval=0.2,
                 what="the base changes in %s's map" % ref)

    def new_ws(self, base):
        ref = self.create(base)
        self.mount(ref)
        return ref

    def cache_files(self):
        return glob.glob(os.path.join(self.home, "basecache", "*.db"))

    def test_second_workspace_reuses_the_shared_rows(self):
        base = self.make_tree(300)
        real = base_map(base)
        a = self.new_ws(base)
        ia = self.wait_hashed(a)
        self.assertEqual((ia["state"], ia["hashed"], ia["from_shared"]), ("done", 300, 0))
        self.assertEqual(self.snapshot_map(a), real)
        self.assertEqual(len(self.cache_files()), 1)
        b = self.new_ws(base)
        ib = self.wait_hashed(b)
        self.assertEqual((ib["state"], ib["hashed"], ib["from_shared"]), ("done", 0, 300))
        self.assertEqual(self.snapshot_map(b), real)
        # its first snapshot looked at no base file: it froze the map the pass prepared
        self.assertNotIn("snapshot: base files:", self.daemon_log(b))
        # removing one workspace leaves the cache the other ones share
        self.cowbox("rm", a)
        self.assertEqual(len(self.cache_files()), 1)
        c = self.new_ws(base)
        self.assertEqual(self.wait_hashed(c)["hashed"], 0)

    def test_snapshot_uses_the_shared_rows_without_the_background_pass(self):
        # the second workspace snapshots at once: its map build reads the shared cache itself
        base = self.make_tree(2000)
        real = base_map(base)
        a = self.new_ws(base)
        self.wait_hashed(a)
        # without a pass of its own (which could finish first and prepare the map)
        self.env["COWBOX_BACKGROUND_HASH"] = "0"
        b = self.new_ws(base)
        del self.env["COWBOX_BACKGROUND_HASH"]
        self.assertEqual(self.snapshot_map(b), real)
        own, shared, hashed = self.snapshot_stats(b)
        self.assertEqual(own + shared + hashed, 2000)
        self.assertEqual(hashed, 0, self.daemon_log(b))

    def test_prepared_map_is_taken_only_while_the_base_did_not_move(self):
        # The background pass prepares the first map; the first snapshot takes it as it is
        # (no walk, no per-file look-up: its cost does not grow with the base) only when the
        # base watch saw nothing move in the base since the pass began walking it.
        base = self.make_tree(500)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        # changed after the pass: same size, mtime put back; the watch sees it
        victim = os.path.join(base, "d002", "f00002")
        rewrite_keeping_mtime(victim, b"changed after the background pass")
        real = base_map(base)
        self.assertEqual(self.snapshot_map(a), real)
        own, shared, hashed = self.snapshot_stats(a)
        self.assertEqual((own + shared + hashed, hashed), (500, 1), self.daemon_log(a))
        # a workspace whose pass saw the base as it is now takes the prepared map
        b = self.new_ws(base)
        self.assertEqual(self.wait_hashed(b)["state"], "done")
        self.assertEqual(self.snapshot_map(b), real)
        self.assertNotIn("snapshot: base files:", self.daemon_log(b))
        # and records later changes of the base as before
        self.assert_base_changes_seen(b, base, [os.path.relpath(victim, base)], b"more")

    def test_base_file_changed_between_workspaces_is_rehashed(self):
        base = self.make_tree(200)
        a = self.new_ws(base)
        self.wait_hashed(a)
        self.cowbox("umount", a)
        # same size, mtime put back: only the ctime (and the bytes) tell
        victim = os.path.join(base, "d001", "f00001")
        st = os.stat(victim)
        with open(victim, "r+b") as f:
            data = bytearray(f.read())
            data[0:1] = bytes([data[0] ^ 0xff]) if data else b""
            f.seek(0)
            f.write(data or b"x")
        os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
        real = base_map(base)
        b = self.new_ws(base)
        ib = self.wait_hashed(b)
        self.assertEqual((ib["hashed"], ib["from_shared"]), (1, 199))
        self.assertEqual(self.snapshot_map(b), real)

    def new_ws_at_once(self, base):
        """A workspace without a background pass of its own: its first snapshot walks the
        base and takes the shared rows itself (the at-once case)."""
        self.env["COWBOX_BACKGROUND_HASH"] = "0"
        try:
            return self.new_ws(base)
        finally:
            del self.env["COWBOX_BACKGROUND_HASH"]

    def test_base_file_changed_between_creates_is_rehashed_at_once(self):
        # The first snapshot at once trusts a shared row only while the file's whole stat
        # key holds: a file rewritten with its size and mtime forged back (touch -d) has a
        # new ctime, one replaced by rename a new inode; both are rehashed, never trusted.
        base = self.make_tree(400)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        self.cowbox("umount", a)
        rewritten = os.path.join(base, "d001", "f00001")
        st = os.stat(rewritten)
        with open(rewritten, "r+b") as f:
            f.write(b"rewritten behind the cache" [:max(st.st_size, 1)])
        os.truncate(rewritten, st.st_size)
        subprocess.run(["touch", "-m", "-d", "@%d.%09d" % divmod(st.st_mtime_ns, 10**9),
                        rewritten], check=True)
        replaced = os.path.join(base, "d002", "f00002")
        st2 = os.stat(replaced)
        with open(replaced, "rb") as f:
            data = bytes(b ^ 0x5a for b in f.read()) or b"y"
        with open(replaced + ".new", "wb") as f:
            f.write(data)
        os.truncate(replaced + ".new", st2.st_size)
        os.utime(replaced + ".new", ns=(st2.st_atime_ns, st2.st_mtime_ns))
        os.rename(replaced + ".new", replaced)
        self.assertEqual((os.stat(rewritten).st_size, os.stat(rewritten).st_mtime_ns),
                         (st.st_size, st.st_mtime_ns))
        self.assertNotEqual(os.stat(replaced).st_ino, st2.st_ino)
        real = base_map(base)
        b = self.new_ws_at_once(base)
        self.assertEqual(self.snapshot_map(b), real)
        own, shared, hashed = self.snapshot_stats(b)
        self.assertEqual((own + shared + hashed, hashed), (400, 2), self.daemon_log(b))
        # the rows b hashed are shared: the next workspace reads no base file at all
        c = self.new_ws_at_once(base)
        self.assertEqual(self.snapshot_map(c), real)
        self.assertEqual(self.snapshot_stats(c)[2], 0, self.daemon_log(c))
        # and a base check after the first map (the files' rows are in the shared cache
        # only) rehashes nothing that did not move: the delta path stays exact
        with open(os.path.join(base, "d003", "f00003"), "ab") as f:
            f.write(b"later")
        real = base_map(base)
        wait_for(lambda: self.snapshot_map(c) == real, 10, interval=0.2,
                 what="the later base change in c's map")
        self.assertRegex(self.daemon_log(c), r"base check \(snapshot\): \d+ entries, 1 files "
                         r"rehashed")
        # a fork compares the whole base with turn 0's through both caches too
        turn = self.cowbox_json("snapshot", c)["turn"]
        fork = self.cowbox_json("fork", c, str(turn), "--name", "c2")["ref"]
        self.mount(fork)
        self.assertEqual(self.snapshot_map(fork), real)

    def read_ahead_logged(self, ref):
        wait_for(lambda: "base read ahead for the first snapshot" in self.daemon_log(ref), 30,
                 interval=0.05, what="the base read ahead at start")

    def test_first_map_from_the_base_read_ahead_at_start(self):
        # Before the first map the daemon reads the base at start as that map would (one
        # walk that also sets the base watch on each directory before reading it); the
        # first snapshot at once takes that walk instead of walking again.
        base = self.make_tree(600)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        real = base_map(base)
        b = self.new_ws_at_once(base)
        self.read_ahead_logged(b)
        self.assertEqual(self.snapshot_map(b), real)
        own, shared, hashed = self.snapshot_stats(b)
        self.assertEqual((own + shared + hashed, shared, hashed), (600, 600, 0),
                         self.daemon_log(b))
        # the watch the walk set sees later changes in any directory of the base
        self.assert_base_changes_seen(b, base, ["d%03d/f%05d" % (i, i) for i in (3, 17, 36)],
                                      b"after the first map")

    def test_base_changed_after_the_read_ahead_is_not_taken_from_it(self):
        # The walk read ahead is used only while the base watch saw nothing move since it
        # began: a file rewritten with its size and mtime put back, a file added and one
        # removed after it are in the first map.
        base = self.make_tree(300)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        b = self.new_ws_at_once(base)
        self.read_ahead_logged(b)
        rewrite_keeping_mtime(os.path.join(base, "d005", "f00005"),
                              b"changed after the read ahead")
        with open(os.path.join(base, "d006", "new"), "wb") as f:
            f.write(b"new after the read ahead")
        os.unlink(os.path.join(base, "d007", "f00007"))
        real = base_map(base)
        self.assertEqual(self.snapshot_map(b), real)

    def test_base_changing_while_workspaces_start_gives_exact_first_maps(self):
        # A writer rewrites, replaces, adds and removes base files while workspaces start
        # (their read ahead walks the base meanwhile); once it stopped, every first map is
        # the base as it is, whichever walk each one took.
        base = self.make_tree(2000, size_max=2048)
        a = self.new_ws(base)
        self.wait_hashed(a)
        stop = []
        seed = random.randrange(1 << 30)
        print("writer seed", seed, file=sys.stderr)

        def writer():
            rng = random.Random(seed)
            k = 0
            while not stop:
                d = os.path.join(base, "d%03d" % rng.randrange(37))
                names = os.listdir(d)
                op = rng.randrange(4)
                if op == 0 and names:
                    with open(os.path.join(d, rng.choice(names)), "ab") as f:
                        f.write(b"w")
                elif op == 1 and names:
                    tmp = os.path.join(d, ".tmp%d" % k)
                    with open(tmp, "wb") as f:
                        f.write(rng.randbytes(64))
                    os.rename(tmp, os.path.join(d, rng.choice(names)))
                elif op == 2:
                    with open(os.path.join(d, "added%d" % k), "wb") as f:
                        f.write(b"added")
                elif names:
                    os.unlink(os.path.join(d, rng.choice(names)))
                k += 1

        import threading
        th = threading.Thread(target=writer)
        th.start()
        try:
            refs = [self.new_ws_at_once(base) for _ in range(3)]
        finally:
            stop.append(1)
            th.join()
        real = base_map(base)
        for ref in refs:
            self.assertEqual(self.snapshot_map(ref), real, ref)

    def test_wide_base_walked_on_threads_under_a_low_fd_limit(self):
        # 1,600 directories, more than the 1,024 descriptors the daemon and its turn worker
        # may hold: the walk's threads hold one directory each at a time.
        base = self.make_base()
        rng = random.Random(16)
        for i in range(40):
            for j in range(40):
                d = os.path.join(base, "t%02d" % i, "s%02d" % j)
                os.makedirs(d)
                with open(os.path.join(d, "f"), "wb") as f:
                    f.write(rng.randbytes(rng.randrange(0, 300)))
        real = base_map(base)
        # The hard limit too, since the daemon raises its soft limit to the hard one at
        # start; set in a wrapper of the binary, as a hard limit cannot be raised back here.
        wrapper = os.path.join(self.tmp, "cowbox-1024")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nulimit -Sn 1024 && ulimit -Hn 1024 && exec %s \"$@\"\n"
                    % cbtest.COWBOX)
        os.chmod(wrapper, 0o755)
        binary, cbtest.COWBOX = cbtest.COWBOX, wrapper
        try:
            a = self.new_ws_at_once(base)  # hashes every file itself
            b = self.new_ws_at_once(base)  # takes every row from the shared cache
        finally:
            cbtest.COWBOX = binary
        for ref in (a, b):
            with open("/proc/%d/limits" % self.daemon_pid(ref)) as f:
                self.assertRegex(f.read(), r"Max open files\s+1024\s")
        self.assertEqual(self.snapshot_map(a), real)
        self.assertEqual(self.snapshot_stats(a)[2], 1600, self.daemon_log(a))
        self.assertEqual(self.snapshot_map(b), real)
        self.assertEqual(self.snapshot_stats(b)[2], 0, self.daemon_log(b))

    def test_large_shared_cache_read_in_two_halves_gives_the_exact_map(self):
        # A first map over many files reads the shared cache on two threads, each from its
        # own handle, split at the middle path of the walk: files changed on either side of
        # that path and a damaged row in each half are hashed, every other row is taken.
        n = 9000
        base = self.make_tree(n, size_max=256)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        entries = []
        for dirpath, dirs, files in os.walk(base):
            for name in dirs + files:
                entries.append(os.path.relpath(os.path.join(dirpath, name), base))
        entries.sort(key=os.fsencode)  # strcmp's order, as the walk sorts
        mid = len(entries) // 2
        changed = [p for p in entries[mid - 3:mid + 3] if os.path.isfile(os.path.join(base, p))]
        for p in changed:
            with open(os.path.join(base, p), "ab") as f:
                f.write(b"changed beside the split")
        files = [p for p in entries if os.path.isfile(os.path.join(base, p))]
        damaged = [files[len(files) // 8], files[len(files) * 7 // 8]]
        (path,) = self.cache_files()
        db = sqlite3.connect(path)
        for p in damaged:
            db.execute("UPDATE base_hash SET sha256 = zeroblob(32) WHERE path = ?", (p,))
        # without the pack (which would vouch for all but the changed files in one read)
        db.execute("DELETE FROM base_pack")
        db.commit()
        db.close()
        (own, shared, hashed), log = self.first_map_at_once(base)
        self.assertEqual((own + shared + hashed, hashed), (n, len(changed) + 2), log)

    def first_map_at_once(self, base):
        """A new workspace over base without a pass of its own: its first map, checked
        against sha256sum's, and (from meta.db's cache, from the shared cache, hashed)."""
        real = base_map(base)
        b = self.new_ws_at_once(base)
        self.assertEqual(self.snapshot_map(b), real)
        return self.snapshot_stats(b), self.daemon_log(b)

    def hashed_base(self, n):
        """A base of n files that a workspace hashed in the background (then unmounted):
        the base and an open connection to its shared cache file."""
        base = self.make_tree(n)
        a = self.new_ws(base)
        self.assertEqual(self.wait_hashed(a)["state"], "done")
        self.cowbox("umount", a)
        (path,) = self.cache_files()
        return base, sqlite3.connect(path)

    def test_first_map_at_once_reads_the_pack_and_checks_each_row(self):
        # The pass that hashed the whole base leaves its rows in one pack: a first map at
        # once reads it instead of the rows (here all damaged: nothing comes from them),
        # and still trusts a pack row only while the file's stat key holds.
        n = 600
        base, db = self.hashed_base(n)
        self.assertEqual(db.execute("SELECT rows FROM base_pack").fetchone(), (n,))
        db.execute("UPDATE base_hash SET sha256 = zeroblob(32)")
        db.commit()
        db.close()
        rewrite_keeping_mtime(os.path.join(base, "d003", "f00003"), b"changed after the pack")
        stats, log = self.first_map_at_once(base)
        self.assertEqual(stats, (0, n - 1, 1), log)

    def test_a_first_map_that_hashed_the_base_leaves_the_pack(self):
        # No background pass (a harness's snapshot() right after create): the first map
        # hashes the base itself and leaves the pack behind it, whether the daemon answered
        # it from the walk (the map asked for) or the worker built it (--changes).
        for how in (["--json"], ["--changes", "--json"]):
            n = 300
            before = set(self.cache_files())
            base = self.make_tree(n)
            a = self.new_ws_at_once(base)
            self.cowbox("snapshot", a, *how)
            self.assertEqual(self.snapshot_stats(a)[2], n, self.daemon_log(a))
            (path,) = set(self.cache_files()) - before
            db = sqlite3.connect(path)
            self.assertEqual(db.execute("SELECT rows FROM base_pack").fetchone(), (n,))
            # every row damaged: what the next workspace takes comes from the pack
            db.execute("UPDATE base_hash SET sha256 = zeroblob(32)")
            db.commit()
            db.close()
            stats, log = self.first_map_at_once(base)
            self.assertEqual(stats, (0, n, 0), log)

    def test_damaged_pack_falls_back_to_the_rows(self):
        n = 500
        base, db = self.hashed_base(n)
        # one byte of the pack changed on disk (its checksum no longer holds)
        (good,) = db.execute("SELECT data FROM base_pack").fetchone()
        data = bytearray(good)
        data[len(data) // 2] ^= 0x40
        db.execute("UPDATE base_pack SET data = ?", (bytes(data),))
        db.commit()
        (own, shared, hashed), log = self.first_map_at_once(base)
        self.assertEqual((own + shared, hashed), (n, 0), log)
        # (that first map wrote the pack anew, from its walk)
        self.assertEqual(db.execute("SELECT data FROM base_pack").fetchone(), (good,))
        # intact bytes, but a row count that is not the pack's own: not a pack either
        db.execute("UPDATE base_pack SET rows = rows + 1")
        db.commit()
        db.close()
        (own, shared, hashed), log = self.first_map_at_once(base)
        self.assertEqual((own + shared, hashed), (n, 0), log)

    def test_damaged_shared_cache_falls_back_to_hashing(self):
        base = self.make_tree(150)
        real = base_map(base)
        a = self.new_ws(base)
        self.wait_hashed(a)
        self.cowbox("umount", a)
        (path,) = self.cache_files()
        # rows whose hashes were changed on disk: their checksums no longer hold
        db = sqlite3.connect(path)
        db.execute("UPDATE base_hash SET sha256 = zeroblob(32), xxh3 = zeroblob(16)")
        db.commit()
        db.close()
        b = self.new_ws(base)
        ib = self.wait_hashed(b)
        self.assertEqual((ib["hashed"], ib["from_shared"]), (150, 0))
        self.assertEqual(self.snapshot_map(b), real)
        self.cowbox("umount", b)
        # garbage instead of a database
        for p in glob.glob(path + "*"):
            os.unlink(p)
        with open(path, "wb") as f:
            f.write(os.urandom(8192))
        c = self.new_ws(base)
        ic = self.wait_hashed(c)
        self.assertEqual((ic["state"], ic["hashed"]), ("done", 150))
        self.assertEqual(self.snapshot_map(c), real)
        self.assertIn("shared base cache", self.daemon_log(c))
        self.assertIn("hashing the base without", self.daemon_log(c))
        self.cowbox("umount", c)
        # another program's database under that name
        os.unlink(path)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE base_hash(path TEXT PRIMARY KEY, sha256 BLOB)")
        db.execute("INSERT INTO base_hash VALUES('d001/f00001', zeroblob(32))")
        db.commit()
        db.close()
        d = self.new_ws(base)
        self.assertEqual(self.wait_hashed(d)["hashed"], 150)
        self.assertEqual(self.snapshot_map(d), real)
        self.assertIn("not a cache of this version", self.daemon_log(d))

    def test_background_progress_reaches_the_total(self):
        base = self.make_tree(1500, size_max=20000)
        total = sum(os.path.getsize(os.path.join(dp, f))
                    for dp, _, fs in os.walk(base) for f in fs)
        a = self.new_ws(base)
        seen = []
        wait_for(lambda: seen.append(self.info(a)) or seen[-1]["state"] in ("done", "failed"),
                 120, interval=0.05, what="the background base hash")
        last = seen[-1]
        self.assertEqual(last["state"], "done", last)
        self.assertEqual((last["files_done"], last["files_total"]), (1500, 1500))
        self.assertEqual((last["bytes_done"], last["bytes_total"]), (total, total))
        for s in seen:
            self.assertLessEqual(s["files_done"], s["files_total"])
            self.assertLessEqual(s["bytes_done"], s["bytes_total"])
        self.assertIn("base hash:", self.cowbox("info", a).stdout)

    def test_snapshot_during_the_background_pass_is_exact(self):
        n = 6000
        base = self.make_tree(n, size_max=16384)
        real = base_map(base)
        a = self.new_ws(base)
        # at once: the pass is still walking or hashing
        before = self.info(a)
        self.assertEqual(self.snapshot_map(a), real)
        # the first map is answered before its rows are written: the pass sees them (and
        # ends) a moment after the reply
        wait_for(lambda: self.info(a)["state"] in ("taken", "done"), 30, interval=0.05,
                 what="the background pass to end")
        after = self.info(a)
        own, shared, hashed = self.snapshot_stats(a)
        self.assertEqual(own + shared + hashed, n)
        if before["state"] in ("walking", "hashing") and after["state"] == "taken":
            # the snapshot hashed only what the pass had not: no file twice but those the
            # pass had hashed and not yet committed when the snapshot read the cache, at
            # most one batch (512 files, ws/basecache.c; 196 were seen on a loaded machine)
            self.assertLessEqual(after["hashed"] + hashed, n + 512, (after, hashed))
        else:
            print("the background pass ended before the snapshot: overlap not seen",
                  file=sys.stderr)
        # the next workspace finds every row shared, whoever hashed it
        b = self.new_ws(base)
        self.assertEqual(self.wait_hashed(b)["hashed"], 0)

    def test_kill_during_the_background_pass_leaves_only_complete_rows(self):
        n = 6000
        base = self.make_tree(n, size_max=16384)
        real = base_map(base)
        a = self.new_ws(base)
        pid = self.daemon_pid(a)
        wait_for(lambda: (self.info(a) or {}).get("files_done", 0) > 0, 60, interval=0.01,
                 what="the background pass to start")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="the daemon to die")
        self.mount(a)
        ia = self.wait_hashed(a)
        self.assertEqual(ia["state"], "done", ia)
        self.assertEqual(self.snapshot_map(a), real)
        b = self.new_ws(base)
        self.assertEqual(self.snapshot_map(b), real)

    def test_first_map_answered_before_its_rows_survives_a_kill(self):
        """The first map is answered from the walk and its rows written after the reply: the
        next turn op waits for them (its delta is against them), and a kill -9 between the
        reply and the rows leaves the client's turn unknown (the whole map again, the base as
        it is now), never a delta against a map rebuilt from another base."""
        base = self.make_tree(60)
        self.env["COWBOX_BACKGROUND_HASH"] = "0"
        self.env["COWBOX_TEST_MAP_WRITE_STALL"] = "1"
        a = self.new_ws(base)
        c = self.client(a, timeout=60)
        r = c.request("snapshot", files=True)
        self.assertTrue(r["full"], r)
        self.assertEqual(r["files"], base_map(base))
        # asked at once: served after the rows, as a delta against them
        r2 = c.request("snapshot", files=True, since=r["turn"], map_id=r["map_id"])
        self.assertIs(r2["full"], False, r2)
        self.assertEqual((r2["changed"], r2["deleted"]), ({}, []))
        self.assertEqual(r2["map_id"], r["map_id"])

        self.env["COWBOX_TEST_MAP_WRITE_STALL"] = "60"
        b = self.new_ws(base)
        pid = self.daemon_pid(b)
        c = self.client(b, timeout=60)
        r = c.request("snapshot", files=True)
        self.assertEqual(r["files"], base_map(base))
        os.kill(pid, signal.SIGKILL)  # in the stall: the reply went, the rows did not
        wait_for(lambda: not pid_alive(pid), 10, what="the daemon to die")
        victim = sorted(r["files"])[7]
        with open(os.path.join(base, victim), "wb") as f:
            f.write(b"changed while the daemon was dead")
        del self.env["COWBOX_TEST_MAP_WRITE_STALL"]
        self.mount(b)
        c = self.client(b, timeout=60)
        r2 = c.request("snapshot", files=True, since=r["turn"], map_id=r["map_id"])
        self.assertIs(r2["full"], True, r2)
        self.assertEqual(r2["files"], base_map(base))
        self.assertNotEqual(r2["files"][victim], r["files"][victim])
        r3 = c.request("snapshot", files=True, since=r2["turn"], map_id=r2["map_id"])
        self.assertIs(r3["full"], False, r3)


if __name__ == "__main__":
    unittest.main()
