"""Seeded kill -9 of the workspace daemon at random points of snapshot, rollback, fork, prune
and of the API's reads and writes of big files: the daemon is gone within seconds (never
wedged), `cowbox mount` works again at once, no half fork is listed or mounts, no rollback
temp is left in the tree or in the next snapshot, and every recorded turn still restores the
right bytes. kill -9 of the turn worker alone: the op in flight fails saying so, the next one
gets a new worker.

COWBOX_SEED replays a run (the seed is printed); COWBOX_FAULT_TRIALS sets trials per op
(default 10; scripts/fault-soak runs 100)."""

import base64
import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import cbtest
from cbtest import CowboxTestCase, reap_children, wait_for
from turnutil import files_of, tree_state

SEED = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 31))
TRIALS = int(os.environ.get("COWBOX_FAULT_TRIALS") or 10)
GONE_WITHIN = 5.0  # seconds for a killed daemon (and its worker) to be gone entirely


def proc_exists(pid):
    """True while anything of pid is left (a zombie whose threads still wait counts)."""
    reap_children()
    return os.path.exists("/proc/%d" % pid)


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def descendants_of(pid):
    """Every process below pid (the spawner and its workers)."""
    out, todo = [], [pid]
    while todo:
        kids = children_of(todo.pop())
        out += kids
        todo += kids
    return out


def comm_of(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def thread_states(pid):
    states = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except OSError:
        pass
    return states


class KillMidTurn(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.rng = random.Random(SEED)
        sys.stderr.write("\ntest_faults_kill: COWBOX_SEED=%d trials=%d\n" % (SEED, TRIALS))
        files = {"src/a%03d.txt" % i: "base file %d\n" % i for i in range(60)}
        self.ref = self.create(base=self.make_base(files), name="main")
        self.pid = self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)
        self.recorded = {}  # turn -> files_of(tree_state) when it was recorded
        self.forks = {}  # fork name -> the turn it was made from
        self.nfork = 0
        self.interrupted = 0  # trials where the kill came before the operation finished
        self.trials_run = 0
        self.addCleanup(lambda: sys.stderr.write(
            "test_faults_kill: %s: the kill interrupted the operation in %d of %d trials\n"
            % (self._testMethodName, self.interrupted, self.trials_run)))
        for _ in range(2):
            self.change_tree()
            self.record()

    # --- the workspace ---

    def change_tree(self):
        """A random batch of changes: new files (some of a few MiB so that turn ops take
        long enough to be killed in the middle), rewrites and deletes."""
        rng = self.rng
        for _ in range(rng.randrange(5, 25)):
            d = os.path.join(self.mnt, "work", "d%d" % rng.randrange(4))
            os.makedirs(d, exist_ok=True)
            size = rng.choice([100, 4096, 65536, 1 << 20, 3 << 20])
            with open(os.path.join(d, "f%03d" % rng.randrange(60)), "wb") as f:
                f.write(rng.randbytes(size))
        for _ in range(rng.randrange(0, 5)):
            p = os.path.join(self.mnt, "src", "a%03d.txt" % rng.randrange(60))
            if os.path.exists(p):
                if rng.random() < 0.5:
                    os.unlink(p)
                else:
                    with open(p, "a") as f:
                        f.write("changed %d\n" % rng.randrange(1 << 30))

    def record(self):
        """Snapshot now and remember the tree that turn must restore."""
        out = self.cowbox_json("snapshot", self.ref)
        state = files_of(tree_state(self.mnt))
        self.assertEqual(out["files"] if isinstance(out.get("files"), dict) else state, state)
        self.recorded[out["turn"]] = state
        return out

    def turns_listed(self):
        return {t["turn"] for t in self.cowbox_json("turns", self.ref)["turns"]}

    def temp_names(self, root):
        found = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                if name.startswith(".cowbox-"):
                    found.append(os.path.join(dirpath, name))
        return found

    # --- one trial ---

    def connect(self):
        return cbtest.Client(os.path.join(self.ws_dir(self.ref), "control.sock"), timeout=120)

    def timed(self, op, **args):
        """Run op through the protocol to the end; how long it took (kill moments are
        picked inside that span, measured from the request, without a CLI's start-up)."""
        c = self.connect()
        try:
            t0 = time.monotonic()
            reply = c.request(op, **args)
            self.assertNotIn("error", reply)
            return time.monotonic() - t0
        finally:
            c.close()

    def kill_during(self, op, args, what, est):
        """Send op, kill -9 the daemon at a random moment of the est seconds it takes, then
        check it is gone entirely within GONE_WITHIN seconds; mount it again."""
        delay = self.rng.uniform(0.0, est)
        c = self.connect()
        c.send(dict(args, id=1, op=op))
        time.sleep(delay)
        self.kill_and_wait(what)
        t_gone = time.monotonic()
        completed = False
        try:
            while True:
                reply = c.recv()
                if reply.get("id") == 1 and "stream" not in reply:
                    completed = "error" not in reply
        except (ConnectionError, OSError, ValueError):
            pass
        c.close()
        self.interrupted += not completed
        self.trials_run += 1
        self.remount_at_once(what, "%s after %.2fs of %.2fs, gone %.2fs" % (
            "completed" if completed else "interrupted", delay, est, t_gone - self.t_kill))

    def kill_and_wait(self, what):
        """kill -9 the daemon; it and every process below it (spawner, workers) must be gone
        entirely within GONE_WITHIN seconds."""
        workers = [p for p in descendants_of(self.pid) if comm_of(p).startswith("cowbox")]
        os.kill(self.pid, signal.SIGKILL)
        self.t_kill = t0 = time.monotonic()
        for pid in [self.pid] + workers:
            deadline = t0 + GONE_WITHIN
            while proc_exists(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertFalse(
                proc_exists(pid),
                "%s (seed %d): pid %d is still there %.1fs after kill -9 (thread states %s)"
                % (what, SEED, pid, GONE_WITHIN, thread_states(pid)))

    def remount_at_once(self, what, how):
        t1 = time.monotonic()
        self.pid = self.mount(self.ref)
        t2 = time.monotonic()
        if os.environ.get("COWBOX_FAULT_VERBOSE"):
            sys.stderr.write("%s: %s, mount %.2fs\n" % (what, how, t2 - t1))
        self.assertLess(t2 - t1, 15, "mount after the kill took too long")

    def check_after(self, what):
        upper = os.path.join(self.ws_dir(self.ref), "upper")
        self.assertEqual(self.temp_names(self.mnt), [], "%s (seed %d)" % (what, SEED))
        self.assertEqual(self.temp_names(upper), [], "%s (seed %d)" % (what, SEED))
        out = self.record()
        self.assertEqual([p for p in out.get("files", {}) if ".cowbox-" in p], [])
        self.check_forks(what)
        # A turn chosen at random still restores exactly what it held.
        listed = self.turns_listed()
        for turn in list(self.recorded):
            if turn not in listed:
                del self.recorded[turn]
        turn = self.rng.choice(sorted(self.recorded))
        self.restore_and_compare(turn, what)

    def check_every_turn(self, what):
        """After all the kills: every turn still listed restores exactly what it held."""
        listed = self.turns_listed()
        for turn in sorted(t for t in self.recorded if t in listed):
            self.restore_and_compare(turn, "%s, every turn" % what)

    def restore_and_compare(self, turn, what):
        self.cowbox("rollback", self.ref, turn)
        self.assertEqual(files_of(tree_state(self.mnt)), self.recorded[turn],
                         "%s (seed %d): rollback to %d" % (what, SEED, turn))

    def check_forks(self, what):
        listed = json.loads(self.cowbox("ls", "--json").stdout)
        workspaces = os.path.join(self.home, "workspaces")
        self.assertEqual([n for n in os.listdir(workspaces) if n.startswith(".unpublished-")],
                         [], "%s (seed %d): an interrupted fork is left" % (what, SEED))
        for ws in listed:
            if ws["ref"] == self.ref:
                continue
            self.assertNotEqual(ws.get("state"), "incomplete", "%s: %s" % (what, ws))
            name = ws.get("name")
            if name is None and len(self.forks) == 1:
                # Killed after the rename that publishes it and before its name link: a
                # complete fork, listed under its ref only. Its tree must still be right.
                name = next(iter(self.forks))
                ws["name"] = None
            turn = self.forks.get(name)
            self.assertIsNotNone(turn, "%s (seed %d): unknown workspace %s" % (what, SEED, ws))
            self.mount(ws["ref"])
            got = files_of(tree_state(self.mountpoint(ws["ref"])))
            self.cowbox("rm", ws["name"] or ws["ref"])
            want = self.recorded_at_fork[name]
            self.assertEqual(got, want,
                             "%s (seed %d): fork %s of turn %d: missing %s, extra %s, differ %s"
                             % (what, SEED, name, turn, sorted(set(want) - set(got)),
                                sorted(set(got) - set(want)),
                                sorted(p for p in want if p in got and got[p] != want[p])))
            self.assertEqual(got, want,
                             "%s (seed %d): fork %s of turn %d" % (what, SEED, name, turn))
        self.forks.clear()

    # --- the ops ---

    def test_kill_during_snapshot(self):
        self.change_tree()
        est = self.timed("snapshot")
        for i in range(TRIALS):
            self.change_tree()
            self.kill_during("snapshot", {}, "snapshot trial %d" % i, est)
            self.check_after("snapshot trial %d" % i)
        self.check_every_turn("snapshot")

    def test_kill_during_rollback(self):
        self.change_tree()
        est = self.timed("rollback", turn=min(self.recorded))
        for i in range(TRIALS):
            self.change_tree()
            turn = self.rng.choice(sorted(self.recorded))
            self.kill_during("rollback", {"turn": turn}, "rollback trial %d" % i, est)
            self.check_after("rollback trial %d" % i)
        self.check_every_turn("rollback")

    def test_kill_during_fork(self):
        self.recorded_at_fork = {}
        est = self.timed("fork", turn=max(self.recorded), name="calibrate")
        self.cowbox("rm", "calibrate")
        for i in range(TRIALS):
            turn = self.rng.choice(sorted(self.recorded))
            self.nfork += 1
            name = "f%d" % self.nfork
            self.forks[name] = turn
            self.recorded_at_fork[name] = self.recorded[turn]
            self.kill_during("fork", {"turn": turn, "name": name}, "fork trial %d" % i, est)
            self.check_after("fork trial %d" % i)
        self.check_every_turn("fork")

    def test_kill_during_prune(self):
        est = 0.1
        for i in range(TRIALS):
            self.change_tree()
            self.record()
            keep = self.rng.randrange(1, 4)
            if i == 0:
                est = self.timed("prune", keep=keep + 2)
            self.kill_during("prune", {"keep": keep}, "prune trial %d" % i, est)
            # Pruned or not, never half: the turns listed are a suffix of what was there.
            listed = sorted(self.turns_listed())
            self.assertEqual(listed, list(range(listed[0], listed[-1] + 1)))
            self.check_after("prune trial %d" % i)
        self.check_every_turn("prune")

    def file_traffic(self, big, rounds):
        """Four connections at once, each sending `rounds` pipelined requests of 4 MiB: two
        read the big files, two write new ones. Returns the threads (they end when the
        daemon answers everything or goes away) and the connections."""
        chunk = 4 << 20
        conns = [self.connect() for _ in range(4)]

        def reader(c, path):
            for i in range(rounds):
                c.send({"id": i + 1, "op": "read", "path": path,
                        "offset": (i * chunk) % (16 << 20),
                        "length": chunk})

        def writer(c, path, data):
            for i in range(rounds):
                c.send({"id": i + 1, "op": "write", "path": path, "offset": i * chunk,
                        "data": data, "truncate": i == 0})

        def drain(c, send):
            try:
                send()
                got = 0
                while got < rounds:
                    reply = c.recv()
                    if "stream" not in reply:
                        got += 1
                        c.answers.append(reply)
            except (ConnectionError, OSError, ValueError):
                pass

        data = base64.b64encode(big[:chunk]).decode()
        jobs = [lambda c=conns[0]: reader(c, "big/r0"), lambda c=conns[1]: reader(c, "big/r1"),
                lambda c=conns[2]: writer(c, "big/w0", data),
                lambda c=conns[3]: writer(c, "big/w1", data)]
        threads = []
        for c, job in zip(conns, jobs):
            c.answers = []
            t = threading.Thread(target=drain, args=(c, job), daemon=True)
            t.start()
            threads.append(t)
        return threads, conns

    def test_kill_during_reads_and_writes(self):
        """The API's read and write go through the mount in the file workers, never in a
        thread of the daemon: a daemon killed with big reads and writes in flight still
        dies at once."""
        big = self.rng.randbytes(16 << 20)
        os.makedirs(os.path.join(self.mnt, "big"), exist_ok=True)
        for name in ("r0", "r1"):
            with open(os.path.join(self.mnt, "big", name), "wb") as f:
                f.write(big)
        self.record()
        t0 = time.monotonic()
        threads, conns = self.file_traffic(big, 2)
        for t in threads:
            t.join(120)
        est = time.monotonic() - t0
        for c in conns:
            self.assertEqual([a for a in c.answers if "error" in a], [])
            self.assertEqual(len(c.answers), 2)
            c.close()
        for i in range(TRIALS):
            what = "reads and writes trial %d" % i
            threads, conns = self.file_traffic(big, 2)
            delay = self.rng.uniform(0.0, est)
            time.sleep(delay)
            self.kill_and_wait(what)
            for t in threads:
                t.join(10)
            answered = sum(len(c.answers) for c in conns)
            for c in conns:
                c.close()
            self.interrupted += answered < 8
            self.trials_run += 1
            self.remount_at_once(what, "%d of 8 answered after %.2fs of %.2fs" % (
                answered, delay, est))
            self.check_after(what)

    def test_turn_worker_killed_during_snapshot_is_replaced(self):
        """kill -9 of the turn worker alone during a snapshot (even trials) or a rollback
        (odd ones): the op fails saying so (or had finished), the daemon lives on, and the
        next snapshot gets a new worker (which removes a killed rollback's temporary names)
        and records exactly what sha256sum reads in the tree."""
        self.change_tree()
        est = {"snapshot": self.timed("snapshot"),
               "rollback": self.timed("rollback", turn=min(self.recorded))}
        for i in range(TRIALS):
            what = "worker kill trial %d" % i
            self.change_tree()
            op, args = "snapshot", {}
            if i % 2:
                op, args = "rollback", {"turn": self.rng.choice(sorted(self.recorded))}
            before = [p for p in descendants_of(self.pid) if comm_of(p) == "cowbox-worker"]
            self.assertEqual(len(before), 1, "%s: one turn worker expected: %s" % (what, before))
            c = self.connect()
            c.send(dict(args, id=1, op=op))
            time.sleep(self.rng.uniform(0.0, est[op]))
            os.kill(before[0], signal.SIGKILL)
            t0 = time.monotonic()
            c.sock.settimeout(30)
            while True:
                reply = c.recv()
                if reply.get("id") == 1 and "stream" not in reply:
                    break
            c.close()
            self.assertLess(time.monotonic() - t0, 30)
            self.trials_run += 1
            if "error" in reply:
                self.interrupted += 1
                self.assertIn("turn worker (pid %d) was killed by signal 9" % before[0],
                              reply["error"]["message"], what)
            self.assertTrue(proc_exists(self.pid), "%s: the daemon died too" % what)
            c = self.connect()
            out = c.request("snapshot", files=True)
            c.close()
            self.assertNotIn("error", out, what)
            sums = subprocess.run(
                "find . -type f -print0 | xargs -0r sha256sum", shell=True, cwd=self.mnt,
                capture_output=True, text=True, check=True).stdout
            want = {line[66:][2:] if line[66:].startswith("./") else line[66:]: line[:64]
                    for line in sums.splitlines()}
            self.assertEqual(out["files"], want, "%s (seed %d)" % (what, SEED))
            self.recorded[out["turn"]] = files_of(tree_state(self.mnt))
            after = [p for p in descendants_of(self.pid) if comm_of(p) == "cowbox-worker"]
            self.assertNotIn(before[0], after)
            self.check_after(what)

    def test_oom_kill_during_snapshot(self):
        """The OOM killer's SIGKILL is a kill -9 nobody asked for: the same promises hold.
        The daemon alone goes into a memory cgroup (v1) with a small limit, and a request
        line it has to buffer pushes it over while its worker is busy with a snapshot."""
        memory = "/sys/fs/cgroup/memory"
        if not os.path.exists(os.path.join(memory, "cgroup.procs")):
            self.skipTest("no memory cgroup (v1) hierarchy at %s" % memory)
        cg = os.path.join(memory, "cowbox-faults-%d" % os.getpid())
        os.mkdir(cg)

        def remove_cgroup():
            with open(os.path.join(cg, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        with open(os.path.join(memory, "cgroup.procs"), "w") as root:
                            root.write(pid)
                    except OSError:
                        pass
            wait_for(lambda: not open(os.path.join(cg, "cgroup.procs")).read().strip(), 10,
                     what="the test cgroup to empty")
            os.rmdir(cg)
        self.addCleanup(remove_cgroup)
        self.change_tree()
        est = self.timed("snapshot")
        for i in range(max(1, TRIALS // 5)):
            what = "oom trial %d" % i
            self.change_tree()
            with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
                f.write(str(8 << 20))
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write(str(self.pid))
            proc = subprocess.Popen([cbtest.COWBOX, "snapshot", self.ref], env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(self.rng.uniform(0.0, est))
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(os.path.join(self.ws_dir(self.ref), "control.sock"))
            pid, t0 = self.pid, time.monotonic()
            try:
                sock.sendall(b'{"op":"ping","pad":"' + b"x" * (15 << 20))
            except OSError:
                pass  # killed while we were still sending
            while proc_exists(pid) and time.monotonic() < t0 + 10 + GONE_WITHIN:
                time.sleep(0.02)
            sock.close()
            self.assertFalse(proc_exists(pid), "%s (seed %d): pid %d is still there (thread "
                             "states %s)" % (what, SEED, pid, thread_states(pid)))
            with open(os.path.join(cg, "memory.oom_control")) as f:
                kills = dict(line.split() for line in f if line.strip()).get("oom_kill")
            self.assertEqual(kills, str(i + 1), "%s: the OOM killer did not act" % what)
            proc.wait(timeout=60)
            self.interrupted += proc.returncode != 0
            self.trials_run += 1
            self.pid = self.mount(self.ref)
            self.check_after(what)


def proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def in_mount_call(pid):
    """True if pid sleeps in a system call other than its socket's read and send."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            nr = f.read().split()[0]
    except (OSError, IndexError):
        return False
    return nr not in ("running", "0", "44", "45", "-1")


class StuckPredecessorTest(CowboxTestCase):
    """A predecessor that genuinely cannot exit: its file worker waits, in D state, on a FUSE
    request that was taken from /dev/fuse and will never be answered (the test takes a copy
    of the daemon's /dev/fuse with pidfd_getfd, stops the daemon, takes the worker's requests
    off the queue, then kills the daemon: the copy keeps the connection from being aborted).
    Only aborting the connection through fusectl frees it; `cowbox mount` must do so, say so,
    and mount."""

    def test_mount_aborts_a_stuck_predecessor(self):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        # Requests must come through read(2) of /dev/fuse, not through io_uring queues.
        self.env["COWBOX_FUSE_URING"] = "0"
        ref = self.create(base=self.make_base({"a.txt": "a\n"}))
        pid = self.mount(ref)
        mnt = self.mountpoint(ref)
        fds = []
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:  # the daemon opens and closes other fds meanwhile
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == "/dev/fuse":
                    fds.append(int(fd))
            except FileNotFoundError:
                pass
        self.assertTrue(fds, "the daemon holds no /dev/fuse")
        pidfd = libc.syscall(434, pid, 0)  # pidfd_open
        self.assertGreaterEqual(pidfd, 0, os.strerror(ctypes.get_errno()))
        fuse = libc.syscall(438, pidfd, fds[0], 0)  # pidfd_getfd
        self.assertGreaterEqual(fuse, 0, os.strerror(ctypes.get_errno()))
        os.close(pidfd)
        fuse_open = [True]

        def close_fuse():
            if fuse_open[0]:
                os.close(fuse)
                fuse_open[0] = False
        self.addCleanup(close_fuse)

        # API writes of new files, pipelined, keep the file workers asking the mount.
        c = cbtest.Client(os.path.join(self.ws_dir(ref), "control.sock"), timeout=5)
        answered = []

        def traffic():
            try:
                for i in range(1, 1 << 20):
                    c.send({"id": i, "op": "write", "path": "s/%d" % i, "data": "eA=="})
                    if i > 8:
                        answered.append(c.recv())
            except (ConnectionError, OSError, ValueError):
                pass
        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        wait_for(lambda: len(answered) > 20, 30, what="the API writes to run")
        # File workers are named "cowbox", as the daemon (their writes are the daemon's).
        workers = [p for p in descendants_of(pid) if comm_of(p) == "cowbox"]
        # Stop the daemon at a moment a worker is inside a call on the mount (not waiting
        # on its socket for the daemon's next request, nor sending its answer).
        for _ in range(500):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            if any(in_mount_call(w) for w in workers):
                break
            os.kill(pid, signal.SIGCONT)
            time.sleep(random.uniform(0.0, 0.02))
        else:
            self.fail("no worker was ever caught inside a call on the mount")
        os.set_blocking(fuse, False)
        taken = 0

        def take(seconds):
            nonlocal taken
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    os.read(fuse, 1 << 21)
                    taken += 1
                except BlockingIOError:
                    time.sleep(0.01)
        take(1.0)
        os.kill(pid, signal.SIGKILL)
        take(0.5)
        wait_for(lambda: not proc_exists(pid), 10, what="the daemon to go")
        stuck = [w for w in workers if proc_state(w) == "D"]
        self.assertTrue(stuck, "no worker is stuck (%d requests taken; states %s)"
                        % (taken, [proc_state(w) for w in workers]))
        t0 = time.monotonic()
        out = self.cowbox("mount", ref, "--json", check=False, timeout=60)
        took = time.monotonic() - t0
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("(pid %d) was killed but cannot finish exiting; aborting its FUSE "
                      "connection and detaching %s" % (pid, mnt), out.stderr)
        self.assertLess(took, 15, "mount took %.1fs" % took)
        self.assertTrue(cbtest.is_fuse_mount(mnt))
        for w in stuck:
            self.assertFalse(proc_exists(w), "worker %d is still there" % w)
        close_fuse()
        c.close()
        with open(os.path.join(mnt, "a.txt")) as f:
            self.assertEqual(f.read(), "a\n")


if __name__ == "__main__":
    unittest.main()
