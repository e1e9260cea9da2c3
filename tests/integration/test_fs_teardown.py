#!/usr/bin/env python3
"""Unmounting while requests are still in flight: a process holding hundreds of files open
is killed and the workspace unmounted at once, so the kernel's RELEASE and FLUSH requests
race the daemon's teardown. The daemon must exit clean: no leak, no use after free, no hang.

libfuse stops its io_uring threads with pthread_cancel; a handler cancelled inside close()
or write() used to lose its open file (and could leave a lock or an SQLite write half done).
The sanitizer check of every test's daemon.log (cbtest) is what fails here."""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cbtest import CowboxTestCase, is_fuse_mount, pid_alive, wait_for  # noqa: E402
import fsharness  # noqa: E402

HOLDER = r"""
import os, sys, threading
root, n = sys.argv[1], int(sys.argv[2])
fds = []
for i in range(n):
    # new files (create) and base files (copy-up on a write open) alike
    path = os.path.join(root, "base%03d" % (i % 40) if i % 3 == 0 else "new%04d" % i)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"x" * 100)
    fds.append(fd)


def churn(k):
    # opens and closes (OPEN, FLUSH, RELEASE) until the mount goes away under it
    i = k
    while True:
        i += 4
        try:
            fd = os.open(os.path.join(root, "base%03d" % (i % 40)), os.O_RDONLY)
            os.read(fd, 16)
            os.close(fd)
        except OSError:
            return


for k in range(4):
    threading.Thread(target=churn, args=(k,), daemon=True).start()
sys.stdout.write("ready\n")
sys.stdout.flush()
threading.Event().wait()
"""


class TeardownRaceTest(CowboxTestCase):
    def test_kill_holder_then_umount(self):
        seed = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 30))
        rng = random.Random(seed)
        print("seed", seed, file=sys.stderr)
        base = self.make_base({"base%03d" % i: "base %d\n" % i for i in range(40)})
        for trial in range(8):
            ref = self.create(base=base)
            pid = self.mount(ref)
            mnt = self.mountpoint(ref)
            holder = subprocess.Popen([sys.executable, "-c", HOLDER, mnt, str(rng.randint(10, 40))],
                                      stdout=subprocess.PIPE, text=True)
            self.assertEqual(holder.stdout.readline().strip(), "ready")
            time.sleep(rng.random() * 0.05)
            if trial % 2:
                # its releases reach the daemon while the daemon tears down
                holder.send_signal(signal.SIGKILL)
            # else it keeps opening and closing files while the mount goes away
            proc = self.cowbox("umount", ref, check=False, timeout=30)
            holder.kill()
            holder.wait(timeout=10)
            holder.stdout.close()
            self.assertEqual(proc.returncode, 0, "trial %d seed %d: %s" % (trial, seed, proc.stderr))
            wait_for(lambda: not pid_alive(pid), 10, what="daemon %d to exit" % pid)
            self.assertFalse(is_fuse_mount(mnt))
            reports = self._sanitizer_reports(os.path.join(self.home, "workspaces"))
            self.assertEqual(reports, [], "trial %d seed %d" % (trial, seed))


class StopWhileCopyEndsTest(unittest.TestCase):
    """A copy of the mount in another mount namespace keeps the loop alive after our umount,
    so a SIGTERM comes to stop it; the loop may end on its own (the copy goes) while that stop
    runs. The stop must not touch the overlay main has begun to free (a use after free that
    ASan caught in CI, in cb-overlay-mount's signal thread), and must exit 0."""

    def test_sigterm_around_the_copys_end(self):
        seed = int(os.environ.get("COWBOX_SEED") or random.randrange(1 << 30))
        rng = random.Random(seed)
        print("seed", seed, file=sys.stderr)
        top = tempfile.mkdtemp(prefix="cb-fs-test-")
        try:
            for trial in range(6):
                d = os.path.join(top, str(trial))
                for sub in ("base", "upper", "mnt"):
                    os.makedirs(os.path.join(d, sub))
                mnt = os.path.join(d, "mnt")
                mount = fsharness.Mount(os.path.join(d, "base"), os.path.join(d, "upper"), mnt)
                with open(os.path.join(mnt, "f"), "wb") as f:
                    f.write(b"x" * (1 << 20))
                copy = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                         "sleep", "0.5"])
                time.sleep(0.2)
                fsharness.umount(mnt)
                # the SIGTERM lands just before, at or after the copy's end
                time.sleep(0.3 + rng.uniform(-0.1, 0.1))
                mount.proc.send_signal(signal.SIGTERM)
                copy.wait(timeout=10)
                mount.proc.wait(timeout=30)
                fsharness.close_checked(self, mount)
        finally:
            subprocess.run(["rm", "-rf", top])


if __name__ == "__main__":
    unittest.main()
