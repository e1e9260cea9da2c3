"""The escape suite: every test tries to get out of the namespace sandbox and must fail (with
a positive control where one proves the probe works), plus the limits: memory, pids, cpus."""

import base64
import json
import os
import pty
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from cbtest import COWBOX, SWAP_LOOP, CowboxTestCase, pid_alive

# Python probes run inside the sandbox; they print what happened instead of raising.
SYSCALL_PROBE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    r = libc.syscall(*args)
    print(name, "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()])
"""


# CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT
USERNS_CAPS = "%016x" % sum(1 << c for c in (0, 1, 3, 5, 6, 7, 8, 10, 18))
DIR_ID_BASE = 2147418112  # cowbox exec --dir's host range: 2^31 - 65536


def setid_files(top):
    """Every setuid file, and setgid non-directory, under top: (path, uid)."""
    found = []
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            if st.st_mode & 0o4000 or (st.st_mode & 0o2000 and not os.path.isdir(
                    os.path.join(root, name))):
                found.append((os.path.join(root, name), st.st_uid))
    return found


class EscapeTestCase(CowboxTestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the escape suite probes root's sandbox (and writes under /root)")
        super().setUp()
        self.ws = os.path.join(self.tmp, "box")
        os.mkdir(self.ws)

    def sandbox(self, *cmd, args=(), env=None, check_status=None, timeout=60, **kw):
        p = subprocess.run([COWBOX, "exec", "--dir", self.ws] + list(args) + ["--"] +
                           list(cmd), env=env or self.env, capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check_status is not None:
            self.assertEqual(p.returncode, check_status, p.stdout + p.stderr)
        return p

    def probe(self, code, args=()):
        return self.sandbox("python3", "-c", SYSCALL_PROBE + code, args=args,
                            check_status=0).stdout


class TestFilesystemEscapes(EscapeTestCase):
    def test_cannot_write_outside_workspace(self):
        p = self.sandbox("sh", "-c", "for f in /etc/cowbox-x /usr/cowbox-x /cowbox-x "
                         "/proc/sys/kernel/cowbox /dev/cowbox-x; do "
                         "echo x > $f 2>/dev/null && echo WROTE $f; done; "
                         "echo ok > /workspace/inside; echo tmp > /tmp/t && cat /tmp/t")
        self.assertNotIn("WROTE", p.stdout)
        self.assertIn("tmp", p.stdout)
        for path in ("/etc/cowbox-x", "/usr/cowbox-x", "/cowbox-x", "/dev/cowbox-x"):
            self.assertFalse(os.path.exists(path), path)
        with open(os.path.join(self.ws, "inside")) as f:
            self.assertEqual(f.read(), "ok\n")

    def test_sysctls_are_read_only(self):
        p = self.sandbox("sh", "-c", "echo 1 > /proc/sys/vm/drop_caches && echo WROTE; "
                         "echo evil > /proc/sys/kernel/hostname && echo WROTE2")
        self.assertNotIn("WROTE", p.stdout)

    def test_cannot_read_host_files_not_bound_in(self):
        secret_dir = tempfile.mkdtemp(prefix="cowbox-escape-", dir="/root")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", secret_dir]))
        secret = os.path.join(secret_dir, "secret")
        with open(secret, "w") as f:
            f.write("TOPSECRET\n")
        os.makedirs(self.home, exist_ok=True)
        with open(os.path.join(self.home, "state"), "w") as f:
            f.write("HOMESECRET\n")
        env = dict(self.env)
        p = self.sandbox("sh", "-c", "cat %s %s/state /var/lib/cowbox/* 2>&1; ls / /root "
                         "/var 2>&1; cat /proc/1/environ 2>&1" % (secret, self.home), env=env)
        self.assertNotIn("TOPSECRET", p.stdout)
        shadow = self.sandbox("sh", "-c", "cat /etc/shadow /etc/gshadow 2>&1").stdout
        self.assertNotIn("root:", shadow)  # uid 0 inside still owns root's files: masked
        self.assertNotIn("HOMESECRET", p.stdout)
        listing = subprocess.run([COWBOX, "exec", "--dir", self.ws, "--", "ls", "/"],
                                 env=env, capture_output=True, text=True).stdout.split()
        self.assertEqual(sorted(set(listing) - {"lib32", "libx32"}),
                         ["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr",
                          "workspace"])

    def test_cannot_mount(self):
        out = self.sandbox("sh", "-c", "mount -t tmpfs none /tmp 2>&1; echo rc=$?").stdout
        self.assertNotIn("rc=0", out)
        out = self.probe("call('mount', 165, b'none', b'/tmp', b'tmpfs', 0, None)\n"
                         "call('umount2', 166, b'/workspace', 2)\n"
                         "call('pivot_root', 155, b'/tmp', b'/tmp')\n"
                         "call('unshare', 272, 0x10000000)\n")
        self.assertEqual(out.split(), ["mount", "EPERM", "umount2", "EPERM", "pivot_root",
                                       "EPERM", "unshare", "EPERM"])

    def test_cannot_reach_a_unix_socket_under_cowbox_home(self):
        os.makedirs(self.home, exist_ok=True)
        path = os.path.join(self.home, "control.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract.bind(b"\0cowbox-escape-%d" % os.getpid())
        abstract.listen(1)
        self.addCleanup(srv.close)
        self.addCleanup(abstract.close)
        code = ("import socket\nfor a in (%r, b'\\0cowbox-escape-%d'):\n"
                "    s = socket.socket(socket.AF_UNIX)\n"
                "    try:\n        s.connect(a); print('CONNECTED')\n"
                "    except OSError as e: print(type(e).__name__)\n" % (path, os.getpid()))
        out = self.sandbox("python3", "-c", code, check_status=0).stdout
        self.assertNotIn("CONNECTED", out)
        self.assertEqual(len(out.split()), 2)


class TestRealWorkspaceEscapes(CowboxTestCase):
    def test_the_daemons_control_socket_and_home_are_out_of_reach(self):
        ref = self.create(base=self.make_base({"a.txt": "a\n"}), name="esc")
        self.cowbox("exec", ref, "--", "true")  # starts the daemon, which owns the socket
        sock = os.path.join(self.ws_dir(ref), "control.sock")
        self.assertTrue(os.path.exists(sock))
        code = ("import os, socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n"
                "    s.connect(%r); print('CONNECTED')\n"
                "except OSError as e: print(type(e).__name__)\n"
                "print(os.path.exists(%r), sorted(os.listdir('/workspace')))\n" % (sock, self.home))
        p = self.cowbox("exec", ref, "--", "python3", "-c", code)
        self.assertEqual(p.stdout, "FileNotFoundError\nFalse ['a.txt']\n")


class TestProcessEscapes(EscapeTestCase):
    def test_cannot_see_host_pids(self):
        host = subprocess.Popen(["sleep", "321.%d" % os.getpid()])
        self.addCleanup(lambda: (host.kill(), host.wait()))
        out = self.sandbox("sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; "
                           "ls /proc | grep -c '^[0-9]'").stdout
        self.assertNotIn("321.%d" % os.getpid(), out)
        self.assertLess(int(out.split()[-1]), 10)  # init, sh, cat/tr/ls, grep

    def test_cannot_kill_a_host_process(self):
        host = subprocess.Popen(["sleep", "60"])
        self.addCleanup(lambda: (host.kill(), host.wait()))
        out = self.sandbox("sh", "-c", "kill -9 %d 2>&1; kill -9 -1 2>&1; echo done" %
                           host.pid).stdout
        self.assertIn("done", out)
        time.sleep(0.1)
        self.assertIsNone(host.poll())
        self.assertTrue(pid_alive(os.getpid()))

    def test_cannot_ptrace(self):
        out = self.probe("import subprocess\n"
                         "c = subprocess.Popen(['sleep', '5'])\n"
                         "call('ptrace_attach', 101, 16, c.pid, 0, 0)\n"
                         "call('ptrace_attach_init', 101, 16, 1, 0, 0)\n"
                         "call('process_vm_readv', 310, 1, 0, 0, 0, 0, 0)\n"
                         "c.kill()\n"
                         "try:\n    open('/proc/1/mem', 'rb').read(1); print('mem READ')\n"
                         "except OSError as e: print('mem', type(e).__name__)\n")
        self.assertEqual(out.split()[:6], ["ptrace_attach", "EPERM", "ptrace_attach_init",
                                           "EPERM", "process_vm_readv", "EPERM"])
        self.assertNotIn("READ", out)

    def test_cannot_load_a_module_or_use_kernel_facilities(self):
        out = self.probe("call('init_module', 175, 0, 0, b'')\n"
                         "call('finit_module', 313, 0, b'', 0)\n"
                         "call('delete_module', 176, b'fuse', 0)\n"
                         "call('kexec_load', 246, 0, 0, 0, 0)\n"
                         "call('bpf', 321, 0, 0, 0)\n"
                         "call('perf_event_open', 298, 0, 0, -1, -1, 0)\n"
                         "call('keyctl', 250, 0, 0, 0, 0, 0)\n"
                         "call('add_key', 248, b'user', b'x', b'y', 1, -2)\n"
                         "call('open_by_handle_at', 304, -100, 0, 0)\n"
                         "call('userfaultfd', 323, 0)\n")
        words = out.split()
        self.assertEqual(words[1::2], ["EPERM"] * 10, out)
        # root's powers over its own ids only (docs/security.md), none as host root
        for args, want in (((), USERNS_CAPS), (("--privileged",), "0000000000000000")):
            p = self.sandbox("sh", "-c", "grep Cap /proc/self/status; cat /proc/self/status | "
                             "grep NoNewPrivs", args=args)
            caps = dict(line.split(":\t") for line in p.stdout.splitlines()
                        if line.startswith("Cap"))
            self.assertEqual(caps, {"CapInh": "0000000000000000", "CapPrm": want,
                                    "CapEff": want, "CapBnd": want,
                                    "CapAmb": "0000000000000000"}, p.stdout)
            self.assertIn("NoNewPrivs:\t1", p.stdout)

    def test_no_io_uring_ldt_or_personality_flags(self):
        out = self.probe("call('io_uring_setup', 425, 1, 0)\n"
                         "call('io_uring_enter', 426, 0, 0, 0, 0, 0)\n"
                         "call('io_uring_register', 427, 0, 0, 0, 0)\n"
                         "call('modify_ldt', 154, 0, 0, 0)\n"
                         "call('read_implies_exec', 135, ctypes.c_ulong(0x0400000))\n"
                         "call('addr_no_randomize', 135, ctypes.c_ulong(0x0040000))\n"
                         "call('high_bits_hide_nothing', 135, ctypes.c_ulong(0x100400000))\n"
                         "call('per_linux', 135, ctypes.c_ulong(0))\n"
                         "call('query', 135, ctypes.c_ulong(0xffffffff))\n")
        got = dict(line.split() for line in out.splitlines())
        for name in ("io_uring_setup", "io_uring_enter", "io_uring_register", "modify_ldt",
                     "read_implies_exec", "addr_no_randomize", "high_bits_hide_nothing"):
            self.assertIn(got[name], ("EPERM", "ENOSYS"), out)
        self.assertEqual((got["per_linux"], got["query"]), ("ok", "ok"), out)

    def test_kernel_state_in_proc_is_masked_read_only(self):
        p = self.sandbox("sh", "-c", "for f in /proc/slabinfo /proc/kpagecount "
                         "/proc/kpageflags /proc/kpagecgroup /proc/sched_debug "
                         "/proc/timer_list; do test -e $f || continue; echo $f $(wc -c < $f); "
                         "chmod 666 $f 2>/dev/null && echo CHMOD $f; "
                         "echo x 2>/dev/null > $f && echo WROTE $f; done; "
                         "chmod 644 /etc/shadow 2>/dev/null && echo CHMOD shadow; "
                         "echo x 2>/dev/null > /etc/shadow && echo WROTE shadow; true")
        self.assertNotIn("CHMOD", p.stdout)
        self.assertNotIn("WROTE", p.stdout)
        shown = [line.split() for line in p.stdout.splitlines()]
        self.assertIn("/proc/timer_list", [w[0] for w in shown], p.stdout)
        for words in shown:
            self.assertTrue(len(words) < 2 or words[1] == "0", p.stdout + p.stderr)

    def test_pid1_has_no_capabilities_and_no_host_command_line(self):
        p = self.sandbox("sh", "-c", "grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/1/status; "
                         "tr '\\0' ' ' < /proc/1/cmdline; echo; "
                         "cat /proc/1/environ >/dev/null 2>&1 && echo ENVIRON; true",
                         check_status=0)
        lines = p.stdout.splitlines()
        caps = [line for line in lines if line.startswith("Cap")]
        self.assertEqual(len(caps), 4, p.stdout)
        for line in caps:
            self.assertTrue(line.endswith("0000000000000000"), line)
        self.assertEqual(lines[4].split(), ["cowbox-init"])
        self.assertNotIn(self.ws, p.stdout)
        self.assertNotIn("ENVIRON", p.stdout)

    def test_cannot_inject_into_the_callers_terminal(self):
        master, slave = pty.openpty()
        try:
            code = ("import fcntl, termios\n"
                    "for req in (termios.TIOCSTI, 0x541C):\n"
                    "    try:\n        fcntl.ioctl(0, req, b'X'); print('INJECTED')\n"
                    "    except OSError as e: print(e.errno)\n")
            p = self.sandbox("python3", "-c", code, stdin=slave)
            self.assertEqual(p.stdout.split(), ["1", "1"], p.stderr)  # EPERM twice
            os.set_blocking(master, False)
            try:
                leaked = os.read(master, 100)
            except BlockingIOError:
                leaked = b""
            self.assertNotIn(b"X", leaked)
        finally:
            os.close(master)
            os.close(slave)

    def test_no_credentials_from_the_host_environment(self):
        env = dict(self.env, ANTHROPIC_API_KEY="sk-ant-secret", AWS_SECRET_ACCESS_KEY="aws")
        out = self.sandbox("sh", "-c", "env; cat /proc/1/environ 2>/dev/null", env=env).stdout
        self.assertNotIn("sk-ant-secret", out)
        self.assertNotIn("aws", out.lower().replace("aws_", ""))


class TestNetwork(EscapeTestCase):
    def serve(self):
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        self.addCleanup(srv.close)

        def accept():
            try:
                while True:
                    conn, _ = srv.accept()
                    conn.sendall(b"HOST-SERVICE\n")
                    conn.close()
            except OSError:
                pass
        threading.Thread(target=accept, daemon=True).start()
        return srv.getsockname()[1]

    CONNECT = ("import socket, sys\ns = socket.socket()\ns.settimeout(3)\ntry:\n"
               "    s.connect(('127.0.0.1', int(sys.argv[1]))); print(s.recv(100).decode())\n"
               "except OSError as e: print('refused', type(e).__name__)\n")

    def test_none_cannot_reach_the_hosts_loopback(self):
        port = self.serve()
        out = self.sandbox("python3", "-c", self.CONNECT, str(port), check_status=0).stdout
        self.assertNotIn("HOST-SERVICE", out)
        self.assertIn("refused", out)
        out = self.sandbox("sh", "-c", "cat /sys/class/net/*/operstate 2>/dev/null; "
                           "ls /proc/sys/net/ipv4/conf").stdout.split()
        self.assertEqual(sorted(set(out) - {"all", "default"}), ["lo"])

    def serve_abstract(self):
        """A host abstract unix socket (the kind container shims, D-Bus and X11 use)."""
        name = "cowbox-test-%d-%d" % (os.getpid(), id(self))
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind("\0" + name)
        srv.listen(4)
        self.addCleanup(srv.close)

        def accept():
            try:
                while True:
                    conn, _ = srv.accept()
                    conn.sendall(b"HOST-ABSTRACT\n")
                    conn.close()
            except OSError:
                pass
        threading.Thread(target=accept, daemon=True).start()
        return name

    ABSTRACT = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(3)\ntry:\n"
                "    s.connect('\\0' + sys.argv[1]); print(s.recv(100).decode())\n"
                "except OSError as e: print('refused', type(e).__name__)\n")

    def peer_namespace(self):
        """A server outside this machine's stack: a network namespace of the test's own,
        joined to the host by a veth pair; answers TCP with PEER-TCP and echoes UDP."""
        tag = "%05d" % (os.getpid() % 100000)
        ns, host_if, peer_if = "cbt-" + tag, "cbh" + tag, "cbp" + tag
        net = "10.%d.%d" % (200 + os.getpid() % 50, os.getpid() % 250)
        ip = lambda *a: subprocess.run(["ip"] + list(a), check=True, capture_output=True)
        ip("netns", "add", ns)
        self.addCleanup(subprocess.run, ["ip", "netns", "del", ns], capture_output=True)
        ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        self.addCleanup(subprocess.run, ["ip", "link", "del", host_if], capture_output=True)
        ip("link", "set", peer_if, "netns", ns)
        ip("addr", "add", net + ".1/24", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", net + ".2/24", "dev", peer_if)
        ip("-n", ns, "link", "set", peer_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        server = ("import socket, threading\n"
                  "t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                  "t.bind(('%s.2', 8765)); t.listen(8)\n"
                  "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('%s.2', 8766))\n"
                  "def udp():\n"
                  "    while True:\n"
                  "        d, a = u.recvfrom(100); u.sendto(b'PEER-UDP ' + d, a)\n"
                  "threading.Thread(target=udp, daemon=True).start()\n"
                  "print('ready', flush=True)\n"
                  "while True:\n"
                  "    c, _ = t.accept(); c.sendall(b'PEER-TCP\\n'); c.close()\n" % (net, net))
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", server],
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.assertEqual(proc.stdout.readline().strip(), "ready")
        return net + ".2"

    OUTBOUND = ("import socket, sys\ns = socket.create_connection((sys.argv[1], 8765), 5)\n"
                "print(s.recv(100).decode().strip())\n"
                "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(5)\n"
                "u.sendto(b'ping', (sys.argv[1], 8766)); print(u.recv(100).decode())\n")

    def test_all_goes_out_but_not_to_the_hosts_loopback_or_abstract_sockets(self):
        port, abstract, peer = self.serve(), self.serve_abstract(), self.peer_namespace()
        p = self.sandbox("python3", "-c", self.OUTBOUND, peer, args=("--network", "all"),
                         check_status=0)
        self.assertEqual(p.stdout.split("\n")[:2], ["PEER-TCP", "PEER-UDP ping"], p.stderr)
        out = self.sandbox("python3", "-c", self.CONNECT, str(port), args=("--network", "all"),
                           check_status=0).stdout
        self.assertNotIn("HOST-SERVICE", out)
        self.assertIn("refused", out)
        out = self.sandbox("python3", "-c", self.ABSTRACT, abstract,
                           args=("--network", "all"), check_status=0).stdout
        self.assertNotIn("HOST-ABSTRACT", out)
        self.assertIn("refused", out)
        # pasta ended with the command: nothing is left of it, nor of its files.
        self.assertEqual([l for l in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                    text=True).stdout.splitlines()
                          if "/tmp/cowbox-net-" in l], [])
        self.assertEqual([d for d in os.listdir("/tmp") if d.startswith("cowbox-net-")], [])

    def test_host_shares_the_hosts_namespace_and_says_so(self):
        port, abstract = self.serve(), self.serve_abstract()
        p = self.sandbox("python3", "-c", self.CONNECT, str(port), args=("--network", "host"),
                         check_status=0)
        self.assertIn("HOST-SERVICE", p.stdout)
        self.assertIn("warning: --network host", p.stderr)
        out = self.sandbox("python3", "-c", self.ABSTRACT, abstract,
                           args=("--network", "host"), check_status=0).stdout
        self.assertIn("HOST-ABSTRACT", out)


class TestUserNamespace(EscapeTestCase):
    def test_root_is_a_host_range_of_its_own_and_dir_stays_writable(self):
        os.chown(self.ws, 1000, 1000)  # --dir shows DIR's owner as the sandbox's root
        out = self.sandbox("sh", "-c", "id -u; cat /proc/self/uid_map /proc/self/gid_map; "
                           "echo hi > /workspace/f; mkdir /workspace/d; stat -c %u /workspace/f; "
                           "cat /etc/shadow 2>&1; true", args=("--userns",),
                           check_status=0).stdout.split()
        self.assertEqual(out[:8], ["0", "0", str(DIR_ID_BASE), "65536", "0", str(DIR_ID_BASE),
                                   "65536", "0"])
        self.assertNotIn("root:", " ".join(out))
        for name in ("f", "d"):  # on disk: DIR's owner, not host root
            st = os.stat(os.path.join(self.ws, name))
            self.assertEqual((st.st_uid, st.st_gid), (1000, 1000), name)

    def test_no_setuid_file_for_a_host_owner_in_dir(self):
        code = ("import os\n"
                "for mode in (0o4755, 0o2755, 0o6777):\n"
                "    for how in ('chmod', 'open', 'mknod'):\n"
                "        p = '/workspace/%s-%o' % (how, mode)\n"
                "        try:\n"
                "            if how == 'chmod':\n"
                "                open(p, 'w').close(); os.chmod(p, mode)\n"
                "            elif how == 'open':\n"
                "                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, mode))\n"
                "            else:\n"
                "                os.mknod(p, mode | 0o100000)\n"
                "            print(how, oct(mode), 'ok')\n"
                "        except OSError as e:\n"
                "            print(how, oct(mode), e.errno)\n"
                "call('openat2', 437, -100, b'/workspace/o2', 0, 0)\n")
        out = self.probe(code)
        self.assertNotIn(" ok", out)
        self.assertIn("openat2 ENOSYS", out)
        subprocess.run([COWBOX, "exec", "--dir", self.ws, "--", "sh", "-c",
                        "cp /bin/true /workspace/t; chmod u+s /workspace/t; "
                        "chmod 4755 /workspace/t; install -m 4755 /bin/true /workspace/i"],
                       env=self.env, capture_output=True, timeout=60)
        self.assertEqual(setid_files(self.ws), [])

    def test_root_only_host_files_are_unreadable_without_a_mask(self):
        secret = "/etc/cowbox-escape-%d.key" % os.getpid()
        fd = os.open(secret, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        self.addCleanup(os.unlink, secret)
        os.write(fd, b"PRIVATE-KEY\n")
        os.close(fd)
        p = self.sandbox("sh", "-c", "cat %s 2>&1; ls -ln %s" % (secret, secret))
        self.assertNotIn("PRIVATE-KEY", p.stdout)
        self.assertIn("Permission denied", p.stdout)
        self.assertIn(" 65534 65534 ", p.stdout)  # host root is no id of the sandbox's

    def test_privileged_warns_and_runs_as_host_root(self):
        p = self.sandbox("sh", "-c", "cat /proc/self/uid_map; echo x > /workspace/p",
                         args=("--privileged",), check_status=0)
        self.assertIn("warning", p.stderr)
        self.assertEqual(p.stdout.split(), ["0", "0", "4294967295"])
        self.assertEqual(os.stat(os.path.join(self.ws, "p")).st_uid, 0)

    def test_workspace_files_live_in_its_own_range(self):
        base = os.path.join(self.tmp, "base")
        os.makedirs(os.path.join(base, "src"))
        with open(os.path.join(base, "src", "a.py"), "w") as f:
            f.write("print(1)\n")
        os.chown(os.path.join(base, "src"), 1000, 1000)
        ref = subprocess.run([COWBOX, "create", "--base", base], env=self.env,
                             capture_output=True, text=True, check=True).stdout.split()[-1]
        self.addCleanup(subprocess.run, [COWBOX, "rm", ref], env=self.env,
                        capture_output=True)
        p = subprocess.run([COWBOX, "exec", ref, "--", "sh", "-c",
                            "cat /proc/self/uid_map; stat -c '%u %g' /workspace/src "
                            "/workspace/src/a.py; echo more >> /workspace/src/a.py; "
                            "echo new > /workspace/new; chown 1000:1000 /workspace/new; "
                            "cp /bin/true /workspace/t; chmod 4755 /workspace/t; "
                            "stat -c '%u %g' /workspace/new"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        wsdir = os.path.join(self.home, "workspaces", ref)
        with open(os.path.join(wsdir, "ids")) as f:
            b = int(f.read())
        self.assertEqual(b % 65536, 0)
        self.assertGreaterEqual(b, 1 << 30)
        out = p.stdout.split()
        self.assertEqual(out, ["0", str(b), "65536", "1000", "1000", "0", "0", "1000", "1000"])
        upper = os.path.join(wsdir, "upper")
        owners = {name: (os.lstat(os.path.join(upper, name)).st_uid,
                         os.lstat(os.path.join(upper, name)).st_gid)
                  for name in ("src", "src/a.py", "new", "t")}
        self.assertEqual(owners, {"src": (b + 1000, b + 1000), "src/a.py": (b, b),
                                  "new": (b + 1000, b + 1000), "t": (b, b)})
        for path, uid in setid_files(upper):  # a set-id bit only ever for the range's ids
            self.assertTrue(b <= uid < b + 65536, (path, uid))
        info = subprocess.run([COWBOX, "info", ref], env=self.env, capture_output=True,
                              text=True).stdout
        self.assertIn(str(b), info)
        # a fork of the turn (written by the daemon as root) lands in the fork's own range
        subprocess.run([COWBOX, "snapshot", ref], env=self.env, capture_output=True,
                       check=True)
        p = subprocess.run([COWBOX, "fork", ref, "1", "--name", "forked"], env=self.env,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        fref = p.stdout.split()[-1]
        self.addCleanup(subprocess.run, [COWBOX, "rm", fref], env=self.env,
                        capture_output=True)
        fdir = os.path.join(self.home, "workspaces", fref)
        with open(os.path.join(fdir, "ids")) as f:
            fb = int(f.read())
        self.assertNotEqual(fb, b)  # unique among the home's workspaces
        # the daemon writes a fork as root before it moves the files into the fork's range,
        # so it never restores a set-id bit (util/beneath's policy): no window in which a
        # setuid file of host root's exists
        t = os.lstat(os.path.join(fdir, "upper", "t"))
        self.assertEqual((t.st_uid, t.st_mode & 0o7777), (fb, 0o755))
        for path, uid in setid_files(os.path.join(fdir, "upper")):
            self.assertTrue(fb <= uid < fb + 65536, (path, uid))
        p = subprocess.run([COWBOX, "exec", fref, "--", "stat", "-c", "%u %a", "/workspace/t"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.stdout.split(), ["0", "755"], p.stderr)

    def test_unprivileged_caller_gets_a_user_namespace(self):
        os.chown(self.ws, 65534, 65534)
        os.chmod(self.tmp, 0o755)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            COWBOX, "exec", "--dir", self.ws, "--", "sh", "-c",
                            "cat /proc/self/uid_map; echo hi > /workspace/f; hostname"],
                           env=self.env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.split(), ["0", "65534", "1", "box"])
        self.assertEqual(os.stat(os.path.join(self.ws, "f")).st_uid, 65534)


class TestLimits(EscapeTestCase):
    def test_memory_cap_kills_with_137(self):
        p = self.sandbox("python3", "-c", "x = bytearray(400 << 20); print('survived')",
                         args=("--memory", "64"))
        self.assertEqual(p.returncode, 137, p.stdout + p.stderr)
        self.assertNotIn("survived", p.stdout)
        self.assertIn("memory cap", p.stderr)

    def test_pids_cap_stops_a_fork_bomb(self):
        code = ("import os, time\nn = 0\nfor i in range(1000):\n    try:\n"
                "        pid = os.fork()\n    except BlockingIOError:\n        break\n"
                "    if pid == 0:\n        time.sleep(30); os._exit(0)\n    n += 1\nprint(n)\n")
        p = self.sandbox("python3", "-c", code, args=("--pids", "64"), check_status=0)
        self.assertGreater(int(p.stdout), 10)
        self.assertLess(int(p.stdout), 64)  # python itself and init count too
        # the classic bomb: capped, then the timeout takes the whole namespace down
        t0 = time.monotonic()
        p = self.sandbox("sh", "-c", "bomb() { bomb | bomb & }; bomb; sleep 30",
                         args=("--pids", "64", "--timeout", "2"))
        self.assertEqual(p.returncode, 124)
        self.assertLess(time.monotonic() - t0, 10)

    def test_cpus_cap_is_enforced(self):
        code = ("import time\nt = time.time(); c = time.process_time()\n"
                "while time.time() - t < 1.0: pass\nprint(time.process_time() - c)\n")
        p = self.sandbox("python3", "-c", code, args=("--cpus", "0.5"), check_status=0)
        used = float(p.stdout)
        # the quota allows 0.05 s per 0.1 s period: one extra period of slack at most
        self.assertLess(used, 0.62)
        if os.getloadavg()[0] < 2.0:  # under load the command gets less than its quota
            self.assertGreater(used, 0.2)
        if os.getloadavg()[0] < 1.0:  # on a busy machine nothing gets a whole cpu anyway
            p = self.sandbox("python3", "-c", code, check_status=0)
            self.assertGreater(float(p.stdout), 0.8)


# The daemon's own operations against what the sandbox plants: every workspace path the daemon
# resolves as root goes through util/beneath (docs/security.md, "Paths the daemon touches").
class TestDaemonPathsEscape(CowboxTestCase):
    """read, write, snapshot, diff --patch, rollback, fork and rm as root while the sandbox
    swaps a directory for a symlink out, plants FIFOs, or a turn says d is a symlink and d/x a
    file: nothing outside the workspace is ever read, made or changed, and nothing hangs."""

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("the daemon's paths are a root daemon's problem")
        super().setUp()
        # Where a followed symlink would lead on the host: a directory with a canary.
        self.outside = tempfile.mkdtemp(prefix="cowbox-outside-", dir="/tmp")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.outside])
        with open(os.path.join(self.outside, "f"), "w") as f:
            f.write("SECRET")
        os.chmod(os.path.join(self.outside, "f"), 0o600)
        self.ref = self.create(self.make_base({"keep.txt": "keep\n"}), name="paths")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def outside_state(self):
        out = []
        for dirpath, dirs, files in os.walk(self.outside):
            for name in sorted(dirs + files) + ["."]:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                with open(p, "rb") if os.path.isfile(p) else open(os.devnull, "rb") as f:
                    data = f.read()
                out.append((p, st.st_mode, st.st_uid, st.st_mtime_ns, data))
        return sorted(out)

    def test_fifo_is_refused_at_once_and_the_daemon_still_answers(self):
        from cowbox import directio, errors
        os.mkfifo(os.path.join(self.mnt, "p"))
        os.mkdir(os.path.join(self.mnt, "dir"))
        os.mkfifo(os.path.join(self.mnt, "dir", "q"))
        c = self.client(self.ref)
        for path in ("p", "dir/q"):
            for op, args in (("read", {}), ("write", {"data": "eA=="})):
                t0 = time.monotonic()
                r = c.request(op, path=path, **args)
                self.assertLess(time.monotonic() - t0, 5, (op, path))
                self.assertEqual(r.get("error", {}).get("code"), "invalid_request", r)
                self.assertIn(path, r["error"]["message"])
                self.assertIn("FIFO", r["error"]["message"])
        self.assertTrue(c.request("ping").get("ok"))
        # The Python client's direct I/O through the mount: the same refusal, at once (in a
        # thread, so a regression fails instead of hanging the suite).
        got = []

        def direct():
            for fn in (lambda: directio.read(self.mnt, "p"),
                       lambda: directio.write(self.mnt, "dir/q", b"x")):
                try:
                    fn()
                    got.append("done")
                except errors.WorkspaceError as e:
                    got.append((type(e).__name__, str(e)))
        th = threading.Thread(target=direct, daemon=True)
        th.start()
        th.join(10)
        self.assertFalse(th.is_alive(), "direct I/O blocked on a FIFO")
        self.assertEqual([g[0] for g in got], ["InvalidRequestError"] * 2, got)
        self.assertIn("p", got[0][1])
        self.assertIn("dir/q", got[1][1])
        # cowbox snapshot and the daemon's other requests still go on.
        self.cowbox("snapshot", self.ref)
        self.assertTrue(self.client(self.ref).request("ping").get("ok"))

    def plant_symlink_turn(self, target):
        """A recorded turn in which d is a symlink to target and d/x a setuid file: what a
        snapshot racing a swap could record before snapshots recorded only trees."""
        import sqlite3
        os.mkdir(os.path.join(self.mnt, "d"))
        with open(os.path.join(self.mnt, "d", "x"), "w") as f:
            f.write("PWNED\n")
        os.chmod(os.path.join(self.mnt, "d", "x"), 0o4755)
        turn = json.loads(self.cowbox("snapshot", self.ref, "--json").stdout)["turn"]
        db = sqlite3.connect(os.path.join(self.ws_dir(self.ref), "meta.db"), timeout=30)
        with db:
            for table, where in (("turn_delta", " AND turn=%d" % turn), ("turn_map", "")):
                n = db.execute("UPDATE %s SET type=3, mode=511, size=?, target=?, sha256=NULL, "
                               "xxh3=NULL WHERE path='d'%s" % (table, where),
                               (len(target), target)).rowcount
                self.assertEqual(n, 1, table)
        db.close()
        return turn

    def test_fork_and_rollback_of_a_planted_symlink_turn_stay_inside(self):
        turn = self.plant_symlink_turn(self.outside)
        before = self.outside_state()
        fork = self.cowbox("fork", self.ref, str(turn), "--name", "forked", check=False)
        self.assertEqual(self.outside_state(), before, "fork wrote outside: " + fork.stderr)
        self.assertFalse(os.path.lexists(os.path.join(self.outside, "x")))
        if fork.returncode == 0:
            self.mount("forked")
            m2 = self.mountpoint(self.ws_dir_ref("forked"))
            self.assertEqual(os.readlink(os.path.join(m2, "d")), self.outside)
            self.assertEqual(self.outside_state(), before)
        # Rollback of the same turn: it may refuse the entry below the symlink (naming it),
        # never write through it.
        os.unlink(os.path.join(self.mnt, "d", "x"))
        rb = self.cowbox("rollback", self.ref, str(turn), check=False)
        if rb.returncode:
            self.assertIn("d/x", rb.stderr)
        self.assertEqual(self.outside_state(), before)
        self.assertFalse(os.path.lexists(os.path.join(self.outside, "x")))

    def ws_dir_ref(self, name):
        return json.loads(self.cowbox("info", name, "--json").stdout)["ref"]

    def test_setuid_is_not_restored_by_rollback_or_fork(self):
        path = os.path.join(self.mnt, "suid")
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, 0o4755)
        turn = json.loads(self.cowbox("snapshot", self.ref, "--json").stdout)["turn"]
        os.chmod(path, 0o755)
        with open(path, "a") as f:
            f.write("changed\n")
        self.cowbox("rollback", self.ref, str(turn))
        self.assertEqual(os.stat(path).st_mode & 0o7777, 0o755)
        self.cowbox("fork", self.ref, str(turn), "--name", "f2")
        upper = os.path.join(self.ws_dir(self.ws_dir_ref("f2")), "upper", "suid")
        self.assertEqual(os.lstat(upper).st_mode & 0o7777, 0o755)

    def test_daemon_ops_race_a_directory_swapped_for_a_symlink(self):
        # The sandbox swaps /workspace/d and /workspace/x (a symlink to a host directory
        # holding the same names) in a loop while the daemon reads, writes, snapshots, diffs
        # with --patch, rolls back and forks as root.
        from cowbox import directio, errors
        before = self.outside_state()
        c = self.client(self.ref)
        loop = subprocess.Popen([COWBOX, "exec", self.ref, "--", "python3", "-c", SWAP_LOOP,
                                 self.outside, "12", "/workspace", "INSIDE"], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (loop.kill(), loop.communicate()))
        self.assertEqual(loop.stdout.readline().strip(), "ready", loop.stderr)
        seen, turns, end = set(), [], time.monotonic() + 8
        while time.monotonic() < end:
            r = c.request("read", path="d/f")
            if r.get("ok"):
                seen.add(base64.b64decode(r["data"]))
            else:
                # a symlink on the way, or d gone for a moment (a rollback)
                self.assertIn(r["error"]["code"], ("invalid_path", "not_found"), r)
            c.request("write", path="d/w", data=base64.b64encode(b"INSIDE").decode())
            try:
                seen.add(directio.read(self.mnt, "d/f"))
                directio.write(self.mnt, "d/w2", b"INSIDE")
            except errors.WorkspaceError as e:
                self.assertIsInstance(e, (errors.InvalidPathError,
                                          errors.WorkspaceNotFoundError), e)
            s = self.cowbox("snapshot", self.ref, "--json", check=False)
            if s.returncode == 0:
                turns.append(json.loads(s.stdout)["turn"])
            # A rollback may restore a turn that caught d and x both as symlinks, after which
            # no read can succeed: roll back only once a read inside has been seen.
            if len(turns) >= 2 and b"INSIDE" in seen:
                p = self.cowbox("diff", self.ref, str(turns[-2]), "--patch", check=False)
                self.assertNotIn("SECRET", p.stdout + p.stderr)
                self.cowbox("rollback", self.ref, str(turns[-2]), check=False)
                self.cowbox("fork", self.ref, str(turns[-1]), "--name", "race%d" % len(turns),
                            check=False)
        out, err = loop.communicate(timeout=60)
        self.assertIn("swaps", out, err)
        self.assertGreater(int(out.split()[-1]), 100, out)
        self.assertTrue(turns, "no snapshot succeeded")
        self.assertIn(b"INSIDE", seen)
        self.assertNotIn(b"SECRET", seen)
        self.assertEqual(self.outside_state(), before)
        self.assertTrue(c.request("ping").get("ok"))
        # rm of a workspace whose upper holds symlinks out: they are unlinked, not walked.
        os.symlink(self.outside, os.path.join(self.mnt, "out-link"))
        self.cowbox("rm", "-f", self.ref)
        self.assertEqual(self.outside_state(), before)

    def test_names_with_dots_are_names(self):
        c = self.client(self.ref)
        for path in ("build..old/x", "a..b", "...", "..hidden"):
            self.assertTrue(c.request("write", path=path, data="eA==").get("ok"), path)
            self.assertEqual(c.request("read", path=path).get("data"), "eA==", path)
        r = c.request("run", cmd=["pwd"], cwd="build..old")
        self.assertEqual(base64.b64decode(r["stdout"]).strip(), b"/workspace/build..old", r)
        for path in ("../x", "a/../keep.txt", "/etc/passwd"):
            r = c.request("read", path=path)
            self.assertEqual(r.get("error", {}).get("code"), "invalid_path", (path, r))
            self.assertIn(path, r["error"]["message"])


if __name__ == "__main__":
    unittest.main()
