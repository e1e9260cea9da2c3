"""The Python client's export and import (issue 36): Sandbox.export writes a workspace of two
turns as an OCI layout, a second export writes no layer again, and Sandbox.create(from_=...)
in a fresh COWBOX_HOME rebuilds it with the same turns, diffs and files (all of them, or up to
from_turn); a bad source raises WorkspaceError naming it."""

import asyncio
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cbtest  # noqa: E402  (tests/integration, on PYTHONPATH under make check)
import cowbox  # noqa: E402


def events(changes):
    return sorted((c.path, c.kind) for c in changes)


class OciTest(cbtest.CowboxTestCase):

    def test_export_and_create_from(self):
        base = self.make_base({"src/a.py": "x = 1\n", "README": "hello\n"})
        layout = os.path.join(tempfile.mkdtemp(prefix="cbocipy"), "layout")
        self.addCleanup(shutil.rmtree, os.path.dirname(layout), True)
        src = "oci:%s:py" % layout

        async def export():
            box = await cowbox.Sandbox.create(base, cowbox=cbtest.COWBOX, home=self.home)
            try:
                await box.write("src/a.py", b"x = 2\n")
                await box.write("new.txt", b"new\n")
                await box.snapshot()
                await box.run(["rm", "README"], strict=True)
                await box.snapshot()
                diffs = [events(await box.diff(0, 1)), events(await box.diff(1, 2))]
                st = await box.export(src)
                self.assertEqual((st["turn"], st["layers_written"], st["layers_reused"]),
                                 (2, 3, 0), st)
                self.assertTrue(st["manifest"].startswith("sha256:"), st)
                again = await box.export(src)
                self.assertEqual((again["layers_written"], again["layers_reused"],
                                  again["manifest"]), (0, 3, st["manifest"]))
                one = await box.export("oci:%s:one" % layout, turn=1)
                self.assertEqual((one["turn"], one["layers_written"]), (1, 0), one)
                return box.ref, diffs
            finally:
                await box.close()
        ref, diffs = asyncio.run(asyncio.wait_for(export(), 300))
        self.setUp()  # a fresh COWBOX_HOME: another host

        async def create_from():
            boxes = []
            try:
                box = await cowbox.Sandbox.create(from_=src, cowbox=cbtest.COWBOX,
                                                  home=self.home)
                boxes.append(box)
                self.assertNotEqual(box.ref, ref)
                self.assertEqual(await box.read("src/a.py"), b"x = 2\n")
                self.assertEqual(await box.read("new.txt"), b"new\n")
                with self.assertRaises(FileNotFoundError):
                    await box.read("README")
                self.assertEqual([events(await box.diff(0, 1)), events(await box.diff(1, 2))],
                                 diffs)
                first = await cowbox.Sandbox.create(from_=src, from_turn=1, name="first",
                                                    cowbox=cbtest.COWBOX, home=self.home)
                boxes.append(first)
                self.assertEqual(await first.read("README"), b"hello\n")
                self.assertEqual(await first.read("src/a.py"), b"x = 2\n")
                self.assertEqual(events(await first.diff(0, 1)), diffs[0])
                with self.assertRaises(cowbox.WorkspaceError) as cm:
                    await cowbox.Sandbox.create(from_="oci:%s:nosuchtag" % layout,
                                                cowbox=cbtest.COWBOX, home=self.home)
                self.assertIn("nosuchtag", str(cm.exception))
                with self.assertRaises(ValueError):
                    await cowbox.Sandbox.create(base, from_turn=1, cowbox=cbtest.COWBOX,
                                                home=self.home)
            finally:
                for b in boxes:
                    await b.close()
        asyncio.run(asyncio.wait_for(create_from(), 300))

if __name__ == "__main__":
    unittest.main()
