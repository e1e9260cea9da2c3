"""The vm backend's lifecycle in one workspace, two boots: qemu starts on first use and goes
with the workspace (a close from elsewhere ends a running command as unavailable and the
background jobs with it), a later use boots a new VM by ref, an idle stop ends it too; what
`cowbox info` says of the accelerator; the guest's writes go through the journal."""

import asyncio
import json
import os
import time
import unittest

import cbtest
import cowbox
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

    def test_boot_close_reattach_idle(self):
        base = self.make_base({"README": "hi\n"})

        async def main():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=self.home,
                                              backend="vm", idle_timeout=2)
            ref = box.ref
            try:
                self.assertEqual(self.qemu_pid(ref), 0)  # nothing boots before first use
                t0 = time.monotonic()
                r = await box.run(["sh", "-c", "uname -r; cat README; echo guest > g.txt"])
                boot = time.monotonic() - t0
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertEqual(r.stdout.splitlines()[1], "hi")
                self.assertNotEqual(r.stdout.splitlines()[0], os.uname().release)
                first = self.qemu_pid(ref)
                self.assertTrue(first)
                info = json.loads(self.cowbox("info", ref, "--json").stdout)
                self.assertIn(info["accel"], ("kvm", "tcg"))
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
                t1 = await box.read("tick")
                r = await box.run(["cat", "up.txt", "g.txt"])
                self.assertEqual(r.stdout, "up\nguest\n")
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


if __name__ == "__main__":
    unittest.main()
