#!/usr/bin/env python3
"""A whole agent turn through the sandbox API, timed step by step: create a workspace over a
project, run its tests in the ns sandbox, snapshot, edit, snapshot, the FileChange events,
rollback, destroy. scripts/quickstart runs it over samples/hello.

usage: agent_turn.py [--cowbox PATH] [--backend ns|local|docker] BASE_DIR"""

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cowbox  # noqa: E402


class Steps:
    def __init__(self):
        self.t = time.perf_counter()

    def __call__(self, what):
        now = time.perf_counter()
        print("  %-58s %7.1f ms" % (what, (now - self.t) * 1000))
        self.t = now


async def main(args):
    step = Steps()
    box = await cowbox.Sandbox.create(args.base, backend=args.backend, cowbox=args.cowbox)
    step("create %s (backend %s)" % (box.ref, args.backend))
    try:
        r = await box.run(["make", "--no-print-directory", "test"], timeout=120)
        step("run the project's tests: exit %d" % r.exit_code)
        print("    " + r.stdout.strip().replace("\n", "\n    "))
        before = await box.snapshot()
        turn = box.last_turn
        step("snapshot: turn %d, %d files" % (turn, len(before)))
        r = await box.run(["sh", "-c", "sed -i 's/Hello/Howdy/' greet.c && "
                           "echo 'edited by the agent' >> README && rm -f hello.c"])
        await box.write("NOTES.md", b"# what the agent did\n")
        step("edit: sed, append, rm, and a write through the API")
        after = await box.snapshot()
        step("snapshot: turn %d" % box.last_turn)
        changes = cowbox.file_changes(before, after)
        step("FileChange events: %d" % len(changes))
        for c in changes:
            print("    %-9s %s" % (c.kind, c.path))
        await box.rollback(turn)
        step("rollback to turn %d" % turn)
        same = await box.snapshot() == before
        step("snapshot again: identical to turn %d: %s" % (turn, same))
    finally:
        ref = box.ref
        await box.close()
        await cowbox.Sandbox.destroy(ref, cowbox=args.cowbox)
        step("close and destroy")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cowbox", default=os.environ.get("COWBOX", "cowbox"))
    ap.add_argument("--backend", default="ns")
    ap.add_argument("base")
    asyncio.run(main(ap.parse_args()))
