"""Nothing unrecorded is lost by a rollback: the open turn's changes (edits, deletes, renames,
a new directory) become a turn of their own first, and rolling back to it gives back every
byte; an empty open turn records nothing. Turns keep the metadata of files, directories and
symlinks (modification times to the nanosecond, modes, owners, xattrs) and hard links between
files: rollback, fork and apply give them back, so make in a fork rebuilds only what
changed."""

import os
import shutil
import sqlite3
import stat
import unittest

import cbtest  # noqa: E402
from cbtest import CowboxTestCase
from turnutil import sha256_file, tree_state


class KeepOpenTurnTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.base = self.make_base({"README": "hello\n", "src/a.c": "int a;\n",
                                    "src/b.c": "int b;\n", "docs/x.md": "x\n",
                                    "docs/deep/y.md": "y\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def read(self, rel):
        with open(self.p(rel)) as f:
            return f.read()

    def labels(self):
        return {t["turn"]: t["label"] for t in self.cowbox_json("turns", "w")["turns"]}

    def test_rollback_keeps_every_unsnapshotted_change(self):
        with open(self.p("src/a.c"), "w") as f:
            f.write("int a = 1;\n")
        self.cowbox_json("snapshot", "w")  # turn 1
        at_turn1 = tree_state(self.mnt)
        # after the last snapshot: an edit, a delete, a rename, a new directory with files,
        # a mode change, a directory deleted whole, a symlink
        with open(self.p("README"), "a") as f:
            f.write("edited after the snapshot\n")
        os.unlink(self.p("src/b.c"))
        os.rename(self.p("src/a.c"), self.p("src/renamed.c"))
        os.makedirs(self.p("new/dir"))
        with open(self.p("new/dir/f.bin"), "wb") as f:
            f.write(os.urandom(300000))
        os.chmod(self.p("docs/x.md"), 0o600)
        os.unlink(self.p("docs/deep/y.md"))
        os.rmdir(self.p("docs/deep"))
        os.symlink("../README", self.p("new/link"))
        before = tree_state(self.mnt)
        self.assertNotEqual(before, at_turn1)

        r = self.cowbox_json("rollback", "w", "1")
        self.assertEqual(r["kept_turn"], 2, r)
        self.assertEqual(r["turn"], 3, r)
        self.assertEqual(tree_state(self.mnt), at_turn1)
        labels = self.labels()
        self.assertEqual(labels[2], "before rollback to 1")
        self.assertEqual(labels[3], "rollback to 1")

        # the kept turn gives back every byte (sha256 of every file), mode and target
        r = self.cowbox_json("rollback", "w", "2")
        self.assertEqual(r["kept_turn"], 0, r)  # nothing changed since the rollback's turn
        self.assertEqual(tree_state(self.mnt), before)
        self.assertEqual(tree_state(self.mnt)["new/dir/f.bin"], before["new/dir/f.bin"])

    def test_empty_open_turn_records_nothing(self):
        with open(self.p("README"), "w") as f:
            f.write("changed\n")
        self.cowbox_json("snapshot", "w")  # turn 1
        # nothing changed since turn 1: no turn 2 (the answer is turn 1)
        self.assertEqual(self.cowbox_json("snapshot", "w")["turn"], 1)
        r = self.cowbox_json("rollback", "w", "0")
        self.assertEqual(r["kept_turn"], 0, r)
        self.assertEqual(r["turn"], 2, r)
        self.assertNotIn("before rollback to 0", self.labels().values())
        self.assertEqual(self.read("README"), "hello\n")

    def test_cli_names_the_kept_turn_and_first_rollback_keeps_too(self):
        # no snapshot at all yet: the open turn 1 is kept as turn 1 before rolling back to 0
        with open(self.p("src/new.c"), "w") as f:
            f.write("int n;\n")
        out = self.cowbox("rollback", "w", "0").stdout
        self.assertIn("kept as turn 1", out)
        self.assertFalse(os.path.exists(self.p("src/new.c")))
        self.cowbox("rollback", "w", "1")
        self.assertEqual(self.read("src/new.c"), "int n;\n")


def xattrs(path):
    """user.* xattrs (the ACL, whose ids are host ids of a range, is compared by getfacl)."""
    return {n: os.getxattr(path, n, follow_symlinks=False)
            for n in sorted(os.listxattr(path, follow_symlinks=False)) if n.startswith("user.")}


def meta_state(root):
    """{path: (kind, mode, mtime_ns, owner, xattrs, sha256 of files; targets of symlinks)}."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), st.st_mtime_ns,
                            (st.st_uid % 65536, st.st_gid % 65536), xattrs(full),
                            sha256_file(full))
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
    return out


class TurnTimesTest(CowboxTestCase):
    """Modification times (ns) are recorded with a file's content and given back."""

    T2020 = 1577836800 * 10**9 + 123456789  # 2020-01-01, with nanoseconds

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"README": "hello\n", "src/a.c": "int a;\n",
                                    "src/b.c": "int b;\n"})
        os.utime(os.path.join(self.base, "src/b.c"), ns=(self.T2020, self.T2020 - 10**9))
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def p(self, rel, root=None):
        return os.path.join(root or self.mnt, rel)

    def test_fork_and_rollback_give_back_times_modes_and_targets(self):
        os.makedirs(self.p("new/deep"))
        with open(self.p("new/deep/f.txt"), "w") as f:
            f.write("new\n")
        os.utime(self.p("new/deep/f.txt"), ns=(self.T2020, self.T2020))
        with open(self.p("src/a.c"), "a") as f:  # a base file, changed
            f.write("int a2;\n")
        os.chmod(self.p("src/a.c"), 0o640)
        os.utime(self.p("src/a.c"), ns=(self.T2020, self.T2020 + 5))
        os.symlink("deep/f.txt", self.p("new/link"))
        with open(self.p("exec.sh"), "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(self.p("exec.sh"), 0o751)
        os.utime(self.p("exec.sh"), ns=(0, 42))  # the epoch itself is a time too
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        at_t1 = meta_state(self.mnt)
        self.assertEqual(at_t1["src/a.c"][2], self.T2020 + 5)

        # fork: every file's time, mode and content as at t1 (the base's own for src/b.c)
        fork = self.cowbox_json("fork", "w", str(t1), "--name", "f")["ref"]
        self.mount(fork)
        self.assertEqual(meta_state(self.mountpoint(fork)), at_t1)

        # rollback: rewrite, delete, retime, then back to t1
        with open(self.p("src/a.c"), "w") as f:
            f.write("rewritten\n")
        os.unlink(self.p("new/deep/f.txt"))
        with open(self.p("exec.sh"), "a") as f:
            f.write("echo\n")
        with open(self.p("src/b.c"), "a") as f:  # a base file: restored with its own time
            f.write("x\n")
        self.cowbox_json("snapshot", "w")
        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(meta_state(self.mnt), at_t1)

    def test_a_database_from_before_the_columns_opens_and_restores(self):
        with open(self.p("f"), "w") as f:
            f.write("one\n")
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        self.cowbox("umount", self.ref)
        db = sqlite3.connect(os.path.join(self.ws_dir(self.ref), "meta.db"))
        for table in ("turn_delta", "turn_map", "base_map"):
            for col in ("mtime_ns", "uid", "gid", "xattrs"):
                db.execute("ALTER TABLE %s DROP COLUMN %s" % (table, col))
        db.commit()
        db.close()
        self.mount(self.ref)
        with open(self.p("f"), "w") as f:
            f.write("two\n")
        self.cowbox_json("snapshot", "w")
        self.cowbox_json("rollback", "w", str(t1))  # its row has no time: the restore's
        with open(self.p("f")) as f:
            self.assertEqual(f.read(), "one\n")
        os.utime(self.p("f"), ns=(self.T2020, self.T2020))
        t3 = self.cowbox_json("snapshot", "w")["turn"]
        with open(self.p("f"), "w") as f:
            f.write("three\n")
        self.cowbox_json("rollback", "w", str(t3))
        self.assertEqual(os.stat(self.p("f")).st_mtime_ns, self.T2020)

    def test_a_time_alone_is_recorded_without_an_event(self):
        with open(self.p("f"), "w") as f:
            f.write("same\n")
        self.cowbox_json("snapshot", "w")
        os.utime(self.p("f"), ns=(self.T2020, self.T2020))  # touch -d: no content change
        snap = self.cowbox_json("snapshot", "w", "--changes")
        t2 = snap["turn"]
        self.assertEqual(snap.get("changes", []), [])
        self.assertEqual(self.cowbox_json("diff", "w", str(t2 - 1), str(t2))["events"], [])
        with open(self.p("f"), "w") as f:
            f.write("other\n")
        self.cowbox_json("rollback", "w", str(t2))
        self.assertEqual(os.stat(self.p("f")).st_mtime_ns, self.T2020)


class TurnOwnersXattrsTest(CowboxTestCase):
    """Owner and group as the sandbox sees them, user.* xattrs and the POSIX ACL (named ids
    in the sandbox's terms) are kept with a file and given back by fork and rollback."""

    T2020 = 1577836800 * 10**9

    def acl(self, ref):
        return self.cowbox("exec", ref, "--", "sh", "-c",
                           "cd /workspace && getfacl -n o.txt && stat -c '%u:%g %a' o.txt"
                           ).stdout

    def test_owner_xattrs_and_acl_come_back(self):
        base = self.make_base({"README": "hi\n"})
        ref = self.create(base, "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        self.cowbox("exec", ref, "--", "sh", "-c",
                    "cd /workspace && echo x > o.txt && chown 1000:2000 o.txt && "
                    "chmod 640 o.txt && setfacl -m u:1234:rw o.txt")
        f = os.path.join(mnt, "o.txt")
        os.setxattr(f, "user.note", b"kept\0bytes")
        os.utime(f, ns=(self.T2020, self.T2020))
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state, acl = meta_state(mnt), self.acl(ref)
        self.assertIn("user:1234:rw-", acl)
        self.assertIn("1000:2000", acl)
        self.assertEqual(state["o.txt"][4], {"user.note": b"kept\0bytes"})

        fork = self.cowbox_json("fork", "w", str(t1), "--name", "f")["ref"]
        self.mount(fork)
        self.assertEqual(meta_state(self.mountpoint(fork)), state)
        self.assertEqual(self.acl(fork), acl)

        with open(f, "w") as out:
            out.write("rewritten\n")
        os.removexattr(f, "user.note")
        self.cowbox("exec", ref, "--", "sh", "-c",
                    "cd /workspace && chown 0:0 o.txt && setfacl -b o.txt")
        self.cowbox_json("snapshot", "w")
        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(meta_state(mnt), state)
        self.assertEqual(self.acl(ref), acl)


def full_state(root, owners=True):
    """{path: lstat's kind, mode, mtime_ns, owner (sandbox ids; None without owners), user.*
    xattrs, and the sha256 of a file or the target of a symlink}, directories and symlinks
    included."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            kind = stat.S_IFMT(st.st_mode)
            owner = (st.st_uid % 65536, st.st_gid % 65536) if owners else None
            if stat.S_ISLNK(st.st_mode):
                what, attrs = os.readlink(full), {}
            else:
                what = sha256_file(full) if stat.S_ISREG(st.st_mode) else None
                attrs = xattrs(full)
            out[os.path.relpath(full, root)] = (kind, stat.S_IMODE(st.st_mode),
                                                st.st_mtime_ns, owner, attrs, what)
    return out


class TurnDirsSymlinksTest(CowboxTestCase):
    """Directories and symlinks keep their metadata as files do: mtime (a directory's after
    everything in it was written), mode, owner, xattrs; rollback, fork and apply give it
    back."""

    T2020 = 1577836800 * 10**9 + 123456789

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"README": "hi\n", "src/a.c": "int a;\n",
                                    "docs/x.md": "x\n", "keep/k.txt": "k\n"})
        self.ref = self.create(self.base, "w")
        self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def p(self, rel, root=None):
        return os.path.join(root or self.mnt, rel)

    def sh(self, ref, script):
        return self.cowbox("exec", ref, "--", "sh", "-c", "cd /workspace && " + script).stdout

    def acls(self, ref):
        return self.sh(ref, "getfacl -n new/deep src | grep -v '^#'")

    def test_fork_rollback_and_apply_give_back_dirs_and_symlinks(self):
        t = self.T2020
        os.makedirs(self.p("new/deep"))
        with open(self.p("new/deep/f.txt"), "w") as f:
            f.write("f\n")
        os.symlink("deep/f.txt", self.p("new/link"))
        os.symlink("../README", self.p("src/up"))
        with open(self.p("docs/y.md"), "w") as f:  # docs' own time moves, nobody sets it
            f.write("y\n")
        self.sh(self.ref, "chown 1000:2000 new/deep && chown -h 1001:1002 new/link && "
                "chmod 750 new/deep && chmod 711 src && setfacl -m u:1234:rx new/deep")
        os.setxattr(self.p("new/deep"), "user.dir", b"a dir\0value")
        os.setxattr(self.p("src"), "user.base", b"on a base dir")
        os.utime(self.p("new/deep/f.txt"), ns=(t, t + 1))
        os.utime(self.p("new/link"), ns=(t, t + 2), follow_symlinks=False)
        os.utime(self.p("src/up"), ns=(t, t + 3), follow_symlinks=False)
        os.utime(self.p("new/deep"), ns=(t, t + 4))
        os.utime(self.p("new"), ns=(t, t + 5))
        os.utime(self.p("src"), ns=(t, t + 6))
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state, acls = full_state(self.mnt), self.acls(self.ref)
        self.assertEqual(state["new/deep"][2], t + 4)
        self.assertEqual(state["new/link"][2:4], (t + 2, (1001, 1002)))
        self.assertEqual(state["new/deep"][1:5],
                         (0o750, t + 4, (1000, 2000), {"user.dir": b"a dir\0value"}))
        self.assertIn("user:1234:r-x", acls)

        fork = self.cowbox_json("fork", "w", str(t1), "--name", "f")["ref"]
        self.mount(fork)
        self.assertEqual(full_state(self.mountpoint(fork)), state)
        self.assertEqual(self.acls(fork), acls)

        # everything moved again: times, modes, owners, xattrs, a name made in a directory
        with open(self.p("new/deep/g.txt"), "w") as f:
            f.write("g\n")
        os.unlink(self.p("src/up"))
        os.symlink("../README", self.p("src/up"))
        os.utime(self.p("new/link"), ns=(t + 99, t + 99), follow_symlinks=False)
        os.utime(self.p("new"), ns=(t + 99, t + 99))
        os.removexattr(self.p("new/deep"), "user.dir")
        os.setxattr(self.p("new/deep"), "user.later", b"x")
        os.setxattr(self.p("src"), "user.base", b"changed")
        self.sh(self.ref, "chown 0:0 new/deep && chown -h 0:0 new/link && chmod 755 src && "
                "setfacl -b new/deep && chmod 700 new")
        self.cowbox_json("snapshot", "w")
        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(full_state(self.mnt), state)
        self.assertEqual(self.acls(self.ref), acls)

        # apply onto a copy of the base: times, modes and user.* xattrs (no owners)
        dst = os.path.join(self.tmp, "dst")
        shutil.copytree(self.base, dst, symlinks=True)
        for name in ("docs", "src", "keep"):  # the base's own times, as the mount shows
            st = os.stat(os.path.join(self.base, name))
            os.utime(os.path.join(dst, name), ns=(st.st_atime_ns, st.st_mtime_ns))
        self.cowbox_json("apply", "w", "--turn", str(t1), "--to", dst)
        self.maxDiff = None
        self.assertEqual(full_state(dst, owners=False), full_state(self.mnt, owners=False))



def link_groups(root):
    """The sets of names (relative) of each file with more than one, and their link counts."""
    inodes = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                inodes.setdefault((st.st_dev, st.st_ino), []).append(
                    (os.path.relpath(full, root), st.st_nlink))
    return sorted((sorted(p for p, _ in names), sorted(n for _, n in names))
                  for names in inodes.values())


class TurnHardLinksTest(CowboxTestCase):
    """Files that are hard links of each other in a turn come back as one inode."""

    T2020 = 1577836800 * 10**9

    def test_fork_rollback_and_apply_keep_hard_links(self):
        base = self.make_base({"README": "hi\n", "src/a.c": "int a;\n"})
        ref = self.create(base, "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        p = lambda rel: os.path.join(mnt, rel)  # noqa: E731
        os.makedirs(p("new"))
        os.makedirs(p("other"))
        with open(p("new/h1"), "w") as f:
            f.write("shared\n")
        os.link(p("new/h1"), p("new/h2"))
        os.link(p("new/h1"), p("other/h3"))
        os.link(p("src/a.c"), p("src/a2.c"))  # a base file gets a second name
        os.setxattr(p("new/h1"), "user.k", b"v")
        os.utime(p("new/h2"), ns=(self.T2020, self.T2020))
        os.utime(p("src/a2.c"), ns=(self.T2020, self.T2020 + 7))
        for d in ("new", "other", "src"):
            os.utime(p(d), ns=(self.T2020, self.T2020 + 1))
        t1 = self.cowbox_json("snapshot", "w")["turn"]
        state, groups = full_state(mnt), link_groups(mnt)
        self.assertEqual(groups, [(["new/h1", "new/h2", "other/h3"], [3, 3, 3]),
                                  (["src/a.c", "src/a2.c"], [2, 2])])

        fork = self.cowbox_json("fork", "w", str(t1), "--name", "f")["ref"]
        self.mount(fork)
        self.assertEqual(link_groups(self.mountpoint(fork)), groups)
        self.assertEqual(full_state(self.mountpoint(fork)), state)

        # the links broken every way: a name replaced, one copied over, the content rewritten
        os.unlink(p("new/h2"))
        with open(p("new/h2"), "w") as f:
            f.write("alone\n")
        shutil.copy2(p("other/h3"), p("other/h3.tmp"))
        os.rename(p("other/h3.tmp"), p("other/h3"))
        os.unlink(p("src/a2.c"))
        with open(p("src/a.c"), "w") as f:
            f.write("int a = 2;\n")
        self.cowbox_json("snapshot", "w")
        self.assertEqual(link_groups(mnt), [])
        self.cowbox_json("rollback", "w", str(t1))
        self.assertEqual(link_groups(mnt), groups)
        self.assertEqual(full_state(mnt), state)

        # a later snapshot of a group left alone keeps it; one name moved keeps its group
        os.rename(p("other/h3"), p("h3"))
        t3 = self.cowbox_json("snapshot", "w")["turn"]
        moved = link_groups(mnt)
        self.assertEqual(moved[0][0], ["h3", "new/h1", "new/h2"])
        os.unlink(p("new/h1"))
        self.cowbox_json("rollback", "w", str(t3))
        self.assertEqual(link_groups(mnt), moved)

        # apply onto a copy of the base: the same groups
        dst = os.path.join(self.tmp, "dst")
        shutil.copytree(base, dst, symlinks=True)
        self.cowbox_json("apply", "w", "--turn", str(t1), "--to", dst)
        self.assertEqual(link_groups(dst), groups)


MAKEFILE = """\
prog: main.o a.o b.o
\tcc -o prog main.o a.o b.o
%.o: %.c
\tcc -c -o $@ $<
"""


class MakeInForkTest(CowboxTestCase):
    """A C project built inside the sandbox, one file edited, forked: make in the fork
    rebuilds only that file's object (and the program)."""

    def test_make_in_a_fork_rebuilds_only_the_edited_file(self):
        base = self.make_base({"Makefile": MAKEFILE, "main.c": "int a(void); int b(void);\n"
                               "int main(void) { return a() + b(); }\n",
                               "a.c": "int a(void) { return 0; }\n",
                               "b.c": "int b(void) { return 0; }\n"})
        old = 1577836800 * 10**9
        for name in ("Makefile", "main.c", "a.c", "b.c"):
            os.utime(os.path.join(base, name), ns=(old, old))
        ref = self.create(base, "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        self.cowbox("exec", ref, "--", "make")
        self.assertTrue(os.path.exists(os.path.join(mnt, "prog")))
        self.assertEqual(self.cowbox("exec", ref, "--", "make", "-q", check=False).returncode,
                         0)
        # a.c edited, newer than every object
        newest = max(os.stat(os.path.join(mnt, n)).st_mtime_ns for n in ("a.o", "prog"))
        with open(os.path.join(mnt, "a.c"), "w") as f:
            f.write("int a(void) { return 1 - 1; }\n")
        os.utime(os.path.join(mnt, "a.c"), ns=(newest + 10**9, newest + 10**9))
        turn = self.cowbox_json("snapshot", "w")["turn"]
        fork = self.cowbox_json("fork", "w", str(turn), "--name", "f")["ref"]
        self.mount(fork)
        self.assertEqual(self.cowbox("exec", fork, "--", "make", "-q",
                                     check=False).returncode, 1)
        plan = self.cowbox("exec", fork, "--", "make", "-n").stdout.splitlines()
        self.assertEqual(plan, ["cc -c -o a.o a.c", "cc -o prog main.o a.o b.o"])
        # and in the original, the same step plans the same
        plan = self.cowbox("exec", ref, "--", "make", "-n").stdout.splitlines()
        self.assertEqual(plan, ["cc -c -o a.o a.c", "cc -o prog main.o a.o b.o"])


if __name__ == "__main__":
    unittest.main()
