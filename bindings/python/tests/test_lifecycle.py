"""The Python client's lifecycle options against a real daemon: access levels (create and
attach, Mistral's access and supported_access), on_create hooks as shell strings and async
callables run at create as the baseline, idle stop and reattach, apply."""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cbtest  # noqa: E402  (tests/integration, on PYTHONPATH under make check)
import cowbox  # noqa: E402


class LifecycleTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"src/a.py": "x = 1\n", "README": "hello\n"})

    def arun(self, coro):
        self.boxes = []

        async def main():
            try:
                return await asyncio.wait_for(coro, 120)
            finally:
                for box in self.boxes:
                    await box.close()
        return asyncio.run(main())

    async def new_box(self, **opts):
        box = await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                          **opts)
        self.boxes.append(box)
        return box

    async def attach(self, ref, **opts):
        box = await cowbox.Sandbox.attach(ref, cowbox=cbtest.COWBOX, home=self.home, **opts)
        self.boxes.append(box)
        return box

    def test_access_create_and_attach(self):
        async def go():
            box = await self.new_box(access="files")
            self.assertEqual((box.access, box.supported_access), ("files", "files"))
            await box.write("new.txt", b"made")  # files: read, write, turns
            self.assertEqual(await box.read("new.txt"), b"made")
            await box.snapshot()
            with self.assertRaises(cowbox.AccessDeniedError) as cm:
                await box.run(["true"])
            self.assertIn("needs full", str(cm.exception))
            with self.assertRaises(PermissionError):
                await box.exec(["true"])
            with self.assertRaises(cowbox.AccessDeniedError):
                box.host_url(80)
            # Wider than the workspace serves: refused, as Mistral's constructor does.
            with self.assertRaises(cowbox.AccessDeniedError) as cm:
                await self.attach(box.ref, access="full")
            self.assertIn("serves at most files", str(cm.exception))
            low = await self.attach(box.ref, access="none")
            self.assertEqual(low.access, "none")
            for direct in (True, False):  # through the mount or the protocol: refused
                low.direct_io = direct
                with self.assertRaises(cowbox.AccessDeniedError):
                    await low.read("src/a.py")
                with self.assertRaises(cowbox.AccessDeniedError):
                    await low.write("x.txt", b"no")
            self.assertIn("new.txt", await low.snapshot())
            # Its level outlives a daemon restart: the next connection asks for it again.
            await box.close()
            with self.assertRaises(cowbox.AccessDeniedError):
                await low.read("src/a.py")
            with self.assertRaises(ValueError):
                await self.attach(box.ref, access="root")
        self.arun(go())

    def test_attach_lowers_only_itself(self):
        async def go():
            box = await self.new_box()
            self.assertEqual((box.access, box.supported_access), ("full", "full"))
            files = await self.attach(box.ref, access="files")
            with self.assertRaises(cowbox.AccessDeniedError):
                await files.run(["true"])
            self.assertEqual((await box.run(["true"])).exit_code, 0)
            await box.set_access("none")
            with self.assertRaises(cowbox.AccessDeniedError):
                await box.read("README")
            with self.assertRaises(cowbox.AccessDeniedError):
                await box.set_access("files")
        self.arun(go())

    def test_on_create_strings_and_async_callables_are_the_baseline(self):
        seen = []

        async def code_hook(sb):
            seen.append(sb.ref)
            await sb.write("from-code.txt", await sb.read("hook.txt"))

        async def go():
            box = await self.new_box(on_create=["echo shell > hook.txt", code_hook])
            self.assertEqual(seen, [box.ref])
            self.assertIsNotNone(box.baseline_turn)
            before = await box.snapshot()
            self.assertEqual(await box.read("from-code.txt"), b"shell\n")
            await box.write("agent.txt", b"mine")
            after = await box.snapshot()
            self.assertEqual([c.path for c in cowbox.file_changes(before, after)],
                             ["agent.txt"])
            self.assertEqual(sorted(c.path for c in await box.diff(0, box.baseline_turn)),
                             ["from-code.txt", "hook.txt"])
            # Without hooks, nothing boots and no turn is recorded.
            plain = await self.new_box()
            self.assertIsNone(plain.baseline_turn)
            with self.assertRaises(TypeError):
                await self.new_box(on_create=[42])

            async def failing(sb):
                raise RuntimeError("hook failed")
            before = set(os.listdir(os.path.join(self.home, "workspaces")))
            with self.assertRaises(RuntimeError):
                await self.new_box(on_create=[failing])
            self.assertEqual(set(os.listdir(os.path.join(self.home, "workspaces"))), before)
        self.arun(go())

    def test_idle_stop_and_reattach(self):
        async def go():
            box = await self.new_box(idle_timeout=1)
            await box.write("kept.txt", b"state")
            pid = self.daemon_pid(box.ref)
            await asyncio.sleep(2.5)
            self.assertTrue(cbtest.pid_alive(pid), "stopped while this object held it")
            await box.detach()
            for _ in range(150):
                if not cbtest.pid_alive(pid):
                    break
                await asyncio.sleep(0.1)
            self.assertFalse(cbtest.pid_alive(pid), "no idle stop")
            again = await self.attach(box.ref)
            self.assertEqual(await again.read("kept.txt"), b"state")
            self.assertNotEqual(self.daemon_pid(box.ref), pid)
        self.arun(go())

    def test_apply(self):
        import shutil
        dst = os.path.join(self.tmp, "target")
        shutil.copytree(self.base, dst)

        async def go():
            box = await self.new_box()
            await box.write("src/a.py", b"x = 2\n")
            await box.snapshot()
            r = await box.apply(to=dst)
            self.assertEqual((r["from_turn"], r["written"]), (0, 1), r)
            with open(os.path.join(dst, "src/a.py")) as f:
                self.assertEqual(f.read(), "x = 2\n")
            await box.write("README", b"agent\n")
            await box.snapshot()
            with open(os.path.join(dst, "README"), "w") as f:
                f.write("user\n")
            with self.assertRaises(cowbox.ConflictError) as cm:
                await box.apply(to=dst)
            self.assertEqual(len(cm.exception.conflicts), 1)
            self.assertIn("README: changed since", cm.exception.conflicts[0])
            # Onto the base (the default), one turn.
            r = await box.apply(turn=box.last_turn)
            self.assertEqual(r["to"], os.path.realpath(self.base))
            with open(os.path.join(self.base, "README")) as f:
                self.assertEqual(f.read(), "agent\n")
        self.arun(go())

    def test_in_place(self):
        # LiteLLM's sandbox.local(path): what the agent writes is in the folder at once, the
        # turns roll it back into the folder, and destroy leaves the folder.
        with self.assertRaises(ValueError):
            asyncio.run(cowbox.Sandbox.create(None, in_place=True, cowbox=cbtest.COWBOX,
                                              home=self.home))

        async def go():
            box = await self.new_box(in_place=True)
            self.assertTrue(box.in_place)
            await box.write("src/a.py", b"x = 2\n")
            await box.run(["sh", "-c", "echo made > made.txt; rm README"])
            with open(os.path.join(self.base, "src/a.py")) as f:
                self.assertEqual(f.read(), "x = 2\n")
            with open(os.path.join(self.base, "made.txt")) as f:
                self.assertEqual(f.read(), "made\n")
            self.assertFalse(os.path.exists(os.path.join(self.base, "README")))
            files = await box.snapshot()
            self.assertEqual(sorted(files), ["made.txt", "src/a.py"])
            self.assertEqual({c.path: c.kind for c in await box.diff(0, box.last_turn)},
                             {"src/a.py": "modified", "made.txt": "added",
                              "README": "deleted"})
            # Applying onto the folder makes no sense: it holds the changes already.
            with self.assertRaises(cowbox.WorkspaceError):
                await box.apply()
            await box.rollback(0)
            with open(os.path.join(self.base, "README")) as f:
                self.assertEqual(f.read(), "hello\n")
            self.assertFalse(os.path.exists(os.path.join(self.base, "made.txt")))
            again = await self.attach(box.ref)
            await again.run(["true"])
            self.assertTrue(again.in_place)
            await box.write("kept.txt", b"kept")
            await box.close()
            await cowbox.Sandbox.destroy(box.ref, cowbox=cbtest.COWBOX, home=self.home)
            with open(os.path.join(self.base, "kept.txt"), "rb") as f:
                self.assertEqual(f.read(), b"kept")
        self.arun(go())


if __name__ == "__main__":
    unittest.main()
