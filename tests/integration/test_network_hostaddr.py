"""Attack: the host's own addresses (ns backend). A listener on a non-loopback address of the
host (one end of a veth pair this test makes in the daemon's namespace, removed after) must not
be reached from the sandbox: through the egress proxy under public, and under allow by a name
that resolves to it, nor directly under all; only an address entry naming it opens it. The
address is added after the workspace's proxy and network started: a new address counts."""

import base64
import os
import socket
import subprocess
import threading
import time
import unittest

import cbtest

# TEST-NET-1 (public-looking to the policy: not a special range), one address per run
ADDR = "192.0.2.%d" % (os.getpid() % 250 + 2)
DEV = "cbha%d" % (os.getpid() % 100000)  # and its peer, DEV + "p": within 15 bytes


# Inside the sandbox: connect to ADDR:PORT from 16 threads for SECONDS; prints the successes
# and the tries.
HAMMER = r"""
import socket, sys, threading, time
addr, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
hits = tries = 0
end = time.time() + secs
def worker():
    global hits, tries
    while time.time() < end:
        s = socket.socket()
        s.settimeout(0.2)
        try:
            s.connect((addr, port))
            hits += 1
        except OSError:
            pass
        tries += 1
        s.close()
ts = [threading.Thread(target=worker) for _ in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(hits, tries)
"""


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class HostAddressTest(cbtest.CowboxTestCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (network namespaces, an interface)")
        # a listener on every address of the host, so that its port is known before the
        # address exists; it answers one line and closes
        cls.srv = socket.create_server(("0.0.0.0", 0))
        cls.port = cls.srv.getsockname()[1]
        cls.accepted = 0

        def serve():
            while True:
                try:
                    c, _ = cls.srv.accept()
                except OSError:
                    return
                cls.accepted += 1
                with c:
                    c.settimeout(5)
                    try:
                        c.recv(4096)
                        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\n"
                                  b"hello from host")
                    except OSError:
                        pass
        threading.Thread(target=serve, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def setUp(self):
        super().setUp()
        self.hosts = os.path.join(self.tmp, "hosts")
        with open(self.hosts, "w") as f:
            f.write("%s hostself.test\n" % ADDR)
        self.env["COWBOX_PROXY_HOSTS"] = self.hosts

    def add_address(self):
        """The host gets ADDR (on a veth end, up), from now until the test ends."""
        sh("ip", "link", "del", DEV, check=False)  # a killed run's
        sh("ip", "link", "add", DEV, "type", "veth", "peer", "name", DEV + "p")
        self.addCleanup(sh, "ip", "link", "del", DEV, check=False)
        sh("ip", "addr", "add", ADDR + "/32", "dev", DEV)
        for d in (DEV, DEV + "p"):
            sh("ip", "link", "set", d, "up")
        probes = self.accepted
        cbtest.wait_for(lambda: cbtest.tcp_reachable(ADDR, self.port), 10,
                        what="the listener on the host's new address")
        # the listener's thread counts the probe when it gets to accept it, which on a
        # loaded machine came after a test read its count: the churn race saw that as a leak
        cbtest.wait_for(lambda: type(self).accepted > probes, 10,
                        what="the listener to accept the probe")

    def workspace(self, network, *allow):
        args = ["create", "--network", network]
        for a in allow:
            args += ["--allow", a]
        ref = self.cowbox(*args).stdout.strip()
        self.mount(ref)
        c = self.client(ref, timeout=120)
        self.run_in(c, "true")  # its network and proxy are up before the address exists
        return ref, c

    def run_in(self, c, script, timeout=60):
        r = c.request("run", cmd=["sh", "-c", script], timeout=timeout)
        self.assertTrue(r.get("ok"), r)
        return (r["exit_code"], base64.b64decode(r["stdout"]).decode(errors="replace"),
                base64.b64decode(r["stderr"]).decode(errors="replace"))

    def curl(self, c, url, *extra):
        """(http code, body) of curl through the proxy the environment names."""
        _, out, err = self.run_in(
            c, "curl -sS -m 10 -o /tmp/body -w '%%{http_code}' %s '%s'; echo; cat /tmp/body"
            % (" ".join(extra), url))
        status, _, body = out.partition("\n")
        return status, body + err

    def assert_refused_as_own(self, c, host):
        for how in ((), ("-p",)):  # plain HTTP forwarded, and a CONNECT tunnel
            status, body = self.curl(c, "http://%s:%d/" % (host, self.port), *how)
            self.assertNotIn("hello from host", body)
            if how:
                self.assertEqual(status, "000", body)  # curl: CONNECT refused
            else:
                self.assertEqual(status, "403", body)
                self.assertIn("address %s is the host's own" % ADDR, body)
        # SOCKS5 as well (the proxy resolves the name)
        status, body = self.curl(c, "http://%s:%d/" % (host, self.port),
                                 "--proxy socks5h://127.0.0.1:3128")
        self.assertNotIn("hello from host", body)

    def test_public_refuses_the_hosts_address(self):
        ref, c = self.workspace("public")
        self.add_address()
        self.assert_refused_as_own(c, ADDR)
        self.assert_refused_as_own(c, "hostself.test")
        rows = self.ok(c, "net_log")["rows"]
        own = [r for r in rows if "the host's own" in r["rule"]]
        self.assertGreaterEqual(len(own), 4, rows)
        self.assertFalse(any(r["allowed"] for r in own), own)

    def test_allow_refuses_it_by_name_and_opens_it_by_address(self):
        ref, c = self.workspace("allow", "hostself.test:%d" % self.port)
        self.add_address()
        self.assert_refused_as_own(c, "hostself.test")
        # an address entry naming it is the one way to open it
        ref, c = self.workspace("allow", "%s:%d" % (ADDR, self.port))
        status, body = self.curl(c, "http://%s:%d/" % (ADDR, self.port))
        self.assertEqual((status, body), ("200", "hello from host"))

    def test_all_cannot_reach_it_directly(self):
        ref, c = self.workspace("all")
        self.add_address()
        code, out, err = self.run_in(
            c, "curl -sS -m 10 --noproxy '*' http://%s:%d/" % (ADDR, self.port))
        self.assertNotIn("hello from host", out)
        self.assertNotEqual(code, 0, out + err)
        # the sandbox cannot lift the block: it has no power over its namespace's rules
        code, out, err = self.run_in(c, "iptables -F OUTPUT 2>&1; nft flush ruleset 2>&1; "
                                     "curl -sS -m 10 --noproxy '*' http://%s:%d/"
                                     % (ADDR, self.port))
        self.assertNotIn("hello from host", out)

    def test_all_address_churn_race(self):
        """The host gains and loses the address over and over while the sandbox tries to
        connect to it from 16 threads: not one connection in the moments between a change
        and any rewrite of rules (COWBOX_SOAK_SECONDS, default 3, makes it a soak)."""
        secs = float(os.environ.get("COWBOX_SOAK_SECONDS", "3"))
        ref, c = self.workspace("all")
        self.add_address()
        before = self.accepted
        stop = time.time() + secs
        cycles = [0]

        def churn():
            while time.time() < stop:
                sh("ip", "addr", "del", ADDR + "/32", "dev", DEV, check=False)
                time.sleep(0.03)
                sh("ip", "addr", "add", ADDR + "/32", "dev", DEV, check=False)
                time.sleep(0.1)
                cycles[0] += 1
        t = threading.Thread(target=churn)
        t.start()
        try:
            code, out, err = self.run_in(c, "python3 -c '%s' %s %d %s"
                                         % (HAMMER, ADDR, self.port, secs), timeout=secs + 60)
        finally:
            t.join()
        self.assertEqual(code, 0, err)
        hits, tries = map(int, out.split())
        self.assertGreater(cycles[0], 2)
        self.assertGreater(tries, cycles[0])
        self.assertEqual((hits, self.accepted - before), (0, 0),
                         "%d cycles, %d tries" % (cycles[0], tries))


if __name__ == "__main__":
    unittest.main()
