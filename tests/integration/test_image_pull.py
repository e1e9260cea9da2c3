"""Images pulled from a registry that the user's registries.conf names (issue 31): a real OCI
registry (Debian's docker-registry) started on loopback by the test, holding an image the test
builds (the store's Debian image plus a marker layer) as python:3.12-slim, in docker.io's place
(the registries.conf maps docker.io to it); ns's
image="python:3.12-slim" and "python@sha256:..." pull it with podman into the local store,
unpacked once and cached by its config digest; the next use pulls nothing (the registry is
gone by then); no registries.conf, no pull."""

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import cbtest
import cowbox
import ociutil

WHY = ociutil.why_not_ready() or (None if shutil.which("docker-registry") else
                                  "docker-registry is not installed (scripts/setup)")


@unittest.skipIf(WHY, WHY)
class ImagePull(cbtest.CowboxTestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="cbpull")
        cls.registry = None
        try:
            cls._set_up()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _set_up(cls):
        d = cls.dir
        cls.registry, cls.addr = ociutil.start_registry(d)
        layout = d + "/layout"
        ociutil.copy_from_store(layout, "base")
        cls.hex = ociutil.add_image(layout, "base", "3.12-slim", [
            ociutil.entry("etc/pulled-marker", data=b"pulled\n")],
            settings={"Env": ["FROM_PULLED_IMAGE=yes"]})
        dest = "docker://%s/library/python:3.12-slim" % cls.addr
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                        "oci:%s:3.12-slim" % layout, dest], check=True, capture_output=True,
                       timeout=300)
        cls.digest = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format",
                                     "{{.Digest}}", dest], check=True, capture_output=True,
                                    text=True, timeout=60).stdout.strip()
        assert cls.digest.startswith("sha256:"), cls.digest

    @classmethod
    def tearDownClass(cls):
        cls.stop_registry()
        # what the pulls put in the local store: the image (its ID is the config digest)
        if getattr(cls, "hex", None):
            subprocess.run(["podman", "rmi", "-f", cls.hex], capture_output=True)
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def stop_registry(cls):
        ociutil.stop_registry(cls.registry)

    def write_conf(self):
        os.makedirs(self.home, exist_ok=True)
        with open(os.path.join(self.home, "registries.conf"), "w") as f:
            # docker's short names (python: docker.io/library/python, as Debian's shortnames.conf
            # aliases it too), served by the loopback registry in docker.io's place
            f.write('unqualified-search-registries = ["docker.io"]\n'
                    'short-name-mode = "permissive"\n[[registry]]\nprefix = "docker.io"\n'
                    'location = "%s"\ninsecure = true\n' % self.addr)

    def run_image(self, image):
        async def main():
            box = await cowbox.Sandbox.create(cowbox=cbtest.COWBOX, home=self.home, image=image)
            try:
                r = await box.run(["sh", "-c", "cat /etc/pulled-marker; echo $FROM_PULLED_IMAGE"])
                return r.exit_code, r.stdout, r.stderr
            finally:
                await box.close()
        return asyncio.run(asyncio.wait_for(main(), 300))

    def test_pull_by_digest_then_tag_then_from_the_store(self):
        # no registries.conf: never pulled, the name is not in the store
        with self.assertRaises(cowbox.WorkspaceError) as cm:
            self.run_image("python:3.12-slim")
        self.assertIn("python:3.12-slim", str(cm.exception))
        self.write_conf()
        t0 = time.monotonic()
        self.assertEqual(self.run_image("python@" + self.digest), (0, "pulled\nyes\n", ""))
        first = time.monotonic() - t0
        # unpacked once, under the config digest
        self.assertTrue(os.path.isdir(os.path.join(self.home, "images", self.hex)))
        self.assertEqual(self.run_image("python:3.12-slim"), (0, "pulled\nyes\n", ""))
        # BoxLite's pinned spelling, NAME:TAG@sha256:...
        self.assertEqual(self.run_image("python:3.12-slim@" + self.digest),
                         (0, "pulled\nyes\n", ""))
        # the registry gone: the store has it, nothing is pulled
        self.stop_registry()
        t0 = time.monotonic()
        self.assertEqual(self.run_image("python:3.12-slim"), (0, "pulled\nyes\n", ""))
        print("pull+unpack %.1f s, then from the cache %.1f s" % (first, time.monotonic() - t0))
        with self.assertRaises(cowbox.WorkspaceError) as cm:
            self.run_image("python:3.99-none")
        self.assertIn("python:3.99-none", str(cm.exception))
        self.assertIn("podman pull failed", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
