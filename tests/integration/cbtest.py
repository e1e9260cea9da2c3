"""Shared helpers for cowbox's integration tests: a private COWBOX_HOME per test, running the
built binary, waiting for mounts, talking to a daemon, and cleaning up every mount and daemon."""

import ctypes
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

COWBOX = os.environ.get("COWBOX", "cowbox")
PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper():
    # The daemons `cowbox mount` starts outlive the CLI; as a subreaper this test process
    # inherits them and can reap them, since PID 1 on these machines reaps nothing.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass


_become_subreaper()



# A program (python3 -c SWAP_LOOP TARGET SECONDS DIR [CONTENT]) that swaps directory DIR/d
# with DIR/x, a symlink to TARGET (a host directory), by rename-exchange for SECONDS, printing
# "ready" first and "swaps N" at the end; with CONTENT it first writes DIR/d/f. Run inside a
# sandbox (and from the host too) while the root daemon works on those paths.
SWAP_LOOP = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[3])
if len(sys.argv) > 4:
    os.makedirs("d", exist_ok=True)
    with open("d/f", "w") as f:
        f.write(sys.argv[4])
if not os.path.lexists("x"):
    os.symlink(sys.argv[1], "x")
print("ready", flush=True)
end, swaps = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < end:
    if libc.renameat2(-100, b"d", -100, b"x", 2) == 0:
        swaps += 1
print("swaps", swaps, flush=True)
"""

def quote_path(name):
    """name as cowbox's text output shows it (git's core.quotePath, cli_q in
    cli/cmd_common.c): as it is, or in double quotes with C escapes when it holds a control
    character, a backslash, a double quote or a leading or trailing blank."""
    if not (name[:1] in (" ", "\t") or name[-1:] in (" ", "\t")) and not any(
            c < " " or c in "\x7f\\\"" for c in name):
        return name
    esc = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r",
           '"': '"', "\\": "\\"}
    out = []
    for c in name:
        if c in esc:
            out.append("\\" + esc[c])
        elif c < " " or c == "\x7f":
            out.append("\\%03o" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def makefile_var(name):
    """A variable of the configured build's Makefile (COWBOX_BUILDDIR; "" if it has none)."""
    with open(os.path.join(os.environ.get("COWBOX_BUILDDIR", ""), "Makefile")) as f:
        for line in f:
            if line.startswith(name + " ="):
                return line.split("=", 1)[1].strip()
    return ""


def tcp_reachable(addr, port, timeout=1):
    """True if a TCP connection to addr:port is accepted now."""
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def stop_netns_server(server, ns):
    """End a test server (a Popen with stdout piped, or None) and delete its network
    namespace ns, which may never have been made."""
    if server:
        server.kill()
        server.wait()
        server.stdout.close()
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def reap_children():
    """Collect every exited child (including adopted daemons) so none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_for(cond, timeout=20.0, interval=0.02, what="condition"):
    """Poll cond() until it returns a true value (returned) or fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def _unescape(field):
    out, i = "", 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out += chr(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i]
            i += 1
    return out


def fuse_mounts():
    """Mount points of every FUSE mount visible here (live or dead)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ")[0].startswith("fuse"):
                found.append(_unescape(left.split(" ")[4]))
    return found


def is_fuse_mount(path):
    return os.path.abspath(path) in fuse_mounts()


def pid_alive(pid):
    """True if pid runs and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if state == "Z":
        # Only this pid: waitpid(-1) would also collect a Popen's child that has just ended,
        # and that Popen then reads its exit status as 0 (a failing `cowbox merge` passed).
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


class Client:
    """A raw control-protocol connection: JSON lines over the workspace's control.sock."""

    def __init__(self, sock_path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        # Long temporary paths do not fit sun_path; go through the directory's fd.
        dfd = os.open(os.path.dirname(sock_path), os.O_PATH)
        try:
            self.sock.connect("/proc/self/fd/%d/%s" % (dfd, os.path.basename(sock_path)))
        finally:
            os.close(dfd)
        self.buf = b""
        self.next_id = 0
        self.hello = self.recv()

    def send_raw(self, data):
        self.sock.sendall(data)

    def send(self, msg):
        self.send_raw(json.dumps(msg).encode() + b"\n")

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def recv_bytes(self, n):
        """The n bytes after the last line (a frame that announces them)."""
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def request(self, op, **args):
        """Send {"id":N,"op":op,...} and return the final reply (stream frames skipped)."""
        self.next_id += 1
        msg = dict(args, id=self.next_id, op=op)
        self.send(msg)
        while True:
            reply = self.recv()
            if reply.get("id") == self.next_id and "stream" not in reply:
                return reply

    def close(self):
        self.sock.close()  # closing twice is harmless


class HelloHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET with "hello from the host": what host_url's tests fetch."""

    def do_GET(self):
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class CowboxTestCase(unittest.TestCase):
    """Each test gets its own COWBOX_HOME under a temporary directory; tearDown stops every
    daemon, detaches every FUSE mount under it and deletes it, also when the test failed."""

    def setUp(self):
        # A test that sets up again (a fresh home for a second case) ends the first home's
        # daemons and files now: the cleanup at the end sees only the last home.
        if getattr(self, "tmp", None):
            self._cleanup()
        self.tmp = tempfile.mkdtemp(prefix="cbtest-")
        self.home = os.path.join(self.tmp, "home")
        self.env = dict(os.environ, COWBOX_HOME=self.home)
        self.addCleanup(self._cleanup)

    def _cleanup(self):
        wsroot = os.path.join(self.home, "workspaces")
        pids = []
        if os.path.isdir(wsroot):
            for ref in os.listdir(wsroot):
                pid = self.daemon_pid(ref)
                if pid:
                    pids.append(pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for pid in pids:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: not pid_alive(pid), 10, what="daemon %d to die" % pid)
        for mnt in fuse_mounts():
            if mnt.startswith(self.tmp):
                subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        # a killed daemon's capped home and upper layer (each an ext4 on a loop device,
        # freed with its mount)
        with open("/proc/self/mountinfo") as f:
            homes = [_unescape(line.split()[4]) for line in f]
        for mnt in homes:
            if mnt.startswith(self.tmp) and mnt.endswith(("/home", "/upper", "/upper.new")):
                subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        reap_children()
        reports = self._sanitizer_reports(wsroot)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if reports:
            self.fail("sanitizer reports in daemon.log:\n" + "\n".join(reports))

    @staticmethod
    def _sanitizer_reports(wsroot):
        """Daemons run detached, so their ASan/UBSan findings only reach daemon.log."""
        found = []
        if not os.path.isdir(wsroot):
            return found
        for ref in os.listdir(wsroot):
            try:
                with open(os.path.join(wsroot, ref, "daemon.log"), errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:
                continue
            for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
                at = text.find(marker)
                if at >= 0:
                    found.append("%s: %s" % (ref, text[max(0, at - 200):at + 1500]))
                    break
        return found

    # --- running the binary ---

    def cowbox(self, *args, check=True, timeout=60, input=None):
        """Run cowbox with this test's COWBOX_HOME; fail the test on a non-zero exit when
        check is set. Returns the CompletedProcess (text mode)."""
        proc = subprocess.run([COWBOX] + [str(a) for a in args], env=self.env,
                              capture_output=True, text=True, timeout=timeout, input=input)
        if check and proc.returncode != 0:
            self.fail("cowbox %s exited %d\nstdout: %s\nstderr: %s" % (
                " ".join(map(str, args)), proc.returncode, proc.stdout, proc.stderr))
        return proc

    def cowbox_json(self, *args):
        return json.loads(self.cowbox(*(args + ("--json",))).stdout)

    def on_tty(self, *args, timeout=60):
        """cowbox ARGS with its stdout and stderr on a pseudo-terminal (what a person sees:
        phases, one-line summaries): (exit status, the text as the terminal got it)."""
        import pty

        master, slave = pty.openpty()
        proc = subprocess.Popen([COWBOX] + [str(a) for a in args], stdout=slave,
                                stderr=slave, stdin=subprocess.DEVNULL, env=self.env)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        os.close(master)
        return proc.wait(timeout=timeout), b"".join(chunks).decode()

    def assert_fails(self, args, pattern, status=None):
        """cowbox ARGS must exit with status and say pattern (a substring) on stderr; status
        None: any failure but a usage error (1, or 3-6 by its kind: man cowbox, EXIT STATUS)."""
        proc = self.cowbox(*args, check=False)
        ok = proc.returncode in (1, 3, 4, 5, 6) if status is None else proc.returncode == status
        self.assertTrue(ok, "exit %d (want %s) stdout: %s stderr: %s" % (
            proc.returncode, status or "1 or 3-6", proc.stdout, proc.stderr))
        self.assertIn(pattern, proc.stderr)
        return proc

    # --- workspaces ---

    def make_base(self, files=None):
        """A base directory with files {relative path: text}; returns its path."""
        base = tempfile.mkdtemp(prefix="base-", dir=self.tmp)
        for rel, text in (files or {}).items():
            path = os.path.join(base, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return base

    def create(self, base=None, name=None):
        args = ["create"]
        if base:
            args += ["--base", base]
        if name:
            args += ["--name", name]
        return self.cowbox(*args).stdout.strip()

    def ws_dir(self, ref):
        return os.path.join(self.home, "workspaces", ref)

    def mountpoint(self, ref):
        return os.path.join(os.path.realpath(self.ws_dir(ref)), "mnt")

    def mount(self, ref, *extra):
        """cowbox mount REF; returns the daemon pid once the mount is there."""
        info = json.loads(self.cowbox("mount", ref, *extra, "--json").stdout)
        self.assertTrue(is_fuse_mount(info["mountpoint"]), info)
        return info["pid"]

    def daemon_pid(self, ref):
        """The pid written in the workspace's lock file if that process is alive, else 0."""
        try:
            with open(os.path.join(self.ws_dir(ref), "lock")) as f:
                pid = int(f.readline().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0
        return pid if pid and pid_alive(pid) else 0

    def ok(self, c, op, **args):
        """c.request(op, **args), asserted to answer ok: the answer."""
        r = c.request(op, **args)
        self.assertTrue(r.get("ok"), r)
        return r

    def client(self, ref, timeout=10.0):
        """A protocol connection to ref's daemon, closed at the end of the test."""
        c = Client(os.path.join(self.ws_dir(ref), "control.sock"), timeout)
        self.addCleanup(c.close)
        return c

    def log(self, ref, *args):
        return self.cowbox_json("log", ref, *args)

    def serve_hello(self):
        """A HelloHandler server on a free host loopback port, stopped when the test ends;
        returns the port."""
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HelloHandler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        return srv.server_address[1]

    def listen_port(self):
        """A host loopback port that listens but never answers (closed when the test ends):
        what a sandbox under network none must not reach."""
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        self.addCleanup(srv.close)
        return srv.getsockname()[1]
