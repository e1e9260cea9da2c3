"""Turns on real mounts: snapshot formats (sha256sum byte for byte), diff, rollback while files
are open and the tree is being read, prune, fork, and a kill -9 between a write and a
snapshot."""

import asyncio
import hashlib
import json
import mmap
from collections import Counter
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import cbtest  # noqa: E402
import cowbox  # noqa: E402
from cbtest import CowboxTestCase, pid_alive, quote_path, wait_for
from turnutil import expected_events, files_of, sha256sum_line, tree_state


# Reads every file of the tree in a loop until SIGTERM; prints how many walks it made.
WALKER = r"""
import os, signal, sys
root = sys.argv[1]
walks, stop = 0, []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(root)))),
                  "walking"), "w").close()
while not stop:
    for d, dirs, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(d, name), "rb") as f:
                    f.read()
            except FileNotFoundError:
                pass
    walks += 1
print(walks)
"""


class TurnsTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base({"README": "hello\n", "src/a.c": "int a;\n",
                                    "src/b.c": "int b;\n", "docs/x.md": "x\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def path(self, rel):
        return os.path.join(self.mnt, rel)

    def write(self, rel, text, mode="w"):
        with open(self.path(rel), mode) as f:
            f.write(text)

    def read(self, rel, root=None):
        with open(os.path.join(root or self.mnt, rel)) as f:
            return f.read()

    def snapshot(self, *args):
        return self.cowbox_json("snapshot", "w", *args)

    def test_snapshot_formats_match_sha256sum(self):
        # names that sha256sum escapes, and one that needs none
        self.write("back\\slash", "b\n")
        self.write("new\nline", "n\n")
        self.write("carriage\rreturn", "r\n")
        self.write("sp ace", "s\n")
        # names the daemon's JSON writer escapes: a quote, a tab, a control byte; and UTF-8
        self.write('quo"te\ttab\x01ctl \u00e9\u6f22\U0001f600', "q\n")
        snap = self.snapshot()
        self.assertEqual(snap["turn"], 1)
        self.assertEqual(snap["files"], files_of(tree_state(self.mnt)))
        out = self.cowbox("snapshot", "w", "--format", "sha256sum").stdout
        names = sorted(snap["files"], key=lambda s: s.encode())
        real = subprocess.run(["sha256sum", "--"] + names, cwd=self.mnt, capture_output=True,
                              text=True, check=True).stdout
        self.assertEqual(out, real)
        self.assertEqual(out, "".join(sha256sum_line(snap["files"][n], n) for n in names))
        # sha256sum -c verifies it inside the mount
        subprocess.run(["sha256sum", "--quiet", "-c", "-"], cwd=self.mnt, input=out, text=True,
                       check=True)
        # --changes: only what changed since the previous turn (the sha256sum snapshot
        # above changed nothing: it recorded no turn, turn 1 was its answer)
        self.write("src/a.c", "int a = 1;\n")
        ch = self.snapshot("--changes")
        self.assertEqual(ch["turn"], 2)
        self.assertEqual([(e["event"], e["path"]) for e in ch["changes"]],
                         [("modified", "src/a.c")])
        self.assertEqual(ch["changes"][0]["old"]["sha256"], snap["files"]["src/a.c"])

    def test_snapshot_streams_the_map(self):
        # More files than one frame holds: the daemon sends the map as frames in path order
        # (never one document), and the CLI's streamed --json and sha256sum output are the
        # whole map, sorted, equal to sha256sum over the tree.
        for i in range(5000):
            d = self.path("many/d%02d" % (i % 37))
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "f%04d é\\x" % i if i % 1000 == 7 else
                                   "f%04d" % i), "w") as f:
                f.write("%d\n" % i)
        # hashing 5,000 new files under ASan on a loaded machine can pass 10 s
        c = self.client(self.ref, timeout=120.0)
        c.next_id += 1
        c.send({"id": c.next_id, "op": "snapshot", "files": True, "stream": True})
        frames = []
        while True:
            msg = c.recv()
            if msg.get("stream") == "files":
                self.assertEqual(msg["turn"], 1)
                self.assertLessEqual(len(msg["files"]), 2048)
                frames.append(list(msg["files"].items()))
            elif "stream" not in msg:
                break
        self.assertTrue(msg["ok"] and msg["full"], msg)
        self.assertNotIn("files", msg)
        self.assertGreaterEqual(len(frames), 3)
        rows = [r for f in frames for r in f]
        self.assertEqual([k for k, _ in rows], sorted((k for k, _ in rows),
                                                      key=lambda s: s.encode()))
        want = files_of(tree_state(self.mnt))
        self.assertEqual(dict(rows), want)
        out = self.cowbox("snapshot", "w", "--json").stdout
        self.assertEqual(out.count("\n"), 1)
        snap = json.loads(out)
        # nothing changed since turn 1: no new turn, turn 1's whole map is the answer
        self.assertEqual((snap["turn"], snap["files"]), (1, want))
        self.assertEqual(list(snap["files"]), sorted(want, key=lambda s: s.encode()))
        out = self.cowbox("snapshot", "w", "--format", "sha256sum").stdout
        names = sorted(want, key=lambda s: s.encode())
        self.assertEqual(out, "".join(sha256sum_line(want[n], n) for n in names))
        subprocess.run(["sha256sum", "--quiet", "-c", "-"], cwd=self.mnt, input=out, text=True,
                       check=True)
        text = self.cowbox("snapshot", "w").stdout.splitlines()
        self.assertEqual(text[0], "turn 1")
        # names quoted as git's core.quotePath does (a name cannot forge a row)
        self.assertEqual(text[1:], ["%s  %s" % (quote_path(n), want[n]) for n in names])

    def test_snapshot_map_in_columns(self):
        # map_form "columns": each frame's paths as one string joined by "//" and its hashes
        # as another, and "raw": both as bytes after the frame's line; names the JSON writer
        # escapes, UTF-8, a trailing backslash and deep paths come back exact, over several
        # frames, and the Python client's snapshot() (which asks for raw) returns the same
        # dict.
        names = ['quo"te\ttab\x01ctl \u00e9\u6f22\U0001f600', "back\\", "new\nline",
                 "sp ace ", "a/b/c/d/e", "a/b/c/x y", "slash-end\\/in"]
        for i, n in enumerate(names):
            os.makedirs(os.path.dirname(self.path(n)) or self.mnt, exist_ok=True)
            self.write(n, "%d\n" % i)
        for i in range(300):
            self.write("many%03d" % i, "m%d\n" % i)
        want = files_of(tree_state(self.mnt))
        c = self.client(self.ref, timeout=120.0)
        c.next_id += 1
        c.send({"id": c.next_id, "op": "snapshot", "files": True, "stream": True,
                "frame_bytes": 4096, "map_form": "columns"})
        got, frames = {}, 0
        while True:
            msg = c.recv()
            if msg.get("stream") == "files":
                self.assertNotIn("files", msg)
                paths, hashes = msg["paths"].split("//"), msg["sha256"].split(" ")
                self.assertEqual(len(paths), len(hashes))
                got.update(zip(paths, hashes))
                frames += 1
            elif "stream" not in msg:
                break
        self.assertTrue(msg["ok"] and msg["full"], msg)
        self.assertGreaterEqual(frames, 3)
        self.assertEqual(got, want)
        # map_form "raw": the same columns as bytes after each frame's line (the paths as
        # they are, joined by NUL), the line announcing both lengths; a request on the same
        # connection meanwhile gets its own reply, never bytes of a frame
        c.next_id += 1
        c.send({"id": c.next_id, "op": "snapshot", "files": True, "stream": True,
                "frame_bytes": 4096, "map_form": "raw"})
        c.send({"id": c.next_id + 100, "op": "ping"})
        got, frames, other, final = {}, 0, [], None
        while final is None or not other:
            msg = c.recv()
            if msg.get("stream") == "files":
                self.assertEqual(msg["id"], c.next_id)
                self.assertEqual(set(msg) & {"files", "paths", "sha256"}, set())
                npaths, nhashes = msg["raw"]
                data = c.recv_bytes(npaths + nhashes)
                paths = data[:npaths].decode().split("\0")
                hashes = data[npaths:].decode("ascii").split(" ")
                self.assertEqual(len(paths), len(hashes))
                self.assertTrue(all(len(h) == 64 for h in hashes), hashes)
                got.update(zip(paths, hashes))
                frames += 1
            elif msg.get("id") == c.next_id + 100:
                other.append(msg)
            elif "stream" not in msg:
                final = msg
        self.assertTrue(final["ok"] and final["full"], final)
        self.assertTrue(other[0]["ok"], other)
        self.assertGreaterEqual(frames, 3)
        self.assertEqual(got, want)

        async def client_map():
            box = await cowbox.Sandbox.attach(self.ref, cowbox=cbtest.COWBOX, home=self.home)
            try:
                return await box.snapshot()
            finally:
                await box.close()
        self.assertEqual(asyncio.run(client_map()), want)

    def hard_links_case(self, passthrough):
        # A file of 40 names (more than any fixed list would hold), two of them in another
        # directory renamed later: a change through one name changes the hash of all, in the
        # same snapshot; also after a remount, when the mount has looked up only the name
        # changed through. With passthrough the writes (also through a shared mapping) never
        # reach the daemon: the open for writing marks every name. Each remount follows a
        # turn that did not touch the file, so no earlier turn's rows bring the names back.
        self.env["COWBOX_FUSE_PASSTHROUGH"] = passthrough
        self.cowbox("umount", "w")
        self.mount(self.ref)
        names = ["links/n%d" % i for i in range(38)] + ["sub/m0", "sub/m1"]
        os.mkdir(self.path("links"))
        os.mkdir(self.path("sub"))
        self.write(names[0], "v1\n")
        for name in names[1:]:
            os.link(self.path(names[0]), self.path(name))

        def same_everywhere(changed_through, only_names=True):
            snap = self.snapshot()
            self.assertEqual(snap["files"], files_of(tree_state(self.mnt)), changed_through)
            self.assertEqual(len({snap["files"][n] for n in names}), 1, changed_through)
            # every name is a change of the turn (not one, or the names the mount knows)
            log = self.cowbox_json("diff", "w", snap["turn"] - 1, snap["turn"])
            if only_names:
                self.assertEqual(sorted(e["path"] for e in log["events"]), sorted(names),
                                 changed_through)

        same_everywhere("created", False)
        self.write("links/n7", "v2\n", "a")
        same_everywhere("links/n7")
        os.rename(self.path("sub"), self.path("moved"))
        names[-2:] = ["moved/m0", "moved/m1"]
        same_everywhere("rename of sub", False)

        def remount():
            self.write("elsewhere", str(time.monotonic()))
            self.snapshot()
            self.cowbox("umount", "w")
            self.mount(self.ref)

        remount()
        with open(self.path("links/n3"), "a") as f:
            f.write("v3\n")
        same_everywhere("links/n3")
        remount()
        with open(self.path("moved/m1"), "r+b") as f:
            with mmap.mmap(f.fileno(), 0) as m:
                m[0:2] = b"V1"
                m.flush()
        same_everywhere("mmap of moved/m1")
        remount()
        os.truncate(self.path("links/n30"), 2)
        same_everywhere("truncate of links/n30")
        remount()
        with open(self.path("links/n9"), "w") as f:  # O_TRUNC, then the new bytes
            f.write("v4\n")
        same_everywhere("open O_TRUNC of links/n9")
        self.assertEqual(self.read("moved/m0"), "v4\n")

    def test_a_write_through_one_hard_link_changes_every_name(self):
        self.hard_links_case("1")

    def test_a_write_through_one_hard_link_changes_every_name_page_cache(self):
        self.hard_links_case("0")

    def test_diff_events_attribution_and_patch(self):
        self.snapshot()
        before = tree_state(self.mnt)
        subprocess.run(["sh", "-c", "echo 'int a = 2;' > src/a.c; echo y > docs/y.md"],
                       cwd=self.mnt, check=True)
        os.unlink(self.path("README"))
        os.chmod(self.path("docs/x.md"), 0o600)
        os.symlink("src/a.c", self.path("link"))
        os.rename(self.path("src"), self.path("lib"))
        os.mkdir(self.path("empty"), 0o700)
        with open(self.path("bin.dat"), "wb") as f:
            f.write(b"\0\1\2")
        after = tree_state(self.mnt)
        # live diff (no turn recorded), then the same between turns
        live = self.cowbox_json("diff", "w", "1")
        self.assertEqual(live["b"], "live")
        got = {e["path"]: e["event"] for e in live["events"]}
        self.assertEqual(got, expected_events(before, after))
        self.assertEqual(self.snapshot()["turn"], 2)
        d = self.cowbox_json("diff", "w", "1", "2")
        self.assertEqual({e["path"]: e["event"] for e in d["events"]}, got)
        ev = {e["path"]: e for e in d["events"]}
        self.assertEqual(ev["docs/y.md"]["comm"], "sh")
        self.assertGreater(ev["docs/y.md"]["pid"], 0)
        self.assertEqual(ev["lib/a.c"]["comm"], "python3")  # it came with the rename
        self.assertEqual(ev["docs/x.md"]["old"]["mode"], 0o644)
        self.assertEqual(ev["docs/x.md"]["new"]["mode"], 0o600)
        self.assertEqual(ev["link"]["new"]["target"], "src/a.c")
        # the reverse direction swaps created and deleted
        rev = self.cowbox_json("diff", "w", "2", "1")
        self.assertEqual({e["path"]: e["event"] for e in rev["events"]},
                         expected_events(after, before))
        patch = self.cowbox("diff", "w", "1", "2", "--patch").stdout
        self.assertIn("--- a/src/a.c", patch)
        self.assertIn("+++ /dev/null", patch)
        self.assertIn("+int a = 2;", patch)
        self.assertIn("Binary files /dev/null and b/bin.dat differ", patch)
        self.assertIn("mode_changed", patch)  # no content to diff: the one-line event
        self.assertIn("created      symlink link  src/a.c", patch)
        human = self.cowbox("diff", "w", "1", "2").stdout
        self.assertIn("mode_changed", human)
        self.assertIn("docs/x.md", human)
        self.assert_fails(["diff", "w", "7"], "turn 7 does not exist")
        self.assert_fails(["diff", "w", "x"], "no turn labelled 'x'", status=3)

    def test_rollback_with_open_files_and_a_reader(self):
        self.write("src/a.c", "turn one\n")
        t1 = self.snapshot()["turn"]
        s1 = tree_state(self.mnt)
        self.write("src/a.c", "turn two\n")
        os.unlink(self.path("src/b.c"))
        self.write("docs/new.md", "new\n")
        os.chmod(self.path("docs"), 0o700)
        t2 = self.snapshot()["turn"]
        s2 = tree_state(self.mnt)
        # a reader holds src/a.c open, a writer holds docs/new.md open, and a process keeps
        # reading the whole tree while the rollback runs
        reader = open(self.path("src/a.c"))
        writer = open(self.path("docs/new.md"), "a")
        # another process walks and reads the whole tree over and over meanwhile; a path
        # the rollback just removed may vanish under it, anything else is a failure
        walker = subprocess.Popen(
            [sys.executable, "-c", WALKER, self.mnt], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: os.path.exists(os.path.join(self.tmp, "walking")) or
                     walker.poll() is not None, what="the walker to start")
            r = self.cowbox_json("rollback", "w", str(t1))
        finally:
            walker.terminate()
            out, err = walker.communicate(timeout=30)
        self.assertEqual(err.strip(), "")
        self.assertGreater(int(out.split()[-1]), 0)
        self.assertEqual(r["turn"], t2 + 1)
        self.assertEqual(tree_state(self.mnt), s1)
        # a cat right after sees the turn's content; the open reader keeps its old file
        self.assertEqual(subprocess.run(["cat", self.path("src/a.c")], capture_output=True,
                                        text=True).stdout, "turn one\n")
        self.assertEqual(reader.read(), "turn two\n")
        reader.close()
        # the writer's file was removed from the tree: its writes land in the orphan
        writer.write("late\n")
        writer.close()
        self.assertFalse(os.path.exists(self.path("docs/new.md")))
        # the rollback is a turn: rolling back to the turn before it undoes it
        self.cowbox_json("rollback", "w", str(t2))
        self.assertEqual(tree_state(self.mnt), s2)
        turns = self.cowbox_json("turns", "w")["turns"]
        self.assertEqual(turns[2]["label"], "rollback to %d" % t1)

    def test_prune_and_info(self):
        self.snapshot()
        for i in range(4):
            self.write("src/a.c", "version %d %s\n" % (i, "x" * 5000 * i))
            self.snapshot()
        before = self.cowbox_json("turns", "w")
        self.assertEqual(before["blob_count"], 4)
        p = self.cowbox_json("prune", "w", "--keep", "2")
        self.assertEqual(p["dropped"], 3)
        self.assertGreater(p["freed_bytes"], 0)
        after = self.cowbox_json("turns", "w")
        self.assertEqual([t["turn"] for t in after["turns"]], [4, 5])
        self.assertEqual(after["blob_count"], 2)
        self.assertLess(after["blob_bytes"], before["blob_bytes"])
        self.assert_fails(["diff", "w", "2", "5"], "turn 2 was pruned")
        # the base and the kept turns are whole
        self.cowbox("rollback", "w", "0")
        self.assertEqual(self.read("src/a.c"), "int a;\n")
        self.cowbox("rollback", "w", "4")
        self.assertTrue(self.read("src/a.c").startswith("version 2"))
        self.assertIn("blobs:", self.cowbox("turns", "w").stdout)
        info = self.cowbox_json("info", "w")
        self.assertEqual((info["blob_count"], info["blob_bytes"]),
                         (after["blob_count"], after["blob_bytes"]))
        self.assertIn("blob store:  2 blobs", self.cowbox("info", "w").stdout)
        self.assert_fails(["prune", "w", "--keep", "0"], "--keep", status=2)

    def test_fork_is_independent(self):
        self.write("src/a.c", "forked content\n")
        os.unlink(self.path("README"))
        os.symlink("docs/x.md", self.path("link"))
        t = self.snapshot()["turn"]
        want = tree_state(self.mnt)
        self.write("src/a.c", "after the fork point\n")
        self.snapshot()
        start = time.monotonic()
        fork = self.cowbox_json("fork", "w", str(t), "--name", "w2")
        elapsed = time.monotonic() - start
        self.assertTrue(fork["ref"].startswith("cb-"))
        self.mount("w2")
        m2 = self.mountpoint(fork["ref"])
        self.assertEqual(tree_state(m2), want)
        # the fork's turn 1 is the forked turn (nothing changed in the fork yet: a snapshot
        # answers it); it goes on on its own
        s = json.loads(self.cowbox("snapshot", "w2", "--json").stdout)
        self.assertEqual(s["turn"], 1)
        self.assertEqual(s["files"], files_of(want))
        with open(os.path.join(m2, "src/a.c"), "w") as f:
            f.write("changed in the fork\n")
        self.cowbox("rollback", "w2", "1")
        self.assertEqual(self.read("src/a.c", m2), "forked content\n")
        # deleting the original does not break the fork (blobs are shared by links): turn 2
        # (the change kept before that rollback) and back to the forked turn 1
        self.cowbox("rm", "w")
        self.cowbox("rollback", "w2", "2")
        self.assertEqual(self.read("src/a.c", m2), "changed in the fork\n")
        self.cowbox("rollback", "w2", "1")
        self.assertEqual(tree_state(m2), want)
        self.assertLess(elapsed, 10)
        self.assert_fails(["fork", "w2", "99", "--name", "w3"], "turn 99 does not exist")
        self.assert_fails(["fork", "w2", "1", "--name", "w2"], "w2")  # the name is taken
        self.assert_fails(["fork", "w2", "1"], "--name", status=2)
        self.assertEqual(sorted(os.listdir(os.path.join(self.home, "workspaces"))),
                         [fork["ref"]])  # a refused fork leaves nothing behind

    def test_snapshot_while_a_file_is_being_written(self):
        # a writer appends fixed-size lines while snapshots run: each recorded hash must be
        # of a state the file really had (a whole number of lines), never of a torn read
        stop = threading.Event()
        line = b"%063d\n"

        def append():
            with open(self.path("log.txt"), "ab", buffering=0) as f:
                i = 0
                while not stop.is_set():
                    f.write(line % i)
                    i += 1
                    time.sleep(0.002)

        th = threading.Thread(target=append)
        th.start()
        seen = []
        try:
            for _ in range(5):
                seen.append(self.snapshot()["files"].get("log.txt"))
        finally:
            stop.set()
            th.join()
        with open(self.path("log.txt"), "rb") as f:
            final = f.read()
        prefixes = {hashlib.sha256(final[:n]).hexdigest() for n in range(0, len(final) + 1, 64)}
        for h in seen:
            if h is not None:
                self.assertIn(h, prefixes)
        self.assertTrue(any(seen))

    def test_progress_bar_only_on_a_terminal(self):
        base = self.make_base({"d%d/f%d" % (i % 7, i): "%d\n" % i for i in range(300)})
        self.create(base, "big")
        # no background hash: this first snapshot hashes the base itself
        self.env["COWBOX_BACKGROUND_HASH"] = "0"
        self.mount("big")
        del self.env["COWBOX_BACKGROUND_HASH"]
        # stderr a terminal: the first (base-hashing) snapshot draws a bar there
        master, slave = os.openpty()
        proc = subprocess.run([os.environ.get("COWBOX", "cowbox"), "snapshot", "big",
                               "--format", "sha256sum"], env=self.env, stdout=subprocess.PIPE,
                              stderr=slave, timeout=60)
        os.close(slave)
        bar = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            bar += chunk
        os.close(master)
        self.assertEqual(proc.returncode, 0)
        self.assertIn(b"hashing base [", bar)
        self.assertIn(b"300/300 files 100%", bar)
        self.assertEqual(len(proc.stdout.splitlines()), 300)
        # not a terminal: nothing on stderr, even for a first hash
        self.create(base, "big2")
        proc = self.cowbox("snapshot", "big2", "--format", "sha256sum")
        self.assertEqual(proc.stderr, "")

    def test_no_fd_leak_in_the_daemon(self):
        self.snapshot()
        pid = self.daemon_pid(self.ref)

        def fds():
            # files, directories and sockets; FUSE worker threads come and go with splice
            # pipes of their own, which are libfuse's
            targets = []
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    targets.append(os.readlink("/proc/%d/fd/%s" % (pid, fd)))
                except FileNotFoundError:
                    pass
            # the journal keeps the last four callers' /proc/PID/comm open (fs/journal.c):
            # bounded, not a leak
            return sorted(t for t in targets if not t.startswith(("pipe:", "anon_inode:"))
                          and not (t.startswith("/proc/") and t.endswith("/comm")))

        # the journal's mark log is opened at the daemon's first mark and kept: one fd
        self.write("first.txt", "marked\n")
        before = fds()
        self.assertEqual(sum(t.endswith("/meta.db-marks") for t in before), 1, before)
        for i in range(3):
            self.write("src/a.c", "round %d\n" % i)
            os.symlink("x", self.path("l%d" % i))
            t = self.snapshot("--changes")["turn"]
            self.cowbox_json("diff", "w", "1")
            self.cowbox("diff", "w", "1", str(t), "--patch")
            self.cowbox_json("rollback", "w", "1")
            self.cowbox_json("turns", "w")
            self.cowbox_json("prune", "w", "--keep", "5")
        self.cowbox_json("fork", "w", str(t), "--name", "w-fd")
        # A leak is an fd now that was not there before; the connection of the snapshot
        # above may still have been open when before was taken (closed asynchronously).
        wait_for(lambda: not Counter(fds()) - Counter(before), timeout=5,
                 what="the daemon's fds to return to %s (now %s)" % (before, fds()))

    def test_kill_between_write_and_snapshot(self):
        self.snapshot()
        pid = self.daemon_pid(self.ref)
        self.write("src/a.c", "written before the crash\n")
        self.write("fresh.txt", "also\n")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), what="daemon to die")
        # the next snapshot starts a new daemon and still sees both changes
        ch = self.cowbox_json("snapshot", "w", "--changes")
        got = {e["path"]: e["event"] for e in ch["changes"]}
        self.assertEqual(got, {"src/a.c": "modified", "fresh.txt": "created"})
        self.assertEqual(self.read("src/a.c"), "written before the crash\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
