"""A workspace's lifecycle over the raw protocol and the CLI: access levels (per connection,
only lowered, bounded by the workspace's widest), hooks and the setup script run at create as
a baseline turn, idle stop, a stop while another mount namespace holds a copy of the mount,
apply."""

import base64
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import cbtest
from cbtest import COWBOX


def b64(data):
    return base64.b64encode(data).decode()


class AccessTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"a.txt": "alpha\n"})
        self.ref = self.create(self.base)
        self.mount(self.ref)

    def code(self, reply):
        self.assertIn("error", reply, reply)
        return reply["error"]["code"]

    def test_connection_levels_are_only_lowered(self):
        c, other = self.client(self.ref), self.client(self.ref)
        r = c.request("info")
        self.assertEqual((r["access"], r["supported_access"]), ("full", "full"))
        r = c.request("access", level="files")
        self.assertEqual((r["access"], r["supported_access"]), ("files", "full"), r)
        # files: read, write, snapshot, diff, rollback; no command, which or host_url.
        self.assertTrue(c.request("write", path="w.txt", data=b64(b"hi")).get("ok"))
        self.assertEqual(base64.b64decode(c.request("read", path="w.txt")["data"]), b"hi")
        turn = c.request("snapshot")["turn"]
        self.assertTrue(c.request("diff", a=0, b=turn).get("ok"))
        for op, args in (("run", {"cmd": ["true"]}), ("exec", {"cmd": ["true"]}),
                         ("which", {"binary": "sh"}), ("host_url", {"port": 80}),
                         ("configure", {"options": {}})):
            r = c.request(op, **args)
            self.assertEqual(self.code(r), "access_denied", (op, r))
            self.assertIn("needs full", r["error"]["message"])
        self.assertTrue(c.request("configure").get("ok"))  # reading the options is fine
        # Never raised again, on this connection.
        r = c.request("access", level="full")
        self.assertEqual(self.code(r), "access_denied")
        self.assertIn("can only be lowered", r["error"]["message"])
        # none: only the owner's ops.
        self.assertEqual(c.request("access", level="none")["access"], "none")
        self.assertEqual(self.code(c.request("read", path="a.txt")), "access_denied")
        self.assertEqual(self.code(c.request("write", path="x", data="")), "access_denied")
        self.assertEqual(self.code(c.request("rollback", turn=0)), "access_denied")
        self.assertTrue(c.request("snapshot").get("ok"))
        self.assertTrue(c.request("turns").get("ok"))
        self.assertEqual(c.request("info")["access"], "none")
        # The other connection (and a new one) is untouched.
        self.assertEqual(other.request("run", cmd=["true"])["exit_code"], 0)
        self.assertEqual(self.client(self.ref).request("info")["access"], "full")
        r = c.request("access", level="bogus")
        self.assertEqual(self.code(r), "invalid_request")

    def test_workspace_level_bounds_every_connection_and_survives_a_restart(self):
        c, other = self.client(self.ref), self.client(self.ref)
        r = c.request("access", level="files", workspace=True)
        self.assertEqual((r["access"], r["supported_access"]), ("files", "files"))
        # An open connection is bounded at once, and a new one starts there.
        self.assertEqual(self.code(other.request("run", cmd=["true"])), "access_denied")
        self.assertEqual(self.client(self.ref).request("info")["access"], "files")
        r = self.client(self.ref).request("access", level="full")
        self.assertEqual(self.code(r), "access_denied")
        self.assertIn("serves at most files", r["error"]["message"])
        self.cowbox("umount", self.ref)
        self.mount(self.ref)
        self.assertEqual(self.client(self.ref).request("info")["supported_access"], "files")
        self.assertEqual(self.cowbox("access", self.ref).stdout.strip(), "files")
        # The CLI runs commands itself: it refuses too.
        self.assert_fails(["exec", self.ref, "--", "true"], "commands need full", 125)

    def test_cli_create_access_and_lowering(self):
        ref = self.cowbox("create", "--base", self.base, "--access", "files").stdout.strip()
        self.assertEqual(self.cowbox_json("access", ref)["supported_access"], "files")
        self.assert_fails(["access", ref, "full"], "only be lowered")
        self.assert_fails(["exec", ref, "--", "true"], "serves at most access files", 125)
        # Lowered while a daemon serves it: through the daemon, at once.
        self.mount(ref)
        c = self.client(ref)
        self.assertEqual(c.request("info")["access"], "files")
        self.assertEqual(self.cowbox("access", ref, "none").stdout.strip(), "none")
        self.assertEqual(self.code(c.request("read", path="a.txt")), "access_denied")
        self.assert_fails(["create", "--access", "most"], "expected none, files or full", 2)
        # The default is full, and the CLI runs commands in it.
        self.assertEqual(self.cowbox("access", self.ref).stdout.strip(), "full")
        self.assertEqual(self.cowbox("exec", self.ref, "--", "cat", "a.txt").stdout,
                         "alpha\n")


class HooksTest(cbtest.CowboxTestCase):

    def test_hooks_and_setup_script_run_at_configure_as_a_turn(self):
        base = self.make_base({"a.txt": "alpha\n"})
        ref = self.create(base)
        self.mount(ref)
        c = self.client(ref)
        r = c.request("configure", options={
            "on_create": ["echo one > hook.txt", "echo two >> hook.txt"],
            "setup_script": "cat hook.txt > setup.txt"})
        self.assertTrue(r.get("ok"), r)
        self.assertTrue(r["created"])
        baseline = r["baseline_turn"]
        # Before any command: the hooks' files are there and recorded as their own turn.
        with open(os.path.join(self.mountpoint(ref), "setup.txt")) as f:
            self.assertEqual(f.read(), "one\ntwo\n")
        turns = c.request("turns")["turns"]
        self.assertEqual([(t["turn"], t["label"]) for t in turns][-1],
                         (baseline, "on_create"))
        events = c.request("diff", a=0, b=baseline)["events"]
        self.assertEqual(sorted(e["path"] for e in events), ["hook.txt", "setup.txt"])
        # The agent's first turn holds only what the agent did.
        self.assertEqual(c.request("run", cmd=["sh", "-c", "echo a > agent.txt"])
                         ["exit_code"], 0)
        turn = c.request("snapshot")["turn"]
        events = c.request("diff", a=baseline, b=turn)["events"]
        self.assertEqual([e["path"] for e in events], ["agent.txt"])
        # Options shape a new workspace only.
        r = c.request("configure", options={})
        self.assertEqual(r["error"]["code"], "in_use", r)

    def test_a_failing_hook_fails_configure(self):
        ref = self.create()
        self.mount(ref)
        c = self.client(ref)
        r = c.request("configure", options={"on_create": ["echo partial > p.txt; exit 7"]})
        self.assertIn("error", r, r)
        self.assertIn("on_create hook", r["error"]["message"])

    def test_no_hooks_no_boot(self):
        ref = self.create()
        self.mount(ref)
        c = self.client(ref)
        r = c.request("configure", options={"env": {"A": "1"}})
        self.assertFalse(r["created"], r)
        self.assertNotIn("baseline_turn", r)
        self.assertEqual(c.request("turns")["turns"], [])


class IdleTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.ref = self.create(self.make_base({"a.txt": "alpha\n"}))

    def boot(self, *mount_args, timeout=1):
        pid = self.mount(self.ref, *mount_args)
        c = cbtest.Client(os.path.join(self.ws_dir(self.ref), "control.sock"))
        r = c.request("idle", timeout=timeout)
        self.assertEqual(r["idle_timeout"], timeout, r)
        return pid, c

    def test_defaults_shown_by_info(self):
        info = self.cowbox_json("info", self.ref)
        self.assertEqual((info["idle_timeout"], info["supported_access"]), (600, "full"))
        self.mount(self.ref, "--idle")
        r = self.client(self.ref).request("info")
        self.assertEqual((r["idle_timeout"], r["pinned"]), (600, False))
        ref = self.cowbox("create", "--idle-timeout", "0").stdout.strip()
        self.assertEqual(self.cowbox_json("info", ref)["idle_timeout"], 0)
        self.assertIn("idle stop:   never", self.cowbox("info", ref).stdout)

    def test_stops_when_no_client_holds_it_and_boots_again_intact(self):
        pid, c = self.boot("--idle")
        c.request("write", path="kept.txt", data=b64(b"state"))
        c.request("snapshot", label="before idle")
        time.sleep(2)
        self.assertTrue(cbtest.pid_alive(pid), "stopped while a client held it")
        c.close()
        t0 = time.monotonic()
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 15, what="the idle stop")
        self.assertLess(time.monotonic() - t0, 6)
        self.assertFalse(cbtest.is_fuse_mount(self.mountpoint(self.ref)))
        with open(os.path.join(self.ws_dir(self.ref), "daemon.log")) as f:
            self.assertIn("idle for", f.read())
        # The next use boots it again, state intact; the timeout was kept.
        self.mount(self.ref, "--idle")
        c = self.client(self.ref)
        self.assertEqual(base64.b64decode(c.request("read", path="kept.txt")["data"]),
                         b"state")
        self.assertEqual(c.request("turns")["turns"][-1]["label"], "before idle")
        self.assertEqual(c.request("info")["idle_timeout"], 1)

    def test_mount_pins_it(self):
        pid, c = self.boot()
        self.assertTrue(c.request("info")["pinned"])
        c.close()
        time.sleep(3)
        self.assertTrue(cbtest.pid_alive(pid), "a `cowbox mount` stopped when idle")
        # Met by `cowbox mount` after the API started it: pinned from then on.
        self.cowbox("umount", self.ref)
        pid, c = self.boot("--idle")
        self.mount(self.ref)
        c.close()
        time.sleep(3)
        self.assertTrue(cbtest.pid_alive(pid))

    def test_a_process_in_the_mount_keeps_it(self):
        pid, c = self.boot("--idle")
        c.close()
        holder = subprocess.Popen(["sleep", "30"], cwd=self.mountpoint(self.ref))
        try:
            time.sleep(3)
            self.assertTrue(cbtest.pid_alive(pid), "unmounted from under a process")
        finally:
            holder.kill()
            holder.wait()
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 15, what="the idle stop")

    def test_timeout_zero_never_stops(self):
        pid, c = self.boot("--idle", timeout=0)
        c.close()
        time.sleep(3)
        self.assertTrue(cbtest.pid_alive(pid))


class StopTest(cbtest.CowboxTestCase):
    """A mount namespace made while a workspace is mounted (unshare -m, a VM's qemu, a
    container, another sandbox being set up) holds a private copy of the mount that the
    daemon's umount does not reach. The daemon used to wait for that copy to go: a VM running
    beside it kept it from stopping for the VM's whole life."""

    def test_a_copy_in_another_mount_namespace_does_not_keep_the_daemon(self):
        ref = self.create(self.make_base({"a.txt": "alpha\n"}))
        pid = self.mount(ref)
        mnt = self.mountpoint(ref)
        data = os.urandom(3 << 20)
        # through the kernel's writeback cache, never synced: the stop must flush it to us
        with open(os.path.join(mnt, "written.bin"), "wb") as f:
            f.write(data)
        holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                   'cd "$1" && exec sleep 120', "sh", mnt])

        def end_holder():
            holder.kill()
            holder.wait()
        self.addCleanup(end_holder)

        def holder_in_copy():
            with open("/proc/%d/comm" % holder.pid) as f:
                return f.read().strip() == "sleep"
        cbtest.wait_for(holder_in_copy, 10, what="the holder inside its copy of the mount")
        t0 = time.monotonic()
        self.cowbox("umount", ref, timeout=90)
        self.assertLess(time.monotonic() - t0, 10, "the stop waited for the copy")
        # the lock is released before the process's last steps (ASan's leak check)
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 10, what="the daemon to exit")
        self.assertFalse(cbtest.is_fuse_mount(mnt))
        # The copy is served no more: it says so (ENOTCONN, or ECONNABORTED once the
        # io_uring queues are torn down) rather than hang.
        r = subprocess.run(["nsenter", "-t", str(holder.pid), "-m", "ls", mnt],
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertRegex(r.stderr, "not connected|connection abort")
        with open(os.path.join(self.ws_dir(ref), "daemon.log")) as f:
            log = f.read()
        self.assertNotIn("stopping the filesystem loop instead", log)
        # Every byte written before the stop is there at the next mount.
        self.mount(ref)
        with open(os.path.join(mnt, "written.bin"), "rb") as f:
            self.assertEqual(f.read(), data)


    def huge_base(self):
        """A base with a 64 GiB sparse file: reading and hashing it takes half a minute or
        more (its holes hash as zeros), and no disk space."""
        base = self.make_base({"small.txt": "s\n"})
        with open(os.path.join(base, "huge.img"), "wb") as f:
            f.truncate(64 << 30)
        return base

    def timed_umount(self, ref):
        t0 = time.monotonic()
        self.cowbox("umount", ref, timeout=90)
        return time.monotonic() - t0

    def test_the_background_hash_of_a_huge_file_does_not_hold_up_the_stop(self):
        ref = self.create(self.huge_base())
        pid = self.mount(ref)

        def hashing():
            return self.cowbox_json("info", ref).get("base_hash", {}).get("state") == "hashing"
        cbtest.wait_for(hashing, 20, what="the background hash")
        self.assertLess(self.timed_umount(ref), 10, "the stop waited for the hash")
        # the lock is released before the process's last steps (ASan's leak check)
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 10, what="the daemon to exit")
        with open(os.path.join(self.ws_dir(ref), "daemon.log")) as f:
            self.assertIn("base hash stopped", f.read())

    def test_a_first_snapshot_hashing_a_huge_file_gives_up_at_a_stop(self):
        self.env["COWBOX_BACKGROUND_HASH"] = "0"  # the snapshot does the hashing
        ref = self.create(self.huge_base())
        pid = self.mount(ref)
        turns = [t["turn"] for t in self.cowbox_json("turns", ref)["turns"]]
        c = cbtest.Client(os.path.join(self.ws_dir(ref), "control.sock"), 120)
        self.addCleanup(c.close)
        c.send({"id": 1, "op": "snapshot"})
        time.sleep(1.5)
        self.assertLess(self.timed_umount(ref), 10, "the stop waited for the snapshot")
        # the lock is released before the process's last steps (ASan's leak check)
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 10, what="the daemon to exit")
        try:
            reply = c.recv()
        except Exception as e:  # the connection ended with the daemon
            reply = {"error": str(e)}
        self.assertIn("error", reply, reply)
        # Nothing was recorded for the snapshot given up.
        self.mount(ref)
        self.assertEqual([t["turn"] for t in self.cowbox_json("turns", ref)["turns"]], turns)


def tree(root):
    """{relative path: ("f", bytes, mode) | ("d",) | ("l", target)} of a directory."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = ("l", os.readlink(full))
            elif os.path.isdir(full):
                out[rel] = ("d",)
            else:
                with open(full, "rb") as f:
                    out[rel] = ("f", f.read(), os.stat(full).st_mode & 0o777)
    return out


class ApplyTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"a.txt": "alpha\n", "d/b.txt": "beta\n",
                                    "keep.txt": "same\n"})
        self.ref = self.create(self.base)
        self.mount(self.ref)
        self.c = self.client(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def edit(self, script):
        r = self.c.request("run", cmd=["sh", "-c", script])
        self.assertEqual(r["exit_code"], 0, base64.b64decode(r["stderr"]))
        return self.c.request("snapshot")["turn"]

    def copy_of_base(self):
        import shutil
        dst = os.path.join(self.tmp, "copy-%d" % len(os.listdir(self.tmp)))
        shutil.copytree(self.base, dst, symlinks=True)
        return dst

    def test_apply_everything_onto_another_folder(self):
        dst = self.copy_of_base()
        self.edit("echo changed > a.txt && rm -r d && mkdir -p new && echo c > new/c.txt && "
                  "ln -s a.txt link && chmod 755 keep.txt")
        r = self.cowbox_json("apply", self.ref, "--to", dst)
        self.assertEqual(r["from_turn"], 0, r)
        self.assertEqual(tree(dst), tree(self.mnt))
        # Again: everything is already so, nothing conflicts.
        r = self.cowbox_json("apply", self.ref, "--to", dst)
        self.assertEqual((r["written"], r["deleted"]), (0, 0), r)
        self.assertEqual(tree(dst), tree(self.mnt))

    def test_one_turn_and_conflicts_refused_whole(self):
        dst = self.copy_of_base()
        t1 = self.edit("echo one > a.txt")
        t2 = self.edit("echo two > keep.txt && echo n > n.txt")
        # Turn 2 alone onto a copy of the base: a.txt is not part of it.
        r = self.cowbox_json("apply", self.ref, "--turn", t2, "--to", dst)
        self.assertEqual((r["from_turn"], r["to_turn"], r["written"]), (t1, t2, 2), r)
        with open(os.path.join(dst, "a.txt")) as f:
            self.assertEqual(f.read(), "alpha\n")
        # Turn 1 changed a.txt; the folder's a.txt was edited there since: refused, and
        # nothing of the turn written.
        dst2 = self.copy_of_base()
        with open(os.path.join(dst2, "a.txt"), "w") as f:
            f.write("edited by the user\n")
        p = self.assert_fails(["apply", self.ref, "--to", dst2], "1 conflict")
        self.assertIn("a.txt: changed since turn 0", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(dst2, "n.txt")))
        r = self.c.request("apply", turn=t1, to=dst2)
        self.assertEqual(r["error"]["code"], "conflict", r)
        self.assertEqual(len(r["error"]["conflicts"]), 1)

    def test_onto_the_base_and_never_out_of_the_folder(self):
        outside = self.make_base({})
        dst = self.copy_of_base()
        os.symlink(outside, os.path.join(dst, "new"))  # a symlink out where a dir will go
        edited = self.edit("mkdir new && echo x > new/x.txt && echo b2 > d/b.txt")
        p = self.assert_fails(["apply", self.ref, "--to", dst], "conflict")
        self.assertIn("new: changed since turn 0", p.stderr)
        self.assertEqual(os.listdir(outside), [])
        # The workspace's own state and mount are refused as targets.
        self.assert_fails(["apply", self.ref, "--to", self.mnt], "inside cowbox's own")
        self.assert_fails(["apply", self.ref, "--to", self.ws_dir(self.ref)], "inside")
        # Onto the base itself (the default): the base gets the changes, the mount still
        # shows them, and the next turn records nothing new.
        r = self.cowbox_json("apply", self.ref)
        self.assertEqual(r["to"], os.path.realpath(self.base))
        with open(os.path.join(self.base, "new/x.txt")) as f:
            self.assertEqual(f.read(), "x\n")
        with open(os.path.join(self.base, "d/b.txt")) as f:
            self.assertEqual(f.read(), "b2\n")
        self.assertEqual(tree(self.base), tree(self.mnt))
        # (a snapshot with no change records no turn: it answers the edit's turn)
        snap = self.c.request("snapshot")
        self.assertEqual((snap["turn"], snap.get("recorded")), (edited, False), snap)
        self.assertEqual(self.c.request("diff", a=edited, b=-1)["events"], [])
        # apply needs access full.
        self.c.request("access", level="files")
        self.assertEqual(self.c.request("apply")["error"]["code"], "access_denied")

    def test_apply_killed_midway_is_finished_by_the_next_run(self):
        # kill -9 of the daemon while apply writes: each file is whole or absent (written
        # beside its path, then renamed), and the next apply finishes the rest, leaving no
        # temporary file behind.
        dst = self.copy_of_base()
        n = 600
        self.edit("mkdir many && i=0; while [ $i -lt %d ]; do echo $i > many/f$i.txt; "
                  "i=$((i+1)); done; echo changed > a.txt" % n)
        pid = self.daemon_pid(self.ref)
        p = subprocess.Popen([COWBOX, "apply", self.ref, "--to", dst], env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        many = os.path.join(dst, "many")
        cbtest.wait_for(lambda: os.path.isdir(many) and len(os.listdir(many)) >= 10,
                        timeout=60, interval=0.002, what="apply's first files")
        os.kill(pid, signal.SIGKILL)
        at_kill = len(os.listdir(many))
        out, err = p.communicate(timeout=60)
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), what="the killed daemon gone")
        if at_kill < n:
            self.assertNotEqual(p.returncode, 0, "apply said done after its daemon was "
                                "killed: %s %s" % (out, err))
        for name in os.listdir(many):
            if ".cowbox-apply-" in name:
                continue  # the one in flight: never renamed into place
            with open(os.path.join(many, name)) as f:
                self.assertEqual(f.read(), "%s\n" % name[1:-4], name)
        # The next run (its daemon started again on demand) finishes it.
        self.cowbox_json("apply", self.ref, "--to", dst)
        self.assertEqual(tree(dst), tree(self.mountpoint(self.ref)))
        self.assertEqual([], [f for f in tree(dst) if ".cowbox-apply" in f])

    def test_apply_races_a_directory_swapped_for_a_symlink_in_the_target(self):
        # The target is bound into the sandbox read-write, so the agent swaps dst/d (where
        # apply writes) with dst/x (a symlink to a host directory) in a loop while apply
        # runs as root: nothing outside dst is ever written, every run ends (done, or
        # refused with a message), and once the loop stops apply converges.
        if os.geteuid() != 0:
            self.skipTest("the daemon's paths are a root daemon's problem")
        outside = tempfile.mkdtemp(prefix="cowbox-outside-", dir="/tmp")
        self.addCleanup(subprocess.run, ["rm", "-rf", outside])
        with open(os.path.join(outside, "b.txt"), "w") as f:
            f.write("SECRET")
        dst = self.copy_of_base()
        os.chmod(dst, 0o777)  # the sandbox's root is a uid range of its own
        ref = self.cowbox("create", "--base", self.base, "--volume",
                          "%s:/vol:rw" % dst).stdout.strip()
        self.mount(ref)
        c = self.client(ref)
        r = c.request("run", cmd=["sh", "-c", "i=0; while [ $i -lt 60 ]; do echo $i > "
                                  "d/n$i.txt; i=$((i+1)); done; echo b2 > d/b.txt"])
        self.assertEqual(r["exit_code"], 0, r)
        turn = c.request("snapshot")["turn"]
        loop = subprocess.Popen(
            [COWBOX, "exec", ref, "--", "python3", "-c", cbtest.SWAP_LOOP, outside, "8",
             "/vol"],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (loop.kill(), loop.communicate()))
        self.assertEqual(loop.stdout.readline().strip(), "ready", loop.stderr.read())
        host = subprocess.Popen(["python3", "-c", cbtest.SWAP_LOOP, outside, "7", dst],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (host.kill(), host.communicate()))
        self.assertEqual(host.stdout.readline().strip(), "ready", host.stderr.read())
        codes, whys, end = [], set(), time.monotonic() + 6
        while time.monotonic() < end:
            a = subprocess.run([COWBOX, "apply", ref, "--turn", str(turn), "--to", dst],
                               env=self.env, capture_output=True, text=True, timeout=60)
            codes.append(a.returncode)
            self.assertIn(a.returncode, (0, 1, 4), a.stderr)  # 4: a conflict
            if a.returncode:
                self.assertTrue(a.stderr.strip(), "a refusal without a message")
                whys.add(a.stderr.strip()[:90])
        out, err = loop.communicate(timeout=60)
        self.assertGreater(int(out.split()[-1]), 100, out + err)
        host.communicate(timeout=60)
        with open(os.path.join(outside, "b.txt")) as f:
            self.assertEqual(f.read(), "SECRET")
        self.assertEqual(os.listdir(outside), ["b.txt"])
        self.assertTrue(c.request("ping").get("ok"))
        # Put d back as the directory if the loop ended swapped, then apply converges.
        if os.path.islink(os.path.join(dst, "d")):
            libc = ctypes.CDLL(None, use_errno=True)
            self.assertEqual(libc.renameat2(-100, os.path.join(dst, "d").encode(), -100,
                                            os.path.join(dst, "x").encode(), 2), 0)
        a = subprocess.run([COWBOX, "apply", ref, "--turn", str(turn), "--to", dst],
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(a.returncode, 0, a.stderr)
        want = {k: v for k, v in tree(self.mountpoint(ref)).items() if k.startswith("d")}
        got = {k: v for k, v in tree(dst).items() if k.startswith("d")}
        self.assertEqual(got, want)
        print("apply under the swap: %d runs, %d done, refusals: %s" %
              (len(codes), codes.count(0), sorted(whys)), file=sys.stderr)



if __name__ == "__main__":
    import unittest
    unittest.main()
