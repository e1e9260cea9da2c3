"""The vm backend's lifecycle in one workspace, two boots: qemu starts on first use and goes
with the workspace (a close from elsewhere ends a running command as unavailable and the
background jobs with it), a later use boots a new VM by ref, an idle stop ends it too; what
`cowbox info` says of the accelerator; the guest's writes go through the journal. Network:
none has no NIC; all (a second workspace, one more boot) reaches a server on a host address
that is not loopback, and neither the host's loopback nor through the gateway's address."""

import asyncio
import hashlib
import json
import os
import random
import socket
import subprocess
import threading
import time
import unittest

import cbtest
import cowbox
from cowbox import boxlite
from test_vm_conformance import READY


@unittest.skipUnless(READY, "no VM kernel, modules, root tree or qemu (scripts/setup-vm)")
class VmLifecycleTest(cbtest.CowboxTestCase):
    def qemu_pid(self, ref):
        try:
            with open(os.path.join(self.ws_dir(ref), "vm", "qemu.pid")) as f:
                pid = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0
        return pid if cbtest.pid_alive(pid) else 0

    def check_kvm_fallback_said(self, ref, accel):
        """A boot that fell back from KVM to TCG said so in daemon.log and left the marker."""
        with open(os.path.join(self.ws_dir(ref), "daemon.log")) as f:
            fell_back = "KVM did not boot the guest" in f.read()
        if fell_back:
            self.assertEqual(accel, "tcg")
            cache = os.environ.get("COWBOX_IMAGE_CACHE", "/var/cache/cowbox")
            with open("/proc/sys/kernel/random/boot_id") as f, \
                    open(os.path.join(cache, "vm", "kvm.broken")) as m:
                self.assertEqual(m.read().strip(), f.read().strip())

    def test_boot_close_reattach_idle(self):
        base = self.make_base({"README": "hi\n"})

        async def main():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=self.home,
                                              backend="vm", idle_timeout=2)
            ref = box.ref
            try:
                self.assertEqual(self.qemu_pid(ref), 0)  # nothing boots before first use
                # the first boot from the CLI on a pipe: its output and nothing else (the
                # boot's phases are for a terminal only)
                t0 = time.monotonic()
                r = await asyncio.to_thread(
                    self.cowbox, "exec", ref, "--", "sh", "-c",
                    "uname -r; cat README; echo guest > g.txt", timeout=400, input="")
                boot = time.monotonic() - t0
                self.assertEqual(r.stderr, "")
                self.assertEqual(r.stdout.splitlines()[1], "hi")
                self.assertNotEqual(r.stdout.splitlines()[0], os.uname().release)
                # network none: no NIC, loopback only
                r = await box.run(["ls", "/sys/class/net"])
                self.assertEqual(r.stdout, "lo\n")
                # host_url over the agent's port, with no NIC; the channel's credit
                await self.check_host_url(box)
                await self.check_stdin_does_not_stall(box)
                first = self.qemu_pid(ref)
                self.assertTrue(first)
                info = json.loads(self.cowbox("info", ref, "--json").stdout)
                self.assertIn(info["accel"], ("kvm", "tcg"))
                # the default accel booted (above) and info says the probe's answer, the
                # Python client's too (a host whose KVM opens but refuses qemu's MSRs, as
                # this one's "failed to set MSR 0x10a": tcg from the probe or the fallback)
                if "COWBOX_VM_ACCEL" not in os.environ:
                    self.assertEqual(info["accel"] == "kvm", boxlite.kvm_works())
                    self.check_kvm_fallback_said(ref, info["accel"])
                # the guest's write went through the FUSE mount: a snapshot records it
                self.assertIn("g.txt", await box.snapshot())
                # a background job ticks; a command runs when the workspace is closed
                await box.run("while :; do date +%s%N > tick; sleep 0.2; done "
                              ">/dev/null 2>&1 &")
                run = asyncio.ensure_future(box.run(["sh", "-c", "echo up > up.txt; sleep 60"]))
                for _ in range(600):
                    try:
                        if await box.read("up.txt") == b"up\n":
                            break
                    except cowbox.WorkspaceNotFoundError:
                        pass
                    await asyncio.sleep(0.05)
                other = await cowbox.Sandbox.attach(ref, cowbox=cbtest.COWBOX, home=self.home)
                t0 = time.monotonic()
                await other.close()
                with self.assertRaises(cowbox.WorkspaceUnavailableError):
                    await run
                self.assertLess(time.monotonic() - t0, 30)
                cbtest.wait_for(lambda: not cbtest.pid_alive(first), 15, what="qemu to end")
                # reattach by ref: a new daemon boots a new VM; the job ended with the old
                box = await cowbox.Sandbox.attach(ref, cowbox=cbtest.COWBOX, home=self.home)
                # (read through the mount: the API's read would boot the VM first)
                with open(os.path.join(self.mountpoint(ref), "tick"), "rb") as f:
                    t1 = f.read()
                # this boot from the CLI on a terminal: its phases on one line, erased
                # before the command's output
                status, text = await asyncio.to_thread(
                    self.on_tty, "exec", ref, "--", "cat", "up.txt", "g.txt", timeout=400)
                self.assertEqual(status, 0, text)
                # (asked every 0.3 s: the guest's boot, the long phase, is always seen)
                self.assertIn("cowbox exec: booting the vm: waiting for the guest's agent (",
                              text)
                self.assertTrue(text.endswith("\r\x1b[Kup\r\nguest\r\n"), repr(text))
                second = self.qemu_pid(ref)
                self.assertTrue(second and second != first)
                self.assertEqual(await box.read("tick"), t1)
                # idle stop: no client, the daemon and its VM go, the disk stays
                pid = self.daemon_pid(ref)
                await box.detach()
                cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 30, what="idle stop")
                cbtest.wait_for(lambda: not cbtest.pid_alive(second), 15, what="qemu to end")
                return boot
            finally:
                await box.close()
        boot = asyncio.run(asyncio.wait_for(main(), 400))
        print("vm boot + first command: %.1f s" % boot)

    def serve(self, handle):
        """A server on the host's 127.0.0.1, handle(conn) on a thread per connection; its
        port."""
        srv = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(srv.close)

        def loop():
            while True:
                try:
                    c, _ = srv.accept()
                except OSError:
                    return
                threading.Thread(target=handle, args=(c,), daemon=True).start()
        threading.Thread(target=loop, daemon=True).start()
        return srv.getsockname()[1]

    async def check_host_url(self, box):
        """Only the ports host_url opened reach the host; many streams at once and 20 MiB
        each way at once arrive byte for byte; a port nothing listens on is accepted and
        closed, as ns's forwarder does."""
        size = 20 << 20
        down = random.Random(14).randbytes(size)
        got_up = []

        def big(c):
            with c:
                t = threading.Thread(target=c.sendall, args=(down,), daemon=True)
                t.start()
                h, n = hashlib.sha256(), 0
                while n < size:
                    b = c.recv(1 << 16)
                    if not b:
                        break
                    h.update(b)
                    n += len(b)
                t.join(120)
                got_up.append((n, h.hexdigest()))

        def echo(c):
            with c:
                c.sendall(b"echo " + c.makefile("rb").readline())
        big_port, echo_port, closed_port = self.serve(big), self.serve(echo), self.serve(echo)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]  # nothing listens there
        self.assertEqual(box.host_url(echo_port), "http://127.0.0.1:%d" % echo_port)
        self.assertEqual(box.host_url(echo_port), "http://127.0.0.1:%d" % echo_port)
        box.host_url(big_port)
        box.host_url(dead_port)
        with self.assertRaises(cowbox.InvalidRequestError):
            box.host_url(70000)
        # 32 connections at once, each answered on its own
        r = await box.run(["bash", "-c", "for i in $(seq 32); do (exec 3<>/dev/tcp/127.0.0.1/%d"
                           " && echo $i >&3 && cat <&3) & done; wait" % echo_port], timeout=120)
        self.assertEqual(sorted(r.stdout.splitlines()),
                         sorted("echo %d" % i for i in range(1, 33)), r.stderr)
        # a host port host_url did not open: nothing listens for it in the guest
        probe = "exec 3<>/dev/tcp/127.0.0.1/%d && echo hi >&3 && cat <&3; echo rc=$?"
        r = await box.run(["bash", "-c", probe % closed_port], timeout=60)
        self.assertNotIn("echo", r.stdout)
        self.assertIn("Connection refused", r.stderr)
        # opened, but nothing listens on the host: accepted, then closed at once
        r = await box.run(["bash", "-c", probe % dead_port], timeout=60)
        self.assertRegex(r.stdout, r"^rc=\d+\n$")
        # 20 MiB each way at once, byte for byte
        t0 = time.monotonic()
        r = await box.run(["bash", "-c", "head -c %d /dev/urandom > /tmp/up && "
                           "exec 3<>/dev/tcp/127.0.0.1/%d && { cat /tmp/up >&3 & } && "
                           "sha256sum <&3 && wait && sha256sum < /tmp/up" % (size, big_port)],
                          timeout=300)
        took = time.monotonic() - t0
        self.assertEqual(r.exit_code, 0, r.stderr)
        sums = [line.split()[0] for line in r.stdout.splitlines()]
        self.assertEqual(sums[0], hashlib.sha256(down).hexdigest())
        self.assertEqual(got_up, [(size, sums[1])])
        print("host_url: 20 MiB each way at once in %.1f s" % took)

    async def check_stdin_does_not_stall(self, box):
        """A command that writes 8 MiB before it reads one byte of its 8 MiB of stdin: the
        stdin's credit keeps the channel flowing (it stalled before)."""
        r = await asyncio.wait_for(box.run(
            ["sh", "-c", "head -c 8388608 /dev/zero; head -c 1 >/dev/null; echo done >&2"],
            input=b"x" * (8 << 20), timeout=120), 180)
        self.assertEqual((r.exit_code, len(r.stdout), r.stderr), (0, 8 << 20, "done\n"))
        self.assertEqual((await box.run(["true"])).exit_code, 0)

    def test_network_all(self):
        """network all: passt with --no-map-gw, in a group the host's firewall keeps from the
        host's own addresses. A server on a host address that is not loopback (a veth end's)
        does not answer the guest (issue 30: the host's own addresses are not reachable), while
        one behind it in a namespace of the test's (another machine, as far as the host can
        tell) does; the same server's twin on the host's 127.0.0.1 answers neither at 127.0.0.1 (the guest's
        own loopback) nor at the gateway's address (qemu's slirp or a mapped gateway would
        reach it there)."""
        addr = "10.251.78.%d" % (os.getpid() % 250 + 2)
        dev = "cbvm%d" % (os.getpid() % 100000)  # and its peer, dev + "p": within 15 bytes
        # a veth pair in the host's namespace: one end holds the address (no dummy module here)
        subprocess.run(["ip", "link", "add", dev, "type", "veth", "peer", "name", dev + "p"],
                       check=True)
        self.addCleanup(subprocess.run, ["ip", "link", "del", dev], capture_output=True)
        subprocess.run(["ip", "addr", "add", addr + "/32", "dev", dev], check=True)
        # the peer end in a namespace of its own, holding an address the host routes to it
        peer, ns = "10.251.79.%d" % (os.getpid() % 250 + 2), "cbvmn%d" % (os.getpid() % 100000)
        nse = ["ip", "netns", "exec", ns]
        subprocess.run(["ip", "netns", "add", ns], check=True)
        self.addCleanup(subprocess.run, ["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "set", dev + "p", "netns", ns], check=True)
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)
        for cmd in (["ip", "addr", "add", peer + "/32", "dev", dev + "p"],
                    ["ip", "link", "set", dev + "p", "up"], ["ip", "link", "set", "lo", "up"],
                    ["ip", "route", "add", addr + "/32", "dev", dev + "p"]):
            subprocess.run(nse + cmd, check=True)
        subprocess.run(["ip", "route", "add", peer + "/32", "dev", dev], check=True)
        peer_srv = subprocess.Popen(nse + ["python3", "-c",
                                           "import socket\n"
                                           "s = socket.create_server((%r, 8765))\n"
                                           "print('ready', flush=True)\n"
                                           "while True:\n"
                                           "    c, _ = s.accept(); c.sendall(b'hello from peer\\n')"
                                           "; c.close()\n" % peer],
                                    stdout=subprocess.PIPE, text=True)
        self.addCleanup(peer_srv.stdout.close)
        self.addCleanup(peer_srv.wait)
        self.addCleanup(peer_srv.kill)
        self.assertEqual(peer_srv.stdout.readline().strip(), "ready")
        servers = []
        for host in (addr, "127.0.0.1"):
            srv = socket.create_server((host, 0))
            self.addCleanup(srv.close)
            servers.append(srv.getsockname()[1])

            def serve(srv=srv, host=host):
                while True:
                    try:
                        c, _ = srv.accept()
                    except OSError:
                        return
                    with c:
                        c.sendall(("hello from %s\n" % host).encode())
            threading.Thread(target=serve, daemon=True).start()
        gw = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True,
                            text=True).stdout.split()[2]
        with open("/etc/resolv.conf") as f:
            dns = [w[1] for w in (line.split() for line in f) if len(w) > 1 and
                   w[0] == "nameserver" and not w[1].startswith("127.") and ":" not in w[1]]
        probe = ("exec 3<>/dev/tcp/%s/%d && head -n1 <&3 || echo refused")
        base = self.make_base({"README": "hi\n"})

        async def main():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=self.home,
                                              backend="vm", network="all")
            try:
                r = await box.run(["ls", "/sys/class/net"])
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertEqual(len(r.stdout.split()), 2, r.stdout)  # lo and the NIC
                passt = self.passt_pids(self.daemon_pid(box.ref))
                self.assertEqual(len(passt), 1, passt)
                r = await box.run(["bash", "-c", probe % (peer, 8765)], timeout=60)
                self.assertEqual(r.stdout, "hello from peer\n", r.stderr)
                r = await box.run(["bash", "-c", "timeout 10 bash -c '%s'"
                                   % (probe % (addr, servers[0]))], timeout=60)
                self.assertNotIn("hello", r.stdout, addr)
                for host in ("127.0.0.1", gw):
                    r = await box.run(["bash", "-c", "timeout 10 bash -c '%s'"
                                       % (probe % (host, servers[1]))], timeout=60)
                    self.assertNotIn("hello", r.stdout, host)
                r = await box.run(["cat", "/etc/resolv.conf"])
                for ns in dns:
                    self.assertIn("nameserver %s\n" % ns, r.stdout)
            finally:
                await box.close()
            # passt goes with the VM
            cbtest.wait_for(lambda: not any(cbtest.pid_alive(p) for p in passt), 15,
                            what="passt to end")
        asyncio.run(asyncio.wait_for(main(), 400))

    def test_network_allow(self):
        """network allow: no NIC, the proxy's variables, and the egress proxy over the agent's
        port the one way out: an address and port the allow entries name is reached, another
        port there is refused (the servers on the host's own address: loopback is never
        allowed)."""
        def hello(c):
            with c:
                c.makefile("rb").readline()
                c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            try:
                u.connect(("192.0.2.1", 9))  # no packet: only the route's source address
                addr = u.getsockname()[0]
            except OSError:
                self.skipTest("no route, so no host address but loopback")
        ports = []
        for _ in range(2):
            srv = socket.create_server((addr, 0))
            self.addCleanup(srv.close)
            ports.append(srv.getsockname()[1])

            def loop(srv=srv):
                while True:
                    try:
                        c, _ = srv.accept()
                    except OSError:
                        return
                    threading.Thread(target=hello, args=(c,), daemon=True).start()
            threading.Thread(target=loop, daemon=True).start()
        get = ('exec 3<>/dev/tcp/127.0.0.1/3128 && printf "GET http://%s:%d/ HTTP/1.0\\r\\n'
               '\\r\\n" >&3 && head -n1 <&3')
        base = self.make_base({"README": "hi\n"})

        async def main():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=self.home,
                                              backend="vm",
                                              network=cowbox.Network.allow(
                                                  ["%s:%d" % (addr, ports[0])]))
            try:
                r = await box.run(["sh", "-c", "ls /sys/class/net; echo $HTTPS_PROXY"])
                self.assertEqual(r.stdout, "lo\nhttp://127.0.0.1:3128\n", r.stderr)
                r = await box.run(["bash", "-c", get % (addr, ports[0])], timeout=60)
                self.assertIn(" 200 ", r.stdout, r.stderr)
                r = await box.run(["bash", "-c", get % (addr, ports[1])], timeout=60)
                self.assertIn(" 403 ", r.stdout, r.stderr)
                # no route around the proxy: the same server, straight, is unreachable
                r = await box.run(["bash", "-c", "exec 3<>/dev/tcp/%s/%d && echo connected"
                                   % (addr, ports[0])], timeout=60)
                self.assertNotIn("connected", r.stdout)
                # the proxy's port is not host_url's
                with self.assertRaises(cowbox.WorkspaceError):
                    box.host_url(3128)
            finally:
                await box.close()
        asyncio.run(asyncio.wait_for(main(), 400))

    @staticmethod
    def ppid(pid):
        with open("/proc/%s/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    def passt_pids(self, daemon):
        """The passt processes the daemon of pid daemon started (the runner's helper between
        them)."""
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
                if argv[0] != b"passt":
                    continue
                ppid = self.ppid(self.ppid(pid))
            except (OSError, ValueError, IndexError):
                continue
            if ppid == daemon:
                pids.append(int(pid))
        return pids

if __name__ == "__main__":
    unittest.main()
