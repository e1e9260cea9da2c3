"""The Python client against a real daemon: the harness Sandbox protocol, a scripted agent
turn (snapshot, edits, snapshot, FileChange events, rollback), errors as exceptions."""

import asyncio
import hashlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cbtest  # noqa: E402  (tests/integration, on PYTHONPATH under make check)
import cowbox  # noqa: E402


class ClientTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"src/a.py": "x = 1\n", "README": "hello\n",
                                    "keep.txt": "same\n"})

    def arun(self, coro):
        """Run a test body in one event loop; boxes it opened are closed in that loop."""
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

    def test_protocol_members(self):
        # The LiteLLM Sandbox protocol, member by member, with the seed's signatures.
        for name in ("exec", "run", "read", "write", "which", "snapshot", "close"):
            self.assertTrue(asyncio.iscoroutinefunction(getattr(cowbox.Sandbox, name)), name)
        self.assertFalse(asyncio.iscoroutinefunction(cowbox.Sandbox.host_url))
        import inspect
        # The seed's parameters, by name and kind (extra keyword-only ones are allowed).
        seed = {"exec": ["cmd", "*env", "*cwd"], "run": ["cmd", "*env", "*cwd", "*timeout"],
                "read": ["path"], "write": ["path", "data"], "host_url": ["port"],
                "which": ["binary"], "snapshot": [], "close": []}
        for name, params in seed.items():
            sig = inspect.signature(getattr(cowbox.Sandbox, name)).parameters
            for p in params:
                kw = p.startswith("*")
                self.assertIn(p.lstrip("*"), sig, name)
                kind = sig[p.lstrip("*")].kind
                self.assertEqual(kind == inspect.Parameter.KEYWORD_ONLY, kw, (name, p))
                if kw:
                    self.assertIsNone(sig[p.lstrip("*")].default, (name, p))

        async def go():
            box = await self.new_box()
            self.assertEqual(box.workdir, "/workspace")
            return box.ref
        self.assertRegex(self.arun(go()), r"^cb-[0-9a-f]{32}$")

    def test_agent_turn(self):
        async def go():
            box = await self.new_box()
            before = await box.snapshot()
            turn1 = box.last_turn
            with open(os.path.join(self.base, "src/a.py"), "rb") as f:
                self.assertEqual(before["src/a.py"], hashlib.sha256(f.read()).hexdigest())
            self.assertEqual(set(before), {"src/a.py", "README", "keep.txt"})
            # The "agent" edits through commands and through write.
            r = await box.run(["sh", "-c", "sed -i s/1/2/ src/a.py && rm README && "
                               "mkdir -p new && echo fresh > new/file.txt"])
            self.assertEqual(r.exit_code, 0, r.stderr)
            await box.write("notes.md", b"# notes\n")
            after = await box.snapshot()
            changes = cowbox.file_changes(before, after)
            self.assertEqual([(c.path, c.kind) for c in changes], [
                ("README", "deleted"), ("new/file.txt", "added"), ("notes.md", "added"),
                ("src/a.py", "modified")])
            mod = changes[-1]
            self.assertEqual(mod.old_sha256, before["src/a.py"])
            self.assertEqual(mod.new_sha256, hashlib.sha256(b"x = 2\n").hexdigest())
            # The daemon's own diff agrees on the files.
            events = await box.diff(turn1, box.last_turn)
            files = {(e.path, e.kind) for e in events if e.path in after or e.path in before}
            self.assertEqual(files, {(c.path, c.kind) for c in changes})
            # Roll back to the first turn: the live tree is what it was.
            await box.rollback(turn1)
            self.assertEqual(await box.read("src/a.py"), b"x = 1\n")
            self.assertEqual(await box.read("README"), b"hello\n")
            with self.assertRaises(cowbox.WorkspaceNotFoundError):
                await box.read("notes.md")
            self.assertEqual(await box.snapshot(), before)
        self.arun(go())

    def test_exec_streams_stdin_and_kill(self):
        async def go():
            box = await self.new_box()
            p = await box.exec(["sh", "-c", "read line; echo got:$line; echo oops >&2"])
            p.stdin.write(b"ping\n")
            await p.stdin.drain()
            self.assertEqual(await p.stdout.readline(), b"got:ping\n")
            self.assertEqual(await p.wait(), 0)
            self.assertEqual(await p.stderr.read(), b"oops\n")
            p = await box.exec(["sleep", "30"])
            await asyncio.sleep(0.2)
            p.kill()
            self.assertEqual(await p.wait(), 137)
            out, err = await (await box.exec(["cat"])).communicate(b"x" * 300000)
            self.assertEqual(len(out), 300000)
        self.arun(go())

    def test_run_results_and_errors(self):
        async def go():
            box = await self.new_box(env={"GREETING": "hi"})
            r = await box.run(["sh", "-c", "echo $GREETING $EXTRA; pwd; exit 3"],
                              env={"EXTRA": "there"})
            self.assertEqual((r.exit_code, r.stdout), (3, "hi there\n/workspace\n"))
            self.assertEqual((await box.run(["no-such-program"])).exit_code, 127)
            r = await box.run(["sleep", "10"], timeout=0.3)
            self.assertTrue(r.timed_out)
            self.assertEqual(r.exit_code, 124)
            with self.assertRaises(cowbox.WorkspaceTimeoutError) as cm:
                await box.run("echo partial; sleep 10", timeout=0.5, strict=True)
            self.assertEqual(cm.exception.result.stdout, "partial\n")
            with self.assertRaises(cowbox.WorkspaceOutputLimitError) as cm:
                await box.run(["sh", "-c", "yes | head -c 20000000"], strict=True)
            self.assertEqual(len(cm.exception.result.stdout_bytes), 65536)
            self.assertEqual(await box.which("sh"), "/usr/bin/sh")
            self.assertIsNone(await box.which("no-such-program"))
            for bad in ("../outside", "/etc/passwd"):
                with self.assertRaises(cowbox.InvalidPathError):
                    await box.read(bad)
                with self.assertRaises(cowbox.InvalidPathError):
                    await box.write(bad, b"x")
            # a file where a directory must be: the request's fault, not the daemon's
            await box.write("plain.txt", b"x")
            with self.assertRaises(cowbox.InvalidRequestError):
                await box.read("plain.txt/x")
            with self.assertRaises(cowbox.InvalidRequestError):
                await box.write("plain.txt/x", b"x")
        self.arun(go())

    def test_what_ended_a_command(self):
        # The result keeps what the protocol says ended the command: its signal, a kill, the
        # memory cap; a destroy from elsewhere raises WorkspaceUnavailableError (BoxLite).
        async def go():
            box = await self.new_box(memory_mb=64)
            r = await box.run(["sh", "-c", "kill -TERM $$"])
            self.assertEqual((r.exit_code, r.signal, r.killed, r.oom_killed),
                             (143, 15, False, False))
            r = await box.run(["true"])
            self.assertEqual((r.exit_code, r.signal, r.killed, r.oom_killed), (0, 0, False, False))
            p = await box.exec(["sh", "-c", "echo up; sleep 30"])
            self.assertEqual(await p.stdout.readline(), b"up\n")
            p.kill()
            self.assertEqual(await p.wait(), 137)
            self.assertEqual((p.killed, p.signal, p.oom_killed), (True, 9, False))
            r = await box.run(["sh", "-c", "x=$(head -c 300000000 /dev/zero | tr '\\0' a); "
                               "echo ${#x}"], timeout=60)
            self.assertEqual((r.exit_code, r.oom_killed), (137, True), r)
            run = asyncio.ensure_future(box.run(["sh", "-c", "echo up > up.txt; sleep 60"]))
            for _ in range(400):
                if os.path.exists(os.path.join(box.mountpoint, "up.txt")):
                    break
                await asyncio.sleep(0.05)
            await cowbox.Sandbox.destroy(box.ref, cowbox=cbtest.COWBOX, home=self.home)
            with self.assertRaises(cowbox.WorkspaceUnavailableError):
                await run
            self.boxes.remove(box)
        self.arun(go())

    def test_list_logged_ref_and_a_destroy_that_finishes(self):
        # BoxLite: the id is logged as the box starts being created, list_info() finds boxes
        # left behind, and a deletion once started finishes even if its caller is cancelled.
        async def go():
            with self.assertLogs("cowbox", "INFO") as logs:
                box = await self.new_box(name="listed")
            self.assertIn(box.ref, "\n".join(logs.output))
            rows = await cowbox.Sandbox.list(cowbox=cbtest.COWBOX, home=self.home)
            row = [r for r in rows if r["ref"] == box.ref]
            self.assertEqual(len(row), 1, rows)
            self.assertEqual((row[0]["name"], row[0]["state"]), ("listed", "mounted"))
            await box.run(["true"])
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(cowbox.Sandbox.destroy(box.ref, cowbox=cbtest.COWBOX,
                                                              home=self.home), 0.05)
            self.boxes.remove(box)
            await box.close()  # its connection: the daemon is gone with the workspace
            rows = await cowbox.Sandbox.list(cowbox=cbtest.COWBOX, home=self.home)
            self.assertNotIn(box.ref, [r["ref"] for r in rows])
            self.assertFalse(os.path.exists(self.ws_dir(box.ref)))
        self.arun(go())

    def test_directories_are_invalid_requests(self):
        # read of a directory raises InvalidRequestError, write to one is invalid_request, on
        # the direct path through the mount and on the protocol's alike.
        async def go():
            box = await self.new_box()
            for direct in (True, False):
                box.direct_io = direct
                with self.assertRaises(cowbox.InvalidRequestError) as cm:
                    await box.read("src")
                self.assertIn("src", str(cm.exception))
                with self.assertRaises(cowbox.InvalidRequestError) as cm:
                    await box.write("src", b"x")
                self.assertEqual(cm.exception.code, "invalid_request")
            self.assertEqual(await box.read("src/a.py"), b"x = 1\n")
        self.arun(go())

    def test_daemon_crash_then_next_use_boots_it_again(self):
        async def go():
            box = await self.new_box()
            await box.write("kept.txt", b"before the crash\n")
            pid = self.daemon_pid(box.ref)
            os.kill(pid, 9)
            cbtest.wait_for(lambda: not cbtest.pid_alive(pid), 10, what="daemon death")
            await asyncio.sleep(0.1)  # the client sees the hang-up
            r = await box.run(["cat", "kept.txt"])
            self.assertEqual(r.stdout, "before the crash\n")
            self.assertNotEqual(self.daemon_pid(box.ref), pid)
        self.arun(go())

    def test_cancelled_run_kills_the_command(self):
        async def go():
            box = await self.new_box()
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(
                    box.run(["sh", "-c", "sleep 1.5; echo late > late.txt"]), 0.3)
            await asyncio.sleep(2)
            with self.assertRaises(cowbox.WorkspaceNotFoundError):
                await box.read("late.txt")
            self.assertEqual((await box.run(["true"])).exit_code, 0)  # the connection is fine
        self.arun(go())

    def test_bad_options_leave_nothing(self):
        async def go():
            for bad in ({"backend": "qemu"}, {"network": "some"}, {"working_dir": "../x"}):
                with self.assertRaises(cowbox.InvalidRequestError, msg=bad):
                    await self.new_box(**bad)
            wsroot = os.path.join(self.home, "workspaces")
            self.assertEqual(os.listdir(wsroot) if os.path.isdir(wsroot) else [], [])
        self.arun(go())

    def test_large_file_round_trip(self):
        async def go():
            box = await self.new_box()
            for direct in (False, True):  # protocol chunks, then straight through the mount
                box.direct_io = direct
                data = os.urandom(3 * cowbox.sandbox.CHUNK + 12345)
                await box.write("big/blob%d.bin" % direct, data)
                self.assertEqual(await box.read("big/blob%d.bin" % direct), data)
                r = await box.run(["sha256sum", "big/blob%d.bin" % direct])
                self.assertEqual(r.stdout.split()[0], hashlib.sha256(data).hexdigest())
                await box.write("small%d" % direct, b"")
                self.assertEqual(await box.read("small%d" % direct), b"")
                with self.assertRaises(cowbox.WorkspaceNotFoundError):
                    await box.read("missing%d" % direct)
            # Both paths see each other's files.
            box.direct_io = False
            self.assertEqual(len(await box.read("big/blob1.bin")), 3 * cowbox.sandbox.CHUNK + 12345)
        self.arun(go())

    def test_path_escapes_both_paths(self):
        async def go():
            box = await self.new_box()
            await box.run(["sh", "-c", "ln -s /etc etc-link; ln -s /etc/passwd pw; "
                                       "ln -s ../.. up"])
            for direct in (False, True):
                box.direct_io = direct
                for bad in ("../outside", "/etc/passwd", "etc-link/passwd", "pw", "up/x",
                            "src/../../x"):
                    with self.assertRaises(cowbox.InvalidPathError, msg=(direct, bad)):
                        await box.read(bad)
                    with self.assertRaises(cowbox.InvalidPathError, msg=(direct, bad)):
                        await box.write(bad, b"x")
                    with self.assertRaises(cowbox.InvalidPathError, msg=(direct, bad)):
                        await box.write(bad + "/deeper/file", b"x")
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "x")))
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "outside")))
        self.arun(go())

    def test_user_namespace_by_default_privileged_on_request(self):
        async def go():
            box = await self.new_box()
            r = await box.run(["sh", "-c", "id -u; cat /proc/self/uid_map; echo x > f; "
                               "stat -c %u f keep.txt"])
            words = r.stdout.split()
            self.assertEqual(r.exit_code, 0, r.stderr)
            self.assertEqual(words[0:2], ["0", "0"])
            self.assertGreaterEqual(int(words[2]), 1 << 30)  # the workspace's own range
            self.assertEqual(words[3:], ["65536", "0", "0"])  # its files are its root's
            with self.assertWarns(RuntimeWarning):
                priv = await self.new_box(privileged=True)
            r = await priv.run(["sh", "-c", "cat /proc/self/uid_map; echo x > f; stat -c %u f"])
            self.assertEqual((r.exit_code, r.stdout.split()), (0, ["0", "0", "4294967295", "0"]),
                             r.stderr)
        self.arun(go())

    def test_snapshot_deltas_equal_sha256sum(self):
        # After the first snapshot() only the changes travel (the reply says full: false)
        # and the map the client builds from them is sha256sum over the tree, also after a
        # rollback, a prune of the turn the client holds, a reattach and in a fork.
        from turnutil import files_of, tree_state
        replies = []

        def spy(box):
            real = box._request

            async def request(op, **args):
                if op != "snapshot":
                    return await real(op, **args)
                # the changes come in frames (never one reply of them all): gather them
                streamed = {"changed": {}, "deleted": []}
                inner = args.get("on_frame")

                def on_frame(msg):
                    if msg.get("stream") == "changes":
                        streamed["changed"].update(msg["changed"])
                        streamed["deleted"] += msg["deleted"]
                    if inner:
                        inner(msg)
                msg = await real(op, **dict(args, on_frame=on_frame))
                self.assertNotIn("changed", msg)
                replies.append(dict(msg, **streamed))
                return msg
            box._request = request
            return box

        async def check(box, full):
            got = await box.snapshot()
            self.assertEqual(got, files_of(tree_state(self.mountpoint(box.ref))))
            self.assertIs(replies[-1]["full"], full)
            if not full:
                self.assertNotIn("files", replies[-1])
            return got

        async def go():
            box = spy(await self.new_box())
            first = await check(box, True)
            first["src/a.py"] = "mutated by the caller"  # the client's own copy stays
            del first["README"]
            await box.run(["sh", "-c", "echo 2 > src/a.py && rm README && mkdir -p n/m && "
                           "echo new > n/m/f && ln -s keep.txt link"])
            await check(box, False)
            self.assertEqual(set(replies[-1]["changed"]), {"src/a.py", "n/m/f"})
            self.assertEqual(replies[-1]["deleted"], ["README"])
            await box.run(["sh", "-c", "rm -r n && echo 3 > keep.txt"])
            await check(box, False)
            self.assertEqual(replies[-1]["deleted"], ["n/m/f"])
            await box.rollback(1)
            await check(box, False)
            # A prune that drops the turn this client holds: the whole map, once.
            # (labelled: a snapshot with no change and no label records no turn)
            self.cowbox("snapshot", box.ref, "--label", "one")
            self.cowbox("snapshot", box.ref, "--label", "two")
            self.cowbox("prune", box.ref, "--keep", "1")
            await box.run(["sh", "-c", "echo after > pruned.txt"])
            await check(box, True)
            await box.run(["sh", "-c", "rm pruned.txt"])
            await check(box, False)
            # Reattach: the daemon starts again over the same database; deltas go on.
            await box.close()
            cbtest.wait_for(lambda: not self.daemon_pid(box.ref), 10, what="the daemon to stop")
            await box.write("back.txt", b"back\n")
            await check(box, False)
            # A fork is another database: a map of this one is never patched into it.
            fork = spy(await box.fork(box.last_turn))
            self.boxes.append(fork)
            fork._map = (box._map[0], box._map[1], dict(box._map[2]))
            await fork.write("forked.txt", b"f\n")
            await check(fork, True)
            await fork.run(["sh", "-c", "rm back.txt"])
            await check(fork, False)
            await check(box, False)
        self.arun(go())

    def test_close_attach_destroy(self):
        async def go():
            box = await cowbox.Sandbox.create(self.base, name="agent-box", cowbox=cbtest.COWBOX,
                                              home=self.home)
            await box.write("state.txt", b"kept\n")
            ref = box.ref
            await box.close()
            cbtest.wait_for(lambda: not self.daemon_pid(ref), 10, what="the daemon to stop")
            again = await cowbox.Sandbox.attach("agent-box", cowbox=cbtest.COWBOX,
                                                home=self.home)
            self.assertEqual(again.ref, ref)
            self.assertEqual(await again.read("state.txt"), b"kept\n")
            await again.snapshot()
            fork = await again.fork(again.last_turn)
            self.boxes.append(fork)
            self.assertEqual(await fork.read("state.txt"), b"kept\n")
            await again.close()
            await cowbox.Sandbox.destroy(ref, cowbox=cbtest.COWBOX, home=self.home)
            self.assertFalse(os.path.exists(self.ws_dir(ref)))
            # Gone already: quiet. Not a ref cowbox makes: refused before anything runs.
            await cowbox.Sandbox.destroy(ref, cowbox=cbtest.COWBOX, home=self.home)
            with self.assertRaises(ValueError):
                await cowbox.Sandbox.destroy("/etc", cowbox=cbtest.COWBOX, home=self.home)
            with self.assertRaises(cowbox.WorkspaceUnavailableError):
                await cowbox.Sandbox.attach("cb-" + "0" * 32, cowbox=cbtest.COWBOX,
                                            home=self.home)
            # host_url first, on a sandbox nothing has started yet (the protocol's is sync).
            box = await cowbox.Sandbox.create(self.base, cowbox=cbtest.COWBOX, home=self.home)
            await box.close()
            cold = cowbox.Sandbox(box.ref, cowbox=cbtest.COWBOX, home=self.home)
            self.boxes.append(cold)
            self.assertEqual(cold.host_url(8080), "http://127.0.0.1:8080")
            self.assertTrue(self.daemon_pid(box.ref))
            await cold.close()
            cbtest.wait_for(lambda: not self.daemon_pid(box.ref), 10, what="the daemon to stop")
        self.arun(go())

    def test_image_oci_layout(self):
        # Sandbox.create(image=...) on ns: an OCI layout (here the local podman store's image
        # with a marker layer on top) is the commands' root; a bad one fails the create,
        # naming the image, and leaves no workspace.
        import ociutil  # tests/integration
        why = ociutil.why_not_ready()
        if why:
            self.skipTest(why)
        layout = os.path.join(self.tmp, "layout")
        ociutil.copy_from_store(layout, "base")
        ociutil.add_image(layout, "base", "marked", [
            ociutil.entry("etc/cowbox-marker", data=b"from the image\n")],
            settings={"Env": ["MARK=image", "OVER=image"], "User": "nobody"})
        missing = os.path.join(self.tmp, "missing")

        async def go():
            box = await self.new_box(image="oci:%s:marked" % layout, env={"OVER": "option"})
            r = await box.run(["sh", "-c", "cat /etc/cowbox-marker README"])
            self.assertEqual(r.stdout, "from the image\nhello\n", r.stderr)
            # the image's Env under the env option, and its User (BoxLite: "commands run as
            # the image's user"; env "on top of the image's")
            r = await box.run(["sh", "-c", "echo $MARK $OVER $HOME; id -un"])
            self.assertEqual(r.stdout, "image option /home/cowbox\nnobody\n", r.stderr)
            with self.assertRaises(cowbox.WorkspaceNotFoundError) as cm:
                await self.new_box(image="oci:" + missing)
            self.assertIn("image oci:%s" % missing, str(cm.exception))
            with self.assertRaises(cowbox.InvalidRequestError) as cm:
                await self.new_box(image="oci:" + self.tmp)
            self.assertIn("not an OCI image layout", str(cm.exception))
            self.assertEqual([w["ref"] for w in self.cowbox_json("ls")], [box.ref])
        self.arun(go())


class PackagingTest(unittest.TestCase):

    def test_pip_installs_without_network(self):
        # The in-tree backend needs nothing from an index: pip builds and installs offline.
        import subprocess
        import tempfile
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        with tempfile.TemporaryDirectory() as target:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index",
                                   "--no-deps", "--quiet", "--target", target, src],
                                  capture_output=True, text=True, timeout=120,
                                  env=dict(os.environ, PIP_NO_CACHE_DIR="1",
                                           PIP_DISABLE_PIP_VERSION_CHECK="1"))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            out = subprocess.run([sys.executable, "-c", "import cowbox; print(cowbox.__file__)"],
                                 capture_output=True, text=True, cwd=target,
                                 env=dict(os.environ, PYTHONPATH=target))
            self.assertTrue(out.stdout.startswith(target), out)


if __name__ == "__main__":
    unittest.main()
