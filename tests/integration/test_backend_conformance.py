"""One conformance suite, run against every backend (ns, local, docker via podman): the same
harness-visible behaviour through the Python client, whatever runs the commands."""

import asyncio
import base64
import hashlib
import json
import os
import subprocess
import time
import unittest
from urllib.parse import urlparse

import cbtest
import cowbox
import ociutil

DOCKER_IMAGE = os.environ.get("COWBOX_DOCKER_IMAGE", "cowbox-debian:bookworm")


def git_set(key, value):
    """git config --global user.KEY VALUE, or its ~/.gitconfig lines where the image has
    no git."""
    return ("if command -v git >/dev/null; then git config --global user.%s '%s'; else "
            "printf '[user]\\n\\t%s = %s\\n' >> ~/.gitconfig; fi" % (key, value, key, value))


def tree_of(root):
    """{relative path: bytes} of a folder's files, {"dir/": None} for its directories."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirs:
            out[os.path.normpath(os.path.join(rel, d)) + "/"] = None
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.normpath(os.path.join(rel, f))] = fh.read()
    return out


class Conformance:
    """Mixed into one TestCase per backend; OPTIONS are that backend's create options."""

    OPTIONS = {}

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"src/main.c": "int main(void) { return 0; }\n",
                                    "README": "hi\n"})

    def arun(self, body):
        return self.run_with(body, env={"FROM_OPTIONS": "yes"})

    def test_run_semantics(self):
        async def body(box):
            r = await box.run(["sh", "-c", "echo out; echo err >&2; exit 5"])
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (5, "out\n", "err\n"))
            self.assertEqual((await box.run(["no-such-program-x"])).exit_code, 127)
            self.assertEqual((await box.run(["sh", "-c", "kill -KILL $$"])).exit_code, 137)
            r = await box.run("pwd")
            self.assertEqual(r.stdout.strip(), box.workdir)
            r = await box.run(["pwd"], cwd="src")
            self.assertEqual(r.stdout.strip(), box.workdir + "/src")
            r = await box.run(["sh", "-c", "echo $FROM_OPTIONS $PER_CMD ${OPENAI_API_KEY:-none}"],
                              env={"PER_CMD": "also"})
            self.assertEqual(r.stdout, "yes also none\n")
            r = await box.run(["cat"], input=b"through stdin")
            self.assertEqual(r.stdout, "through stdin")
        os.environ["OPENAI_API_KEY"] = "sk-must-not-leak"
        try:
            self.arun(body)
        finally:
            del os.environ["OPENAI_API_KEY"]

    # Whether the backend kills a timed-out command's whole tree at once (ns: the pid
    # namespace; local: the command's cgroup), rather than leftovers at the 2 s drain.
    KILLS_TREE_AT_ONCE = False

    def test_cli_exec_matches_the_api(self):
        # One exec path: `cowbox exec REF` runs on the workspace's own backend and options
        # (env, working_dir, its network namespace) as the API does: the same command gives
        # the same result, --json being the API's run reply.
        script = ("pwd; echo $FROM_OPTIONS $PER_CMD; cat ../README; cat; id -u; hostname; "
                  "[ \"$HOME\" = /home/cowbox ] && echo home || echo host-home; ")
        if os.geteuid() == 0:  # (without root each command has a namespace of its own)
            script += "readlink /proc/self/ns/net; "
        script += "echo err >&2; exit 3"

        async def body(box):
            api = await box.run(["sh", "-c", script], env={"PER_CMD": "also"}, input=b"fed\n")
            self.assertEqual(api.exit_code, 3, api.stderr)
            cli = self.cowbox("exec", box.ref, "--json", "--env", "PER_CMD=also", "--", "sh",
                              "-c", script, input="fed\n", check=False)
            self.assertEqual(cli.returncode, 3, cli.stderr)
            got = json.loads(cli.stdout)
            self.assertEqual((got["exit_code"], base64.b64decode(got["stdout"]).decode(),
                              base64.b64decode(got["stderr"]).decode(), got["timed_out"]),
                             (api.exit_code, api.stdout, api.stderr, False))
            plain = self.cowbox("exec", box.ref, "--timeout", "1", "--", "sh", "-c",
                                "pwd; echo $FROM_OPTIONS; sleep 5", check=False)
            self.assertEqual((plain.returncode, plain.stdout), (124, box.workdir + "\nyes\n"))
        self.run_with(body, env={"FROM_OPTIONS": "yes"}, working_dir="sub")

    def test_timeout_kills_the_tree(self):
        late = 1 if self.KILLS_TREE_AT_ONCE else 3

        async def body(box):
            t0 = time.monotonic()
            r = await box.run(["sh", "-c", "(sleep %d; echo late > late.txt) & sleep 30" % late],
                              timeout=0.5)
            took = time.monotonic() - t0
            self.assertEqual((r.exit_code, r.timed_out), (124, True))
            if self.KILLS_TREE_AT_ONCE:
                # The subshell holds stdout: had it outlived the timeout, the call would have
                # waited out the 2 s drain. Its write was due within `late` s of the start.
                self.assertLess(took, 2.0)
                await asyncio.sleep(late + 0.2)
            else:
                # Leftovers of the tree are killed at most 2 s after the command ends.
                self.assertLess(took, 10)
                await asyncio.sleep(3.5)
            with self.assertRaises(cowbox.WorkspaceNotFoundError):
                await box.read("late.txt")
        self.arun(body)

    def test_timeout_when_sigterm_is_ignored(self):
        # SIGTERM is ignored by the whole tree (the ignore is inherited): the timeout's
        # SIGKILL 5 s later ends it, and the result still says it timed out (124). The
        # timeout leaves the shell 3 s to set its trap: a vm under TCG on a loaded machine
        # took longer than 0.5 s, and a SIGTERM before the trap proves nothing.
        async def body(box):
            t0 = time.monotonic()
            r = await box.run(["sh", "-c", "trap '' TERM; (sleep 11; echo late > late.txt) & "
                               "sleep 30"], timeout=3)
            took = time.monotonic() - t0
            self.assertEqual((r.exit_code, r.timed_out), (124, True), r)
            self.assertGreater(took, 7.5)
            self.assertLess(took, 20)
            await asyncio.sleep(max(0, 12 - (time.monotonic() - t0)))
            with self.assertRaises(cowbox.WorkspaceNotFoundError):
                await box.read("late.txt")
        self.arun(body)

    def test_setsid_descendants_die_with_timeout_and_kill(self):
        # A descendant that left the command's session and process group is still part of
        # its tree: a timeout and a kill end it too.
        async def body(box):
            r = await box.run(["sh", "-c", "setsid sh -c 'sleep 3; echo late > t.txt' "
                               "</dev/null >/dev/null 2>&1 & sleep 30"], timeout=0.5)
            self.assertEqual((r.exit_code, r.timed_out), (124, True))
            p = await box.exec(["sh", "-c", "setsid sh -c 'sleep 3; echo late > k.txt' "
                                "</dev/null >/dev/null 2>&1 & echo started; sleep 30"])
            self.assertEqual(await p.stdout.readline(), b"started\n")
            p.kill()
            self.assertEqual(await p.wait(), 137)
            await asyncio.sleep(4)
            for name in ("t.txt", "k.txt"):
                with self.assertRaises(cowbox.WorkspaceNotFoundError):
                    await box.read(name)
        self.arun(body)

    def test_output_cap(self):
        async def body(box):
            r = await box.run(["sh", "-c", "yes | head -c 30000000; echo done >&2"])
            self.assertTrue(r.output_limited)
            self.assertEqual(len(r.stdout_bytes), 65536)
        self.arun(body)

    def test_exec_stream_stdin_kill(self):
        async def body(box):
            p = await box.exec(["sh", "-c", "while read l; do echo \"<$l>\"; done; echo bye >&2"])
            p.stdin.write(b"a\nb\n")
            p.stdin.close()
            self.assertEqual(await p.stdout.read(), b"<a>\n<b>\n")
            self.assertEqual(await p.wait(), 0)
            self.assertEqual(await p.stderr.read(), b"bye\n")
            p = await box.exec(["sh", "-c", "echo started; sleep 60"])
            self.assertEqual(await p.stdout.readline(), b"started\n")
            p.terminate()
            self.assertIn(await p.wait(), (143, 137))
        self.arun(body)

    def test_kill_right_after_exec(self):
        # The first kill comes while the backend boots (the docker container starts), the
        # others while the command is being started: each is applied, none is lost.
        async def body(box):
            for sig in (9, 9, 15, 9, 15, 9):
                p = await box.exec(["sleep", "60"])
                p.send_signal(sig)
                self.assertEqual(await asyncio.wait_for(p.wait(), 60), 128 + sig)
            self.assertEqual((await box.run(["true"])).exit_code, 0)
        self.arun(body)

    def test_files_and_paths(self):
        async def body(box):
            data = os.urandom(2 * cowbox.sandbox.CHUNK + 7)
            await box.write("out/data.bin", data)
            r = await box.run(["sha256sum", "out/data.bin"])
            self.assertEqual(r.stdout.split()[0], hashlib.sha256(data).hexdigest())
            await box.run(["sh", "-c", "printf made > made.txt"])
            self.assertEqual(await box.read("made.txt"), b"made")
            await box.run(["ln", "-s", "/etc/passwd", "escape"])
            for bad in ("../x", "/etc/passwd", "escape"):
                with self.assertRaises(cowbox.InvalidPathError):
                    await box.read(bad)
            snap = await box.snapshot()
            self.assertEqual(snap["made.txt"], hashlib.sha256(b"made").hexdigest())
            self.assertEqual(snap["out/data.bin"], hashlib.sha256(data).hexdigest())
        self.arun(body)

    def test_in_place(self):
        # LiteLLM's sandbox.local(path): the agent's edits land in the folder itself, the
        # turns still hash, diff and roll back what is there, and destroy leaves the folder.
        folder = self.make_base({"keep.txt": "keep\n", "edit.txt": "old\n",
                                 "sub/gone.txt": "bye\n"})
        before = tree_of(folder)

        async def main():
            box = await cowbox.Sandbox.create(folder, in_place=True, cowbox=cbtest.COWBOX,
                                              home=self.home, **self.OPTIONS)
            try:
                r = await box.run(["sh", "-c", "echo new > edit.txt; rm sub/gone.txt; "
                                   "echo hi > made.txt"])
                self.assertEqual(r.exit_code, 0, r.stderr)
                self.assertEqual(tree_of(folder), {"keep.txt": b"keep\n", "edit.txt": b"new\n",
                                                   "made.txt": b"hi\n", "sub/": None})
                files = await box.snapshot()
                self.assertEqual(files, {p: hashlib.sha256(b).hexdigest()
                                         for p, b in tree_of(folder).items() if b is not None})
                got = {c.path: c.kind for c in await box.diff(0, box.last_turn)}
                self.assertEqual(got, {"edit.txt": "modified", "sub/gone.txt": "deleted",
                                       "made.txt": "added"})
                await box.rollback(0)
                self.assertEqual(tree_of(folder), before)
            finally:
                await box.close()
            await cowbox.Sandbox.destroy(box.ref, cowbox=cbtest.COWBOX, home=self.home)
            self.assertEqual(tree_of(folder), before)
        asyncio.run(asyncio.wait_for(main(), 180))

    def test_which(self):
        async def body(box):
            path = await box.which("sh")
            self.assertTrue(path and path.startswith("/") and path.endswith("/sh"), path)
            self.assertIsNone(await box.which("no-such-program-x"))
            # Programs that are also shell builtins still come back as paths.
            for prog in ("true", "echo"):
                path = await box.which(prog)
                self.assertTrue(path and path.endswith("/" + prog), (prog, path))
        self.arun(body)

    def test_network_none(self):
        if self.OPTIONS.get("backend") == "local":
            self.skipTest("the local backend runs on the host's network by definition")
        port = self.listen_port()

        async def body(box):
            # A port listening on the host is not reachable: only loopback exists inside.
            script = "exec 3<>/dev/tcp/127.0.0.1/%d && echo reached" % port
            r = await box.run(["bash", "-c", script], timeout=20)
            self.assertNotEqual(r.exit_code, 0, r.stdout)
            self.assertNotIn("reached", r.stdout)
        self.arun(body)

    def test_host_url(self):
        port = self.serve_hello()

        async def body(box):
            await box.run(["true"])  # boots the backend
            url = urlparse(box.host_url(port))
            # bash's /dev/tcp: images need no HTTP client for this.
            script = ('exec 3<>/dev/tcp/%s/%d && printf "GET / HTTP/1.0\\r\\n\\r\\n" >&3 && '
                      'cat <&3' % (url.hostname, url.port))
            r = await box.run(["bash", "-c", script], timeout=20)
            self.assertEqual(r.exit_code, 0, r.stderr)
            self.assertTrue(r.stdout.endswith("hello from the host"), r.stdout)
        self.arun(body)

    def run_with(self, body, **options):
        """body(box) in a workspace made with these options on top of the backend's."""
        async def main():
            box = await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                              **dict(self.OPTIONS, **options))
            try:
                return await asyncio.wait_for(body(box), 180)
            finally:
                await box.close()
        return asyncio.run(main())

    def test_shell_option(self):
        # Mistral's shell: command strings and hooks run with bash when asked, sh otherwise.
        async def sh(box):
            r = await box.run("echo ${BASH_VERSION:-none}")
            self.assertEqual(r.stdout, "none\n")
        self.arun(sh)

        async def bash(box):
            r = await box.run("[[ -n $BASH_VERSION ]] && echo bash")
            self.assertEqual((r.exit_code, r.stdout), (0, "bash\n"), r.stderr)
            p = await box.exec("[[ 1 == 1 ]] && echo streamed")
            self.assertEqual(await p.stdout.read(), b"streamed\n")
            self.assertEqual(await box.read("hook.txt"), b"hook\n")
        self.run_with(bash, shell="bash",
                      on_create=["[[ -n $BASH_VERSION ]] && echo hook > hook.txt"])
        with self.assertRaises(cowbox.InvalidRequestError):
            self.run_with(bash, shell="zsh")

    def test_image_option(self):
        # BoxLite's and LocalDocker's image: commands run in that image's root. The same name
        # in the local podman store serves ns (unpacked once into a cached root) and docker
        # (the engine's image); local has no root of its own and refuses one.
        if self.OPTIONS.get("backend") == "local":
            with self.assertRaises(cowbox.InvalidRequestError) as cm:
                self.run_with(None, image=ociutil.STORE_IMAGE)
            self.assertIn("image", str(cm.exception))
            return
        why = ociutil.why_not_ready()
        if why:
            self.skipTest(why)

        async def body(box):
            # the image is Debian minbase: no python3, which this host has
            r = await box.run(["sh", "-c", "test -e /etc/debian_version && echo debian; "
                               "command -v python3 || echo no-python3; cat README"])
            self.assertEqual(r.stdout, "debian\nno-python3\nhi\n", r.stderr)
            self.assertIsNone(await box.which("python3"))
        self.assertTrue(os.path.exists("/usr/bin/python3"))
        self.run_with(body, image=ociutil.STORE_IMAGE)
        with self.assertRaises(cowbox.WorkspaceError) as cm:
            self.run_with(body, image="cowbox-no-such:image")
        self.assertIn("cowbox-no-such:image", str(cm.exception))

    def test_image_env_and_user(self):
        # BoxLite: env is "on top of the image's" and commands "run as the image's user". An
        # image in the local store whose config sets Env and User (made here from the store's
        # Debian image plus a layer): ns and docker alike take both, the env option over Env.
        if self.OPTIONS.get("backend") == "local":
            self.skipTest("local has no image")
        why = ociutil.why_not_ready()
        if why:
            self.skipTest(why)
        # made once for the file (ns and docker use the same one), removed at its exit
        name = ociutil.store_image_with("cowbox-test-settings:%d" % os.getpid(),
                                        {"Env": ["MARK=image", "OVER=image"],
                                         "User": "nobody"})

        async def body(box):
            r = await box.run(["sh", "-c", "echo $MARK $OVER; id -un"])
            self.assertEqual(r.stdout, "image option\nnobody\n", r.stderr)
        self.run_with(body, image=name, env={"OVER": "option"})

    def test_user_option(self):
        # BoxLite's user: commands run as that user inside; a command may name its own.
        if self.OPTIONS.get("backend") == "local":
            with self.assertRaises(cowbox.InvalidRequestError) as cm:
                self.run_with(None, user="nobody")
            self.assertIn("local", str(cm.exception))
            return

        async def body(box):
            r = await box.run(["sh", "-c", "id -u; id -g; id -un; touch /tmp/mine && "
                               "stat -c %U /tmp/mine"])
            self.assertEqual(r.stdout.split(), ["65534", "65534", "nobody", "nobody"],
                             r.stderr)
            # The workspace is root's: the user writes where root lets it.
            r = await box.run(["touch", "nope"])
            self.assertNotEqual(r.exit_code, 0)
            r = await box.run("mkdir -p shared && chmod 777 shared", user="root")
            self.assertEqual(r.exit_code, 0, r.stderr)
            r = await box.run("echo hi > shared/f && stat -c %U shared/f")
            self.assertEqual(r.exit_code, 0, r.stderr)
            if self.OPTIONS.get("backend") == "ns":
                # docker shows the workspace's own host id range, not the container's ids
                self.assertEqual(r.stdout, "nobody\n")
                r = await box.run("mkdir mine && chown nobody mine", user="root")
                r = await box.run("touch mine/f && stat -c %U mine/f")
                self.assertEqual((r.exit_code, r.stdout), (0, "nobody\n"), r.stderr)
            r = await box.run(["sh", "-c", "id -u; id -g"], user="1234:100")
            self.assertEqual(r.stdout.split(), ["1234", "100"], r.stderr)
            self.assertEqual((await box.run(["id", "-u"], user=0)).stdout, "0\n")
            try:
                r = await box.run(["id"], user="no-such-user-x")
                self.assertNotEqual(r.exit_code, 0)
            except cowbox.WorkspaceNotFoundError as e:
                self.assertIn("no-such-user-x", str(e))
            self.assertEqual((await box.run(["true"])).exit_code, 0)
            self.assertEqual(await box.read("shared/f"), b"hi\n")
        self.run_with(body, user="nobody")
        with self.assertRaises(cowbox.InvalidRequestError):
            self.run_with(body, user="-x")

    def test_close_from_elsewhere_ends_a_command_as_unavailable(self):
        # BoxLite: a command that a stop or a deletion ended raises WorkspaceUnavailableError,
        # not a plain exit 137.
        async def body(box):
            run = asyncio.ensure_future(box.run(["sh", "-c", "echo up > up.txt; sleep 60"]))
            for _ in range(600):
                try:
                    if await box.read("up.txt") == b"up\n":
                        break
                except cowbox.WorkspaceNotFoundError:
                    pass
                await asyncio.sleep(0.05)
            other = await cowbox.Sandbox.attach(box.ref, cowbox=cbtest.COWBOX, home=self.home)
            t0 = time.monotonic()
            await other.close()
            with self.assertRaises(cowbox.WorkspaceUnavailableError):
                await run
            self.assertLess(time.monotonic() - t0, 30)
            # the next use boots the workspace again
            self.assertEqual((await box.run(["cat", "up.txt"])).stdout, "up\n")
        self.arun(body)

    async def read_soon(self, box, path, within=10.0):
        """The bytes of path once it exists and holds some (a shell's `echo x > f` makes f
        empty a moment before it writes; a slow backend widens that moment): what it holds
        at the end of the time if it stays empty, None if it never exists."""
        t0, got = time.monotonic(), None
        while time.monotonic() - t0 < within:
            try:
                got = await box.read(path)
                if got:
                    return got
            except cowbox.WorkspaceNotFoundError:
                pass
            await asyncio.sleep(0.1)
        return got

    async def ticking(self, box, name):
        """Fail unless the file name (rewritten by a live job) changes within 10 s."""
        first = await self.read_soon(box, name)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            await asyncio.sleep(0.2)
            if await box.read(name) != first:
                return
        self.fail("%s stood still for 10 s: its job was ended" % name)

    def test_background_jobs_outlive_their_command(self):
        # BoxLite's Shell background jobs, Mistral's supports_background_processes: a job
        # started with &, nohup or setsid runs on until the workspace closes, on every
        # backend; the call still returns at most 2 s after the command exits, even while a
        # job holds its output, and a job that keeps writing there is not killed by it.
        ref = []

        async def body(box):
            ref.append(box.ref)
            await box.run(["true"])  # boots the backend
            t0 = time.monotonic()
            await box.run(["true"])
            alone = time.monotonic() - t0  # what a command costs here (docker exec: ~1 s)
            t0 = time.monotonic()
            r = await box.run(["sh", "-c", "(sleep 3; echo a > amp.txt; sleep 60) & "
                               "nohup sh -c 'sleep 3; echo n > nohup.txt; sleep 60' "
                               ">/dev/null 2>&1 & "
                               "setsid sh -c 'sleep 3; echo s > setsid.txt; sleep 60' "
                               "</dev/null >/dev/null 2>&1 & echo started"])
            took = time.monotonic() - t0
            self.assertEqual((r.exit_code, r.stdout, r.killed), (0, "started\n", False))
            self.assertLess(took, alone + 2.5)
            for name, data in (("amp.txt", b"a\n"), ("nohup.txt", b"n\n"),
                               ("setsid.txt", b"s\n")):
                self.assertEqual(await self.read_soon(box, name), data, name)
            if self.OPTIONS.get("backend") != "docker":
                # (docker exec closes the streams when its process exits: a job writing
                # there later gets EPIPE; docs/protocol.md)
                r = await box.run(["sh", "-c", "(for i in $(seq 40); do echo line $i; "
                                   "echo err $i >&2; sleep 0.1; done; echo done > chatty.txt) & "
                                   "echo started"])
                self.assertEqual(r.stdout.splitlines()[0], "started")
                self.assertEqual(await self.read_soon(box, "chatty.txt"), b"done\n")
            # A job of run() and one of a streamed exec() tick until the close below. (A
            # tick is written by rename, never read half-made; a live job on a machine at
            # load 40+ may stand still for a second, so each gets 10 s to move.)
            r = await box.run("while :; do date +%s%N > tick.new; mv tick.new tick; "
                              "sleep 0.1; done >/dev/null 2>&1 & echo up")
            self.assertEqual(r.stdout, "up\n")
            await self.ticking(box, "tick")
            p = await box.exec("while :; do date +%s%N > tick2.new; mv tick2.new tick2; "
                               "sleep 0.1; done >/dev/null 2>&1 & echo up")
            self.assertEqual(await p.stdout.read(), b"up\n")
            self.assertEqual(await p.wait(), 0)
            await self.ticking(box, "tick2")
        self.arun(body)

        async def after(box):
            # close ended them: the ticks stand still
            for name in ("tick", "tick2"):
                first = await box.read(name)
                await asyncio.sleep(0.6)
                self.assertEqual(await box.read(name), first, name)
        async def attached():
            box = await cowbox.Sandbox.attach(ref[0], cowbox=cbtest.COWBOX, home=self.home)
            try:
                await after(box)
            finally:
                await box.close()
        asyncio.run(attached())

    def test_background_kill(self):
        # background="kill" ends the jobs with their command; a command may ask otherwise.
        async def body(box):
            t0 = time.monotonic()
            r = await box.run(["sh", "-c", "(sleep 3; echo late > late.txt) & "
                               "setsid sh -c 'sleep 3; echo s > setsid.txt' "
                               "</dev/null >/dev/null 2>&1 & echo started"])
            self.assertEqual((r.exit_code, r.stdout), (0, "started\n"))
            r = await box.run("(sleep 1; echo kept > kept.txt) >/dev/null 2>&1 &",
                              background="keep")
            self.assertEqual(r.exit_code, 0)
            self.assertEqual(await self.read_soon(box, "kept.txt"), b"kept\n")
            await asyncio.sleep(max(0, 4 - (time.monotonic() - t0)))
            for name in ("late.txt", "setsid.txt"):
                with self.assertRaises(cowbox.WorkspaceNotFoundError):
                    await box.read(name)
        self.run_with(body, background="kill")
        with self.assertRaises(cowbox.InvalidRequestError):
            self.run_with(body, background="detach")

    def test_background_kill_ends_every_job_with_its_command(self):
        # background="kill": every process a command started ends when the command does, not
        # at the end of the 2 s output drain (a job sleeping 2 s there used to write, now and
        # then): one that holds stdout (&), one in a session of its own that holds it too
        # (setsid), one double-forked away with its output elsewhere; 20 times over. Each
        # job marks that it ran before the command exits, so the test sees them started.
        if not self.KILLS_TREE_AT_ONCE:
            self.skipTest("docker's jobs end through its engine (docker_signal_tree)")
        script = ("(echo > ran-amp-{i}; sleep 2; echo > late-amp-{i}) & "
                  "setsid sh -c 'echo > ran-setsid-{i}; sleep 2; echo > late-setsid-{i}' & "
                  "sh -c '(sh -c \"echo > ran-fork-{i}; sleep 2; echo > late-fork-{i}\" "
                  ">/dev/null 2>&1 &) &'; "
                  "for f in ran-amp-{i} ran-setsid-{i} ran-fork-{i}; do "
                  "while [ ! -e $f ]; do sleep 0.01; done; done; echo {i}")

        async def body(box):
            t0 = time.monotonic()
            for i in range(20):
                r = await box.run(["sh", "-c", script.format(i=i)])
                self.assertEqual((r.exit_code, r.stdout), (0, "%d\n" % i), r.stderr)
            took = time.monotonic() - t0
            await asyncio.sleep(2.5)  # past the last jobs' sleep 2
            names = (await box.run(["ls"])).stdout.split()
            self.assertEqual(len([n for n in names if n.startswith("ran-")]), 60)
            self.assertEqual([n for n in names if n.startswith("late-")], [])
            # nor did any hold its call for the drain (20 of them would be 40 s)
            self.assertLess(took, 20)
        self.run_with(body, background="kill")

    def test_working_dir(self):
        # BoxLite's working_dir: an absolute directory under the workspace, made if missing;
        # commands start there and relative read/write paths resolve against it, while
        # /workspace/... paths name the same files commands see there.
        async def body(box):
            self.assertTrue(box.workdir.endswith("/sub/dir"), box.workdir)
            self.assertEqual((await box.run("pwd")).stdout.strip(), box.workdir)
            for direct in (True, False):
                box.direct_io = direct
                await box.write("rel.txt", b"r%d" % direct)
                self.assertEqual((await box.run(["cat", "rel.txt"])).stdout, "r%d" % direct)
                self.assertEqual(await box.read("rel.txt"), b"r%d" % direct)
                self.assertEqual(await box.read("/workspace/sub/dir/rel.txt"), b"r%d" % direct)
                self.assertEqual(await box.read("/workspace/src/main.c"),
                                 b"int main(void) { return 0; }\n")
                await box.write("/workspace/abs.txt", b"a%d" % direct)
                r = await box.run(["cat", "../../abs.txt"])
                self.assertEqual(r.stdout, "a%d" % direct)
                for bad in ("/etc/passwd", "/workspace/../etc/passwd", "../../../x"):
                    with self.assertRaises(cowbox.InvalidPathError, msg=bad):
                        await box.read(bad)
        self.run_with(body, working_dir="/workspace/sub/dir")

    def test_persistent_home(self):
        # A home per workspace outside /workspace: git config --global and caches set by a
        # hook or a command are there for the next (Mistral's GitIdentity hook), across a
        # close, not in snapshots, and gone with the workspace.
        if self.OPTIONS.get("backend") == "local":
            self.skipTest("the local backend runs on the host with the host's HOME")
        ref = []

        async def body(box):
            ref.append(box.ref)
            self.assertEqual((await box.run("echo $HOME")).stdout, "/home/cowbox\n")
            r = await box.run(git_set("email", "bot@acme.com") +
                              " && mkdir -p ~/.cache/pip && echo x > ~/.cache/pip/marker")
            self.assertEqual(r.exit_code, 0, r.stderr)
            r = await box.run("grep -c -e 'Acme Bot' -e bot@acme.com ~/.gitconfig")
            self.assertEqual(r.stdout, "2\n", r.stderr)
            r = await box.run("touch ~/by-nobody && echo ok", user="nobody")
            self.assertEqual(r.stdout, "ok\n", r.stderr)
            snap = await box.snapshot()
            self.assertFalse([p for p in snap if "gitconfig" in p or "marker" in p], snap)
        self.run_with(body, on_create=[git_set("name", "Acme Bot")])

        async def again():
            box = await cowbox.Sandbox.attach(ref[0], cowbox=cbtest.COWBOX, home=self.home)
            try:
                r = await box.run("cat ~/.cache/pip/marker; grep -c 'Acme Bot' ~/.gitconfig")
                self.assertEqual(r.stdout, "x\n1\n", r.stderr)
            finally:
                await box.close()
            await cowbox.Sandbox.destroy(ref[0], cowbox=cbtest.COWBOX, home=self.home)
        asyncio.run(again())
        self.assertFalse(os.path.exists(os.path.join(self.home, "workspaces", ref[0])))

    def test_volumes(self):
        # BoxLite's volumes, LiteLLM's mounts: host directories bound in, read-only unless
        # asked; nothing under COWBOX_HOME (the workspaces, their control sockets).
        shared = os.path.join(self.tmp, "shared")
        out = os.path.join(self.tmp, "out")
        os.makedirs(shared)
        os.makedirs(out)
        os.chmod(out, 0o777)
        with open(os.path.join(shared, "data.txt"), "w") as f:
            f.write("from the host\n")
        if self.OPTIONS.get("backend") == "local":
            with self.assertRaises(cowbox.InvalidRequestError):
                self.run_with(None, volumes=[(shared, "/data")])
            return

        async def body(box):
            r = await box.run(["cat", "/data/data.txt"])
            self.assertEqual(r.stdout, "from the host\n", r.stderr)
            r = await box.run("echo x > /data/new.txt")
            self.assertNotEqual(r.exit_code, 0)
            r = await box.run("echo made > /mnt/out/made.txt")
            self.assertEqual(r.exit_code, 0, r.stderr)
        self.run_with(body, volumes=[(shared, "/data"), (out, "/mnt/out", "rw")])
        with open(os.path.join(out, "made.txt")) as f:
            self.assertEqual(f.read(), "made\n")
        self.assertFalse(os.path.exists(os.path.join(shared, "new.txt")))
        for bad in ([(self.home, "/h")], [(os.path.join(self.home, "workspaces"), "/w")],
                    [(self.tmp, "/t")], [(shared, "/workspace/x")], [(shared, "rel")],
                    [(shared, "/data", "rx")], [("/no/such/dir", "/x")]):
            with self.assertRaises(cowbox.InvalidRequestError, msg=bad):
                self.run_with(None, volumes=bad)


    async def _create(self, **opts):
        return await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                           **dict(self.OPTIONS, **opts))

    def test_access_levels(self):
        # Mistral's access: files gives the file tools, full adds commands; a wider level
        # than the workspace serves is refused.
        async def body(box):
            low = await cowbox.Sandbox.attach(box.ref, access="files", cowbox=cbtest.COWBOX,
                                              home=self.home)
            await low.write("by-files.txt", b"ok")
            self.assertEqual(await low.read("by-files.txt"), b"ok")
            for call in (low.run(["true"]), low.exec(["true"]), low.which("sh")):
                with self.assertRaises(cowbox.AccessDeniedError):
                    await call
            self.assertEqual((await box.run(["cat", "by-files.txt"])).stdout, "ok")
            await low._conn.close()
            narrow = await self._create(access="files")
            try:
                self.assertEqual(narrow.supported_access, "files")
                with self.assertRaises(cowbox.AccessDeniedError):
                    await narrow.run(["true"])
                with self.assertRaises(cowbox.AccessDeniedError):
                    await cowbox.Sandbox.attach(narrow.ref, access="full",
                                                cowbox=cbtest.COWBOX, home=self.home)
            finally:
                await narrow.close()
        self.arun(body)

    def test_hooks_run_at_create_as_the_baseline(self):
        # The on_create hooks (a shell string and an async callable) and the setup script
        # run before create returns; what they made is the baseline turn, not the agent's
        # first turn's FileChanges.
        async def code_hook(sb):
            r = await sb.run(["sh", "-c", "cat hook.txt > from-code.txt"])
            self.assertEqual(r.exit_code, 0, r.stderr)

        async def body(_):
            box = await self._create(on_create=["echo hooked > hook.txt", code_hook],
                                     setup_script="echo setup >> hook.txt")
            try:
                self.assertIsNotNone(box.baseline_turn)
                before = await box.snapshot()
                self.assertIn("hook.txt", before)
                self.assertEqual(await box.read("from-code.txt"), b"hooked\nsetup\n")
                await box.run(["sh", "-c", "echo agent > agent.txt"])
                after = await box.snapshot()
                self.assertEqual([c.path for c in cowbox.file_changes(before, after)],
                                 ["agent.txt"])
                self.assertEqual([c.path for c in await box.diff(box.baseline_turn)],
                                 ["agent.txt"])
            finally:
                await box.close()
            # A failing hook fails the create, which leaves nothing behind.
            with self.assertRaises(cowbox.WorkspaceError):
                await self._create(on_create=["exit 3"])
            self.assertEqual(len(os.listdir(os.path.join(self.home, "workspaces"))), 2)
        self.arun(body)


    def idle_resources_gone(self, ref):
        """Whatever the backend keeps for a booted workspace is gone (docker: the container)."""

    def test_idle_stop_keeps_the_disk(self):
        # BoxLite: a box stops when nothing uses it any more and keeps its disk; the next
        # use boots it again.
        async def body(_):
            box = await self._create(idle_timeout=1)
            try:
                self.assertEqual((await box.run(["sh", "-c", "echo kept > kept.txt"]))
                                 .exit_code, 0)
                pid = self.daemon_pid(box.ref)
                await box.detach()
                for _ in range(150):
                    if not cbtest.pid_alive(pid):
                        break
                    await asyncio.sleep(0.1)
                self.assertFalse(cbtest.pid_alive(pid), "no idle stop")
                self.idle_resources_gone(box.ref)
                r = await box.run(["cat", "kept.txt"])
                self.assertEqual(r.stdout, "kept\n")
            finally:
                await box.close()
        self.arun(body)


class NsConformance(Conformance, cbtest.CowboxTestCase):
    OPTIONS = {"backend": "ns"}
    KILLS_TREE_AT_ONCE = True


class LocalConformance(Conformance, cbtest.CowboxTestCase):
    OPTIONS = {"backend": "local"}
    KILLS_TREE_AT_ONCE = True

    def test_credentials_stripped_by_pattern(self):
        # Through the daemon (the API's path): the host's secrets by name and by pattern are
        # gone, harmless names stay, and the env given by the caller wins.
        planted = {"GH_TOKEN": "gho_x", "HF_TOKEN": "hf_x", "DATABASE_URL": "postgres:///d",
                   "SSH_AUTH_SOCK": "/tmp/agent", "VAULT_ADDR": "https://v",
                   "CACHE_URL": "redis://u:pw@cache/0", "AUTHOR_NAME": "Ada"}
        os.environ.update(planted)

        async def body(box):
            r = await box.run(["env"], env={"HF_TOKEN": "explicit"})
            got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
            for name in ("GH_TOKEN", "DATABASE_URL", "SSH_AUTH_SOCK", "VAULT_ADDR",
                         "CACHE_URL"):
                self.assertNotIn(name, got)
            self.assertEqual(got.get("HF_TOKEN"), "explicit")
            self.assertEqual(got.get("FROM_OPTIONS"), "yes")
            self.assertEqual(got.get("AUTHOR_NAME"), "Ada")
            self.assertEqual(got.get("PATH"), os.environ["PATH"])
        try:
            self.arun(body)
        finally:
            for name in planted:
                del os.environ[name]


def _docker_ready():
    try:
        return subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@unittest.skipUnless(_docker_ready(), "no docker engine with image %s (DOCKER_HOST=%s); "
                     "scripts/setup-podman sets one up" % (DOCKER_IMAGE,
                                                           os.environ.get("DOCKER_HOST")))
class DockerConformance(Conformance, cbtest.CowboxTestCase):
    OPTIONS = {"backend": "docker", "image": DOCKER_IMAGE}

    def setUp(self):
        super().setUp()
        # Runs before the daemons are stopped: a test that failed half-way (or a daemon that
        # died) must not leave a container behind once its workspace is deleted.
        self.addCleanup(self._remove_containers)

    def _remove_containers(self):
        wsroot = os.path.join(self.home, "workspaces")
        for ref in os.listdir(wsroot) if os.path.isdir(wsroot) else []:
            subprocess.run(["docker", "rm", "-f", "cowbox-" + ref], capture_output=True)

    def test_default_image(self):
        # LocalDocker's image=None: the documented default, cowbox-debian:bookworm (what
        # scripts/setup-podman builds), when neither the option nor $COWBOX_DOCKER_IMAGE
        # names one; cowbox info says which.
        if subprocess.run(["docker", "image", "inspect", "cowbox-debian:bookworm"],
                          capture_output=True, timeout=20).returncode != 0:
            self.skipTest("no cowbox-debian:bookworm in the engine")
        saved = os.environ.pop("COWBOX_DOCKER_IMAGE", None)
        refs = []

        async def main():
            box = await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                              backend="docker")
            try:
                refs.append(box.ref)
                r = await box.run(["sh", "-c", "cat /etc/debian_version >/dev/null && "
                                   "cat README"])
                self.assertEqual((r.exit_code, r.stdout), (0, "hi\n"), r.stderr)
            finally:
                await box.close()
        try:
            asyncio.run(main())
            self.env.pop("COWBOX_DOCKER_IMAGE", None)
            info = self.cowbox_json("info", refs[0])
        finally:
            if saved is not None:
                os.environ["COWBOX_DOCKER_IMAGE"] = saved
        self.assertEqual((info["backend"], info["image"]), ("docker", "cowbox-debian:bookworm"))

    def test_rm_after_a_crash_removes_the_container(self):
        refs = []

        async def body(box):
            await box.run(["true"])
            refs.append(box.ref)
            os.kill(self.daemon_pid(box.ref), 9)
        self.arun(body)
        name = "cowbox-" + refs[0]
        self.assertEqual(subprocess.run(["docker", "inspect", name],
                                        capture_output=True).returncode, 0)
        self.cowbox("rm", refs[0])
        self.assertNotEqual(subprocess.run(["docker", "inspect", name],
                                           capture_output=True).returncode, 0)

    def test_memory_cap(self):
        async def main():
            box = await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home,
                                              memory_mb=96, cpus=0.5, **self.OPTIONS)
            try:
                r = await box.run(["sh", "-c", "x=$(head -c 300000000 /dev/zero | tr '\\0' a); "
                                   "echo ${#x}"], timeout=60)
                self.assertEqual(r.exit_code, 137, r)
                self.assertEqual((await box.run(["true"])).exit_code, 0)
            finally:
                await box.close()
        asyncio.run(main())

    def idle_resources_gone(self, ref):
        gone = subprocess.run(["docker", "inspect", "cowbox-" + ref], capture_output=True)
        self.assertNotEqual(gone.returncode, 0, "the container outlived an idle stop")

    def test_container_lifecycle(self):
        name = []

        async def body(box):
            await box.run(["true"])
            name.append("cowbox-" + box.ref)
            out = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.NetworkMode}}",
                                  name[0]], capture_output=True, text=True).stdout.strip()
            self.assertEqual(out, "none")
            # The container removed behind our back: the command in flight fails saying so
            # (not a plain exit 1), and the next use boots the workspace again (BoxLite's
            # semantics), files intact.
            await box.write("kept.txt", b"kept\n")
            old_id = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name[0]],
                                    capture_output=True, text=True).stdout
            subprocess.run(["docker", "rm", "-f", name[0]], capture_output=True)
            with self.assertRaises(cowbox.WorkspaceUnavailableError) as cm:
                await box.run(["true"])
            self.assertIn(name[0], str(cm.exception))
            cbtest.wait_for(lambda: not self.daemon_pid(box.ref), 15, what="daemon stop")
            r = await box.run(["cat", "kept.txt"])
            self.assertEqual(r.stdout, "kept\n")
            new_id = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", name[0]],
                                    capture_output=True, text=True).stdout
            self.assertNotEqual(new_id, old_id)
        self.arun(body)
        # close took the container with it (its bind of the mount dies with the daemon).
        gone = subprocess.run(["docker", "inspect", name[0]], capture_output=True)
        self.assertNotEqual(gone.returncode, 0)


if __name__ == "__main__":
    unittest.main()
