#!/usr/bin/env python3
"""A turn's memory is bounded: the daemon and its turn worker reach the same peak RSS for a
snapshot of many changed paths as for one of a few (the rows stream through SQLite's
temporary tables a page at a time, never all in memory, nor in one worker message)."""

import os
import time
import unittest

from cbtest import CowboxTestCase

SMALL = int(os.environ.get("COWBOX_TEST_TURN_SMALL", "2000"))
LARGE = int(os.environ.get("COWBOX_TEST_TURN_LARGE", "20000"))
# What a fixed bound must absorb: SQLite's page caches (2 MiB each for meta.db and the
# temporary tables) filling, libfuse's request buffers, allocator slack. The code before
# streaming grew by ~0.55 KiB per changed path in the daemon and ~0.85 KiB in the worker
# (release build; more under ASan): +12.8 and +19 MiB more for 25,000 paths than for 2,000.
BOUND_KIB = 8 * 1024


def vm_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


def read(path):
    with open(path) as f:
        return f.read().strip()


class TurnMemoryTest(CowboxTestCase):
    def setUp(self):
        super().setUp()
        # ASan keeps freed memory in a quarantine (256 MiB by default) that would count as
        # growth: keep it small for this test's daemon.
        opts = os.environ.get("ASAN_OPTIONS", "")
        self.env["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=1"
        self.ref = self.create()
        self.daemon = self.mount(self.ref)
        self.mnt = self.mountpoint(self.ref)

    def turn_worker(self):
        """The turn worker: a child of the daemon's spawner, started at the first turn op."""
        todo, seen = [self.daemon], []
        while todo:
            pid = todo.pop()
            for c in read("/proc/%d/task/%d/children" % (pid, pid)).split():
                if read("/proc/%s/comm" % c) == "cowbox-worker":
                    return int(c)
                todo.append(int(c))
        raise AssertionError("no turn worker below the daemon %d" % self.daemon)

    def make(self, top, n):
        """n changed paths in one turn: directories (one FUSE request and one journal row
        each, nothing to hash), a file in every hundredth."""
        os.mkdir(os.path.join(self.mnt, top))
        for i in range(n):
            d = os.path.join(self.mnt, top, "d%06d" % i)
            os.mkdir(d)
            if i % 100 == 0:
                with open(os.path.join(d, "f"), "w") as f:
                    f.write("%d\n" % i)

    def snapshot_growth(self):
        """Peak RSS growth (KiB) of the daemon and the worker over one `cowbox snapshot`."""
        before = []
        self.worker = self.turn_worker()
        for pid in (self.daemon, self.worker):
            with open("/proc/%d/clear_refs" % pid, "w") as f:
                f.write("5")  # VmHWM := VmRSS
            before.append(vm_kib(pid, "VmRSS"))
        t = time.monotonic()
        self.cowbox("snapshot", self.ref, timeout=600)
        took = time.monotonic() - t
        grew = [vm_kib(pid, "VmHWM") - b for pid, b in zip((self.daemon, self.worker), before)]
        return grew, took

    def test_peak_rss_does_not_follow_changed_paths(self):
        self.make("warm", 200)
        self.snapshot_growth()  # the first snapshot builds the map
        self.make("small", SMALL)
        small, t_small = self.snapshot_growth()
        self.make("large", LARGE)
        large, t_large = self.snapshot_growth()
        print("peak RSS growth over a snapshot: %d changed paths: daemon %+d KiB, worker %+d "
              "KiB (%.1f s); %d: daemon %+d KiB, worker %+d KiB (%.1f s)" % (
                  SMALL, small[0], small[1], t_small, LARGE, large[0], large[1], t_large))
        for who, s, l in zip(("daemon", "worker"), small, large):
            self.assertLess(l - s, BOUND_KIB,
                            "the %s's peak RSS grew %d KiB more for %d changed paths than "
                            "for %d" % (who, l - s, LARGE, SMALL))
        # and the turn is all there
        turns = self.cowbox_json("turns", self.ref)["turns"]
        self.assertEqual(turns[-1]["changes"], 1 + LARGE + LARGE // 100)


if __name__ == "__main__":
    unittest.main()
