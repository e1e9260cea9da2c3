"""Attack: idle egress proxy connections from inside the sandbox must not use up the daemon's open
files (they wedged the workspace: snapshot and reads through the mount failed with "Too many
open files"). The daemon raises its soft RLIMIT_NOFILE to the hard limit at start; the proxy
caps its connections (proxy_conns, default 256), lowered to keep a reserve of fds for the
mount and the turn ops, and past the cap closes the longest idle tunnel first."""

import base64
import os
import resource
import socket
import subprocess
import threading
import time
import unittest

import cbtest

# Inside the sandbox: BATCHES of CONNECT tunnels to the host's listener, a pause between
# them; prints per tunnel (in order) "open" (answered 200, still open), "closed" (answered,
# then closed by the proxy) or "refused" (closed without an answer).
CLIENT = r'''
import socket, sys, time
port, pause = int(sys.argv[1]), float(sys.argv[2])
socks, answered = [], []
for batch in sys.argv[3:]:
    if socks:
        time.sleep(pause)
    for _ in range(int(batch)):
        s = socket.create_connection(("127.0.0.1", 3128))
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % port)
        socks.append(s)
        answered.append(False)
    for i, s in enumerate(socks):
        if not answered[i]:
            s.settimeout(10)
            try:
                answered[i] = s.recv(4096).startswith(b"HTTP/1.1 200")
            except OSError:
                pass
time.sleep(0.5)
out = []
for i, s in enumerate(socks):
    s.setblocking(False)
    try:
        alive = s.recv(1) != b""
    except BlockingIOError:
        alive = True
    except OSError:
        alive = False
    out.append("open" if answered[i] and alive else "closed" if answered[i] else "refused")
print(" ".join(out))
'''


class ProxyFdsTest(cbtest.CowboxTestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (the proxy listens in a network namespace)")
        # the destination: a host loopback listener that keeps every connection, idle
        cls.srv = socket.create_server(("127.0.0.1", 0), backlog=1024)
        cls.port = cls.srv.getsockname()[1]
        cls.held = []

        def serve():
            while True:
                try:
                    cls.held.append(cls.srv.accept()[0])
                except OSError:
                    return
        threading.Thread(target=serve, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()
        for s in cls.held:
            s.close()

    def workspace(self, nofile, *extra):
        """A workspace under network allow (the listener named by address) whose daemon
        starts with RLIMIT_NOFILE (soft, hard) = nofile."""
        base = self.make_base({"README": "hello\n"})
        ref = self.cowbox("create", "--base", base, "--network", "allow", "--allow",
                          "127.0.0.1:%d" % self.port, *extra).stdout.strip()
        subprocess.run([cbtest.COWBOX, "mount", ref], env=self.env, check=True,
                       capture_output=True, timeout=60,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile))
        return ref, self.client(ref, timeout=180)

    def tunnels(self, c, pause, *batches):
        r = c.request("run", cmd=["python3", "-c", CLIENT, str(self.port), str(pause)] +
                      [str(b) for b in batches], timeout=170)
        self.assertTrue(r.get("ok"), r)
        self.assertEqual(r["exit_code"], 0, base64.b64decode(r["stderr"]))
        return base64.b64decode(r["stdout"]).decode().split()

    def assert_workspace_works(self, ref):
        """A snapshot and a read through the mount from the host, while the tunnels are held
        (the client's command ended: they are held by the proxy until it closes them)."""
        p = self.cowbox("snapshot", ref, check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(self.mountpoint(ref), "README")) as f:
            self.assertEqual(f.read(), "hello\n")

    def limits(self, pid):
        with open("/proc/%d/limits" % pid) as f:
            line = [l for l in f if l.startswith("Max open files")][0]
        return [int(x) for x in line.split()[3:5]]

    def test_soft_limit_raised_and_the_cap_holds(self):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard < 4096:
            self.skipTest("a hard RLIMIT_NOFILE of %d leaves nothing to raise" % hard)
        ref, c = self.workspace((1024, hard), "--proxy-conns", "100")
        self.assertEqual(self.limits(self.daemon_pid(ref)), [hard, hard])
        self.assertEqual(self.cowbox_json("info", ref)["proxy_conns"], 100)
        self.assertIn("proxy conns: 100 at once", self.cowbox("info", ref).stdout)
        # 300 tunnels at once: at most 100 open; the rest refused, or (when opening them took
        # over a second, as on a loaded machine) older ones closed as idle to let them in
        got = self.tunnels(c, 0, 300)
        self.assertEqual(len(got), 300, got)
        self.assertLessEqual(got.count("open"), 100, got)
        self.assertGreaterEqual(got.count("refused") + got.count("closed"), 200, got)
        self.assert_workspace_works(ref)
        if got.count("refused"):
            rows = self.ok(c, "net_log")["rows"]
            self.assertTrue(any("connections open (the cap)" in r["rule"] for r in rows),
                            rows[-3:])

    def test_reserve_kept_under_a_low_hard_limit_oldest_idle_closed_first(self):
        # soft = hard = 1024: nothing to raise; the cap comes down to keep the reserve. One
        # event loop: each loop closes its own longest idle, so with several the order is
        # only roughly the global one
        self.env["COWBOX_PROXY_LOOPS"] = "1"
        ref, c = self.workspace((1024, 1024))
        self.assertEqual(self.limits(self.daemon_pid(ref)), [1024, 1024])
        got = self.tunnels(c, 1.5, 300, 40)
        first, second = got[:300], got[300:]
        # the second batch, after the first went idle, got in: the oldest idle made room
        self.assertEqual(second, ["open"] * 40, got)
        self.assertGreater(first.count("closed"), 0, got)
        kept = first.count("open") + 40
        self.assertLess(kept, 1024 // 6, got)  # far below what the limit would hold
        # the oldest went first: the tunnels of the first batch still open are its last
        answered = [s for s in first if s != "refused"]
        self.assertEqual(answered, sorted(answered, key=lambda s: s == "open"), got)
        self.assert_workspace_works(ref)
        # the daemon still has room: its fds stay below its limit minus the reserve
        self.assertLess(cbtest.fd_count(self.daemon_pid(ref)), 1024 - 256)
        rows = self.ok(c, "net_log")["rows"]
        self.assertTrue(any("closed idle" in r["rule"] for r in rows), rows[-3:])


if __name__ == "__main__":
    unittest.main()
