"""The workspace commands of the cowbox CLI: create, ls, info, rm, mount, umount, log, serve,
with --json and --help, and the errors for refs and names cowbox did not make."""

import base64
import json
import os
import re
import select
import subprocess
import unittest

from cbtest import COWBOX, CowboxTestCase, is_fuse_mount

REF_RE = re.compile(r"^cb-[0-9a-f]{32}$")
COMMANDS = ["create", "mount", "umount", "ls", "info", "rm", "log", "serve"]


class TestCreate(CowboxTestCase):
    def test_create_prints_a_ref_and_records_base_and_name(self):
        base = self.make_base({"a.txt": "hello\n"})
        proc = self.cowbox("create", "--base", base, "--name", "fix-42")
        ref = proc.stdout.strip()
        self.assertRegex(ref, REF_RE)
        self.assertIn(ref, proc.stderr)  # logged as soon as the ref exists
        info = self.cowbox_json("info", "fix-42")
        self.assertEqual(info["ref"], ref)
        self.assertEqual(info["name"], "fix-42")
        self.assertEqual(info["base"], os.path.realpath(base))
        self.assertEqual(info["state"], "unmounted")
        self.assertEqual(info["pid"], 0)
        for leaf in ("meta.db", "upper", "mnt"):
            self.assertTrue(os.path.exists(os.path.join(self.ws_dir(ref), leaf)), leaf)

    def test_create_without_base_and_json(self):
        out = self.cowbox_json("create")
        self.assertRegex(out["ref"], REF_RE)
        self.assertIsNone(out["base"])
        self.assertIsNone(out["name"])
        refs = [self.create() for _ in range(3)]
        self.assertEqual(len(set(refs + [out["ref"]])), 4)

    def test_create_errors_leave_nothing_behind(self):
        base = self.make_base({"f": "x"})
        cases = [
            (["create", "--name", "../x"], "bad workspace name '../x'"),
            (["create", "--name", "cb-0123"], "may not start with 'cb-'"),
            (["create", "--name", "a b"], "bad workspace name"),
            (["create", "--name", ""], "bad workspace name"),
            (["create", "--base", os.path.join(self.tmp, "missing")], "No such file"),
            (["create", "--base", os.path.join(base, "f")], "not a directory"),
        ]
        for args, pattern in cases:
            with self.subTest(args=args):
                self.assert_fails(args, pattern)
        wsroot = os.path.join(self.home, "workspaces")
        self.assertEqual(os.listdir(wsroot) if os.path.isdir(wsroot) else [], [])

    def test_create_with_command_options(self):
        # user, shell and background as `cowbox create` flags: kept in the workspace's
        # options, followed by `cowbox exec` and by the daemon's API alike.
        ref = self.cowbox("create", "--user", "nobody", "--shell", "bash",
                          "--background", "kill").stdout.strip()
        self.assertEqual(self.cowbox("exec", ref, "--", "id", "-un").stdout, "nobody\n")
        self.assertEqual(self.cowbox("exec", ref, "--user", "0", "--", "id", "-u").stdout,
                         "0\n")
        self.assertEqual(self.cowbox("exec", ref, "--shell",
                                     "echo ${BASH_VERSION:+bash}").stdout, "bash\n")
        self.mount(ref)
        c = self.client(ref)
        opts = c.request("configure")["options"]
        self.assertEqual((opts["user"], opts["shell"], opts["background"]),
                         ("nobody", "bash", "kill"))
        r = c.request("run", shell="id -un; echo ${BASH_VERSION:+bash}")
        self.assertEqual(base64.b64decode(r["stdout"]), b"nobody\nbash\n")
        r = c.request("run", cmd=["id", "-u"], user=0)
        self.assertEqual(base64.b64decode(r["stdout"]), b"0\n")
        for bad in (["--user", "-x"], ["--shell", "zsh"], ["--background", "maybe"]):
            proc = self.cowbox("create", *bad, check=False)
            self.assertEqual(proc.returncode, 2, (bad, proc.stderr))
            self.assertIn(bad[1], proc.stderr)
        self.assertEqual(self.cowbox("exec", ref, "--user", "-x", "--", "true",
                                     check=False).returncode, 2)

    def test_create_volume_and_the_home_in_cowbox_exec(self):
        # --volume is kept like the API's volumes option; cowbox exec binds them and the
        # workspace's persistent home as the daemon's commands get them.
        shared = os.path.join(self.tmp, "shared")
        os.makedirs(shared)
        with open(os.path.join(shared, "in.txt"), "w") as f:
            f.write("in\n")
        ref = self.cowbox("create", "--volume", shared + ":/data").stdout.strip()
        with open(os.path.join(self.ws_dir(ref), "backend.json")) as f:
            opts = json.load(f)
        self.assertEqual(opts["volumes"], [[shared, "/data", "ro"]])
        self.assertEqual(self.cowbox("exec", ref, "--", "cat", "/data/in.txt").stdout, "in\n")
        self.cowbox("exec", ref, "--", "sh", "-c", "echo kept > $HOME/note")
        out = self.cowbox("exec", ref, "--", "sh", "-c", "echo $HOME; cat ~/note").stdout
        self.assertEqual(out, "/home/cowbox\nkept\n")
        self.assertNotEqual(self.cowbox("exec", ref, "--", "touch", "/data/x",
                                        check=False).returncode, 0)
        for bad in (shared, self.home + ":/h", shared + ":/workspace", shared + ":/d:rx"):
            proc = self.cowbox("create", "--volume", bad, check=False)
            self.assertNotEqual(proc.returncode, 0, bad)
            self.assertIn("volume", proc.stderr)

    def test_duplicate_name_refused(self):
        ref = self.create(name="twin")
        proc = self.assert_fails(["create", "--name", "twin"], "already used by " + ref)
        self.assertEqual(proc.stdout, "")
        self.assertEqual(len(self.cowbox_json("ls")), 1)


class TestResolve(CowboxTestCase):
    def test_refs_cowbox_did_not_make_are_refused(self):
        self.create(name="real")
        cases = [
            ("cb-xyz", "is not a cowbox ref"),
            ("cb-" + "0" * 31, "is not a cowbox ref"),
            ("cb-" + "A" * 32, "is not a cowbox ref"),
            ("../x", "neither a workspace ref nor a workspace name"),
            ("/etc", "neither a workspace ref nor a workspace name"),
            ("unknown-name", "no workspace named 'unknown-name'"),
            ("cb-" + "1" * 32, "no workspace cb-" + "1" * 32),
        ]
        for cmd in ("info", "mount", "umount", "log"):
            for arg, pattern in cases:
                with self.subTest(cmd=cmd, arg=arg):
                    self.assert_fails([cmd, arg], pattern)
        # Nothing was created or mounted on the way.
        self.assertEqual(len(os.listdir(os.path.join(self.home, "workspaces"))), 1)
        self.assertFalse([m for m in os.listdir(self.tmp) if m.startswith("cb-")])

    def test_interrupted_creation_is_refused_but_removable(self):
        ref = self.create()
        os.unlink(os.path.join(self.ws_dir(ref), "meta.db"))
        self.assert_fails(["info", ref], "not fully created")
        self.assertEqual(self.cowbox_json("ls")[0]["state"], "incomplete")
        self.cowbox("rm", ref)
        self.assertFalse(os.path.exists(self.ws_dir(ref)))

    def test_corrupt_database_is_named_and_removable(self):
        ref = self.create()
        with open(os.path.join(self.ws_dir(ref), "meta.db"), "wb") as f:
            f.write(b"\x42" * 4096)
        self.assert_fails(["info", ref], "meta.db: set WAL mode: file is not a database")
        self.assert_fails(["mount", ref], "file is not a database")
        self.assertEqual(self.cowbox_json("ls")[0]["state"], "broken")
        self.cowbox("rm", ref)
        self.assertEqual(self.cowbox_json("ls"), [])


class TestListRemove(CowboxTestCase):
    def test_ls_lists_every_workspace(self):
        self.assertEqual(self.cowbox("ls").stdout, "")
        base = self.make_base({"x": "1"})
        a = self.create(base=base, name="alpha")
        b = self.create()
        rows = self.cowbox_json("ls")
        self.assertEqual(sorted(r["ref"] for r in rows), sorted([a, b]))
        text = self.cowbox("ls").stdout
        self.assertIn("alpha", text)
        self.assertIn(a, text)
        self.assertIn("unmounted", text)

    def test_rm_deletes_and_a_gone_ref_is_quiet(self):
        ref = self.create(name="gone")
        self.cowbox("rm", "gone")
        self.assertFalse(os.path.exists(self.ws_dir(ref)))
        self.assertFalse(os.path.lexists(os.path.join(self.home, "names", "gone")))
        again = self.cowbox("rm", ref)
        self.assertEqual((again.stdout, again.stderr), ("", ""))
        never = self.cowbox("rm", "cb-" + "2" * 32)
        self.assertEqual((never.stdout, never.stderr), ("", ""))
        self.assert_fails(["rm", "cb-xyz"], "is not a cowbox ref")
        # The name is free again.
        self.create(name="gone")


class TestHelp(CowboxTestCase):
    def test_help_and_usage_errors(self):
        top = self.cowbox("--help").stdout
        for cmd in COMMANDS:
            with self.subTest(cmd=cmd):
                self.assertIn(cmd, top)
                out = self.cowbox(cmd, "--help").stdout
                self.assertTrue(out.startswith("usage: cowbox " + cmd), out)
                self.assert_fails([cmd, "--no-such-option"], "unknown option", status=2)
        self.assert_fails(["frobnicate"], "unknown command", status=2)
        self.assert_fails(["info"], "usage:", status=2)
        self.assert_fails(["log", "x", "--turn", "0"], "bad turn", status=2)
        self.assert_fails(["log", "x", "--turn", "zero"], "no workspace named", status=3)


class TestMount(CowboxTestCase):
    def test_mount_write_log_umount_mount_again(self):
        base = self.make_base({"src/a.c": "int a;\n", "README": "base\n"})
        ref = self.create(base=base, name="demo")
        pid = self.mount("demo")
        mnt = self.mountpoint(ref)
        info = self.cowbox_json("info", ref)
        self.assertEqual(info["state"], "mounted")
        self.assertEqual(info["pid"], pid)
        self.assertEqual(info["mountpoint"], mnt)
        with open(os.path.join(mnt, "src/a.c")) as f:
            self.assertEqual(f.read(), "int a;\n")
        with open(os.path.join(mnt, "src/a.c"), "a") as f:
            f.write("int b;\n")
        with open(os.path.join(mnt, "new.txt"), "w") as f:
            f.write("new\n")
        rows = self.log(ref)
        seen = {(r["path"], r["kind"]) for r in rows}
        self.assertIn(("src/a.c", "write"), seen)
        self.assertIn(("new.txt", "create"), seen)
        self.assertTrue(all(r["turn"] == 1 and r["pid"] > 0 for r in rows), rows)
        self.assertEqual(self.log(ref, "--turn", "1"), rows)
        self.assertEqual(self.log(ref, "--turn", "2"), [])
        self.assertIn("new.txt", self.cowbox("log", ref).stdout)
        # Mounting again while mounted is a no-op that reports the same daemon.
        self.assertEqual(self.mount(ref), pid)

        self.cowbox("umount", ref)
        self.assertFalse(is_fuse_mount(mnt))
        self.assertEqual(self.cowbox_json("info", ref)["state"], "unmounted")
        self.assertFalse(os.path.exists(os.path.join(self.ws_dir(ref), "control.sock")))
        with open(os.path.join(base, "src/a.c")) as f:
            self.assertEqual(f.read(), "int a;\n")  # the base is never written
        self.assertIn("was not mounted", self.cowbox("umount", ref).stdout)

        self.mount(ref)
        with open(os.path.join(mnt, "src/a.c")) as f:
            self.assertEqual(f.read(), "int a;\nint b;\n")
        with open(os.path.join(mnt, "new.txt")) as f:
            self.assertEqual(f.read(), "new\n")
        self.assertGreater(self.cowbox_json("info", ref)["upper_bytes"], 0)
        # changes no snapshot recorded: rm asks for -f
        self.assert_fails(["rm", ref], "no snapshot recorded", status=4)
        self.cowbox("rm", "-f", ref)
        self.assertFalse(is_fuse_mount(mnt))
        self.assertFalse(os.path.exists(self.ws_dir(ref)))

    def test_mount_at_a_chosen_directory(self):
        ref = self.create()
        where = os.path.join(self.tmp, "elsewhere")
        os.mkdir(where)
        pid = self.mount(ref, where)
        self.assertTrue(is_fuse_mount(where))
        self.assertEqual(self.cowbox_json("info", ref)["mountpoint"], where)
        other = os.path.join(self.tmp, "other")
        os.mkdir(other)
        self.assert_fails(["mount", ref, other], "already mounted at %s by pid %d" % (where, pid))
        self.assert_fails(["mount", self.create(), os.path.join(self.tmp, "nope")],
                          "No such file")
        self.cowbox("umount", ref)
        self.assertFalse(is_fuse_mount(where))

    def test_daemon_does_not_keep_the_callers_fds(self):
        ref = self.create()
        r, w = os.pipe()
        try:
            proc = subprocess.run([COWBOX, "mount", ref], env=self.env, pass_fds=[w],
                                  capture_output=True, timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            os.close(w)
            w = -1
            ready, _, _ = select.select([r], [], [], 5)
            self.assertTrue(ready and os.read(r, 1) == b"",
                            "the daemon inherited the caller's pipe")
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)

    def test_racing_mounts_share_one_daemon(self):
        ref = self.create()
        procs = [subprocess.Popen([COWBOX, "mount", ref, "--json"], env=self.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        outs = [p.communicate(timeout=60) for p in procs]
        self.assertEqual([p.returncode for p in procs], [0] * 4, outs)
        pids = {json.loads(out)["pid"] for out, _ in outs}
        self.assertEqual(len(pids), 1, outs)
        self.assertEqual(self.daemon_pid(ref), pids.pop())

    def test_second_serve_is_refused_with_the_owner_pid(self):
        ref = self.create()
        pid = self.mount(ref)
        self.assert_fails(["serve", ref, "--foreground"],
                          "workspace %s is in use by pid %d" % (ref, pid))
        self.assert_fails(["mount", ref, "--foreground"], "in use by pid %d" % pid)
        self.assertTrue(is_fuse_mount(self.mountpoint(ref)))
        self.assertEqual(self.client(ref).request("ping")["ok"], True)


if __name__ == "__main__":
    unittest.main()
