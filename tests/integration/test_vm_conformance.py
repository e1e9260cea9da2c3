"""The backend conformance suite on the vm backend. A boot under TCG (no KVM on CI) costs
tens of seconds, so the cases share one workspace and its VM, booted once for the class;
the cases that need a workspace of other options are skipped, each saying why."""

import asyncio
import os
import shutil
import tempfile
import unittest

import cbtest
import cowbox
from test_backend_conformance import Conformance

CACHE = os.environ.get("COWBOX_IMAGE_CACHE", "/var/cache/cowbox")
READY = all(os.path.exists(os.path.join(CACHE, p)) for p in
            ("vm/vmlinuz", "vm/modules.cpio.gz", "rootfs-bookworm")) and \
    shutil.which("qemu-system-x86_64")

SHARED_OPTIONS = {"env": {"FROM_OPTIONS": "yes"}}
OWN_OPTIONS = ("needs a workspace of its own options: one more VM boot (tens of seconds under "
               "TCG) is over this file's budget; the options themselves are backend-independent")


@unittest.skipUnless(READY, "no VM kernel, modules or root tree in %s (scripts/setup-vm, "
                     "scripts/setup-podman) or no qemu-system-x86_64" % CACHE)
class VmConformance(Conformance, cbtest.CowboxTestCase):
    OPTIONS = {"backend": "vm"}
    # the guest's runner kills a timed-out tree at once, as the ns sandbox does
    KILLS_TREE_AT_ONCE = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.shared_tmp = tempfile.mkdtemp(prefix="cbtest-vm-")
        cls.shared_home = os.path.join(cls.shared_tmp, "home")
        base = os.path.join(cls.shared_tmp, "base")
        os.makedirs(os.path.join(base, "src"))
        with open(os.path.join(base, "src", "main.c"), "w") as f:
            f.write("int main(void) { return 0; }\n")
        with open(os.path.join(base, "README"), "w") as f:
            f.write("hi\n")

        async def boot():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=cls.shared_home,
                                              backend="vm", **SHARED_OPTIONS)
            await box.run(["true"])
            await box.detach()
            return box.ref
        cls.shared_ref = asyncio.run(boot())

    @classmethod
    def tearDownClass(cls):
        helper = cls("test_run_semantics")
        helper.tmp, helper.home = cls.shared_tmp, cls.shared_home
        try:
            cbtest.CowboxTestCase._cleanup(helper)
        finally:
            super().tearDownClass()

    def setUp(self):
        super().setUp()
        self.own_home = self.home
        self.home = self.shared_home
        self.env["COWBOX_HOME"] = self.shared_home

    def _cleanup(self):
        self.home = self.own_home  # the shared workspace outlives the case
        super()._cleanup()

    def run_with(self, body, **options):
        refused = [k for k in ("user", "volumes") if k in options]
        if refused:
            # refused at create, before anything boots: that much is checked here
            async def create():
                await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                            backend="vm", **options)
            with self.assertRaises(cowbox.InvalidRequestError) as cm:
                asyncio.run(create())
            self.assertIn("vm backend", str(cm.exception))
            self.skipTest("the vm backend refuses %s (checked: create says so); its guest runs "
                          "commands as root and shares only the workspace and home"
                          % ", ".join(refused))
        if options != SHARED_OPTIONS:
            self.skipTest(OWN_OPTIONS)

        async def main():
            box = await cowbox.Sandbox.attach(self.shared_ref, cowbox=cbtest.COWBOX,
                                              home=self.shared_home)
            try:
                return await asyncio.wait_for(body(box), 240)
            finally:
                await box.detach()
        return asyncio.run(main())

    async def _create(self, **opts):
        self.skipTest(OWN_OPTIONS)

    def test_in_place(self):
        self.skipTest("an in-place workspace is one more VM boot; " + OWN_OPTIONS)

    def test_cli_exec_matches_the_api(self):
        self.skipTest("its workspace has a working_dir of its own; " + OWN_OPTIONS)

    def test_host_url(self):
        self.skipTest("host_url: the vm backend's guest cannot reach the host's loopback (none: no "
                      "NIC; all: passt without the gateway mapped), and says so")

    def test_network_none(self):
        async def body(box):
            r = await box.run(["sh", "-c", "cat /sys/class/net/*/address | wc -l; "
                               "ls /sys/class/net"])
            self.assertEqual(r.stdout.split()[1:], ["lo"])
        self.arun(body)

    def test_close_from_elsewhere_ends_a_command_as_unavailable(self):
        self.skipTest("it stops the shared VM and boots another (tens of seconds under TCG); "
                      "test_vm_lifecycle covers a stop under a running command")

    def test_background_jobs_outlive_their_command(self):
        self.skipTest("it stops the shared VM to see the jobs end; test_vm_lifecycle boots "
                      "its own VM for that")

    def test_idle_stop_keeps_the_disk(self):
        self.skipTest("test_vm_lifecycle boots its own VM for the idle stop")


if __name__ == "__main__":
    unittest.main()
