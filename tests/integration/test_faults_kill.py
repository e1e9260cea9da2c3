"""Seeded kill -9 of the workspace daemon at random points of snapshot, rollback, fork and
prune: the daemon is gone within seconds (never wedged), `cowbox mount` works again at once,
no half fork is listed or mounts, no rollback temp is left in the tree or in the next
snapshot, and every recorded turn still restores the right bytes.

COWBOX_SEED replays a run (the seed is printed); COWBOX_FAULT_TRIALS sets trials per op
(default 10; scripts/fault-soak runs 100)."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
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
        workers = [c for c in children_of(self.pid) if comm_of(c) == "cowbox-worker"]
        c = self.connect()
        c.send(dict(args, id=1, op=op))
        time.sleep(delay)
        os.kill(self.pid, signal.SIGKILL)
        t0 = time.monotonic()
        for pid in [self.pid] + workers:
            deadline = t0 + GONE_WITHIN
            while proc_exists(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertFalse(
                proc_exists(pid),
                "%s (seed %d): pid %d is still there %.1fs after kill -9 (thread states %s)"
                % (what, SEED, pid, GONE_WITHIN, thread_states(pid)))
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
        t1 = time.monotonic()
        self.pid = self.mount(self.ref)
        t2 = time.monotonic()
        if os.environ.get("COWBOX_FAULT_VERBOSE"):
            sys.stderr.write("%s: %s after %.2fs of %.2fs, gone %.2fs, mount %.2fs\n" % (
                what, "completed" if completed else "interrupted", delay, est,
                t_gone - t0, t2 - t1))
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


if __name__ == "__main__":
    unittest.main()
