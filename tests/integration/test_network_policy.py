"""Network policy conformance through the workspace's egress proxy (ns backend): curl, Python
urllib and SOCKS5 inside the sandbox against real servers in a network namespace the test
makes (veth, a public-looking and a private address), names resolved through
COWBOX_PROXY_HOSTS; every entry kind, private and rebinding refusals, no route around the
proxy, the refusal's words, the network log, reaches, a restart, fuzzed input and load; published
ports."""

import json
import os
import random
import socket
import subprocess
import time
import unittest

import cbtest

# A /30 of each test range (and a /64) per run: runs beside each other, or what another run
# left, never take this one's addresses (the longest prefix wins).
_NET = os.getpid() % 63 + 1
PUB, PUB_HOST = "203.0.113.%d" % (4 * _NET + 2), "203.0.113.%d" % (4 * _NET + 1)
PRIV, PRIV_HOST = "10.251.77.%d" % (4 * _NET + 2), "10.251.77.%d" % (4 * _NET + 1)
V6, V6_HOST = "2001:db8:cb:%x::2" % _NET, "2001:db8:cb:%x::1" % _NET
V6_NET = "2001:db8:cb:%x::/64" % _NET
PORT, OTHER_PORT = 8080, 9090

SERVER = r'''
import http.server, json, socket, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = json.dumps({"path": self.path, "port": self.server.server_address[1],
                           "headers": dict(self.headers)}).encode()
        if self.path.startswith("/big"):
            body = b"x" * int(self.path[5:])
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    request_queue_size = 1024
    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()
servers = [S(("::", int(p)), H) for p in sys.argv[1:]]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
servers[0].serve_forever()
'''

FETCH = r'''
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=10)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except Exception as e:
    print("error", type(e).__name__, e)
'''


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class ServersCase(cbtest.CowboxTestCase):
    """The test servers in a network namespace of their own, and the resolver map."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (network namespaces)")
        # one set per class: a veth pair goes with its namespace asynchronously
        tag = "%d%s" % (os.getpid(), cls.__name__[0].lower())
        cls.ns, cls.host_if = "cbnt" + tag, "cbh" + tag
        cls.server, cls.hosts = None, None
        try:
            cls._setup_servers(tag)
        except BaseException:
            cls.tearDownClass()  # a failed set-up leaves no server, namespace or file behind
            raise

    @classmethod
    def _setup_servers(cls, tag):
        host_if, ns_if = cls.host_if, "cbn" + tag
        sh("ip", "netns", "add", cls.ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", cls.ns)
        for a in (PUB_HOST + "/30", PRIV_HOST + "/30"):
            sh("ip", "addr", "add", a, "dev", host_if)
        sh("ip", "-6", "addr", "add", V6_HOST + "/64", "dev", host_if, "nodad")
        sh("ip", "link", "set", host_if, "up")
        nse = ["ip", "netns", "exec", cls.ns]
        for a in (PUB + "/30", PRIV + "/30"):
            sh(*nse, "ip", "addr", "add", a, "dev", ns_if)
        sh(*nse, "ip", "-6", "addr", "add", V6 + "/64", "dev", ns_if, "nodad")
        sh(*nse, "ip", "link", "set", ns_if, "up")
        sh(*nse, "ip", "link", "set", "lo", "up")
        cls.server = subprocess.Popen(nse + ["python3", "-c", SERVER, str(PORT), str(OTHER_PORT),
                                             "80"], stdout=subprocess.PIPE, text=True)
        assert cls.server.stdout.readline().strip() == "ready"
        cbtest.wait_for(lambda: cbtest.tcp_reachable(PUB, PORT), 20, what="the test server")
        cls.hosts_dir = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
        cls.hosts = os.path.join(cls.hosts_dir, "cbnt-hosts-" + tag)
        with open(cls.hosts, "w") as f:
            f.write("# test resolver map\n"
                    "%s api.example.test other.example.test a.pkg.test pkg.test\n" % PUB +
                    "%s v6.example.test\n" % V6 +
                    "%s private.example.test\n" % PRIV +
                    "127.0.0.1 rebind.example.test\n"
                    "%s dual.example.test\n" % PRIV + "%s dual.example.test\n" % PUB)

    @classmethod
    def tearDownClass(cls):
        cbtest.stop_netns_server(cls.server, cls.ns)
        sh("ip", "link", "del", cls.host_if, check=False)  # if it never reached the namespace
        if cls.hosts and os.path.exists(cls.hosts):
            os.unlink(cls.hosts)

    def setUp(self):
        super().setUp()
        self.env["COWBOX_PROXY_HOSTS"] = self.hosts

    def ok(self, c, op, **args):
        r = c.request(op, **args)
        self.assertTrue(r.get("ok"), r)
        return r

    def run_in(self, c, script, timeout=60):
        r = c.request("run", cmd=["sh", "-c", script], timeout=timeout)
        self.assertTrue(r.get("ok"), r)
        import base64
        return (r["exit_code"], base64.b64decode(r["stdout"]).decode(errors="replace"),
                base64.b64decode(r["stderr"]).decode(errors="replace"))


# An HTTP client through the proxy in perl (the docker image has no curl or Python; the ns
# sandbox has the host's perl): MODE http (absolute URI), connect (a CONNECT tunnel, then the
# request inside) or socks (SOCKS5, the name resolved by the proxy); prints what came back.
PERL_CLIENT = r"""
use strict; use IO::Socket::INET;
my ($mode, $host, $port, $path) = @ARGV;
my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => 3128, Timeout => 10)
    or die "proxy: $!\n";
binmode $s;
my $req = "GET %s HTTP/1.1\r\nHost: $host:$port\r\nConnection: close\r\n\r\n";
if ($mode eq "http") {
    printf $s $req, "http://$host:$port$path";
} elsif ($mode eq "connect") {
    print $s "CONNECT $host:$port HTTP/1.1\r\nHost: $host:$port\r\n\r\n";
    my $l = <$s>;
    print "CONNECT $l";
    if ($l !~ m{^HTTP/1\.[01] 200}) { local $/; print <$s> // ""; exit 0 }
    while (my $h = <$s>) { last if $h =~ /^\r?\n$/ }
    printf $s $req, $path;
} else {
    print $s "\x05\x01\x00";
    read($s, my $m, 2);
    print $s pack("C4", 5, 1, 0, 3) . pack("C", length $host) . $host . pack("n", $port);
    read($s, my $r, 4);
    my $code = ord(substr($r, 1, 1));
    if ($code) { print "SOCKS $code\n"; exit 0 }
    my $atyp = ord(substr($r, 3, 1));
    my $len = $atyp == 1 ? 4 : $atyp == 4 ? 16 : do { read($s, my $n, 1); ord $n };
    read($s, my $skip, $len + 2);
    printf $s $req, $path;
}
local $/;
print <$s> // "";
"""


class PolicyConformance:
    """The same policy checks on each backend (ns, docker), through the perl client: each
    class gives policy_workspace(network, *allow) -> (ref, client) with client.pl at the
    workspace's root."""

    def via(self, c, mode, host, port, path="/"):
        """(status, body) of a request through the proxy: status "200", "403", ... or
        "SOCKS n" for a SOCKS5 refusal."""
        _, out, err = self.run_in(c, "perl /workspace/client.pl %s %s %d %s"
                                  % (mode, host, port, path))
        if out.startswith("SOCKS "):
            return out.strip(), ""
        if out.startswith("CONNECT "):
            line, _, out = out.partition("\n")
            if " 200" not in line:
                return line.split()[2], out
        head, _, body = out.partition("\r\n\r\n")
        parts = head.split()
        return (parts[1] if len(parts) > 1 else "error: " + out + err), body

    def test_conformance_allow(self):
        ref, c = self.policy_workspace("allow", "api.example.test:%d" % PORT,
                                       "*.pkg.test:%d" % PORT, "private.example.test:%d" % PORT,
                                       "rebind.example.test:%d" % PORT,
                                       "%s:%d" % (PUB, OTHER_PORT))
        # allowed: each protocol, the path as asked
        for mode in ("http", "connect", "socks"):
            status, body = self.via(c, mode, "api.example.test", PORT, "/%s?x=1" % mode)
            self.assertEqual(status, "200", (mode, body))
            self.assertEqual(json.loads(body)["path"], "/%s?x=1" % mode)
        self.assertEqual(self.via(c, "http", "a.pkg.test", PORT)[0], "200")
        self.assertEqual(self.via(c, "http", PUB, OTHER_PORT)[0], "200")
        # refused: a name not listed, the wildcard's own domain, a port not named, an
        # address entry's address on another port
        status, body = self.via(c, "http", "pkg.test", PORT)
        self.assertEqual(status, "403")
        self.assertEqual(body.strip(), "cowbox: refused pkg.test:%d: no allow entry matches "
                         "pkg.test:%d" % (PORT, PORT))
        self.assertEqual(self.via(c, "http", "other.example.test", PORT)[0], "403")
        self.assertEqual(self.via(c, "connect", "other.example.test", PORT)[0], "403")
        self.assertEqual(self.via(c, "socks", "other.example.test", PORT)[0], "SOCKS 2")
        self.assertEqual(self.via(c, "http", "api.example.test", 80)[0], "403")
        self.assertEqual(self.via(c, "http", PUB, PORT)[0], "403")
        # allowed names at a private or loopback address: refused on the address
        status, body = self.via(c, "http", "private.example.test", PORT)
        self.assertEqual(status, "403")
        self.assertIn("private 10.0.0.0/8", body)
        status, body = self.via(c, "connect", "rebind.example.test", PORT)
        self.assertEqual(status, "403")
        self.assertIn("loopback 127.0.0.0/8", body)
        # no way around the proxy
        code, out, err = self.run_in(c, "perl -MIO::Socket::INET -e 'IO::Socket::INET->new("
                                     "PeerAddr => \"%s\", PeerPort => %d, Timeout => 3) "
                                     "and print \"connected\"'" % (PUB, PORT))
        self.assertNotIn("connected", out)
        # reaches, and the log of it all
        self.assertTrue(self.ok(c, "reaches", dest="api.example.test:%d" % PORT)["allowed"])
        self.assertFalse(self.ok(c, "reaches", dest="other.example.test")["allowed"])
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual(len(rows), 13, rows)
        self.assertEqual({r["proto"] for r in rows if r["allowed"]}, {"http", "connect", "socks5"})
        self.assertEqual(sum(1 for r in rows if r["allowed"]), 5, rows)
        self.assertTrue(all(r["bytes_down"] > 0 for r in rows if r["allowed"]), rows)

    def test_conformance_public(self):
        ref, c = self.policy_workspace("public")
        self.assertEqual(self.via(c, "http", "api.example.test", PORT)[0], "200")
        self.assertEqual(self.via(c, "socks", PUB, OTHER_PORT)[0], "200")
        status, body = self.via(c, "http", "private.example.test", PORT)
        self.assertEqual(status, "403")
        self.assertIn("private", body)
        self.assertEqual(self.via(c, "connect", "rebind.example.test", PORT)[0], "403")
        self.assertEqual(self.via(c, "http", "169.254.169.254", 80)[0], "403")
        self.assertEqual(self.via(c, "http", "dual.example.test", PORT)[0], "200")
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual([r["address"] for r in rows if r["name"] == "dual.example.test"], [PUB])


class NetworkPolicyTest(PolicyConformance, ServersCase):
    """The ns backend, with curl and Python from the host's tree."""

    def workspace(self, network, *allow, base=None):
        args = ["create", "--network", network]
        for a in allow:
            args += ["--allow", a]
        if base:
            args += ["--base", base]
        ref = self.cowbox(*args).stdout.strip()
        self.mount(ref)
        return ref, self.client(ref, timeout=120)

    def policy_workspace(self, network, *allow):
        return self.workspace(network, *allow, base=self.make_base({"client.pl": PERL_CLIENT}))

    def curl(self, c, url, *extra):
        """curl through the proxy as the environment says: (http code, body)."""
        code, out, err = self.run_in(
            c, "curl -sS -m 10 -o /tmp/body -w '%%{http_code}' %s '%s'; echo; cat /tmp/body"
            % (" ".join(extra), url))
        status, _, body = out.partition("\n")
        return status, body, err

    # --- the policy ---

    def test_allow_entries_through_http_connect_socks_and_urllib(self):
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT,
                                "*.pkg.test:%d" % PORT, V6_NET,
                                "private.example.test:%d" % PORT,
                                "rebind.example.test:%d" % PORT, "%s:%d" % (PUB, OTHER_PORT))
        code, out, _ = self.run_in(c, "env | grep -i _proxy | sort")
        self.assertIn("HTTP_PROXY=http://127.0.0.1:3128", out)
        self.assertIn("https_proxy=http://127.0.0.1:3128", out)
        self.assertIn("ALL_PROXY=socks5h://127.0.0.1:3128", out)
        self.assertIn("NO_PROXY=localhost,127.0.0.1,::1", out)
        url = "http://api.example.test:%d/hello?x=1" % PORT
        # plain HTTP forwarding: origin-form path, hop-by-hop headers gone
        status, body, err = self.curl(c, url, "-H 'Proxy-Connection: keep-alive'")
        self.assertEqual(status, "200", err)
        seen = json.loads(body)
        self.assertEqual(seen["path"], "/hello?x=1")
        self.assertNotIn("Proxy-Connection", seen["headers"])
        # CONNECT (curl -p tunnels plain HTTP through CONNECT)
        status, body, err = self.curl(c, url, "-p")
        self.assertEqual(status, "200", err)
        self.assertEqual(json.loads(body)["path"], "/hello?x=1")
        # SOCKS5 with remote resolution
        status, body, err = self.curl(c, url, "--proxy socks5h://127.0.0.1:3128")
        self.assertEqual(status, "200", err)
        # Python urllib, through the variables
        code, out, _ = self.run_in(c, "python3 -c '%s' %s" % (FETCH.replace("'", "'\\''"), url))
        self.assertTrue(out.startswith("200 "), out)
        # wildcard: subdomains only
        self.assertEqual(self.curl(c, "http://a.pkg.test:%d/" % PORT)[0], "200")
        status, body, _ = self.curl(c, "http://pkg.test:%d/" % PORT)
        self.assertEqual(status, "403")
        self.assertEqual(body.strip(), "cowbox: refused pkg.test:%d: no allow entry matches "
                         "pkg.test:%d" % (PORT, PORT))
        # a port not named (the host entry has 8080 only)
        self.assertEqual(self.curl(c, "http://api.example.test/")[0], "403")
        # an address entry opens its address on its port whatever name led there
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % OTHER_PORT)[0], "200")
        # an address entry with its port; the same address on another port is not open
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PUB, OTHER_PORT))[0], "200")
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PUB, PORT))[0], "403")
        # IPv6 CIDR, by name and by literal, default ports only (80 here)
        self.assertEqual(self.curl(c, "http://v6.example.test/")[0], "200")
        self.assertEqual(self.curl(c, "http://[%s]/" % V6)[0], "200")
        self.assertEqual(self.curl(c, "http://v6.example.test:%d/" % PORT)[0], "403")
        # a name not listed; a SOCKS5 refusal is reply 2, "not allowed by ruleset"
        self.assertEqual(self.curl(c, "http://other.example.test:%d/" % PORT)[0], "403")
        code, _, err = self.run_in(c, "curl -sS -m 10 --proxy socks5h://127.0.0.1:3128 "
                                   "http://other.example.test:%d/" % PORT)
        self.assertEqual(code, 97, err)  # curl: the SOCKS5 reply code, 2
        self.assertTrue(err.rstrip().endswith("(2)"), err)
        # an allowed name at a private address, and one rebinding to loopback: refused
        status, body, _ = self.curl(c, "http://private.example.test:%d/" % PORT)
        self.assertEqual(status, "403")
        self.assertIn("private 10.0.0.0/8", body)
        status, body, _ = self.curl(c, "http://rebind.example.test:%d/" % PORT)
        self.assertEqual(status, "403")
        self.assertIn("loopback 127.0.0.0/8", body)
        _, _, err = self.curl(c, "http://rebind.example.test:%d/" % PORT, "-p")
        self.assertIn("CONNECT tunnel failed, response 403", err)
        # reaches says the same, without resolving
        self.assertTrue(self.ok(c, "reaches", dest="api.example.test:%d" % PORT)["allowed"])
        r = self.ok(c, "reaches", dest="other.example.test")
        self.assertFalse(r["allowed"])
        self.assertIn("no host entry matches other.example.test:443", r["rule"])
        self.assertEqual(self.cowbox("reaches", ref, "10.1.1.1:%d" % PORT,
                                     check=False).returncode, 1)
        # the network log: every attempt, with its verdict, rule and bytes
        rows = self.ok(c, "net_log")["rows"]
        self.assertGreaterEqual(len(rows), 16)
        ok_rows = [r for r in rows if r["allowed"]]
        self.assertTrue(all(r["bytes_down"] > 0 and r["address"] for r in ok_rows), ok_rows)
        protos = {r["proto"] for r in ok_rows}
        self.assertEqual(protos, {"http", "connect", "socks5"})
        refused = [r for r in rows if not r["allowed"]]
        self.assertTrue(any(r["name"] == "rebind.example.test" and r["address"] == "127.0.0.1"
                            and "loopback" in r["rule"] for r in refused), refused)
        self.assertTrue(all(r["turn"] == 1 and not r["secret"] for r in rows))
        text = self.cowbox("net-log", ref).stdout
        self.assertIn("refused", text)
        self.assertIn("private.example.test", text)

    def test_no_route_around_the_proxy(self):
        _, c = self.workspace("allow", "api.example.test:%d" % PORT)
        code, _, err = self.run_in(c, "curl -sS -m 5 --noproxy '*' http://%s:%d/" % (PUB, PORT))
        self.assertNotEqual(code, 0)
        code, out, _ = self.run_in(c, "python3 -c 'import socket\n"
                                   "try:\n socket.create_connection((\"%s\", %d), timeout=3)\n"
                                   " print(\"connected\")\n"
                                   "except OSError as e:\n print(\"no route\", e.errno)'"
                                   % (PUB, PORT))
        self.assertTrue(out.startswith("no route"), out)
        code, out, _ = self.run_in(c, "cat /proc/net/route | wc -l; "
                                   "tail -n +3 /proc/net/dev | cut -d: -f1")
        self.assertEqual(out.split(), ["1", "lo"])

    def test_private_address_allowed_when_named(self):
        ref, c = self.workspace("allow", "%s:%d" % (PRIV, PORT))
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PRIV, PORT))[0], "200")
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PRIV, PORT), "-p")[0], "200")
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PRIV, OTHER_PORT))[0], "403")

    def test_public(self):
        ref, c = self.workspace("public")
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % PORT)[0], "200")
        self.assertEqual(self.curl(c, "http://%s:%d/" % (PUB, OTHER_PORT))[0], "200")
        status, body, _ = self.curl(c, "http://private.example.test:%d/" % PORT)
        self.assertEqual(status, "403")
        self.assertIn("private", body)
        self.assertEqual(self.curl(c, "http://rebind.example.test:%d/" % PORT)[0], "403")
        self.assertEqual(self.curl(c, "http://127.0.0.1:%d/" % PORT, "--noproxy ''")[0],
                         "403")
        self.assertEqual(self.curl(c, "http://169.254.169.254/", "--noproxy ''")[0], "403")
        # a name with a private and a public address: the public one is the one connected
        self.assertEqual(self.curl(c, "http://dual.example.test:%d/" % PORT)[0], "200")
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual([r["address"] for r in rows if r["name"] == "dual.example.test"], [PUB])
        info = self.cowbox_json("info", ref)
        self.assertEqual(info["network"], "public")

    def test_policy_survives_a_restart(self):
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT)
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % PORT)[0], "200")
        pid = self.daemon_pid(ref)
        self.ok(c, "close")
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 15, what="the daemon to stop")
        self.mount(ref)
        c = self.client(ref, timeout=120)
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % PORT)[0], "200")
        self.assertEqual(self.curl(c, "http://other.example.test:%d/" % PORT)[0], "403")
        info = self.cowbox_json("info", ref)
        self.assertEqual((info["network"], info["allow"]),
                         ("allow", ["api.example.test:%d" % PORT]))
        self.assertEqual(len(self.ok(c, "net_log")["rows"]), 3)
        self.assertEqual(len(self.cowbox_json("net-log", ref, "--turn", "1")), 3)
        self.assertEqual(self.cowbox_json("net-log", ref, "--turn", "2"), [])

    def test_bad_entries_refused_at_create(self):
        for entry, says in (("", "empty"), ("a.*.com", "wildcard"), ("10.0.0.0/33", "prefix"),
                            ("x.test:70000", "port"), ("10.0.0.1/8", "CIDR")):
            proc = self.assert_fails(["create", "--network", "allow", "--allow", entry], says)
        self.assert_fails(["create", "--network", "public", "--allow", "a.test"],
                          "only with network allow")
        self.assert_fails(["create", "--network", "bogus"], "none, all, host, public or allow")
        self.assertEqual(os.listdir(os.path.join(self.home, "workspaces")), [])

    def test_fuzzed_input_answered_and_proxy_keeps_serving(self):
        seed = int(os.environ.get("COWBOX_SEED", random.randrange(1 << 30)))
        print("test_fuzzed_input: COWBOX_SEED=%d" % seed)
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT)
        pid = self.daemon_pid(ref)
        fuzz = r'''
import random, socket, sys
rnd = random.Random(int(sys.argv[1]))
seeds = [b"CONNECT api.example.test:8080 HTTP/1.1\r\n\r\n", b"GET http://api.example.test:8080/ HTTP/1.1\r\nHost: x\r\n\r\n",
         b"\x05\x01\x00\x05\x01\x00\x03\x10api.example.test\x1f\x90", b"GET / HTTP/1.1\r\n\r\n"]
answered = 0
for i in range(300):
    data = bytearray(rnd.choice(seeds))
    for _ in range(rnd.randrange(1, 6)):
        op = rnd.randrange(3)
        at = rnd.randrange(len(data) + 1)
        if op == 0 and data: data[min(at, len(data) - 1)] = rnd.randrange(256)
        elif op == 1: data[at:at] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 8)))
        elif data: del data[at:at + rnd.randrange(1, 4)]
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    try:
        s.sendall(bytes(data))
        s.shutdown(socket.SHUT_WR)
        if s.recv(1 << 16) is not None: answered += 1
    except OSError:
        answered += 1
    s.close()
print("answered", answered)
'''
        code, out, err = self.run_in(c, "python3 -c '%s' %d" % (fuzz.replace("'", "'\\''"), seed),
                                     timeout=300)
        self.assertEqual(out.strip(), "answered 300", err)
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % PORT)[0], "200")
        self.assertTrue(cbtest.pid_alive(pid))

    def test_concurrency_and_no_fd_leak(self):
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT)
        pid = self.daemon_pid(ref)
        self.assertEqual(self.curl(c, "http://api.example.test:%d/" % PORT)[0], "200")
        cbtest.wait_for(lambda: True, 1)
        before = cbtest.fd_count(pid)
        load = r'''
import selectors, socket, sys
n, total = int(sys.argv[1]), int(sys.argv[2])
req = b"GET http://api.example.test:8080/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n"
sel = selectors.DefaultSelector()
done = ok = started = 0
def start():
    global started
    s = socket.socket(); s.setblocking(False)
    s.connect_ex(("127.0.0.1", 3128)); started += 1
    sel.register(s, selectors.EVENT_WRITE, [b""])
for _ in range(n): start()
while done < total:
    for key, ev in sel.select(30):
        s, buf = key.fileobj, key.data
        if ev & selectors.EVENT_WRITE:
            s.send(req); sel.modify(s, selectors.EVENT_READ, buf); continue
        chunk = s.recv(65536)
        if chunk:
            buf[0] += chunk; continue
        sel.unregister(s); s.close(); done += 1
        ok += buf[0].startswith(b"HTTP/1.0 200") or buf[0].startswith(b"HTTP/1.1 200")
        if started < total: start()
print(ok, done)
'''
        # 200 at once: below the proxy's default cap of 256 connections, past which a new
        # one is refused while none is idle (test_network_fds.py)
        code, out, err = self.run_in(c, "ulimit -n 4096; python3 -c '%s' 200 %d"
                                     % (load.replace("'", "'\\''"), self.requests), timeout=600)
        self.assertEqual(out.split(), [str(self.requests)] * 2, err)
        # each of the proxy's event loops (one per online CPU, at most 4) keeps one
        # connection's two pipes while idle
        loops = min(max(os.sysconf("SC_NPROCESSORS_ONLN"), 1), 4)
        cbtest.wait_for(lambda: cbtest.fd_count(pid) <= before + 2 + 4 * loops, 30,
                        what="the daemon's fds to come back to %d (+%d for %d loops' idle "
                        "pipes)" % (before, 4 * loops, loops))
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual(len(rows), self.requests + 1)

    requests = int(os.environ.get("COWBOX_NET_REQUESTS", "2000"))

    def test_publish(self):
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT)
        server = self.client(ref, timeout=60)
        # a server inside the sandbox on its own loopback, kept up by a running command
        server.send({"id": "srv", "op": "run", "timeout": 120, "cmd": [
            "sh", "-c", "cd /tmp && echo inside > hello.txt && "
            "exec python3 -m http.server 8000 --bind 127.0.0.1"]})
        addr = self.ok(c, "publish", port=8000)["address"]
        self.assertRegex(addr, r"^127\.0\.0\.1:\d+$")
        self.assertEqual(self.ok(c, "publish", port=8000)["address"], addr)  # idempotent
        host, port = addr.split(":")
        import urllib.request

        def fetch():
            try:
                return urllib.request.urlopen("http://%s/hello.txt" % addr, timeout=5).read()
            except OSError:
                return None
        cbtest.wait_for(lambda: fetch() == b"inside\n", 30, what="the published server")
        self.assertEqual(self.cowbox("publish", ref, "8000").stdout.strip(), addr)
        self.cowbox("unpublish", ref, "8000")
        self.assertFalse(cbtest.tcp_reachable(host, int(port)))
        j = self.cowbox_json("publish", ref, "8000")
        self.assertEqual(j["address"], "127.0.0.1:%d" % j["host_port"])
        self.assertEqual(self.cowbox("publish", ref, "8000").stdout.strip(), j["address"])
        self.assert_fails(["publish", ref, "70000"], "PORT is 1-65535", status=2)
        self.ok(c, "unpublish", port=8000)
        r = c.request("unpublish", port=8000)
        self.assertEqual(r["error"]["code"], "not_found", r)
        r = c.request("publish", port=0)
        self.assertEqual(r["error"]["code"], "invalid_request", r)
        # a port nothing listens on inside, while the host's loopback has one: the relay
        # connects inside the sandbox only, never to the host's
        decoy = socket.socket()
        decoy.bind(("127.0.0.1", 0))
        decoy.listen(4)
        self.addCleanup(decoy.close)
        dport = decoy.getsockname()[1]
        daddr = self.ok(c, "publish", port=dport)["address"].split(":")
        with socket.create_connection((daddr[0], int(daddr[1])), timeout=5) as s:
            s.settimeout(5)
            self.assertEqual(s.recv(10), b"")  # closed at once: nothing inside
        decoy.settimeout(0.5)
        with self.assertRaises(socket.timeout):
            decoy.accept()
        self.ok(c, "unpublish", port=dport)
        # a connection open at unpublish is closed with it (the server inside keeps it)
        holder = self.client(ref, timeout=60)
        holder.send({"id": "hold", "op": "run", "timeout": 120, "cmd": ["python3", "-c",
                     "import socket, time\ns = socket.socket()\n"
                     "s.bind(('127.0.0.1', 8003))\ns.listen()\nc, _ = s.accept()\n"
                     "c.sendall(b'hi\\n')\ntime.sleep(100)\n"]})
        haddr = self.ok(c, "publish", port=8003)["address"].split(":")

        def hold():
            try:
                h = socket.create_connection((haddr[0], int(haddr[1])), timeout=10)
            except OSError:
                return None
            if h.recv(3) == b"hi\n":
                return h
            h.close()
        held = cbtest.wait_for(hold, 30, what="the holding server")
        self.addCleanup(held.close)
        self.ok(c, "unpublish", port=8003)
        try:
            self.assertEqual(held.recv(4096), b"")
        except ConnectionResetError:
            pass
        holder.close()
        # the next one closes with the workspace's daemon
        addr = self.ok(c, "publish", port=8000)["address"]
        cbtest.wait_for(lambda: fetch() == b"inside\n", 30, what="the published server")
        pid = self.daemon_pid(ref)
        server.close()
        self.ok(c, "close")
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 15, what="the daemon to stop")
        self.assertFalse(cbtest.tcp_reachable("127.0.0.1", int(addr.split(":")[1])))

    def test_cli_exec_joins_the_policy(self):
        """cowbox exec REF (the CLI's own sandbox, no daemon command) gets the workspace's
        namespace and proxy: allowed, refused, no route around it, in the network log."""
        ref, c = self.workspace("allow", "api.example.test:%d" % PORT)
        curl = "curl -sS -m 10 -w ' %%{http_code}' http://%s:%d/%s"
        r = self.cowbox("exec", ref, "--", "sh", "-c",
                        curl % ("api.example.test", PORT, "cli"), check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('"path": "/cli"', r.stdout)
        self.assertTrue(r.stdout.endswith(" 200"), r.stdout)
        r = self.cowbox("exec", ref, "--", "sh", "-c",
                        curl % ("other.example.test", PORT, ""), check=False)
        self.assertIn("cowbox: refused other.example.test", r.stdout)
        self.assertTrue(r.stdout.endswith(" 403"), r.stdout)
        r = self.cowbox("exec", ref, "--", "curl", "-sS", "-m", "5", "--noproxy", "*",
                        "http://%s:%d/" % (PUB, PORT), check=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        # an --env of the proxy's names wins (and then nothing is reached)
        r = self.cowbox("exec", ref, "--env", "HTTP_PROXY=http://127.0.0.1:1", "--", "sh",
                        "-c", "echo $HTTP_PROXY $ALL_PROXY")
        self.assertEqual(r.stdout.split(), ["http://127.0.0.1:1", "socks5h://127.0.0.1:3128"])
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual([(x["name"], x["allowed"]) for x in rows],
                         [("api.example.test", True), ("other.example.test", False)])
        # diff --net lists them with the changes (and the network log is full access's)
        out = self.cowbox("diff", ref, "0", "--net").stdout
        self.assertIn("network:", out)
        self.assertRegex(out, r"refused +other\.example\.test")
        self.assertEqual(self.cowbox_json("diff", ref, "0", "--net")["network"], rows)
        self.assertNotIn("network", self.cowbox_json("diff", ref, "0"))
        low = self.client(ref, timeout=60)
        self.ok(low, "access", level="files")
        r = low.request("diff", a=0, network=True)
        self.assertEqual(r["error"]["code"], "access_denied", r)
        self.ok(low, "diff", a=0)
        low.close()
        # and what the API runs meets the same namespace: a server started from the CLI
        # is on the loopback the API's commands see
        self.assertEqual(self.cowbox("exec", ref, "--", "sh", "-c",
                                     "cat /proc/self/ns/net >/dev/null; readlink "
                                     "/proc/self/ns/net").stdout.strip(),
                         self.run_in(c, "readlink /proc/self/ns/net")[1].strip())

    def test_publish_refused_without_a_namespace(self):
        for net in ("host",):
            ref, c = self.workspace(net)
            r = c.request("publish", port=22)
            self.assertFalse(r.get("ok"), r)
            self.assertIn("no network namespace of its own", r["error"]["message"])
        ref = self.create()
        self.mount(ref)
        c = self.client(ref, timeout=60)
        self.ok(c, "configure", options={"backend": "local"})
        r = c.request("publish", port=22)
        self.assertIn("no network namespace of its own", r["error"]["message"])

    def test_local_backend_refuses_a_policy(self):
        ref = self.create()
        self.mount(ref)
        c = self.client(ref)
        for net in ("public", "allow", "none", "all"):
            r = c.request("configure", options={"backend": "local", "network": net})
            self.assertEqual(r["error"]["code"], "invalid_request", r)
            self.assertIn("cannot keep a command from going around a proxy",
                          r["error"]["message"])

    def test_python_client(self):
        import asyncio
        import cowbox

        async def go():
            box = await cowbox.Sandbox.create(
                network=cowbox.Network.allow(hosts=["api.example.test:%d" % PORT]),
                home=self.home)
            try:
                r = await box.run(["curl", "-sS", "-m", "10",
                                   "http://api.example.test:%d/py" % PORT])
                self.assertEqual(json.loads(r.stdout)["path"], "/py", r)
                r = await box.run(["curl", "-sS", "-m", "10",
                                   "http://other.example.test:%d/" % PORT])
                self.assertIn("cowbox: refused other.example.test", r.stdout)
                self.assertTrue(await box.reaches("api.example.test:%d" % PORT))
                self.assertFalse(await box.reaches("other.example.test"))
                rows = await box.net_log()
                self.assertEqual([(x["name"], x["allowed"]) for x in rows],
                                 [("api.example.test", True), ("other.example.test", False)])
                self.assertEqual(await box.net_log(turn=1), rows)
                await box.snapshot()
                self.assertEqual(await box.net_log(turn=2), [])
                # diff(network=True): the rows of the turns the diff spans
                r = await box.run(["curl", "-sS", "-m", "10", "http://pkg.test:%d/" % PORT])
                await box.write("made.txt", b"x")
                await box.snapshot()
                d = await box.diff(0, 1, network=True)
                self.assertEqual(d.network, rows)
                d = await box.diff(1, 2, network=True)
                self.assertEqual([x.path for x in d], ["made.txt"])
                self.assertEqual([(x["name"], x["turn"]) for x in d.network], [("pkg.test", 2)])
                self.assertEqual((await box.diff(2, 1, network=True)).network, d.network)
                self.assertEqual((await box.diff(1, network=True)).network, d.network)
                self.assertEqual((await box.diff(2, network=True)).network, [])
                self.assertIsNone((await box.diff(1, 2)).network)
                # publish: a server the sandbox keeps, reached from here
                await box.run(["sh", "-c", "mkdir -p /tmp/www && echo py > /tmp/www/p.txt && "
                               "cd /tmp/www && (python3 -m http.server 8002 --bind 127.0.0.1 "
                               ">/dev/null 2>&1 &)"])
                addr = await box.publish(8002)
                self.assertEqual(await box.publish(8002), addr)
                import urllib.request

                def fetch():
                    try:
                        return urllib.request.urlopen("http://%s/p.txt" % addr,
                                                      timeout=5).read()
                    except OSError:
                        return None
                cbtest.wait_for(lambda: fetch() == b"py\n", 30, what="the published server")
                await box.unpublish(8002)
                self.assertIsNone(fetch())
            finally:
                await box.close()
            with self.assertRaises(ValueError):
                cowbox.Network("bogus")
            with self.assertRaises(ValueError):
                cowbox.Network.public().__class__("public", ["a.test"])
            self.assertEqual(cowbox.Network.allow(["a.test"]).options(),
                             {"network": "allow", "allow": ["a.test"]})

        saved = os.environ.get("COWBOX_PROXY_HOSTS")
        os.environ["COWBOX_PROXY_HOSTS"] = self.hosts
        try:
            asyncio.run(go())
        finally:
            if saved is None:
                del os.environ["COWBOX_PROXY_HOSTS"]
            else:
                os.environ["COWBOX_PROXY_HOSTS"] = saved



DOCKER_IMAGE = os.environ.get("COWBOX_DOCKER_IMAGE", "cowbox-debian:bookworm")


def _docker_ready():
    try:
        return subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@unittest.skipUnless(_docker_ready(), "no docker engine with image %s; scripts/setup-podman "
                     "sets one up" % DOCKER_IMAGE)
class DockerNetworkPolicyTest(PolicyConformance, ServersCase):
    """The docker backend (podman): the container runs with --network none and the proxy
    listens in its namespace. Its Debian image has no curl or Python: perl and bash."""

    def policy_workspace(self, network, *allow):
        ref = self.create(base=self.make_base({"client.pl": PERL_CLIENT}))
        self.mount(ref)
        c = self.client(ref, timeout=180)
        self.addCleanup(subprocess.run, ["docker", "rm", "-f", "cowbox-" + ref],
                        capture_output=True)
        options = {"backend": "docker", "image": DOCKER_IMAGE, "network": network}
        if allow:
            options["allow"] = list(allow)
        self.ok(c, "configure", options=options)
        return ref, c

    def request(self, c, line):
        code, out, err = self.run_in(c, "bash -c 'exec 3<>/dev/tcp/127.0.0.1/3128 && "
                                     "printf \"%s\" >&3 && cat <&3'" % line)
        return out

    def docker_workspace(self, network, **options):
        """A mounted workspace on the docker backend with that network policy: (ref, client)."""
        ref = self.create()
        self.mount(ref)
        c = self.client(ref, timeout=180)
        self.addCleanup(subprocess.run, ["docker", "rm", "-f", "cowbox-" + ref],
                        capture_output=True)
        self.ok(c, "configure", options=dict(options, backend="docker", image=DOCKER_IMAGE,
                                             network=network))
        return ref, c

    def test_policy_in_a_container(self):
        _, c = self.docker_workspace("allow", allow=["api.example.test:%d" % PORT,
                                                     "rebind.example.test:%d" % PORT])
        code, out, _ = self.run_in(c, "env | grep _PROXY | sort")
        self.assertIn("HTTP_PROXY=http://127.0.0.1:3128", out)
        get = "GET http://%s:%d/docker HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"
        out = self.request(c, get % ("api.example.test", PORT))
        self.assertTrue(out.startswith("HTTP/1.1 200"), out)
        self.assertIn('"path": "/docker"', out)
        out = self.request(c, get % ("other.example.test", PORT))
        self.assertTrue(out.startswith("HTTP/1.1 403"), out)
        out = self.request(c, get % ("rebind.example.test", PORT))
        self.assertIn("loopback", out)
        code, _, _ = self.run_in(c, "bash -c 'exec 3<>/dev/tcp/%s/%d'" % (PUB, PORT))
        self.assertNotEqual(code, 0)
        rows = self.ok(c, "net_log")["rows"]
        self.assertEqual([r["allowed"] for r in rows], [True, False, False])

    def test_publish_from_a_container(self):
        """A server on the container's own loopback (perl: the image has no Python) reached
        from the host's 127.0.0.1; closed by unpublish; none under network host."""
        ref, c = self.docker_workspace("none")
        server = self.client(ref, timeout=120)
        server.send({"id": "srv", "op": "run", "timeout": 120, "cmd": ["perl", "-e", PERL_ECHO]})
        addr = self.ok(c, "publish", port=8001)["address"]
        host, port = addr.split(":")
        cbtest.wait_for(lambda: _echo(host, int(port), b"ping") == b"echo ping", 30,
                        what="the published server in the container")
        self.ok(c, "unpublish", port=8001)
        self.assertFalse(cbtest.tcp_reachable(host, int(port)))
        server.close()

    def test_publish_refused_under_network_host(self):
        _, c = self.docker_workspace("host")
        r = c.request("publish", port=22)
        self.assertFalse(r.get("ok"), r)
        self.assertIn("host", r["error"]["message"])


# One line in, "echo LINE" out, per connection, on the sandbox's 127.0.0.1:8001.
PERL_ECHO = r"""
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => 8001, Listen => 16,
                              ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) { my $l = <$c>; print $c "echo $l"; close $c; }
"""


def _echo(host, port, line):
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(line + b"\n")
            s.shutdown(socket.SHUT_WR)
            out = b""
            while True:
                b = s.recv(4096)
                if not b:
                    return out.strip()
                out += b
    except OSError:
        return None


if __name__ == "__main__":
    unittest.main()
