# Crash safety of the workspace filesystem: kill -9 of the mount daemon in the middle of a
# workload, mount again: the upper layer is consistent and the journal has every answered path.
import os
import sqlite3
import subprocess
import sys
import time
import unittest

import fsharness

WORKER = r"""
import os, sys
mnt, log = sys.argv[1], sys.argv[2]
out = open(log, "a")
i = 0
while True:
    p = "new/f%05d" % i
    with open(os.path.join(mnt, p), "w") as f:
        f.write("x" * 100)
    out.write(p + "\n"); out.flush()
    b = "base/b%03d" % (i % 200)
    with open(os.path.join(mnt, b), "a") as f:
        f.write("more\n")
    out.write(b + "\n"); out.flush()
    if i % 7 == 0:
        os.rename(os.path.join(mnt, p), os.path.join(mnt, p + ".r"))
        out.write(p + " " + p + ".r\n"); out.flush()
    i += 1
"""


class Crash(unittest.TestCase):
    def setUp(self):
        self.dirs = fsharness.TempDirs("state")
        os.mkdir(os.path.join(self.dirs.base, "base"))
        for i in range(200):
            with open(os.path.join(self.dirs.base, "base", "b%03d" % i), "w") as f:
                f.write("base %d\n" % i)
        self.base_digest = fsharness.tree_digest(self.dirs.base)
        self.db = os.path.join(self.dirs.state, "meta.db")
        self.mount = None

    def tearDown(self):
        if self.mount and self.mount.proc.poll() is None:
            self.mount.close()
        self.dirs.cleanup()

    def journal_paths(self):
        con = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True)
        try:
            return {row[0] for row in con.execute("SELECT path FROM journal")}
        finally:
            con.close()

    def test_kill9_loses_no_answered_change(self):
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt, db=self.db)
        os.mkdir(os.path.join(self.dirs.mnt, "new"))
        log = os.path.join(self.dirs.state, "answered")
        worker = subprocess.Popen([sys.executable, "-c", WORKER, self.dirs.mnt, log],
                                  stderr=subprocess.DEVNULL)
        time.sleep(2)
        self.mount.kill9()
        self.mount = None
        worker.wait(timeout=30)
        with open(log) as f:
            answered = f.read().split("\n")
        self.assertGreater(len(answered), 20, "the workload did not run")
        # mount again: the killed daemon's mark log is folded into the table as the database
        # opens; the upper layer is consistent, and everything answered is there
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt, db=self.db)
        journal = self.journal_paths()
        for line in answered:
            if not line.strip():
                continue
            for path in line.split():
                self.assertIn(path, journal, "answered change to %s is not journaled" % path)
        names = set(os.listdir(os.path.join(self.dirs.mnt, "new")))
        renamed = {l.split()[0] for l in answered if " " in l}
        # The rename after the last answered lines may have been done and not answered (the
        # kill fell between the two): that file may stand under its new name.
        last = [l for l in answered if l.strip()][-3:]
        for line in answered[:-1]:
            if line.startswith("new/") and " " not in line and line not in renamed:
                name = os.path.basename(line)
                if line in last and name not in names and int(name[1:]) % 7 == 0:
                    name += ".r"
                self.assertIn(name, names)
        self.assertFalse([n for n in names if n.startswith(".cbwh")], "temp whiteouts left")
        for i in range(200):
            with open(os.path.join(self.dirs.mnt, "base", "b%03d" % i)) as f:
                self.assertTrue(f.readline().startswith("base %d" % i))
        mount, self.mount = self.mount, None
        fsharness.close_checked(self, mount)
        self.assertEqual(fsharness.tree_digest(self.dirs.base), self.base_digest)

    def test_journal_kinds_and_turn_reuse(self):
        self.mount = fsharness.Mount(self.dirs.base, self.dirs.upper, self.dirs.mnt, db=self.db)
        m = self.dirs.mnt
        with open(os.path.join(m, "base", "b001"), "a") as f:
            f.write("x")
        with open(os.path.join(m, "base", "b001"), "a") as f:
            f.write("y")  # same turn: nothing new
        os.chmod(os.path.join(m, "base", "b002"), 0o600)
        os.mkdir(os.path.join(m, "d"))
        os.rename(os.path.join(m, "d"), os.path.join(m, "e"))
        os.unlink(os.path.join(m, "base", "b003"))
        mount, self.mount = self.mount, None
        fsharness.close_checked(self, mount)
        con = sqlite3.connect("file:%s?mode=ro" % self.db, uri=True)
        rows = con.execute("SELECT path, kind, subtree, pid, comm FROM journal").fetchall()
        con.close()
        kinds = {(r[0], r[1]) for r in rows}
        self.assertIn(("base/b001", 2), kinds)
        self.assertEqual(sum(1 for r in rows if r[:2] == ("base/b001", 2)), 1, rows)
        self.assertIn(("base/b002", 3), kinds)
        self.assertIn(("d", 1), kinds)
        self.assertIn(("d", 5), kinds)
        self.assertIn(("e", 6), kinds)
        self.assertIn(("base/b003", 4), kinds)
        self.assertTrue(all(r[3] > 0 for r in rows), rows)
        self.assertIn("python3", {r[4] for r in rows})
        self.assertEqual([r[2] for r in rows if r[0] == "e"], [1])


if __name__ == "__main__":
    unittest.main()
