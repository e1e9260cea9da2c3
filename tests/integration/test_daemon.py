"""The workspace daemon: its control protocol (hello, ops, malformed input), no fd leaks over
many clients, close, and recovery after a kill -9 with every answered change journaled."""

import base64
import json
import os
import random
import signal
import socket
import threading
import time
import unittest

from cbtest import CowboxTestCase, fd_count, is_fuse_mount, pid_alive, wait_for


class TestProtocol(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.ref = self.create(name="proto")
        self.pid = self.mount(self.ref)

    def test_hello_and_core_ops(self):
        c = self.client(self.ref)
        self.assertEqual(c.hello, {"hello": "cowbox", "protocol": 1, "ref": self.ref,
                                   "pid": self.pid})
        self.assertEqual(c.request("ping"), {"id": 1, "ok": True})
        hello = c.request("hello")
        self.assertEqual((hello["ref"], hello["pid"]), (self.ref, self.pid))
        info = c.request("info")
        self.assertEqual(info["mountpoint"], self.mountpoint(self.ref))
        self.assertEqual((info["name"], info["base"], info["turn"]), ("proto", None, 1))
        # String ids are echoed as given.
        c.send({"id": "abc", "op": "ping"})
        self.assertEqual(c.recv(), {"id": "abc", "ok": True})
        c.close()

    def test_malformed_input_is_answered_and_serving_goes_on(self):
        c = self.client(self.ref)
        bad = [
            b"{not json\n",
            b"[1,2,3]\n",
            b'{"op":"ping"}\n',
            b'{"id":1.5,"op":"ping"}\n',
            b'{"id":7,"op":5}\n',
            b'{"id":8,"op":"no_such_op"}\n',
            b'{"id":9}\n',
        ]
        for line in bad:
            with self.subTest(line=line):
                c.send_raw(line)
                reply = c.recv()
                self.assertEqual(reply["error"]["code"], "invalid_request", reply)
                self.assertTrue(reply["error"]["message"])
        self.assertIn("unknown op 'no_such_op'", json.dumps(c.request("no_such_op")))
        # A line over 16 MiB is refused once; the rest of it is skipped, not parsed.
        chunk = b"x" * (1 << 20)
        c.send_raw(b'{"id":10,"op":"ping","pad":"')
        for _ in range(17):
            c.send_raw(chunk)
        c.send_raw(b'"}\n')
        reply = c.recv()
        self.assertEqual(reply["error"]["code"], "invalid_request")
        self.assertIn("longer than", reply["error"]["message"])
        self.assertEqual(c.request("ping")["ok"], True)
        c.close()
        # A client that hangs up mid-line hurts nobody.
        s = socket.socket(socket.AF_UNIX)
        dfd = os.open(self.ws_dir(self.ref), os.O_PATH)
        s.connect("/proc/self/fd/%d/control.sock" % dfd)
        os.close(dfd)
        s.sendall(b'{"id":1,"op":"pi')
        s.close()
        self.assertEqual(self.client(self.ref).request("ping")["ok"], True)
        self.assertTrue(pid_alive(self.pid))

    def test_random_garbage_lines(self):
        seed = int(os.environ.get("COWBOX_SEED", random.randrange(1 << 30)))
        print("COWBOX_SEED=%d" % seed)
        rng = random.Random(seed)
        c = self.client(self.ref)
        alphabet = [bytes([b]) for b in range(256) if b != 0x0A]
        pieces = [b'{"id":', b'"op":', b'"ping"', b"[", b"]", b"{", b"}", b",", b"null",
                  b"1e999", b'"\\u0000"', b"\xff\xfe", b'"id"', b"-0", b"true"]
        for i in range(300):
            line = b"".join(rng.choice(pieces) if rng.random() < 0.5 else rng.choice(alphabet)
                            for _ in range(rng.randrange(1, 60)))
            if not line.strip(b" \t\r"):
                continue
            c.send_raw(line + b"\n")
            reply = c.recv()
            self.assertTrue("error" in reply or reply.get("ok") is True, (line, reply))
        self.assertEqual(c.request("ping")["ok"], True)
        self.assertTrue(pid_alive(self.pid))

    def test_no_fd_leak_over_many_connections(self):
        warm = self.client(self.ref)
        warm.request("ping")
        warm.close()
        time.sleep(0.2)
        before = fd_count(self.pid)
        for i in range(200):
            c = self.client(self.ref)
            if i % 2:
                c.request("info")
            c.close()
        # Readers notice the hang-up asynchronously; give them a moment.
        wait_for(lambda: fd_count(self.pid) <= before, 10,
                 what="daemon fds back to %d (now %d)" % (before, fd_count(self.pid)))
        clients = [self.client(self.ref) for _ in range(20)]
        for c in clients:
            self.assertTrue(c.request("ping")["ok"])
        self.assertGreaterEqual(fd_count(self.pid), before + 20)
        for c in clients:
            c.close()
        wait_for(lambda: fd_count(self.pid) <= before, 10, what="fds after 20 parallel")

    def test_close_unmounts_and_exits_keeping_the_disk(self):
        mnt = self.mountpoint(self.ref)
        with open(os.path.join(mnt, "kept"), "w") as f:
            f.write("kept\n")
        c = self.client(self.ref)
        self.assertEqual(c.request("close"), {"id": 1, "ok": True})
        wait_for(lambda: not pid_alive(self.pid), 20, what="daemon exit")
        self.assertFalse(is_fuse_mount(mnt))
        self.assertEqual(self.cowbox_json("info", self.ref)["state"], "unmounted")
        self.mount(self.ref)
        with open(os.path.join(mnt, "kept")) as f:
            self.assertEqual(f.read(), "kept\n")

    def test_sigterm_stops_cleanly(self):
        os.kill(self.pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(self.pid), 20, what="daemon exit")
        self.assertFalse(is_fuse_mount(self.mountpoint(self.ref)))
        self.assertFalse(os.path.exists(os.path.join(self.ws_dir(self.ref), "control.sock")))
        with open(os.path.join(self.ws_dir(self.ref), "daemon.log")) as f:
            log = f.read()
        self.assertIn("ready", log)
        self.assertIn("stopped", log)


class TestCrash(CowboxTestCase):
    def test_kill9_mid_workload_then_mount_recovers(self):
        base = self.make_base({"base/%03d.txt" % i: "base %d\n" % i for i in range(50)})
        ref = self.create(base=base)
        pid = self.mount(ref)
        mnt = self.mountpoint(ref)
        answered = []
        stop = threading.Event()

        def writer(tag):
            # Each path is appended to answered only once the kernel answered the create
            # and the close: those changes must be in the journal after the crash.
            i = 0
            while not stop.is_set():
                rel = "w%s/%05d" % (tag, i)
                try:
                    if i == 0:
                        os.mkdir(os.path.join(mnt, "w" + tag))
                        answered.append("w" + tag)
                        continue
                    with open(os.path.join(mnt, rel), "w") as f:
                        f.write("data %d\n" % i)
                    answered.append(rel)
                    if i % 10 == 0:
                        b = "base/%03d.txt" % (i // 10 % 50)
                        with open(os.path.join(mnt, b), "a") as f:
                            f.write("more\n")
                        answered.append(b)
                except OSError:
                    return
                finally:
                    i += 1

        threads = [threading.Thread(target=writer, args=(str(t),)) for t in range(3)]
        for t in threads:
            t.start()
        wait_for(lambda: len(answered) > 300, 30, what="writes through the mount")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="daemon to die")
        stop.set()
        for t in threads:
            t.join(30)
        self.assertEqual(self.cowbox_json("info", ref)["state"], "stale")
        self.assertTrue(os.path.exists(os.path.join(self.ws_dir(ref), "control.sock")))

        new_pid = self.mount(ref)
        self.assertNotEqual(new_pid, pid)
        with open(os.path.join(self.ws_dir(ref), "daemon.log")) as f:
            log = f.read()
        self.assertIn("left behind by a daemon that died", log)
        self.assertIn("stale control socket", log)
        journaled = {r["path"] for r in self.log(ref)}
        missing = [p for p in answered if p not in journaled]
        self.assertEqual(missing, [], "%d of %d answered changes not journaled" % (
            len(missing), len(answered)))
        # Creates are answered only once the file exists in upper/ (contents may still have
        # been in the kernel's writeback cache, which a kill -9 loses by design).
        lost = [p for p in answered if p.startswith("w") and not os.path.exists(
            os.path.join(mnt, p))]
        self.assertEqual(lost, [], "answered creates missing after the crash")
        for i in range(50):
            with open(os.path.join(base, "base/%03d.txt" % i)) as f:
                self.assertEqual(f.read(), "base %d\n" % i)
        self.assertEqual(self.client(ref).request("ping")["ok"], True)

    def test_kill9_at_a_chosen_mountpoint_then_umount_and_rm_clean_up(self):
        ref = self.create()
        where = os.path.join(self.tmp, "custom")
        os.mkdir(where)
        pid = self.mount(ref, where)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="daemon to die")
        self.assertTrue(is_fuse_mount(where))
        info = self.cowbox_json("info", ref)
        self.assertEqual((info["state"], info["mountpoint"]), ("stale", where))
        self.cowbox("umount", ref)
        self.assertFalse(is_fuse_mount(where))
        self.assertEqual(self.cowbox_json("info", ref)["state"], "unmounted")
        self.assertFalse(os.path.exists(os.path.join(self.ws_dir(ref), "control.sock")))
        pid = self.mount(ref, where)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="daemon to die")
        self.cowbox("rm", ref)
        self.assertFalse(is_fuse_mount(where))
        self.assertFalse(os.path.exists(self.ws_dir(ref)))


class TestSchedulingShare(CowboxTestCase):
    """A daemon `cowbox mount` started leads a session of its own, whose autogroup gets a
    higher CPU weight (nice -5 by default) so a loaded host's other sessions do not starve
    its FUSE threads; the commands it runs start sessions of their own at the default weight,
    so a sandbox cannot borrow the daemon's share (daemon/sched.c)."""

    @staticmethod
    def autogroup_nice(text):
        # "/autogroup-42 nice -5"
        return int(text.split()[-1])

    def setUp(self):
        super().setUp()
        if not os.path.exists("/proc/self/autogroup"):
            self.skipTest("kernel without autogroups")

    def test_daemon_raised_commands_not(self):
        ref = self.create(self.make_base({"a": "x"}))
        pid = self.mount(ref)
        with open("/proc/%d/autogroup" % pid) as f:
            self.assertEqual(self.autogroup_nice(f.read()), -5)
        # A process of init's own session is in the root group, whose file reads empty (CI's
        # runner is one): name it so the comparison below still means something.
        with open("/proc/self/autogroup") as f:
            mine = f.read().strip() or "(root-group) nice 0"
        # `cowbox exec` through the CLI, and a command through the daemon's API (exec op):
        # each in a session of its own at nice 0, and a setsid inside changes nothing.
        out = self.cowbox("exec", ref, "--", "sh", "-c",
                          "cat /proc/self/autogroup; setsid cat /proc/self/autogroup").stdout
        for line in out.splitlines():
            self.assertEqual(self.autogroup_nice(line), 0, out)
            self.assertNotEqual(line.split()[0], mine.split()[0])
        c = self.client(ref)
        reply = c.request("run", cmd=["cat", "/proc/self/autogroup"], timeout=30)
        c.close()
        self.assertEqual(reply.get("exit_code"), 0, reply)
        api_line = base64.b64decode(reply["stdout"]).decode()
        self.assertEqual(self.autogroup_nice(api_line), 0, reply)
        with open("/proc/%d/autogroup" % pid) as f:
            self.assertNotEqual(f.read().split()[0], api_line.split()[0])

    def test_the_share_is_bounded_and_can_be_lowered(self):
        for asked, got in (("-50", -10), ("3", 3), ("junk", -5)):
            self.env["COWBOX_DAEMON_NICE"] = asked
            ref = self.create(self.make_base({"a": asked}))
            pid = self.mount(ref)
            with open("/proc/%d/autogroup" % pid) as f:
                self.assertEqual(self.autogroup_nice(f.read()), got, asked)
            self.cowbox("umount", ref)


if __name__ == "__main__":
    unittest.main()
