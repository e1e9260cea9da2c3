"""Property test of turns on a real mount: random writes, renames of files and directories,
deletes, chmods, symlinks, hard links and truncates with snapshots at random points. Every
snapshot equals sha256sum over the tree (the CLI's whole map, and the map a client keeps up to
date from the changes since its last turn: the protocol's snapshot `since`, also after a
prune, a remount and in a fork), every diff equals the difference of two states,
every rollback restores its turn exactly (content, modes, symlinks, directories), also after
a remount. Prints its seed; COWBOX_SEED=N replays a run."""

import os
import random
import shutil
import sys
import unittest

import cbtest
from cbtest import CowboxTestCase
from turnutil import expected_events, files_of, tree_state

STEPS = int(os.environ.get("COWBOX_TURNS_STEPS", "300"))


class Mutator:
    """Random changes to the tree under root (the mount point)."""

    def __init__(self, rng, root):
        self.rng, self.root = rng, root

    def entries(self, kind):
        st = tree_state(self.root)
        return sorted(p for p, v in st.items() if v[0] == kind)

    def any_dir(self):
        return self.rng.choice([""] + self.entries("dir"))

    def new_name(self, parent):
        # now and then a name that needs care: spaces, a backslash, a newline, non-ASCII
        odd = self.rng.choice(["", "", "", "", " sp ace", "back\\slash", "new\nline", "ü-ñ"])
        return os.path.join(parent, "n%d%s" % (self.rng.randrange(10**6), odd))

    def content(self):
        r = self.rng.random()
        if r < 0.1:
            return b""
        if r < 0.2:
            return bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 300)))
        n = self.rng.choice([1, 10, 100, 1000, 20000])
        return ("".join(self.rng.choice("abc \n") for _ in range(n))).encode()

    def p(self, rel):
        return os.path.join(self.root, rel)

    def step(self):
        rng = self.rng
        files, dirs = self.entries("file"), self.entries("dir")
        op = rng.choice(["write", "write", "new", "new", "append", "truncate", "unlink",
                         "rename", "rename_dir", "mkdir", "rmtree", "chmod", "chmod_dir",
                         "symlink", "hardlink", "retype"])
        if op in ("write", "append", "truncate", "unlink", "rename", "chmod", "hardlink") \
                and not files:
            op = "new"
        if op in ("rename_dir", "rmtree", "chmod_dir") and not dirs:
            op = "mkdir"
        if op == "write":
            with open(self.p(rng.choice(files)), "wb") as f:
                f.write(self.content())
        elif op == "new":
            with open(self.p(self.new_name(self.any_dir())), "wb") as f:
                f.write(self.content())
        elif op == "append":
            with open(self.p(rng.choice(files)), "ab") as f:
                f.write(self.content())
        elif op == "truncate":
            path = self.p(rng.choice(files))
            os.truncate(path, rng.randrange(os.path.getsize(path) + 1))
        elif op == "unlink":
            os.unlink(self.p(rng.choice(files)))
        elif op == "rename":
            src = rng.choice(files)
            dst = rng.choice(files) if rng.random() < 0.3 else self.new_name(self.any_dir())
            os.rename(self.p(src), self.p(dst))
        elif op == "rename_dir":
            src = rng.choice(dirs)
            parent = self.any_dir()
            if parent == src or parent.startswith(src + "/"):
                parent = ""
            os.rename(self.p(src), self.p(self.new_name(parent)))
        elif op == "mkdir":
            os.mkdir(self.p(self.new_name(self.any_dir())), rng.choice([0o755, 0o700, 0o750]))
        elif op == "rmtree":
            shutil.rmtree(self.p(rng.choice(dirs)))
        elif op == "chmod":
            os.chmod(self.p(rng.choice(files)),
                     rng.choice([0o644, 0o600, 0o755, 0o444, 0o666, 0o777]))
        elif op == "chmod_dir":
            # 0777 and the sticky bit: modes a umask would change, had it been used
            os.chmod(self.p(rng.choice(dirs)), rng.choice([0o755, 0o700, 0o750, 0o777, 0o1777]))
        elif op == "symlink":
            target = rng.choice(files + ["nowhere", "../x"])
            os.symlink(target, self.p(self.new_name(self.any_dir())))
        elif op == "hardlink":
            os.link(self.p(rng.choice(files)), self.p(self.new_name(self.any_dir())))
        elif op == "retype":
            # the same path becomes another type: file -> dir, dir -> file, link -> file
            links = self.entries("symlink")
            kind = rng.choice(["file", "dir", "link"])
            if kind == "file" and files:
                path = rng.choice(files)
                os.unlink(self.p(path))
                os.mkdir(self.p(path))
            elif kind == "dir" and dirs:
                path = rng.choice(dirs)
                shutil.rmtree(self.p(path))
                with open(self.p(path), "wb") as f:
                    f.write(self.content())
            elif links:
                path = rng.choice(links)
                os.unlink(self.p(path))
                with open(self.p(path), "wb") as f:
                    f.write(self.content())
        return op


class TurnsPropertyTest(CowboxTestCase):
    def test_random_turns(self):
        seed = int(os.environ.get("COWBOX_SEED", random.randrange(2**32)))
        print("COWBOX_SEED=%d" % seed, file=sys.stderr, flush=True)
        rng = random.Random(seed)
        base_files = {"f%d.txt" % i: "base %d\n" % i for i in range(8)}
        base_files.update({"d%d/g%d.c" % (i % 3, i): "int g%d;\n" % i for i in range(12)})
        base_files["d0/deep/er/h.txt"] = "deep\n"
        ref = self.create(self.make_base(base_files), "prop")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        mut = Mutator(rng, mnt)
        states = {}  # turn -> tree state
        held = {}  # the delta client's map: turn, map_id, files
        oldest = [0]  # the oldest turn kept (after a prune)

        def delta_snapshot(ref, expect_full=None):
            """A client that keeps its map and asks only for the changes since its turn."""
            args = {"label": "prop", "files": True}
            if held:
                args.update(since=held["turn"], map_id=held["map_id"])
            c = cbtest.Client(os.path.join(self.ws_dir(ref), "control.sock"))
            try:
                snap = c.request("snapshot", **args)
            finally:
                c.close()
            self.assertNotIn("error", snap)
            if expect_full is None:
                expect_full = not held or held["turn"] < oldest[0]
            self.assertIs(snap["full"], expect_full, "seed %d: turn %d from %s" % (
                seed, snap["turn"], held.get("turn")))
            if snap["full"]:
                files = snap["files"]
            else:
                files = dict(held["files"])
                for path in snap["deleted"]:
                    self.assertIn(path, files, "seed %d: deleted %s" % (seed, path))
                    del files[path]
                files.update(snap["changed"])
            held.update(turn=snap["turn"], map_id=snap["map_id"], files=files)
            return dict(snap, files=files)

        def snapshot(delta=None):
            if not (delta if delta is not None else rng.random() < 0.5):
                snap = self.cowbox_json("snapshot", "prop")
            else:
                snap = delta_snapshot(ref)
            state = tree_state(mnt)
            self.assertEqual(snap["files"], files_of(state),
                             "seed %d: snapshot %d != sha256sum of the tree" % (seed,
                                                                                snap["turn"]))
            states[snap["turn"]] = state
            return snap["turn"]

        def check_diff():
            a, b = sorted(rng.sample(sorted(states), 2))
            d = self.cowbox_json("diff", "prop", str(a), str(b))
            got = {e["path"]: e["event"] for e in d["events"]}
            self.assertEqual(got, expected_events(states[a], states[b]),
                             "seed %d: diff %d %d" % (seed, a, b))

        def check_rollback():
            turn = rng.choice(sorted(states))
            r = self.cowbox_json("rollback", "prop", str(turn))
            self.assertEqual(tree_state(mnt), states[turn],
                             "seed %d: rollback to %d" % (seed, turn))
            states[r["turn"]] = states[turn]
            return turn

        snapshot(delta=True)
        for i in range(STEPS):
            mut.step()
            r = rng.random()
            if r < 0.15:
                snapshot()
            elif r < 0.2 and len(states) > 1:
                check_diff()
            elif r < 0.22:
                live = tree_state(mnt)
                a = rng.choice(sorted(states))
                d = self.cowbox_json("diff", "prop", str(a))
                self.assertEqual({e["path"]: e["event"] for e in d["events"]},
                                 expected_events(states[a], live),
                                 "seed %d: live diff from %d" % (seed, a))
            elif r < 0.26 and len(states) > 1:
                # roll back, then forward to the latest turn before the rollback
                latest = max(states)
                check_rollback()
                fwd = self.cowbox_json("rollback", "prop", str(latest))
                self.assertEqual(tree_state(mnt), states[latest], "seed %d: forward" % seed)
                states[fwd["turn"]] = states[latest]
        snapshot()
        # live diff against the first turn, then remount and check everything again
        mut.step()
        live = tree_state(mnt)
        d = self.cowbox_json("diff", "prop", "1")
        self.assertEqual({e["path"]: e["event"] for e in d["events"]},
                         expected_events(states[1], live), "seed %d: live diff" % seed)
        self.cowbox("umount", "prop")
        self.mount(ref)
        self.assertEqual(tree_state(mnt), live, "seed %d: remount" % seed)
        snapshot(delta=True)
        for _ in range(3):
            check_diff()
            check_rollback()
        snapshot()
        # prune to the newest 3 turns: they (and the base) still diff and roll back exactly,
        # the others are refused
        latest = max(states)
        self.cowbox_json("prune", "prop", "--keep", "3")
        for turn in [t for t in states if 0 < t <= latest - 3]:
            del states[turn]
        self.assertEqual(len(states), 3)
        oldest[0] = latest - 2
        for _ in range(2):
            mut.step()
            check_rollback()
            check_diff()
        snapshot(delta=True)  # the whole map if the client's turn was pruned
        self.assertEqual(self.cowbox("diff", "prop", "1", check=False).returncode, 3)
        # fork a random kept turn: the new workspace's tree is that turn exactly (files,
        # modes, symlinks, directories, deletions of base entries as whiteouts)
        turn = rng.choice(sorted(states))
        fork = self.cowbox_json("fork", "prop", str(turn), "--name", "prop2")
        self.mount(fork["ref"])
        self.assertEqual(tree_state(self.mountpoint(fork["ref"])), states[turn],
                         "seed %d: fork of turn %d" % (seed, turn))
        # The fork is another database: a map of this workspace's turns gets the whole map,
        # then changes again.
        for expect_full in (True, False):
            snap = delta_snapshot(fork["ref"], expect_full)
            self.assertEqual(snap["files"], files_of(tree_state(self.mountpoint(fork["ref"]))),
                             "seed %d: delta map of the fork" % seed)
            with open(os.path.join(self.mountpoint(fork["ref"]), "after-fork.txt"), "w") as f:
                f.write("x\n")


if __name__ == "__main__":
    unittest.main(verbosity=2)
