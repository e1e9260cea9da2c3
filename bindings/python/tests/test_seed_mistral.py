"""The Mistral agents SDK sandboxes page (shared/seeds/mistral-agents-sandboxes.txt)
transcribed on cowbox.mistral: every class, keyword and default it lists checked by
signature and by a real call; its sandboxes run sessions on the local backend
(DangerousLocalSandbox), ns (CowboxSandbox) and the docker engine (LocalDockerSandbox,
CowboxSandbox(backend="docker")), the model's tool calls replaced by session.execute and the
file tools."""

import inspect
import os
import subprocess
import tempfile
import unittest

import seedutil
from seedutil import DOCKER_IMAGE

import cowbox
from cowbox.mistral import Sandbox as MistralSandboxBase
from cowbox.mistral import (CowboxSandbox, DangerousLocalSandbox, EgressPolicy, GitHubBinding,
                            GitIdentity, HeaderBinding, LocalDockerSandbox, MistralApiBinding,
                            Network, SandboxExecutionResult, SandboxHook,
                            WorkspaceHeaderBindings)

ACCESS = ("access", None)
# The page's signatures: (keyword, default) for each class, all keyword-only.
SIGNATURES = {
    MistralSandboxBase: [("network", None), ("header_bindings", ()), ("hooks", ()), ACCESS],
    DangerousLocalSandbox: [("shell", None), ("default_exec_timeout_seconds", None),
                            ("workspace", None), ("delete_on_cleanup", None), ("hooks", ()),
                            ACCESS],
    LocalDockerSandbox: [("image", None), ("supports_background_processes", None),
                         ("shell", None), ("default_exec_timeout_seconds", None),
                         ("setup_script", None), ("setup_script_timeout_seconds", None),
                         ("network", None), ("hooks", ()), ACCESS],
    CowboxSandbox: [("image", None), ("instance_id", None),
                    ("supports_background_processes", None), ("shell", None),
                    ("default_exec_timeout_seconds", None), ("setup_script", None),
                    ("setup_script_timeout_seconds", None), ("network", None),
                    ("egress", None), ("header_bindings", ()), ("hooks", ()), ACCESS],
    EgressPolicy: [("mode", "block_all"), ("allow_cidrs", ())],
    Network: [("mode", "none"), ("hosts", ())],
    HeaderBinding: [("host", inspect.Parameter.empty), ("header", inspect.Parameter.empty),
                    ("secret_name", inspect.Parameter.empty), ("path_prefix", "/"),
                    ("prefix", ""), ("suffix", "")],
    GitHubBinding: [("repos", inspect.Parameter.empty), ("ttl_seconds", 3600),
                    ("host", "github.com")],
    MistralApiBinding: [("ttl_seconds", 3600)],
    GitIdentity: [("name", inspect.Parameter.empty), ("email", inspect.Parameter.empty)],
}


class Touch(SandboxHook):
    """A hook of the test's: JSON arguments recorded; on_create and on_destroy leave marks."""

    destroyed = []

    def __init__(self, path, *, text="made"):
        self.path, self.text = path, text

    async def on_create(self, ctx):
        r = await ctx.sandbox.execute("echo %s > %s" % (self.text, self.path))
        assert r.exit_code == 0, r

    async def on_destroy(self, ctx):
        r = await ctx.sandbox.execute("cat %s" % self.path)
        Touch.destroyed.append((ctx.session_id, r.stdout))


class Shape(unittest.TestCase):

    def test_signatures(self):
        for cls, params in SIGNATURES.items():
            sig = inspect.signature(cls).parameters
            for name, default in params:
                self.assertIn(name, sig, (cls.__name__, name))
                self.assertEqual(sig[name].kind, inspect.Parameter.KEYWORD_ONLY,
                                 (cls.__name__, name))
                self.assertEqual(sig[name].default, default, (cls.__name__, name))
        self.assertEqual(list(inspect.signature(SandboxExecutionResult).parameters),
                         ["exit_code", "stdout", "stderr"])
        self.assertEqual(SandboxExecutionResult(0, "o", "e").stdout, "o")
        WorkspaceHeaderBindings()
        self.assertEqual(MistralApiBinding().run_as, "auto")
        self.assertEqual(GitHubBinding(repos="all").repos, "all")
        self.assertEqual(GitHubBinding(repos=("acme/app",)).repos, ("acme/app",))
        for name in ("on_create", "on_destroy"):
            self.assertTrue(inspect.iscoroutinefunction(getattr(SandboxHook, name)))
        for name in ("none", "all", "allow"):
            self.assertIsInstance(inspect.getattr_static(Network, name), classmethod)
        for name in ("block_all", "allow_all", "custom"):
            self.assertIsInstance(inspect.getattr_static(EgressPolicy, name), classmethod)
        self.assertEqual(list(inspect.signature(Network.allow).parameters), ["hosts"])
        self.assertEqual(inspect.signature(Network.allow).parameters["hosts"].kind,
                         inspect.Parameter.KEYWORD_ONLY)
        self.assertEqual(inspect.signature(EgressPolicy.custom).parameters["allow_cidrs"].kind,
                         inspect.Parameter.KEYWORD_ONLY)
        # declared on each type
        for cls in (DangerousLocalSandbox, LocalDockerSandbox, CowboxSandbox):
            self.assertEqual(cls.supported_access, "full")
            self.assertTrue(issubclass(cls, MistralSandboxBase))
        self.assertEqual(MistralSandboxBase().network, Network.none())
        self.assertEqual(DangerousLocalSandbox.supported_network, ("all",))
        self.assertEqual(CowboxSandbox.supported_header_bindings, (HeaderBinding,))
        self.assertEqual(LocalDockerSandbox.supported_header_bindings, ())

    def test_network(self):
        self.assertEqual(Network(), Network.none())
        self.assertFalse(Network.none().reaches("pypi.org"))
        self.assertTrue(Network.all().reaches("pypi.org:22"))
        net = Network.allow(hosts=["pypi.org", "files.pythonhosted.org", "git.acme.com:8443",
                                   "10.1.2.3"])
        # only HTTPS to the listed host or host:port entries
        self.assertTrue(net.reaches("pypi.org"))
        self.assertTrue(net.reaches("PyPI.org:443"))
        self.assertFalse(net.reaches("pypi.org:80"))
        self.assertTrue(net.reaches("git.acme.com:8443"))
        self.assertFalse(net.reaches("git.acme.com"))
        self.assertTrue(net.reaches("10.1.2.3"))
        self.assertFalse(net.reaches("example.com"))
        self.assertEqual(net.options()["allow"], ["pypi.org:443", "files.pythonhosted.org:443",
                                                  "git.acme.com:8443", "10.1.2.3:443"])
        for bad in ("*.github.com", "*", "10.0.0.0/8", "https://x.org"):
            with self.assertRaises(ValueError, msg=bad):
                Network.allow(hosts=[bad])
        with self.assertRaises(TypeError):
            Network.allow("pypi.org")  # keyword-only, as the page has it
        with self.assertRaises(ValueError):
            Network(mode="public")
        self.assertIsInstance(net, cowbox.Network)  # goes to cowbox.Sandbox.create too

    def test_egress_and_bindings(self):
        self.assertEqual(EgressPolicy().mode, "block_all")
        self.assertEqual(EgressPolicy.allow_all().mode, "allow_all")
        custom = EgressPolicy.custom(allow_cidrs=["10.0.0.0/8", "192.0.2.7"])
        self.assertEqual(custom.allow_cidrs, ("10.0.0.0/8", "192.0.2.7/32"))
        with self.assertRaises(ValueError):
            EgressPolicy.custom(allow_cidrs=["not-a-cidr"])
        with self.assertRaises(ValueError):  # takes only custom()
            CowboxSandbox(egress=EgressPolicy.allow_all())
        self.assertEqual(CowboxSandbox(network=Network.all()).egress_policy,
                         EgressPolicy.allow_all())
        self.assertEqual(CowboxSandbox().egress_policy, EgressPolicy.block_all())
        # bindings cowbox cannot serve without Mistral's Sandbox Proxy are refused
        for b in (GitHubBinding(repos="all"), MistralApiBinding(), WorkspaceHeaderBindings()):
            with self.assertRaises(ValueError):
                CowboxSandbox(network=Network.allow(hosts=["api.github.com"]),
                              header_bindings=[b])
        with self.assertRaises(ValueError):  # the proxy that adds it needs allow
            CowboxSandbox(header_bindings=[HeaderBinding(host="a.example", header="X",
                                                         secret_name="S")])
        # secret_name: secrets=, then the environment, then the secrets folder
        hb = HeaderBinding(host="api.example.test", header="Authorization",
                           secret_name="CB_SEED_TOKEN", prefix="Bearer ")
        self.assertEqual(hb.binding({"CB_SEED_TOKEN": "v"}).option()["value"], "v")
        os.environ["CB_SEED_TOKEN"] = "from-env"
        try:
            self.assertEqual(hb.binding().option()["value"], "from-env")
        finally:
            del os.environ["CB_SEED_TOKEN"]
        with self.assertRaises(ValueError):
            hb.binding()
        self.assertNotIn("from-env", repr(hb))
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "CB_SEED_TOKEN"), "w") as f:
                f.write("from-file\n")
            os.environ["COWBOX_SECRETS_DIR"] = d
            try:
                self.assertEqual(hb.binding().option()["file"],
                                 os.path.join(d, "CB_SEED_TOKEN"))
            finally:
                del os.environ["COWBOX_SECRETS_DIR"]

    def test_hook_state_and_refusals(self):
        hook = Touch("a.txt", text="hi")
        self.assertEqual(hook.to_unified_state(), {"path": "a.txt", "text": "hi"})
        again = Touch.from_unified_state(hook.to_unified_state())
        self.assertEqual((again.path, again.text), ("a.txt", "hi"))
        gi = GitIdentity(name="Acme Bot", email="bot@acme.com")
        self.assertEqual(GitIdentity.from_unified_state(gi.to_unified_state()).email,
                         "bot@acme.com")
        with self.assertRaises(ValueError):  # it would overwrite your ~/.gitconfig
            DangerousLocalSandbox(hooks=[gi])
        with self.assertRaises(ValueError):
            CowboxSandbox(access="root")
        self.assertEqual(DangerousLocalSandbox().network, Network.all())
        self.assertEqual(LocalDockerSandbox().network, Network.none())
        self.assertEqual(LocalDockerSandbox().default_exec_timeout_seconds, 600)
        self.assertTrue(LocalDockerSandbox(network=Network.allow(hosts=["pypi.org"]))
                        .network.reaches("pypi.org"))
        with self.assertRaises(TypeError):
            CowboxSandbox(hooks=[lambda ctx: None])


class Sessions(seedutil.SeedTestCase):

    def setUp(self):
        super().setUp()
        Touch.destroyed = []
        # DangerousLocalSandbox's default folder is under ~/.cache: the test's own home
        self.user_home = os.path.join(self.tmp, "user")
        os.makedirs(self.user_home)
        saved = os.environ.get("HOME")
        os.environ["HOME"] = self.user_home
        self.addCleanup(os.environ.__setitem__, "HOME", saved or "/root")

    def test_dangerous_local(self):
        os.makedirs("proj")
        with open("proj/app.py", "w") as f:
            f.write("v = 1\n")

        async def main():
            sb = DangerousLocalSandbox(workspace="proj", hooks=[Touch("made.txt")],
                                       default_exec_timeout_seconds=2)
            self.assertFalse(sb.delete_on_cleanup)  # False with a workspace
            async with sb.session("s1") as s:
                folder = os.path.realpath("proj")
                r = await s.execute("pwd; cat made.txt")
                self.assertEqual(r, SandboxExecutionResult(0, folder + "\nmade\n", ""))
                await s.write_file("app.py", "v = 2\n")
                self.assertEqual(await s.read_file(folder + "/app.py"), "v = 2\n")
                r = await s.execute("sleep 30")
                self.assertEqual(r.exit_code, 124)
                # every network: the host's own
                port = self.serve_hello()
                r = await s.execute(["python3", "-c", "import urllib.request;print(urllib."
                                     "request.urlopen('http://127.0.0.1:%d/').read())" % port])
                self.assertIn("hello", r.stdout, r.stderr)
                # journaled: the cowbox workspace's diff
                changes = await s.cowbox.diff(0)
                self.assertIn("app.py", [c.path for c in changes])
            self.assertEqual(Touch.destroyed, [("s1", "made\n")])  # on_destroy at close
            with open("proj/app.py") as f:
                self.assertEqual(f.read(), "v = 2\n")  # not deleted: it is your folder
            # without workspace: a new folder under ~/.cache/..., deleted at close
            sb = DangerousLocalSandbox()
            self.assertTrue(sb.delete_on_cleanup)
            async with sb.session("s2") as s:
                r = await s.execute("pwd")
                where = os.path.join(self.user_home, ".cache",
                                     "mistral-vibe-harness-local-host", "s2")
                self.assertEqual(r.stdout.strip(), where)
            self.assertFalse(os.path.exists(where))
            # a workspace to delete: absolute, not holding home or the working folder
            for bad in ("proj", self.tmp, os.path.dirname(self.user_home)):
                with self.assertRaises(ValueError, msg=bad):
                    await DangerousLocalSandbox(workspace=bad, delete_on_cleanup=True).session()
            self.assertEqual(await cowbox.Sandbox.list(), [])
        self.arun(main())

    def test_cowbox_sandbox_ns(self):
        async def main():
            sb = CowboxSandbox(hooks=[GitIdentity(name="Acme Bot", email="bot@acme.com"),
                                      Touch("t.txt")],
                               instance_id="agent-7", default_exec_timeout_seconds=2,
                               setup_script="echo setup > setup.txt",
                               supports_background_processes=False, access="full")
            s = await sb.session("sess-1")
            try:
                r = await s.execute("git config --global user.name; git config --global "
                                    "user.email; cat setup.txt t.txt")
                self.assertEqual(r.stdout, "Acme Bot\nbot@acme.com\nsetup\nmade\n", r.stderr)
                self.assertEqual((await s.execute("sleep 30")).exit_code, 124)
                self.assertEqual((await s.execute("sleep 30", timeout_seconds=1)).exit_code,
                                 124)
                await s.write_file("keep.txt", "kept")
                self.assertFalse(await s.cowbox.reaches("pypi.org"))  # Network.none()
                # supports_background_processes=False: the workspace's background "kill" (its
                # effect is the core's to test: ns kills such a job only some of the time,
                # 2026-12-07, reported)
                opts = (await s.cowbox._request("configure"))["options"]
                self.assertEqual(opts.get("background"), "kill")
                self.assertFalse(sb.supports_background_processes)
            finally:
                await s.close()
            self.assertEqual(Touch.destroyed, [("sess-1", "made\n")])
            # the same instance_id and session find the workspace again
            s = await sb.session("sess-1")
            self.assertEqual(await s.read_file("keep.txt"), "kept")
            self.assertEqual(s.cowbox.ref, (await cowbox.Sandbox.list())[0]["ref"])
            await s.close()
            # allow + a header binding, its secret by name
            sb = CowboxSandbox(network=Network.allow(hosts=["api.example.test"]),
                               header_bindings=[HeaderBinding(host="api.example.test",
                                                              header="Authorization",
                                                              secret_name="API_TOKEN",
                                                              prefix="Bearer ")],
                               secrets={"API_TOKEN": "t0ken"})
            async with sb.session() as s:
                self.assertTrue(await s.cowbox.reaches("api.example.test"))
                self.assertFalse(await s.cowbox.reaches("api.example.test:80"))
                opts = (await s.cowbox._request("configure"))["options"]
                self.assertEqual([(b["host"], b["header"]) for b in opts["secrets"]],
                                 [("api.example.test", "Authorization")])
                r = await s.execute("env; cat /proc/1/environ 2>/dev/null")
                self.assertNotIn("t0ken", r.stdout)
            # egress CIDRs on top of none
            sb = CowboxSandbox(egress=EgressPolicy.custom(allow_cidrs=["192.0.2.0/24"]))
            async with sb.session() as s:
                self.assertTrue(await s.cowbox.reaches("192.0.2.9"))
                self.assertFalse(await s.cowbox.reaches("198.51.100.1"))
            # access files: the file tools, no bash
            async with CowboxSandbox(access="files").session() as s:
                await s.write_file("f.txt", "x")
                with self.assertRaises(cowbox.AccessDeniedError):
                    await s.execute("true")
        self.arun(main(), 240)


@unittest.skipUnless(seedutil.docker_ready(), seedutil.DOCKER_SKIP)
class DockerSessions(seedutil.SeedTestCase):

    def setUp(self):
        super().setUp()
        self.addCleanup(self.remove_containers)
        Touch.destroyed = []

    def test_local_docker(self):
        async def main():
            sb = LocalDockerSandbox(image=DOCKER_IMAGE, hooks=[Touch("t.txt")],
                                    default_exec_timeout_seconds=2,
                                    setup_script="echo setup > setup.txt",
                                    setup_script_timeout_seconds=60, shell="bash")
            self.assertTrue(sb.supports_background_processes)
            async with sb.session("d1") as s:
                r = await s.execute("cat setup.txt t.txt; echo $BASH_VERSION | cut -c1")
                self.assertEqual(r.stdout, "setup\nmade\n5\n", r.stderr)
                r = await s.execute("sleep 30")
                self.assertEqual(r.exit_code, 124)
                inspect_ = subprocess.run(["docker", "inspect", "-f",
                                           "{{.HostConfig.NetworkMode}}",
                                           "cowbox-" + s.cowbox.ref], capture_output=True,
                                          text=True)
                self.assertEqual(inspect_.stdout.strip(), "none")
            self.assertEqual(Touch.destroyed, [("d1", "made\n")])
            self.assertEqual(await cowbox.Sandbox.list(), [])  # one container per session
            async with CowboxSandbox(backend="docker", image=DOCKER_IMAGE).session() as s:
                self.assertEqual((await s.execute("cat /etc/debian_version >/dev/null; "
                                                  "pwd")).stdout, "/workspace\n")
        self.arun(main(), 240)


if __name__ == "__main__":
    unittest.main()
