"""The vm backend's guest agent (backends/cb-vm-agent) driven over its frames, outside a VM
(--stdio): the runner's contract as the guest keeps it, concurrency, and malformed input."""

import json
import os
import socket
import struct
import subprocess
import threading
import time
import unittest

BUILD = os.environ.get("COWBOX_BUILDDIR", ".")
AGENT = os.path.join(BUILD, "backends", "cb-vm-agent")
ENV = ["PATH=/usr/local/bin:/usr/bin:/bin"]


def frame(fid, kind, payload=b""):
    return struct.pack("<IIB", len(payload) + 5, fid, ord(kind)) + payload


class Agent:
    """One agent process; frames from it are sorted per command id by a reader thread."""

    def __init__(self):
        self.proc = subprocess.Popen([AGENT, "--stdio"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lock = threading.Condition()
        self.frames = {}
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        f = self.proc.stdout
        while True:
            head = f.read(9)
            if len(head) < 9:
                break
            n, fid, kind = struct.unpack("<IIB", head)
            payload = f.read(n - 5)
            with self.lock:
                self.frames.setdefault(fid, []).append((chr(kind), payload))
                self.lock.notify_all()
        with self.lock:
            self.eof = True
            self.lock.notify_all()

    def send(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def run(self, fid, spec, stdin=None):
        self.send(frame(fid, "R", json.dumps(dict({"env": ENV}, **spec)).encode()))
        if stdin is not None:
            self.send(frame(fid, "I", stdin) + frame(fid, "E"))

    def result(self, fid, timeout=30):
        """(last frame's kind, its JSON or message, stdout bytes, stderr bytes)."""
        end = time.monotonic() + timeout
        with self.lock:
            while not any(k in "XF" for k, _ in self.frames.get(fid, [])):
                left = end - time.monotonic()
                if left <= 0 or self.eof:
                    raise AssertionError(f"no end frame for {fid}: {self.frames.get(fid)}")
                self.lock.wait(left)
            got = self.frames.pop(fid)
        out = b"".join(p for k, p in got if k == "O")
        err = b"".join(p for k, p in got if k == "e")
        kind, last = got[-1]
        return kind, (json.loads(last) if kind == "X" else last.decode()), out, err

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        rc = self.proc.wait(30)
        self.reader.join(5)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


class AgentTest(unittest.TestCase):
    def setUp(self):
        self.agent = Agent()
        self.addCleanup(self.agent.close)
        with self.agent.lock:
            while 0 not in self.agent.frames:
                self.agent.lock.wait(10)
        kind, hello = self.agent.frames.pop(0)[0]
        self.assertEqual(kind, "H")
        self.assertIn("kernel", json.loads(hello))

    def run_one(self, fid, spec, stdin=None):
        self.agent.run(fid, spec, stdin)
        return self.agent.result(fid)

    def test_exit_codes_and_streams(self):
        kind, res, out, err = self.run_one(1, {"shell": "echo out; echo err >&2; exit 3"})
        self.assertEqual((kind, res["exit_code"], out, err), ("X", 3, b"out\n", b"err\n"))
        kind, res, _, err = self.run_one(2, {"argv": ["no-such-program-here"]})
        self.assertEqual(res["exit_code"], 127)
        self.assertIn(b"not found", err)
        _, res, _, _ = self.run_one(3, {"shell": "kill -TERM $$"})
        self.assertEqual((res["exit_code"], res["term_signal"]), (143, 15))

    def test_env_and_cwd_are_exactly_given(self):
        _, res, out, _ = self.run_one(1, {"argv": ["sh", "-c", "pwd; env | sort"],
                                          "env": ENV + ["A=1"], "cwd": "/tmp"})
        lines = out.decode().splitlines()
        self.assertEqual(lines[0], "/tmp")
        self.assertIn("A=1", lines)
        self.assertNotIn("HOME", out.decode())  # nothing of the agent's own environment

    def test_timeout_kills_the_tree(self):
        marker = f"/tmp/cbvm-{os.getpid()}-{time.monotonic_ns()}"
        t = time.monotonic()
        _, res, _, _ = self.run_one(1, {"shell": f"(sleep 3; touch {marker}) & sleep 30",
                                        "timeout": 0.5, "grace": 0.5})
        self.assertEqual((res["exit_code"], res["timed_out"]), (124, True))
        self.assertLess(time.monotonic() - t, 5)
        time.sleep(3.5)
        self.assertFalse(os.path.exists(marker), "a background job outlived the timeout")

    def test_background_jobs_do_not_hold_the_call(self):
        t = time.monotonic()
        _, res, _, _ = self.run_one(1, {"shell": "sleep 30 & exit 0"})
        self.assertEqual(res["exit_code"], 0)
        self.assertLess(time.monotonic() - t, 4)  # within 2 s of exit, as every backend

    def test_stdin_stream_and_kill(self):
        _, res, out, _ = self.run_one(1, {"argv": ["cat"], "stdin": True}, stdin=b"x" * 300000)
        self.assertEqual((res["exit_code"], len(out)), (0, 300000))
        self.agent.run(2, {"argv": ["sleep", "30"]})
        time.sleep(0.3)
        self.agent.send(frame(2, "K", bytes([9])))
        _, res, _, _ = self.agent.result(2)
        self.assertEqual(res["exit_code"], 137)

    def test_commands_still_get_sigpipe(self):
        # the agent ignores SIGPIPE (a pipe's goes to the whole process); its commands do not
        _, res, out, _ = self.run_one(1, {"argv": ["bash", "-c",
                                                   "yes | head -n1; echo ${PIPESTATUS[0]}"]})
        self.assertEqual((res["exit_code"], out), (0, b"y\n141\n"))

    def test_output_cap(self):
        _, res, out, _ = self.run_one(1, {"shell": "head -c 30000000 /dev/zero",
                                          "output_limit": 1 << 20})
        self.assertTrue(res["output_limited"])
        self.assertLess(len(out), 3 << 20)

    def test_commands_run_at_once(self):
        t = time.monotonic()
        for i in range(8):
            self.agent.run(10 + i, {"shell": f"sleep 1; echo {i}"})
        outs = [self.agent.result(10 + i)[2] for i in range(8)]
        self.assertEqual(outs, [f"{i}\n".encode() for i in range(8)])
        self.assertLess(time.monotonic() - t, 6)

    def test_bad_requests_are_answered_and_the_agent_serves_on(self):
        self.agent.send(frame(1, "R", b"{not json"))
        self.assertEqual(self.agent.result(1)[0], "F")
        self.agent.send(frame(2, "R", b'{"argv": [], "env": []}'))
        self.assertEqual(self.agent.result(2)[0], "F")
        self.agent.send(frame(3, "R", b'{"argv": [1, 2]}'))
        self.assertEqual(self.agent.result(3)[0], "F")
        self.agent.send(frame(99, "I", b"to nobody") + frame(99, "K", b"\x09"))
        self.assertEqual(self.run_one(4, {"argv": ["true"]})[1]["exit_code"], 0)

    def test_an_oversized_frame_ends_the_agent_cleanly(self):
        self.agent.send(struct.pack("<IIB", 1 << 30, 1, ord("R")))
        self.agent.proc.stdin.close()
        self.assertEqual(self.agent.close(), 1)

    def test_end_of_input_ends_every_command(self):
        self.agent.run(1, {"argv": ["sleep", "60"]})
        time.sleep(0.3)
        t = time.monotonic()
        self.assertEqual(self.agent.close(), 0)
        self.assertLess(time.monotonic() - t, 10)

    # --- host_url's streams (the agent's side; the daemon's is in test_vm_lifecycle) ---

    def wait_frame(self, fid, kinds, timeout=10):
        """Pop and return the first frame of fid whose kind is in kinds."""
        end = time.monotonic() + timeout
        with self.agent.lock:
            while True:
                got = self.agent.frames.get(fid, [])
                for i, (k, p) in enumerate(got):
                    if k in kinds:
                        del got[i]
                        return k, p
                left = end - time.monotonic()
                if left <= 0 or self.agent.eof:
                    raise AssertionError(f"no {kinds} frame for {fid}: {got}")
                self.agent.lock.wait(left)

    def listen(self):
        """A free port the agent then listens on (its answer checked)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.agent.send(frame(port, "L"))
        self.assertEqual(self.wait_frame(port, "l"), ("l", b""))
        return port

    def open_stream(self, port):
        conn = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(conn.close)
        with self.agent.lock:
            while not any(k == "o" for f in self.agent.frames.values() for k, _ in f):
                self.assertTrue(self.agent.lock.wait(10), "no open frame")
            sid = next(i for i, f in self.agent.frames.items() if any(k == "o" for k, _ in f))
        self.assertEqual(self.wait_frame(sid, "o"), ("o", struct.pack("<I", port)))
        return conn, sid

    def test_stream_both_ways_within_the_credit(self):
        port = self.listen()
        self.agent.send(frame(port, "L"))  # again: listening already
        self.assertEqual(self.wait_frame(port, "l"), ("l", b""))
        conn, sid = self.open_stream(port)
        # host to guest: written out, then acknowledged
        self.agent.send(frame(sid, "d", b"hello guest"))
        self.assertEqual(conn.recv(100), b"hello guest")
        self.assertEqual(self.wait_frame(sid, "a"), ("a", struct.pack("<I", 11)))
        # guest to host: no more than the window (256 KiB) until the host acknowledges
        sent = threading.Thread(target=conn.sendall, args=(b"y" * (1 << 20),), daemon=True)
        sent.start()
        got = 0
        while got < 256 * 1024:
            got += len(self.wait_frame(sid, "d")[1])
        time.sleep(0.5)
        with self.agent.lock:
            self.assertFalse(any(k == "d" for k, _ in self.agent.frames.get(sid, [])))
        self.assertEqual(got, 256 * 1024)
        while got < 1 << 20:
            self.agent.send(frame(sid, "a", struct.pack("<I", 64 * 1024)))
            got += len(self.wait_frame(sid, "d")[1])
        self.assertEqual(got, 1 << 20)
        sent.join(10)
        self.agent.send(frame(sid, "a", struct.pack("<I", 256 * 1024)))
        # the guest's side ends: a shut frame; the host's end: end of file in the guest
        conn.shutdown(socket.SHUT_WR)
        self.assertEqual(self.wait_frame(sid, "s"), ("s", b""))
        self.agent.send(frame(sid, "s"))
        self.assertEqual(conn.recv(10), b"")

    def test_stream_beyond_the_credit_is_dropped(self):
        conn, sid = self.open_stream(self.listen())
        # the guest's reader never blocks: a host that breaks the credit (more than 256 KiB
        # not acknowledged) loses the stream, and the guest's connection ends
        self.agent.send(frame(sid, "d", b"z" * (300 * 1024)))
        self.assertEqual(self.wait_frame(sid, "c"), ("c", b""))
        self.assertEqual(conn.recv(10), b"")
        # the host closes a stream: the guest's connection ends
        conn2, sid2 = self.open_stream(self.listen())
        self.agent.send(frame(sid2, "c"))
        self.assertEqual(conn2.recv(10), b"")
        self.assertEqual(self.run_one(1, {"argv": ["true"]})[1]["exit_code"], 0)

    def test_stdin_is_acknowledged_as_written(self):
        self.agent.run(1, {"shell": "sleep 1; cat >/dev/null", "stdin": True},
                       stdin=b"x" * 300000)
        self.assertEqual(self.agent.result(1)[1]["exit_code"], 0)
        self.agent.run(2, {"argv": ["cat"], "stdin": True}, stdin=b"q" * 100000)
        acked = 0
        while acked < 100000:
            acked += struct.unpack("<I", self.wait_frame(2, "i")[1])[0]
        self.assertEqual(acked, 100000)
        self.assertEqual(self.agent.result(2)[2], b"q" * 100000)


if __name__ == "__main__":
    unittest.main()
