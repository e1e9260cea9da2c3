"""Header secrets through the workspace's egress proxy (ns backend): an HTTPS server with a test
CA in a network namespace the test makes (names through COWBOX_PROXY_HOSTS, the CA through
COWBOX_PROXY_EXTRA_CA); the header set for the bound host and path prefix only, replacing the
sandbox's own; an unbound host tunnelled with its real certificate; the secret nowhere inside
the sandbox nor in backend.json; a bad upstream certificate refused; curl, urllib, requests
(Debian's python3-requests, required), node and git over HTTPS; a restart; the network log's
flag; the Python client."""

import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import unittest

import cbtest

# A /30 of TEST-NET-2 of this run's own (test_network_policy uses TEST-NET-3): runs in
# parallel, of this test and that one, do not take each other's addresses.
_NET = 4 * (os.getpid() % 63)
PUB, PUB_HOST = "198.51.100.%d" % (_NET + 2), "198.51.100.%d" % (_NET + 1)

SERVER = r'''
import http.server, json, os, socket, ssl, subprocess, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def reply(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                n = int(self.rfile.readline().split(b";")[0], 16)
                if not n:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return data
                data += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))
    def git(self, body):
        # git http-backend as a CGI, only with the bound secret
        if self.headers.get("Authorization") != "Bearer " + os.environ["GIT_SECRET"]:
            self.send_response(401)
            self.send_header("WWW-Authenticate", "Basic realm=git")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path[4:].partition("?")
        env = dict(os.environ, GIT_PROJECT_ROOT=sys.argv[2], GIT_HTTP_EXPORT_ALL="1",
                   PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command,
                   CONTENT_TYPE=self.headers.get("Content-Type", ""),
                   CONTENT_LENGTH=str(len(body)), REMOTE_USER="t", REMOTE_ADDR="1.2.3.4")
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        code = 200
        hdrs = []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                code = int(v.split()[0])
            else:
                hdrs.append((k, v.strip()))
        self.send_response(code)
        for k, v in hdrs:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)
    def do_GET(self, body=b""):
        if self.path.startswith("/git/"):
            return self.git(body)
        self.reply(200, json.dumps({"path": self.path, "headers": dict(self.headers),
                                    "body": body.decode(errors="replace"),
                                    "resumed": getattr(self.request, "session_reused", None)}).encode())
    def do_POST(self):
        self.do_GET(self.body())
    def log_message(self, *a):
        pass
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1] + "/srv.pem", sys.argv[1] + "/srv.key")
srv = S(("0.0.0.0", 443), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
import threading
threading.Thread(target=S(("0.0.0.0", 80), H).serve_forever, daemon=True).start()
print("ready", flush=True)
srv.serve_forever()
'''

# Looks for the secret (given reversed, so that no command line holds it) in every process's
# environment and command line, and in the files a sandbox sees.
SEEK = r'''
import os, sys
secret = sys.argv[1][::-1].encode()
hits = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for f in ("environ", "cmdline"):
            try:
                if secret in open("/proc/%s/%s" % (pid, f), "rb").read():
                    hits.append("/proc/%s/%s" % (pid, f))
            except OSError:
                pass
for top in ("/workspace", "/home", "/tmp", "/etc", "/root", "/run", "/var", "/opt"):
    for d, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < 1 << 24:
                    if secret in open(p, "rb").read():
                        hits.append(p)
            except OSError:
                pass
print("hits", hits)
'''


def sh(*args, check=True, **kw):
    return subprocess.run(args, check=check, capture_output=True, text=True, **kw)


class NetworkSecretsTest(cbtest.CowboxTestCase):
    backend = "ns"

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (network namespaces)")
        cls.server = None
        cls.ns = "cbst%d" % os.getpid()
        try:
            cls._set_up()
        except BaseException:
            cls.tearDownClass()  # unittest does not when setUpClass fails
            raise

    @classmethod
    def _set_up(cls):
        cls.dir = tempfile.mkdtemp(prefix="cbsec")
        os.chmod(cls.dir, 0o755)
        d = cls.dir
        # a test CA and a server certificate for api and other, not for bad
        sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
           "-nodes", "-keyout", d + "/ca.key", "-out", d + "/ca.pem", "-days", "2",
           "-subj", "/CN=cowbox test upstream CA")
        sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
           "-keyout", d + "/srv.key", "-out", d + "/srv.csr", "-subj", "/CN=api.example.test")
        with open(d + "/ext", "w") as f:
            f.write("subjectAltName=DNS:api.example.test,DNS:other.example.test\n"
                    "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
        sh("openssl", "x509", "-req", "-in", d + "/srv.csr", "-CA", d + "/ca.pem", "-CAkey",
           d + "/ca.key", "-CAcreateserial", "-out", d + "/srv.pem", "-days", "2",
           "-extfile", d + "/ext")
        # a git repository served by git http-backend
        cls.git_secret = "gitsecret-" + secrets.token_hex(8)
        sh("git", "init", "-q", "--bare", d + "/repo.git")
        sh("sh", "-c", "cd %s && git init -q w && cd w && echo hello > f && git add f && "
           "git -c user.name=t -c user.email=t@t commit -qm one && "
           "git push -q ../repo.git HEAD:refs/heads/main" % d)
        sh("git", "--git-dir", d + "/repo.git", "symbolic-ref", "HEAD", "refs/heads/main")
        host_if, ns_if = "cbsh%d" % os.getpid(), "cbsn%d" % os.getpid()
        sh("ip", "netns", "add", cls.ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", cls.ns)
        sh("ip", "addr", "add", PUB_HOST + "/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        nse = ["ip", "netns", "exec", cls.ns]
        sh(*nse, "ip", "addr", "add", PUB + "/30", "dev", ns_if)
        sh(*nse, "ip", "link", "set", ns_if, "up")
        sh(*nse, "ip", "link", "set", "lo", "up")
        cls.server = subprocess.Popen(nse + ["python3", "-c", SERVER, d, d],
                                      stdout=subprocess.PIPE, text=True,
                                      env=dict(os.environ, GIT_SECRET=cls.git_secret))
        assert cls.server.stdout.readline().strip() == "ready"
        cbtest.wait_for(lambda: cbtest.tcp_reachable(PUB, 443), 20, what="the test server")
        cls.hosts = d + "/hosts"
        with open(cls.hosts, "w") as f:
            f.write("%s api.example.test other.example.test bad.example.test\n" % PUB)
        cls.base = d + "/base"
        os.mkdir(cls.base)
        shutil.copy(d + "/ca.pem", cls.base + "/upstream-ca.pem")

    @classmethod
    def tearDownClass(cls):
        cbtest.stop_netns_server(cls.server, cls.ns)
        if getattr(cls, "dir", None):
            shutil.rmtree(cls.dir, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.env["COWBOX_PROXY_HOSTS"] = self.hosts
        self.env["COWBOX_PROXY_EXTRA_CA"] = self.dir + "/ca.pem"
        self.secret = "s3cret-" + secrets.token_hex(12)
        self.file_secret = "filesecret-" + secrets.token_hex(12)
        self.secret_file = os.path.join(self.tmp, "api-key")
        with open(self.secret_file, "w") as f:
            f.write(self.file_secret + "\n")

    def workspace(self):
        """allow api, other and bad; Authorization under /v1/ and X-Api-Key everywhere on api,
        the git secret under /git/ of api, a binding on bad (whose certificate is wrong)."""
        env = dict(self.env, CB_TEST_TOKEN=self.secret, CB_GIT_TOKEN=self.git_secret)
        args = [cbtest.COWBOX, "create", "--base", self.base, "--network", "allow",
                "--allow", "api.example.test", "--allow", "other.example.test",
                "--allow", "bad.example.test",
                "--secret", "api.example.test:Authorization:env:CB_TEST_TOKEN:/v1/",
                "--secret-prefix", "Bearer ",
                "--secret", "api.example.test:Authorization:env:CB_GIT_TOKEN:/git/",
                "--secret-prefix", "Bearer ",
                "--secret", "API.example.test.:X-Api-Key:file:" + self.secret_file,
                "--secret-suffix", ";v=1",
                "--secret", "bad.example.test:X-Api-Key:file:" + self.secret_file]
        ref = subprocess.run(args, env=env, check=True, capture_output=True,
                             text=True).stdout.strip()
        self.mount(ref)
        return ref, self.client(ref, timeout=120)

    def run_in(self, c, script, timeout=60):
        r = c.request("run", cmd=["sh", "-c", script], timeout=timeout)
        self.assertTrue(r.get("ok"), r)
        return (r["exit_code"], base64.b64decode(r["stdout"]).decode(errors="replace"),
                base64.b64decode(r["stderr"]).decode(errors="replace"))

    def seen(self, c, url, *extra):
        """What the server saw of a curl request (its JSON), and curl's stderr."""
        code, out, err = self.run_in(c, "curl -sS -m 20 %s '%s'" % (" ".join(extra), url))
        self.assertEqual(code, 0, err)
        return json.loads(out), err

    def ok(self, c, op, **args):
        r = c.request(op, **args)
        self.assertTrue(r.get("ok"), r)
        return r

    def test_headers_set_where_bound_and_nowhere_else(self):
        ref, c = self.workspace()
        code, out, _ = self.run_in(c, "env | sort")
        for k in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                  "GIT_SSL_CAINFO"):
            self.assertIn(k + "=/etc/ssl/certs/ca-certificates.crt", out)
        pid = self.daemon_pid(ref)
        fds = cbtest.fd_count(pid)
        # bound host, bound prefix: set, replacing the sandbox's own value
        s, err = self.seen(c, "https://api.example.test/v1/models?x=1",
                           "-H 'Authorization: Bearer mine'", "-v")
        self.assertEqual(s["path"], "/v1/models?x=1")
        self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        self.assertEqual(s["headers"]["X-Api-Key"], self.file_secret + ";v=1")
        self.assertIn("CN=cowbox workspace %s CA" % ref, err)  # our leaf
        # `cowbox exec REF` from the CLI: the same namespace, proxy, trust and header
        p = self.cowbox("exec", ref, "--", "sh", "-c",
                        "curl -sS -m 20 https://api.example.test/v1/cli")
        self.assertEqual(json.loads(p.stdout)["headers"]["Authorization"],
                         "Bearer " + self.secret, p.stderr)
        # through SOCKS5 as well
        s, _ = self.seen(c, "https://api.example.test/v1/s", "--proxy socks5h://127.0.0.1:3128")
        self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        # plain HTTP to a bound host, forwarded or tunnelled to port 80: no secret
        for how in ("", "-p"):
            s, _ = self.seen(c, "http://api.example.test/v1/plain", how)
            self.assertNotIn("Authorization", s["headers"])
            self.assertNotIn("X-Api-Key", s["headers"])
        # another path: the prefix-less binding only; the sandbox's own Authorization stays
        s, _ = self.seen(c, "https://api.example.test/v2/x", "-H 'Authorization: mine'")
        self.assertEqual(s["headers"]["Authorization"], "mine")
        self.assertEqual(s["headers"]["X-Api-Key"], self.file_secret + ";v=1")
        # a dot segment that a server would resolve outside the prefix gets nothing
        s, _ = self.seen(c, "https://api.example.test/v1/../admin", "--path-as-is")
        self.assertNotIn("Authorization", s["headers"])
        self.assertEqual(s["headers"]["X-Api-Key"], self.file_secret + ";v=1")  # prefix /
        # keep-alive and a POST body (Content-Length, then chunked): each request set
        code, out, err = self.run_in(
            c, "curl -sS -m 20 https://api.example.test/v1/a -d hello --next "
            "-H 'Transfer-Encoding: chunked' -d world https://api.example.test/v1/b --next "
            "https://api.example.test/other")
        docs = [json.loads(x) for x in out.replace("}{", "}\n{").splitlines()]
        self.assertEqual([d["path"] for d in docs], ["/v1/a", "/v1/b", "/other"], err)
        self.assertEqual([d["body"] for d in docs], ["hello", "world", ""])
        self.assertEqual([d["headers"].get("Authorization") for d in docs],
                         ["Bearer " + self.secret] * 2 + [None])
        # an unbound host is tunnelled: its real certificate, which our bundle does not trust
        code, _, err = self.run_in(c, "curl -sS -m 20 https://other.example.test/v1/")
        self.assertEqual(code, 60, err)  # curl: peer certificate cannot be authenticated
        s, err = self.seen(c, "https://other.example.test/v1/", "-v",
                           "--cacert /workspace/upstream-ca.pem")
        self.assertIn("CN=cowbox test upstream CA", err)
        self.assertNotIn("Authorization", s["headers"])
        self.assertNotIn("X-Api-Key", s["headers"])
        # the upstream certificate is checked: a name it does not cover is refused, clearly
        code, out, err = self.run_in(c, "curl -sS -m 20 https://bad.example.test/v1/")
        self.assertIn("CONNECT tunnel failed, response 502", err)
        code, out, _ = self.run_in(c, "printf 'CONNECT bad.example.test:443 HTTP/1.1\\r\\n"
                                   "\\r\\n' | python3 -c 'import socket,sys\n"
                                   "s=socket.create_connection((\"127.0.0.1\",3128))\n"
                                   "s.sendall(sys.stdin.buffer.read())\n"
                                   "print(s.recv(4096).decode())'")
        self.assertIn("502 Bad Gateway", out)
        self.assertIn("upstream TLS: certificate verify failed: hostname mismatch", out)
        # a sandbox that does not trust the workspace's CA gets no further than its handshake
        code, _, err = self.run_in(c, "curl -sS -m 20 --cacert /workspace/upstream-ca.pem "
                                   "https://api.example.test/v1/")
        self.assertEqual(code, 60, err)
        # the network log: which connections had a secret injected
        rows = self.ok(c, "net_log")["rows"]
        by = {}
        for r in rows:
            by.setdefault(r["name"], set()).add(r["secret"])
        tls = [r["secret"] for r in rows if r["name"] == "api.example.test" and r["port"] == 443
               and not r["rule"].startswith("TLS from the sandbox failed")]
        self.assertGreaterEqual(len(tls), 5)
        self.assertTrue(all(tls), rows)
        self.assertEqual([r["secret"] for r in rows if r["name"] == "api.example.test"
                          and r["port"] == 80], [False] * 2)
        self.assertEqual(by["other.example.test"], {False})
        self.assertEqual(by["bad.example.test"], {False})
        self.assertTrue(any("certificate verify failed" in r["rule"] for r in rows), rows)
        self.assertTrue(any(r["rule"].startswith("TLS from the sandbox failed")
                            and not r["secret"] for r in rows), rows)
        self.assertNotIn(self.secret, json.dumps(rows))
        text = self.cowbox("net-log", ref).stdout
        self.assertIn("[secret]", text)
        self.assertNotIn(self.secret, text)
        # every connection's sockets are closed (+4 a loop: the two pipes each of the proxy's
        # event loops, one per online CPU up to 4, keeps for its next plain tunnel)
        loops = min(max(os.sysconf("SC_NPROCESSORS_ONLN"), 1), 4)
        cbtest.wait_for(lambda: cbtest.fd_count(pid) <= fds + 2 + 4 * loops, 30,
                        what="the daemon's fds to come back to %d" % fds)
        # info shows the bindings, never the value
        info = self.cowbox("info", ref, "--json").stdout
        self.assertNotIn(self.secret, info)
        self.assertEqual([(x["host"], x["header"], x["path_prefix"])
                          for x in json.loads(info)["secrets"]],
                         [("api.example.test", "Authorization", "/v1/"),
                          ("api.example.test", "Authorization", "/git/"),
                          ("api.example.test", "X-Api-Key", "/"),
                          ("bad.example.test", "X-Api-Key", "/")])
        self.assertIn("secret:      Authorization on https://api.example.test/v1/*",
                      self.cowbox("info", ref).stdout)

    def test_upstream_session_resumed(self):
        """The proxy's second connection to a bound host resumes the TLS session of its first
        (no certificate chain to verify again), per host and port; every one still gets the
        header, and a client's own keep-alive connection stays one upstream connection."""
        ref, c = self.workspace()
        first, _ = self.seen(c, "https://api.example.test/v1/a")
        second, _ = self.seen(c, "https://api.example.test/v1/b")
        self.assertFalse(first["resumed"])
        self.assertTrue(second["resumed"])
        for s in (first, second):
            self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        # two requests on one client connection: one upstream connection (one log row)
        before = len(self.ok(c, "net_log")["rows"])
        code, out, err = self.run_in(c, "curl -sS -m 20 https://api.example.test/v1/c "
                                     "https://api.example.test/v1/d")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count('"Bearer %s"' % self.secret), 2, out)
        rows = self.ok(c, "net_log")["rows"][before:]
        self.assertEqual(len(rows), 1, rows)
        self.assertTrue(rows[0]["secret"])

    def test_secret_follows_the_request_not_the_connection(self):
        """Attack: on an intercepted connection to the bound host, a request that names
        another host of the same front end (Host, an absolute target, the SNI; the first
        request of a connection or a later one) would carry the secret there. Each is refused
        with 421 before it goes out, and logged as refused."""
        ref, c = self.workspace()
        url = "https://api.example.test/v1/x"
        fmt = "-o /tmp/body -w '%{http_code}\\n'; cat /tmp/body"

        def curl(args):
            code, out, err = self.run_in(c, "curl -sS -m 20 %s %s" % (args, fmt))
            self.assertNotIn(self.secret, out)
            self.assertNotIn(self.file_secret, out)
            return out, err
        # Host names another site of the same server
        out, err = curl("-H 'Host: other.example.test' " + url)
        self.assertTrue(out.startswith("421\n"), out + err)
        self.assertIn("misdirected request: Host 'other.example.test'", out)
        # an absolute target naming it (curl sends Host: api.example.test)
        out, err = curl("--request-target https://other.example.test/v1/x " + url)
        self.assertTrue(out.startswith("421\n"), out + err)
        self.assertIn("request target's authority 'other.example.test'", out)
        # a keep-alive connection: the first request is the bound host's, the second not
        code, out, err = self.run_in(
            c, "curl -sS -m 20 -v %s --next -H 'Host: other.example.test' "
            "https://api.example.test/v1/y" % url)
        self.assertIn("Re-using existing connection", err)
        self.assertEqual(out.count(self.secret), 1, out)  # the first one's, echoed
        self.assertIn("misdirected request: Host 'other.example.test'", out)
        # the SNI names another host (the client takes any certificate)
        sni = r"""
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\n\r\n")
assert s.recv(4096).startswith(b"HTTP/1.1 200")
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
t = ctx.wrap_socket(s, server_hostname="other.example.test")
t.sendall(b"GET /v1/z HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n")
data = b""
while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < int(
        data.lower().partition(b"content-length: ")[2].split(b"\r")[0]):
    d = t.recv(65536)
    if not d:
        break
    data += d
print(data.decode(errors="replace"))
"""
        code, out, err = self.run_in(c, "python3 -c '%s'" % sni.replace("'", "'\\''"))
        self.assertTrue(out.startswith("HTTP/1.1 421 Misdirected Request"), out + err)
        self.assertIn("the TLS server name (SNI) 'other.example.test'", out)
        self.assertNotIn(self.secret, out)
        # a request naming the bound host still gets it, on its own connection
        s, _ = self.seen(c, url)
        self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        rows = [r for r in self.ok(c, "net_log")["rows"]
                if "misdirected request" in r["rule"]]
        self.assertEqual(len(rows), 4, rows)
        self.assertFalse(any(r["allowed"] for r in rows), rows)
        self.assertIn("misdirected request", self.cowbox("net-log", ref).stdout)

    def test_secret_nowhere_inside(self):
        ref, c = self.workspace()
        s, _ = self.seen(c, "https://api.example.test/v1/")
        self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        # a background process's environment and command line count too
        self.run_in(c, "sleep 30 >/dev/null 2>&1 &")
        for value in (self.secret, self.file_secret):
            code, out, err = self.run_in(c, "python3 -c '%s' %s" % (SEEK, value[::-1]),
                                         timeout=120)
            self.assertEqual(out.strip(), "hits []", err)
        # on the host: backend.json holds no value; the values' file and the CA key are 0600
        wsdir = os.path.join(self.home, "workspaces", ref)
        with open(os.path.join(wsdir, "backend.json")) as f:
            text = f.read()
        self.assertNotIn(self.secret, text)
        self.assertNotIn(self.file_secret, text)
        self.assertIn(self.secret_file, text)  # a file secret is kept by its path
        for name in ("secrets.json", "ca-key.pem"):
            self.assertEqual(os.stat(os.path.join(wsdir, name)).st_mode & 0o777, 0o600, name)
        with open(os.path.join(wsdir, "secrets.json")) as f:
            self.assertIn(self.secret, f.read())
        # the options a client reads back have no value either
        r = self.ok(c, "configure")
        self.assertNotIn(self.secret, json.dumps(r))

    def test_clients_python_node_git_and_restart(self):
        ref, c = self.workspace()
        url = "https://api.example.test/v1/client"
        code, out, err = self.run_in(
            c, "python3 -c 'import urllib.request,json,sys;"
            "print(json.load(urllib.request.urlopen(sys.argv[1]))[\"headers\"][\"Authorization\"])'"
            " " + url)
        self.assertEqual(out.strip(), "Bearer " + self.secret, err)
        # requests: test_python_requests
        # node honours no proxy variable by itself: a CONNECT by hand, then TLS on it
        node = r'''
const http = require("http"), https = require("https");
http.request({host: "127.0.0.1", port: 3128, method: "CONNECT", path: "api.example.test:443"})
  .on("connect", (res, socket) => {
    https.get({host: "api.example.test", path: "/v1/node", socket, agent: false}, (r) => {
      let b = ""; r.on("data", (d) => b += d);
      r.on("end", () => console.log(JSON.parse(b).headers.Authorization));
    }).on("error", (e) => console.log("error", e.message));
  }).end();
'''
        code, out, err = self.run_in(c, "node -e '%s'" % node)
        self.assertEqual(out.strip(), "Bearer " + self.secret, err)
        # git over HTTPS: the server wants the secret, which git never had
        code, out, err = self.run_in(c, "cd /tmp && git clone -q https://api.example.test/git/repo.git r "
                                     "&& cat r/f", timeout=120)
        self.assertEqual((code, out.strip()), (0, "hello"), err)
        # a restart: the policy and the bindings come back from disk
        pid = self.daemon_pid(ref)
        self.ok(c, "close")
        cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 15, what="the daemon to stop")
        self.mount(ref)
        c = self.client(ref, timeout=120)
        s, _ = self.seen(c, url)
        self.assertEqual(s["headers"]["Authorization"], "Bearer " + self.secret)
        self.assertEqual(s["headers"]["X-Api-Key"], self.file_secret + ";v=1")
        code, _, _ = self.run_in(c, "curl -sS -m 20 https://other.example.test/")
        self.assertEqual(code, 60)

    def test_python_requests(self):
        """Debian's python3-requests as a command runs it, through the proxy the environment
        names: a header secret set on the bound host (GET, and a POST with a body), an allowed
        host tunnelled with its own certificate both ways with a 2 MB body, plain HTTP, and a
        host the allow-list refuses."""
        ref, c = self.workspace()
        code, out, err = self.run_in(c, "python3 -c 'import requests; print(requests.__version__)'")
        self.assertEqual(code, 0, "python3-requests is missing (scripts/setup installs it): " + err)
        script = r'''
import json, requests
out = {}
r = requests.get("https://api.example.test/v1/req", headers={"Authorization": "mine"}, timeout=20)
out["bound"] = [r.status_code, r.json()["headers"]["Authorization"], r.json()["path"]]
r = requests.post("https://api.example.test/v1/post", json={"a": 1}, timeout=20)
out["post"] = [r.status_code, r.json()["body"], r.json()["headers"]["Authorization"]]
body = "0123456789abcdef" * (1 << 17)
r = requests.post("https://other.example.test/v1/big", data=body, timeout=60,
                  headers={"Authorization": "mine"}, verify="/workspace/upstream-ca.pem")
out["tunnel"] = [r.status_code, r.json()["body"] == body, r.json()["headers"]["Authorization"]]
r = requests.get("http://other.example.test/plain?x=1", timeout=20)
out["http"] = [r.status_code, r.json()["path"]]
try:
    requests.get("https://refused.example.test/", timeout=20)
    out["refused"] = "reached"
except requests.exceptions.ProxyError as e:
    out["refused"] = "403" if "403" in str(e) else str(e)
print(json.dumps(out))
'''
        code, out, err = self.run_in(c, "python3 -c '%s'" % script.replace("'", "'\\''"),
                                     timeout=120)
        self.assertEqual(code, 0, err)
        got = json.loads(out)
        self.assertEqual(got["bound"], [200, "Bearer " + self.secret, "/v1/req"])
        self.assertEqual(got["post"], [200, '{"a": 1}', "Bearer " + self.secret])
        self.assertEqual(got["tunnel"], [200, True, "mine"])  # not bound: untouched
        self.assertEqual(got["http"], [200, "/plain?x=1"])
        self.assertEqual(got["refused"], "403")
        rows = self.ok(c, "net_log")["rows"]
        by = {(r["name"], r["proto"]): r for r in rows}
        self.assertTrue(by[("api.example.test", "connect")]["secret"])
        big = [r for r in rows if r["name"] == "other.example.test" and r["proto"] == "connect"]
        self.assertEqual(len(big), 1, rows)
        self.assertGreater(big[0]["bytes_up"], 2 << 20)
        self.assertGreater(big[0]["bytes_down"], 2 << 20)
        self.assertFalse(big[0]["secret"])
        refused = [r for r in rows if r["name"] == "refused.example.test"]
        self.assertEqual([r["allowed"] for r in refused], [False])

    def test_bad_bindings_refused_at_create(self):
        env = dict(self.env, T="x")
        for spec, says in (("a.test:Authorization:env:NOPE_UNSET", "is not set"),
                           ("a.test:Host:env:T", "frames or routes"),
                           ("a.test:Bad Header:env:T", "not an HTTP header name"),
                           ("*.a.test:X:env:T", "not a name or an address"),
                           ("a.test:X:value", "needs HOST:HEADER"),
                           ("a.test:X:file:/nonexistent/x", "No such file")):
            proc = subprocess.run([cbtest.COWBOX, "create", "--network", "public",
                                   "--secret", spec], env=env, capture_output=True, text=True)
            self.assertNotEqual(proc.returncode, 0, spec)
            self.assertIn(says, proc.stderr, spec)
        proc = subprocess.run([cbtest.COWBOX, "create", "--network", "none", "--secret",
                               "a.test:X:env:T"], env=env, capture_output=True, text=True)
        self.assertIn("only with network public or allow", proc.stderr)
        self.assertEqual(os.listdir(os.path.join(self.home, "workspaces")), [])

    def test_python_client(self):
        import asyncio
        import cowbox

        async def go():
            box = await cowbox.Sandbox.create(
                self.base, network=cowbox.Network.allow(hosts=["api.example.test"]),
                header_bindings=[cowbox.HeaderBinding(
                    host="api.example.test", header="Authorization", env="CB_PY_TOKEN",
                    path_prefix="/v1/", prefix="Bearer ")],
                home=self.home)
            try:
                r = await box.run(["curl", "-sS", "-m", "20",
                                   "https://api.example.test/v1/py"])
                self.assertEqual(json.loads(r.stdout)["headers"]["Authorization"],
                                 "Bearer " + self.secret, r)
                rows = await box.net_log()
                self.assertEqual([x["secret"] for x in rows], [True])
            finally:
                await box.close()
            b = cowbox.HeaderBinding("h", "X", value="v")
            self.assertNotIn("'v'", repr(b))
            with self.assertRaises(ValueError):
                cowbox.HeaderBinding("h", "X", value="v", env="E")

        saved = {k: os.environ.get(k) for k in ("COWBOX_PROXY_HOSTS", "COWBOX_PROXY_EXTRA_CA",
                                                "CB_PY_TOKEN")}
        os.environ.update(COWBOX_PROXY_HOSTS=self.hosts,
                          COWBOX_PROXY_EXTRA_CA=self.dir + "/ca.pem", CB_PY_TOKEN=self.secret)
        try:
            asyncio.run(go())
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def test_docker_bundle_and_interception(self):
        """docker: the bundle at the standard path and the variables in the container, and the
        proxy in its namespace intercepting (the image has no TLS client: the host's curl
        runs in the container's network namespace)."""
        image = os.environ.get("COWBOX_DOCKER_IMAGE", "cowbox-debian:bookworm")
        try:
            ready = subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                                   timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ready = False
        if not ready:
            self.skipTest("no docker engine with image %s (scripts/setup-podman)" % image)
        ref = self.cowbox("create").stdout.strip()
        self.addCleanup(subprocess.run, ["docker", "rm", "-f", "cowbox-" + ref],
                        capture_output=True)
        self.mount(ref)
        c = self.client(ref, timeout=180)
        self.ok(c, "configure", options={
            "backend": "docker", "image": image, "network": "allow",
            "allow": ["api.example.test"],
            "secrets": [{"host": "api.example.test", "header": "Authorization",
                         "value": self.secret, "prefix": "Bearer "}]})
        code, out, err = self.run_in(c, "cat /etc/ssl/certs/ca-certificates.crt; env", 180)
        self.assertEqual(code, 0, err)
        with open(os.path.join(self.home, "workspaces", ref, "ca.pem")) as f:
            self.assertIn(f.read().strip(), out)
        self.assertIn("GIT_SSL_CAINFO=/etc/ssl/certs/ca-certificates.crt", out)
        self.assertNotIn(self.secret, out)
        pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", "cowbox-" + ref],
                             capture_output=True, text=True, check=True).stdout.strip()
        out = sh("nsenter", "--net=/proc/%s/ns/net" % pid, "curl", "-sS", "-m", "20",
                 "--cacert", os.path.join(self.home, "workspaces", ref, "ca.pem"),
                 "-x", "http://127.0.0.1:3128", "https://api.example.test/v1/d").stdout
        self.assertEqual(json.loads(out)["headers"]["Authorization"], "Bearer " + self.secret)


if __name__ == "__main__":
    unittest.main()
