"""The journal as `cowbox log` shows it: one row per path, kind and turn, attributed to the
process that made the change, also with several writers at once."""

import os
import subprocess
import threading
import unittest

from cbtest import CowboxTestCase


class TestJournal(CowboxTestCase):
    def test_rows_name_the_process_and_repeat_changes_add_nothing(self):
        base = self.make_base({"doc.txt": "v1\n"})
        ref = self.create(base=base)
        self.mount(ref)
        mnt = self.mountpoint(ref)
        proc = subprocess.run(["sh", "-c", "echo more >> doc.txt; touch made-by-touch"],
                              cwd=mnt)
        self.assertEqual(proc.returncode, 0)
        for _ in range(20):
            with open(os.path.join(mnt, "doc.txt"), "a") as f:
                f.write("again\n")
        rows = self.log(ref)
        writes = [r for r in rows if r["path"] == "doc.txt" and r["kind"] == "write"]
        self.assertEqual(len(writes), 1, rows)
        made = [r for r in rows if r["path"] == "made-by-touch" and r["kind"] == "create"]
        self.assertEqual(len(made), 1, rows)
        self.assertEqual(made[0]["comm"], "touch")
        self.assertGreater(made[0]["pid"], 0)
        self.assertGreater(made[0]["time"], 1e9)
        self.assertEqual(writes[0]["comm"], "sh")
        text = self.cowbox("log", ref).stdout
        self.assertIn("made-by-touch", text)
        self.assertIn("touch", text)

    def test_concurrent_writers_each_path_once(self):
        ref = self.create()
        self.mount(ref)
        mnt = self.mountpoint(ref)
        errors = []

        def writer(t):
            try:
                for i in range(100):
                    p = os.path.join(mnt, "t%d-%03d" % (t, i))
                    with open(p, "w") as f:
                        f.write("x" * i)
                    with open(p, "a") as f:
                        f.write("y")
            except OSError as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        rows = self.log(ref)
        creates = [r["path"] for r in rows if r["kind"] == "create"]
        self.assertEqual(sorted(creates), sorted("t%d-%03d" % (t, i)
                                                 for t in range(6) for i in range(100)))
        keys = [(r["turn"], r["path"], r["kind"]) for r in rows]
        self.assertEqual(len(keys), len(set(keys)))


if __name__ == "__main__":
    unittest.main()
