"""A workspace's lifecycle over the raw protocol and the CLI: access levels (per connection,
only lowered, bounded by the workspace's widest), hooks and the setup script run at create as
a baseline turn, idle stop, apply."""

import base64
import json
import os
import time

import cbtest


def b64(data):
    return base64.b64encode(data).decode()


class AccessTest(cbtest.CowboxTestCase):

    def setUp(self):
        super().setUp()
        self.base = self.make_base({"a.txt": "alpha\n"})
        self.ref = self.create(self.base)
        self.mount(self.ref)

    def code(self, reply):
        self.assertIn("error", reply, reply)
        return reply["error"]["code"]

    def test_connection_levels_are_only_lowered(self):
        c, other = self.client(self.ref), self.client(self.ref)
        r = c.request("info")
        self.assertEqual((r["access"], r["supported_access"]), ("full", "full"))
        r = c.request("access", level="files")
        self.assertEqual((r["access"], r["supported_access"]), ("files", "full"), r)
        # files: read, write, snapshot, diff, rollback; no command, which or host_url.
        self.assertTrue(c.request("write", path="w.txt", data=b64(b"hi")).get("ok"))
        self.assertEqual(base64.b64decode(c.request("read", path="w.txt")["data"]), b"hi")
        turn = c.request("snapshot")["turn"]
        self.assertTrue(c.request("diff", a=0, b=turn).get("ok"))
        for op, args in (("run", {"cmd": ["true"]}), ("exec", {"cmd": ["true"]}),
                         ("which", {"binary": "sh"}), ("host_url", {"port": 80}),
                         ("configure", {"options": {}})):
            r = c.request(op, **args)
            self.assertEqual(self.code(r), "access_denied", (op, r))
            self.assertIn("needs full", r["error"]["message"])
        self.assertTrue(c.request("configure").get("ok"))  # reading the options is fine
        # Never raised again, on this connection.
        r = c.request("access", level="full")
        self.assertEqual(self.code(r), "access_denied")
        self.assertIn("can only be lowered", r["error"]["message"])
        # none: only the owner's ops.
        self.assertEqual(c.request("access", level="none")["access"], "none")
        self.assertEqual(self.code(c.request("read", path="a.txt")), "access_denied")
        self.assertEqual(self.code(c.request("write", path="x", data="")), "access_denied")
        self.assertEqual(self.code(c.request("rollback", turn=0)), "access_denied")
        self.assertTrue(c.request("snapshot").get("ok"))
        self.assertTrue(c.request("turns").get("ok"))
        self.assertEqual(c.request("info")["access"], "none")
        # The other connection (and a new one) is untouched.
        self.assertEqual(other.request("run", cmd=["true"])["exit_code"], 0)
        self.assertEqual(self.client(self.ref).request("info")["access"], "full")
        r = c.request("access", level="bogus")
        self.assertEqual(self.code(r), "invalid_request")

    def test_workspace_level_bounds_every_connection_and_survives_a_restart(self):
        c, other = self.client(self.ref), self.client(self.ref)
        r = c.request("access", level="files", workspace=True)
        self.assertEqual((r["access"], r["supported_access"]), ("files", "files"))
        # An open connection is bounded at once, and a new one starts there.
        self.assertEqual(self.code(other.request("run", cmd=["true"])), "access_denied")
        self.assertEqual(self.client(self.ref).request("info")["access"], "files")
        r = self.client(self.ref).request("access", level="full")
        self.assertEqual(self.code(r), "access_denied")
        self.assertIn("serves at most files", r["error"]["message"])
        self.cowbox("umount", self.ref)
        self.mount(self.ref)
        self.assertEqual(self.client(self.ref).request("info")["supported_access"], "files")
        self.assertEqual(self.cowbox("access", self.ref).stdout.strip(), "files")
        # The CLI runs commands itself: it refuses too.
        self.assert_fails(["exec", self.ref, "--", "true"], "commands need full", 125)

    def test_cli_create_access_and_lowering(self):
        ref = self.cowbox("create", "--base", self.base, "--access", "files").stdout.strip()
        self.assertEqual(self.cowbox_json("access", ref)["supported_access"], "files")
        self.assert_fails(["access", ref, "full"], "only be lowered")
        self.assert_fails(["exec", ref, "--", "true"], "serves at most access files", 125)
        # Lowered while a daemon serves it: through the daemon, at once.
        self.mount(ref)
        c = self.client(ref)
        self.assertEqual(c.request("info")["access"], "files")
        self.assertEqual(self.cowbox("access", ref, "none").stdout.strip(), "none")
        self.assertEqual(self.code(c.request("read", path="a.txt")), "access_denied")
        self.assert_fails(["create", "--access", "most"], "expected none, files or full", 2)
        # The default is full, and the CLI runs commands in it.
        self.assertEqual(self.cowbox("access", self.ref).stdout.strip(), "full")
        self.assertEqual(self.cowbox("exec", self.ref, "--", "cat", "a.txt").stdout,
                         "alpha\n")


if __name__ == "__main__":
    import unittest
    unittest.main()
