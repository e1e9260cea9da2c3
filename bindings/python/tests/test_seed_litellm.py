"""The LiteLLM harness page (shared/seeds/litellm-harness-sandboxes.md) transcribed: its
examples run as written on cowbox.litellm (the model's turns replaced by the tool calls a
runtime makes), sandbox.local on the local backend and sandbox.docker on the docker engine;
its Sandbox protocol checked member by member, signatures and real calls."""

import hashlib
import inspect
import os
import subprocess
import unittest
from typing import Protocol, runtime_checkable

import seedutil
from seedutil import DOCKER_IMAGE

import cowbox
from cowbox.litellm import HarnessInstallFailed, sandbox


# The page's protocol, as written there (Process and CompletedRun are cowbox's).
@runtime_checkable
class Sandbox(Protocol):
    workdir: str
    async def exec(self, cmd: list[str], *, env=None, cwd=None) -> cowbox.Process: ...
    async def run(self, cmd: list[str], *, env=None, cwd=None, timeout=None) -> cowbox.CompletedRun: ...
    async def read(self, path: str) -> bytes: ...
    async def write(self, path: str, data: bytes) -> None: ...
    def host_url(self, port: int) -> str: ...
    async def which(self, binary: str) -> str | None: ...
    async def snapshot(self) -> dict[str, str]: ...
    async def close(self) -> None: ...


PROVIDER_KEYS = {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "LITELLM_MASTER_KEY": "l",
                 "AZURE_API_KEY": "z", "AWS_SECRET_ACCESS_KEY": "w", "GEMINI_API_KEY": "g",
                 "GOOGLE_API_KEY": "k", "CODEX_HOME": "c", "CURSOR_API_KEY": "u"}


class ProtocolShape(unittest.TestCase):
    """Every member the page names, on both constructors, without running anything."""

    def test_members_and_keywords(self):
        for box in (sandbox.local("."), sandbox.docker("img", mounts={".": "/workspace"},
                                                       workdir="/workspace")):
            self.assertIsInstance(box, Sandbox)
            self.assertIsInstance(box.workdir, str)
            for name in ("exec", "run", "read", "write", "host_url", "which", "snapshot",
                         "close"):
                proto = getattr(Sandbox, name)
                mine = getattr(box, name)
                self.assertEqual(inspect.iscoroutinefunction(mine),
                                 inspect.iscoroutinefunction(proto), name)
                have = inspect.signature(mine).parameters
                for p in list(inspect.signature(proto).parameters.values())[1:]:
                    self.assertIn(p.name, have, "%s lacks %s" % (name, p.name))
                    if p.kind == p.KEYWORD_ONLY:
                        self.assertIn(have[p.name].kind, (p.KEYWORD_ONLY,), (name, p.name))
                        self.assertEqual(have[p.name].default, p.default, (name, p.name))
        sig = inspect.signature(sandbox.docker)
        self.assertIn("mounts", sig.parameters)
        self.assertEqual(sig.parameters["workdir"].default, "/workspace")
        self.assertEqual(list(inspect.signature(sandbox.local).parameters)[0], "path")
        self.assertEqual(sandbox.local(".").workdir, os.path.realpath("."))
        self.assertTrue(issubclass(HarnessInstallFailed, Exception))
        with self.assertRaises(ValueError):
            sandbox.docker("img", workdir="/elsewhere")


class Local(seedutil.SeedTestCase):

    def setUp(self):
        super().setUp()
        os.makedirs("repo/src")
        with open("repo/src/app.py", "w") as f:
            f.write("print('v1')\n")

    def test_local_is_a_host_subprocess_in_path(self):
        os.environ.update(PROVIDER_KEYS)
        self.addCleanup(lambda: [os.environ.pop(k, None) for k in PROVIDER_KEYS])

        async def main():
            box = sandbox.local("repo")
            try:
                self.assertIsInstance(box, Sandbox)
                path = os.path.realpath("repo")
                self.assertEqual(box.workdir, path)
                # host subprocess, working directory is `path`
                r = await box.run(["sh", "-c", "pwd; echo $PWD; id -u"])
                self.assertEqual(r.stdout.splitlines(), [path, path, str(os.getuid())])
                self.assertEqual((await box.run("pwd", cwd="src")).stdout.strip(),
                                 path + "/src")
                # provider credentials stripped from the child environment
                r = await box.run(["env"], env={"MINE": "kept"})
                got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
                for name in PROVIDER_KEYS:
                    self.assertNotIn(name, got)
                self.assertEqual(got["MINE"], "kept")
                # edits land in path, journaled and undoable
                before = await box.snapshot()
                r = await box.run(["sh", "-c", "echo v2 > src/app.py && echo new > NEW"])
                self.assertEqual(r.exit_code, 0, r.stderr)
                await box.write("notes.txt", b"written\n")
                after = await box.snapshot()
                changes = cowbox.file_changes(before, after)
                self.assertEqual([(c.path, c.kind) for c in changes],
                                 [("NEW", "added"), ("notes.txt", "added"),
                                  ("src/app.py", "modified")])
                with open("repo/src/app.py") as f:
                    self.assertEqual(f.read(), "v2\n")
                self.assertEqual(after["src/app.py"],
                                 hashlib.sha256(b"v2\n").hexdigest())
                self.assertEqual(await box.read("notes.txt"), b"written\n")
                self.assertEqual(await box.read(path + "/NEW"), b"new\n")
                with self.assertRaises(cowbox.InvalidPathError):
                    await box.read("/etc/passwd")
                await box.cowbox.rollback(box.cowbox.baseline_turn or 0)
                with open("repo/src/app.py") as f:
                    self.assertEqual(f.read(), "print('v1')\n")
                self.assertFalse(os.path.exists("repo/NEW"))
                # the binary must be on your PATH; a missing one raises HarnessInstallFailed
                self.assertEqual(await box.which("sh"), subprocess.run(
                    ["sh", "-c", "command -v sh"], capture_output=True,
                    text=True).stdout.strip())
                self.assertIsNone(await box.which("claude-not-installed"))
                with self.assertRaises(HarnessInstallFailed) as cm:
                    await box.run(["claude-not-installed", "-p", "hi"])
                self.assertEqual(cm.exception.binary, "claude-not-installed")
                self.assertIn("claude-not-installed", str(cm.exception))
                with self.assertRaises(HarnessInstallFailed):
                    await box.exec(["codex-not-installed"])
                # a program that is there and exits 127 itself stays an exit code
                r = await box.run(["sh", "-c", "exit 127"])
                self.assertEqual(r.exit_code, 127)
                # plain cowbox.Sandbox keeps exit 127 for a missing program
                self.assertEqual((await box.cowbox.run(["claude-not-installed"])).exit_code,
                                 127)
                # exec: a Process
                proc = await box.exec(["sh", "-c", "read x; echo got $x"], env={"A": "1"})
                out, _ = await proc.communicate(b"it\n")
                self.assertEqual((out, proc.returncode), (b"got it\n", 0))
                # host_url: code inside reaches a port on the host
                port = self.serve_hello()
                url = box.host_url(port)
                r = await box.run(["python3", "-c", "import urllib.request,sys; sys.stdout."
                                   "write(urllib.request.urlopen(sys.argv[1]).read()."
                                   "decode())", url])
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertIn("hello", r.stdout)
            finally:
                await box.close()
            # close: the folder keeps the files, the workspace is gone
            self.assertTrue(os.path.exists("repo/src/app.py"))
            self.assertEqual(await cowbox.Sandbox.list(), [])
        self.arun(main())


@unittest.skipUnless(seedutil.docker_ready(), seedutil.DOCKER_SKIP)
class Docker(seedutil.SeedTestCase):

    def setUp(self):
        super().setUp()
        self.addCleanup(self.remove_containers)
        os.makedirs("repo")
        with open("repo/setup.sh", "w") as f:
            f.write("echo installed > .installed\n")
        os.makedirs("cache")
        # The page's image name: the test image under that tag.
        subprocess.run(["docker", "tag", DOCKER_IMAGE, "my-agents:latest"], check=True,
                       capture_output=True)
        self.addCleanup(subprocess.run, ["docker", "rmi", "my-agents:latest"],
                        capture_output=True)

    def test_setup_before_the_first_turn(self):
        async def main():
            # The page's example, with a setup the image can run (it has no pip).
            box = sandbox.docker("my-agents:latest", mounts={"./repo": "/workspace",
                                                             "./cache": "/cache"})
            try:
                self.assertIsInstance(box, Sandbox)
                self.assertEqual(box.workdir, "/workspace")
                r = await box.run(["sh", "setup.sh"])
                self.assertEqual(r.exit_code, 0, r.stderr)
                # mounts: edits land in ./repo; the other mount is bound read-write
                with open("repo/.installed") as f:
                    self.assertEqual(f.read(), "installed\n")
                r = await box.run(["sh", "-c", "pwd; echo c > /cache/c"])
                self.assertEqual(r.stdout, "/workspace\n")
                with open("cache/c") as f:
                    self.assertEqual(f.read(), "c\n")
                # aagent_session's turn: which(runtime), snapshot, the runtime's edits, snapshot
                self.assertIsNone(await box.which("codex"))
                with self.assertRaises(HarnessInstallFailed) as cm:
                    await box.run(["codex", "exec", "fix the bug"])
                self.assertEqual(cm.exception.binary, "codex")
                before = await box.snapshot()
                await box.run(["sh", "-c", "echo 'def f(): pass' > fix.py"])
                await box.write("out/report.txt", b"done\n")
                after = await box.snapshot()
                self.assertEqual([(c.path, c.kind) for c in
                                  cowbox.file_changes(before, after)],
                                 [("fix.py", "added"), ("out/report.txt", "added")])
                self.assertEqual(await box.read("fix.py"), b"def f(): pass\n")
                self.assertTrue(os.path.exists("repo/out/report.txt"))
                # host_url: the host endpoint, reached from inside (bash's /dev/tcp)
                port = self.serve_hello()
                url = box.host_url(port)
                hostport = url.split("//", 1)[1].rstrip("/")
                host, p = hostport.rsplit(":", 1)
                r = await box.run(["bash", "-c", "exec 3<>/dev/tcp/%s/%s; printf 'GET / "
                                   "HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3" % (host, p)])
                self.assertIn("hello", r.stdout, r.stderr)
            finally:
                await box.close()
            self.assertEqual(await cowbox.Sandbox.list(), [])
            self.assertTrue(os.path.exists("repo/fix.py"))
        self.arun(main(), timeout=240)

    def test_bad_image_fails_naming_it(self):
        async def main():
            box = sandbox.docker("no-such-image-of-cowbox:1")
            with self.assertRaises(cowbox.WorkspaceError) as cm:
                await box.run(["true"])
            self.assertIn("no-such-image-of-cowbox:1", str(cm.exception))
            await box.close()
        self.arun(main())


class HostUrlInLoop(seedutil.SeedTestCase):

    def test_host_url_before_start_does_not_block_the_loop(self):
        os.makedirs("repo")

        async def main():
            box = sandbox.local("repo")
            try:
                with self.assertRaises(cowbox.WorkspaceUnavailableError):
                    box.host_url(8000)
                await box.start()
                self.assertTrue(box.host_url(8000).endswith(":8000"))
            finally:
                await box.close()
        self.arun(main())


class HostUrlOutsideLoop(seedutil.SeedTestCase):

    def test_host_url_first_outside_a_loop(self):
        # no event loop in this thread: host_url creates the workspace itself, and a later
        # loop uses it
        os.makedirs("repo")
        box = sandbox.local("repo")
        self.assertEqual(box.host_url(8001), "http://127.0.0.1:8001")

        async def main():
            try:
                self.assertEqual((await box.run(["pwd"])).stdout.strip(),
                                 os.path.realpath("repo"))
            finally:
                await box.close()
        self.arun(main())


if __name__ == "__main__":
    unittest.main()
