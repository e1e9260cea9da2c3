"""Shared by the seed-page tests (test_seed_*.py): a test case whose COWBOX_HOME is the
process's own (so the pages' code runs unchanged, with no cowbox= or home= arguments), whose
current directory is tmp/work (for the pages' relative paths), and the docker engine check."""

import asyncio
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cbtest  # noqa: E402  (tests/integration, on PYTHONPATH under make check)

IMAGE_CACHE = os.environ.get("COWBOX_IMAGE_CACHE", "/var/cache/cowbox")
DOCKER_IMAGE = os.environ.get("COWBOX_DOCKER_IMAGE", "cowbox-debian:bookworm")


def docker_ready():
    """Whether the docker engine ($DOCKER_HOST, podman's service in make check) has the
    test image."""
    try:
        return subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


DOCKER_SKIP = ("no docker engine with image %s (DOCKER_HOST=%s); scripts/setup-podman sets "
               "one up" % (DOCKER_IMAGE, os.environ.get("DOCKER_HOST")))


class SeedTestCase(cbtest.CowboxTestCase):
    """COWBOX comes from make check's environment; COWBOX_HOME and the cwd are set here for
    the test's life."""

    def setUp(self):
        super().setUp()
        saved = {k: os.environ.get(k) for k in ("COWBOX_HOME",)}
        os.environ["COWBOX_HOME"] = self.home
        os.environ.setdefault("COWBOX", cbtest.COWBOX)
        cwd = os.getcwd()
        # Not the tmp itself: it holds COWBOX_HOME, which no volume may.
        self.work = os.path.join(self.tmp, "work")
        os.makedirs(self.work)
        os.chdir(self.work)

        def restore():
            os.chdir(cwd)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.addCleanup(restore)

    def arun(self, coro, timeout=120):
        return asyncio.run(asyncio.wait_for(coro, timeout))

    def remove_containers(self):
        """Containers of this home's workspaces, if a test failed half-way."""
        wsroot = os.path.join(self.home, "workspaces")
        for ref in os.listdir(wsroot) if os.path.isdir(wsroot) else []:
            subprocess.run(["docker", "rm", "-f", "cowbox-" + ref], capture_output=True)
