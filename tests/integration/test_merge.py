"""cowbox merge on real mounts: two forks of a small C project bring their edits back into the
original (different files, the same file in different places, the same lines, a delete
against an edit, a binary file, a rename), the merged tree builds inside the sandbox, and a
rollback to the turn before undoes the merge."""
import json
import os
import signal
import subprocess
import sys
import unittest

from cbtest import CowboxTestCase, COWBOX, pid_alive, wait_for

PROJECT = {
    "Makefile": "prog: main.o util.o\n\tcc -o prog main.o util.o\n"
                "%.o: %.c util.h\n\tcc -c -o $@ $<\n",
    "util.h": "int add(int a, int b);\nint mul(int a, int b);\n",
    "util.c": "#include \"util.h\"\n\n"
              "int add(int a, int b)\n{\n\treturn a + b;\n}\n\n"
              "int mul(int a, int b)\n{\n\treturn a * b;\n}\n",
    "main.c": "#include <stdio.h>\n#include \"util.h\"\n\n"
              "int main(void)\n{\n\tprintf(\"%d\\n\", add(2, 3));\n"
              "\tprintf(\"%d\\n\", mul(2, 3));\n\treturn 0;\n}\n",
    "README": "a small project\nline two\nline three\n",
    "notes.txt": "to be deleted by one side\n",
    "old_name.txt": "renamed by the fork\n",
}


class MergeTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base(PROJECT)
        with open(os.path.join(self.base, "logo.bin"), "wb") as f:
            f.write(b"\x00\x01binary\x00" * 64)
        self.ref = self.create(self.base, name="main")
        self.mount(self.ref)
        self.t0 = self.snap("main")

    def snap(self, ws):
        return self.cowbox_json("snapshot", ws)["turn"]

    def mnt(self, ws):
        ref = self.ref if ws == "main" else self.forks[ws]
        return self.mountpoint(ref)

    def fork(self, name):
        out = self.cowbox_json("fork", "main", str(self.t0), "--name", name)
        self.forks = getattr(self, "forks", {})
        self.forks[name] = out["ref"]
        self.mount(out["ref"])
        return out["ref"]

    def write(self, ws, rel, data):
        path = os.path.join(self.mnt(ws), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)

    def read(self, ws, rel):
        with open(os.path.join(self.mnt(ws), rel)) as f:
            return f.read()

    def edit(self, ws, rel, old, new):
        text = self.read(ws, rel)
        self.assertIn(old, text)
        self.write(ws, rel, text.replace(old, new))

    def merge(self, *args, check=True):
        proc = self.cowbox("merge", "main", *args, "--json", check=check)
        return proc, json.loads(proc.stdout) if proc.stdout.strip() else None

    def conflicts(self, reply):
        return {c["path"]: (c["kind"], c["resolution"]) for c in reply["conflicts"]}

    def test_clean_merge_conflicts_build_and_rollback(self):
        self.forks = {}
        self.fork("a")
        # the original goes on too: edits util.c's add, deletes README's line two
        self.edit("main", "util.c", "return a + b;", "return b + a; /* main */")
        self.edit("main", "README", "line three\n", "line three (main)\n")
        self.edit("main", "main.c", "add(2, 3)", "add(20, 3)")
        self.write("main", "logo.bin", b"\x00main binary\x00" * 10)
        self.edit("main", "old_name.txt", "renamed", "kept")  # edits what the fork renames
        self.write("main", "both.txt", "made by main\n")  # created on both sides
        self.write("main", "same.txt", "the same\n")
        main_before = self.snap("main")
        # the fork: a new file, another function of util.c, the same line of main.c, the
        # binary too, deletes notes.txt, renames old_name.txt, a new directory
        self.write("a", "sub.c", "int sub(int a, int b) { return a - b; }\n")
        self.edit("a", "util.c", "return a * b;", "return a * b; /* fork */")
        self.edit("a", "util.h", "int mul(int a, int b);\n",
                  "int mul(int a, int b);\nint sub(int a, int b);\n")
        self.edit("a", "main.c", "add(2, 3)", "add(2, 30)")
        self.write("a", "logo.bin", b"\x00fork binary\x00" * 10)
        os.unlink(os.path.join(self.mnt("a"), "notes.txt"))
        os.rename(os.path.join(self.mnt("a"), "old_name.txt"),
                  os.path.join(self.mnt("a"), "new_name.txt"))
        self.write("a", "lib/extra.h", "#define EXTRA 1\n")
        self.write("a", "both.txt", "made by the fork\n")
        self.write("a", "same.txt", "the same\n")
        self.snap("a")

        # dry run: the plan, nothing written, no turn
        proc, dry = self.merge("a", "--dry-run", check=False)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertTrue(dry["dry_run"])
        self.assertIsNone(dry["turn"])
        self.assertEqual(self.read("main", "util.c").count("/* fork */"), 0)
        self.assertNotIn("new_name.txt", os.listdir(self.mnt("main")))

        proc, res = self.merge("a", check=False)
        self.assertEqual(proc.returncode, 1, proc.stderr)  # conflicts are left
        self.assertEqual(res["ancestor_turn"], 1)
        self.assertGreater(res["turn"], main_before)
        c = self.conflicts(res)
        self.assertEqual(c["main.c"], ("content", "markers"))
        self.assertEqual(c["logo.bin"], ("binary", "target"))
        self.assertEqual(c["old_name.txt"], ("delete/modify", "target"))
        self.assertEqual(c["both.txt"], ("content", "markers"))  # add/add
        self.assertNotIn("util.c", c)
        self.assertEqual(sorted(res["merged"]), sorted(
            ["both.txt", "lib", "lib/extra.h", "main.c", "new_name.txt", "notes.txt", "sub.c",
             "util.c", "util.h"]))
        both = self.read("main", "both.txt")
        self.assertIn("made by main", both)
        self.assertIn("made by the fork", both)
        self.assertIn("<<<<<<< TARGET", both)
        self.assertEqual(self.read("main", "same.txt"), "the same\n")
        # different files, and the same file in different places: clean
        util = self.read("main", "util.c")
        self.assertIn("return b + a; /* main */", util)
        self.assertIn("return a * b; /* fork */", util)
        self.assertIn("int sub(int a, int b);", self.read("main", "util.h"))
        self.assertEqual(self.read("main", "README"), self.read("main", "README"))
        self.assertIn("line three (main)", self.read("main", "README"))
        self.assertFalse(os.path.exists(os.path.join(self.mnt("main"), "notes.txt")))
        self.assertEqual(self.read("main", "new_name.txt"), "renamed by the fork\n")
        self.assertEqual(self.read("main", "lib/extra.h"), "#define EXTRA 1\n")
        # the same line: git's markers, both versions between them
        text = self.read("main", "main.c")
        self.assertIn("<<<<<<< TARGET", text)
        self.assertIn("add(20, 3)", text)
        self.assertIn("add(2, 30)", text)
        self.assertIn(">>>>>>> a", text)
        # binary and delete/modify: TARGET's versions kept
        with open(os.path.join(self.mnt("main"), "logo.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00main binary\x00" * 10)
        self.assertEqual(self.read("main", "old_name.txt"), "kept by the fork\n")
        # the turn is labelled with where it came from
        turns = self.cowbox_json("turns", "main")["turns"]
        self.assertIn("merge of a turn", turns[-1]["label"])

        # resolve the conflict by hand; the merged tree builds inside the sandbox
        self.edit("main", "main.c", self.read("main", "main.c"), PROJECT["main.c"])
        build = self.cowbox("exec", "main", "--", "sh", "-c",
                            "cd /workspace && make -s && ./prog",
                            check=False, timeout=120)
        self.assertEqual(build.returncode, 0, build.stdout + build.stderr)
        self.assertEqual(build.stdout.split()[-2:], ["5", "6"])

        # undo: rollback to the turn before the merge restores TARGET exactly
        self.cowbox("rollback", "main", str(main_before))
        self.assertNotIn("/* fork */", self.read("main", "util.c"))
        self.assertFalse(os.path.exists(os.path.join(self.mnt("main"), "sub.c")))
        self.assertTrue(os.path.exists(os.path.join(self.mnt("main"), "notes.txt")))
        self.assertFalse(os.path.exists(os.path.join(self.mnt("main"), "lib")))
        self.assertIn("add(20, 3)", self.read("main", "main.c"))
        self.assertNotIn("<<<<<<<", self.read("main", "main.c"))

    def test_strategies_and_unsnapshotted_target(self):
        self.forks = {}
        self.fork("b")
        self.edit("main", "main.c", "add(2, 3)", "add(20, 3)")
        self.write("main", "logo.bin", b"\x00main\x00")
        self.snap("main")
        self.edit("b", "main.c", "add(2, 3)", "add(2, 30)")
        self.write("b", "logo.bin", b"\x00fork\x00")
        self.snap("b")
        # an edit of TARGET not yet in a turn, on a path the merge touches: refused
        self.edit("main", "main.c", "#include <stdio.h>", "#include <stdio.h> /* io */")
        proc = self.cowbox("merge", "main", "b", check=False)
        self.assertEqual(proc.returncode, 4)  # conflict (the man page's EXIT STATUS)
        self.assertIn("main.c", proc.stderr)
        self.assertIn("nothing written", proc.stderr)
        self.assertIn("/* io */", self.read("main", "main.c"))
        self.snap("main")
        # theirs: conflicting hunks and the binary take SOURCE's; exit 0
        proc, res = self.merge("b", "--strategy", "theirs")
        self.assertEqual(self.conflicts(res)["main.c"], ("content", "source"))
        self.assertEqual(self.conflicts(res)["logo.bin"], ("binary", "source"))
        text = self.read("main", "main.c")
        self.assertIn("add(2, 30)", text)
        self.assertIn("/* io */", text)  # TARGET's other hunk stays
        self.assertNotIn("<<<<<<<", text)
        with open(os.path.join(self.mnt("main"), "logo.bin"), "rb") as f:
            self.assertEqual(f.read(), b"\x00fork\x00")
        # merging again changes nothing: TARGET has SOURCE's versions already
        proc, res = self.merge("b")
        self.assertEqual(res["merged"], [])
        self.assertEqual(res["conflicts"], [])
        self.assertIsNone(res["turn"])

    def as_command(self, ws, script):
        """Run script (python, cwd: ws's mount) in a process named "srcwriter"; its pid."""
        code = ("import ctypes, os\n"
                "ctypes.CDLL(None).prctl(15, b'srcwriter', 0, 0, 0)  # PR_SET_NAME\n"
                + script + "\nprint(os.getpid())\n")
        out = subprocess.run([sys.executable, "-c", code], cwd=self.mnt(ws), check=True,
                             capture_output=True, text=True).stdout
        return int(out.split()[-1])

    def test_audit_keeps_source_pid_and_command(self):
        self.forks = {}
        self.fork("a")
        self.edit("main", "util.c", "return a + b;", "return b + a; /* main */")
        self.snap("main")
        # in SOURCE, a command of its own: creates a file, edits util.c elsewhere (merged
        # line by line), deletes notes.txt, makes a directory with a file
        pid = self.as_command("a", (
            "open('f.txt', 'w').write('x\\n')\n"
            "t = open('util.c').read().replace('return a * b;', 'return a * b; /* a */')\n"
            "open('util.c', 'w').write(t)\n"
            "os.unlink('notes.txt')\n"
            "os.mkdir('d')\n"
            "open('d/g.txt', 'w').write('g\\n')"))
        self.snap("a")
        src = {(r["path"], r["pid"], r["comm"]) for r in self.cowbox_json("log", "a")}
        self.assertIn(("f.txt", pid, "srcwriter"), src)

        proc, res = self.merge("a")
        self.assertEqual(res["conflicts"], [], proc.stderr)
        paths = ["d", "d/g.txt", "f.txt", "notes.txt", "util.c"]
        self.assertEqual(sorted(res["merged"]), paths)
        self.assertNotIn("audit", res)
        self.assertEqual(self.read("main", "util.c").count("/* a */"), 1)
        self.assertEqual(self.read("main", "util.c").count("/* main */"), 1)
        turn = res["turn"]
        # the journal (cowbox log): every row of the merge's turn is SOURCE's command (the
        # temporary names its files are built under are never journaled)
        rows = self.cowbox_json("log", "main", "--turn", str(turn))
        self.assertEqual(sorted({r["path"] for r in rows}), paths)
        for r in rows:
            self.assertEqual((r["pid"], r["comm"]), (pid, "srcwriter"), r)
        # the turn's deltas (cowbox diff): the same
        diff = self.cowbox_json("diff", "main", str(turn - 1), str(turn))
        events = diff["events"] if isinstance(diff, dict) else diff
        self.assertEqual(sorted(e["path"] for e in events), paths)
        for e in events:
            self.assertEqual((e.get("pid"), e.get("comm")), (pid, "srcwriter"), e)
        # the map of the latest turn (what the next snapshot starts from) says so too
        import sqlite3
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.ws_dir(self.ref), "meta.db"),
                             uri=True)
        try:
            self.assertEqual(db.execute("SELECT value FROM turn_meta WHERE key='map_turn'")
                             .fetchone()[0], turn)
            got = dict(((p, (pid_, comm)) for p, pid_, comm in
                        db.execute("SELECT path, pid, comm FROM turn_map WHERE path IN "
                                   "('d', 'd/g.txt', 'f.txt', 'util.c')")))
        finally:
            db.close()
        self.assertEqual(got, {p: (pid, "srcwriter") for p in ("d", "d/g.txt", "f.txt", "util.c")})

    def test_python_both_directions(self):
        import asyncio
        import cbtest
        import cowbox

        async def main():
            box = await cowbox.Sandbox.attach("main", cowbox=cbtest.COWBOX, home=self.home)
            fork = await box.fork(self.t0, name="py")
            try:
                await fork.write("py.txt", b"from py\n")
                await fork.write("util.h", PROJECT["util.h"] + "int py(void);\n")
                await fork.snapshot()
                dry = await box.merge(fork, dry_run=True)
                self.assertEqual(sorted(dry["merged"]), ["py.txt", "util.h"])
                self.assertIsNone(dry["turn"])
                with self.assertRaises(cowbox.WorkspaceError):
                    await box.read("py.txt")
                # TARGET edited util.h and did not snapshot: refused, nothing written
                await box.write("util.h", b"unsnapshotted\n")
                with self.assertRaises(cowbox.ConflictError) as cm:
                    await box.merge("py")
                self.assertEqual(cm.exception.conflicts,
                                 ["util.h: changed in TARGET since its latest turn"])
                with self.assertRaises(cowbox.WorkspaceError):
                    await box.read("py.txt")
                await box.write("util.h", PROJECT["util.h"].encode())
                res = await box.merge("py")
                self.assertEqual(sorted(res["merged"]), ["py.txt", "util.h"])
                self.assertEqual(res["conflicts"], [])
                self.assertIsInstance(res["turn"], int)
                self.assertEqual(await box.read("py.txt"), b"from py\n")
                # the other way: the fork takes what the original did since the fork point
                await box.write("main.txt", b"from main\n")
                await box.snapshot()
                back = await fork.merge("main")
                self.assertEqual(back["ancestor_turn"], self.t0)
                self.assertEqual(back["merged"], ["main.txt"])  # py.txt is there already
                self.assertEqual(await fork.read("main.txt"), b"from main\n")
            finally:
                await fork.close()
                await box.detach()
        asyncio.run(main())

    def tree(self, root):
        out = {}
        for d, dirs, files in os.walk(root):
            for n in dirs + files:
                p = os.path.join(d, n)
                rel = os.path.relpath(p, root)
                if os.path.isdir(p):
                    out[rel] = None
                else:
                    with open(p, "rb") as f:
                        out[rel] = f.read()
        return out

    def test_kill_mid_merge_leaves_target_unchanged(self):
        self.forks = {}
        self.fork("k")
        for i in range(6):
            self.write("k", "k/k%d.txt" % i, "k %d\n" % i)
        self.edit("k", "util.c", "return a * b;", "return a * b; /* k */")
        self.snap("k")
        self.write("main", "uncommitted.txt", "not in a turn, not touched by the merge\n")
        before = self.tree(self.mnt("main"))
        self.cowbox("umount", "main")
        self.env["COWBOX_TEST_MERGE_STALL"] = "1.0"  # 4 s left after k1: a loaded machine polls late
        self.mount(self.ref)
        pid = self.daemon_pid(self.ref)
        merging = subprocess.Popen([COWBOX, "merge", "main", "k"], env=self.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        upper = os.path.join(self.ws_dir(self.ref), "upper")
        pending = os.path.join(self.ws_dir(self.ref), "merge.pending")
        # killed between two writes: part of the merge is in the tree
        wait_for(lambda: os.path.exists(os.path.join(upper, "k", "k1.txt")), 30,
                 what="the merge to write")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="the daemon to die")
        out, err = merging.communicate(timeout=30)
        self.assertNotEqual(merging.returncode, 0, (out, err))
        self.assertTrue(os.path.exists(pending))
        del self.env["COWBOX_TEST_MERGE_STALL"]
        self.mount(self.ref)
        wait_for(lambda: not os.path.exists(pending), 30, what="the undo at start")
        self.assertEqual(self.tree(self.mnt("main")), before)
        # and the merge, run again, lands whole
        proc, res = self.merge("k")
        self.assertIn("k/k5.txt", res["merged"])
        self.assertIn("/* k */", self.read("main", "util.c"))
        self.assertEqual(self.read("main", "uncommitted.txt"),
                         "not in a turn, not touched by the merge\n")

    def test_race_in_target_never_writes_outside(self):
        """A sandbox in TARGET swapping the directory the merge writes into for a symlink to a
        host directory, as fast as it can: every merge either lands inside the workspace or
        fails naming the path; nothing ever appears in the host directory."""
        self.forks = {}
        self.fork("r")
        for i in range(8):
            self.write("r", "lib/f%d.h" % i, "#define F%d %d\n" % (i, i))
        self.snap("r")
        outside = os.path.join(self.tmp, "outside")
        os.mkdir(outside)
        before = self.snap("main")
        racer = subprocess.Popen(
            [COWBOX, "exec", "main", "--", "sh", "-c",
             "cd /workspace; end=$(( $(date +%%s) + 8 )); while [ $(date +%%s) -lt $end ]; do "
             "rm -rf lib; ln -s %s lib; rm -f lib; mkdir lib; done" % outside],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        landed = refused = 0
        try:
            while racer.poll() is None:
                proc = self.cowbox("merge", "main", "r", "--json", check=False)
                if proc.returncode == 0:
                    landed += 1
                    # The racer races the rollback too: it lands or fails naming the path.
                    back = self.cowbox("rollback", "main", str(before), check=False)
                    if back.returncode != 0:
                        self.assertIn("lib", back.stderr)
                else:
                    refused += 1
                    self.assertTrue(proc.stderr or proc.stdout)
                self.assertEqual(os.listdir(outside), [])
        finally:
            racer.kill()
            racer.wait()
        self.assertEqual(os.listdir(outside), [])
        self.assertGreater(landed + refused, 0)
        print("race: %d merges landed, %d refused" % (landed, refused), file=sys.stderr)

    def test_refusals(self):
        other = self.create(self.base, name="other")
        self.assert_fails(["merge", "main", "other"], "share no fork point")
        self.assert_fails(["merge", "main", "main"], "same workspace")
        self.assert_fails(["merge", "main", "nosuch"], "nosuch")
        self.assert_fails(["merge", "main", "other", "--strategy", "best"], "--strategy",
                          status=2)
        self.assertTrue(other)


if __name__ == "__main__":
    unittest.main()
