"""The daemon's one table of running commands (daemon/ops_api.c, in struct cb_daemon): the bound
on requests in flight per connection, stdin and kill routed by (connection, id), and a hang-up
killing exactly the commands of the connection that went away."""

import os
import time
import unittest

import cbtest

MARK = "600.4242"  # `sleep MARK`: found on the host by its command line


def sleepers():
    found = 0
    for entry in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                found += entry.isdigit() and f.read() == b"sleep\0" + MARK.encode() + b"\0"
        except OSError:
            pass
    return found


def wait_for(pred, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class RunningTableTest(cbtest.CowboxTestCase):
    MAX_IN_FLIGHT = 64  # CB_PROTOCOL_MAX_IN_FLIGHT, docs/protocol.md

    def setUp(self):
        super().setUp()
        self.ref = self.create(self.make_base({"a.txt": "alpha\n"}))
        self.mount(self.ref)
        self.c = self.client(self.ref)
        r = self.c.request("configure", options={"backend": "local"})
        self.assertTrue(r.get("ok"), r)

    def final(self, c, ids):
        got = {}
        while len(got) < len(ids):
            m = c.recv()
            if "stream" not in m and m.get("id") in ids:
                got[m["id"]] = m
        return got

    def test_in_flight_bound_and_hang_up(self):
        for i in range(self.MAX_IN_FLIGHT):
            self.c.send({"id": i, "op": "exec", "cmd": ["sleep", MARK]})
        # One more is refused saying why; an inline op still goes through.
        self.c.send({"id": "over", "op": "exec", "cmd": ["true"]})
        self.c.send({"id": "p", "op": "ping"})
        r = self.final(self.c, {"over", "p"})
        self.assertEqual(r["over"]["error"]["code"], "in_use", r["over"])
        self.assertIn("in flight", r["over"]["error"]["message"])
        self.assertTrue(r["p"]["ok"])
        # Another connection has a bound of its own, and its commands are its own: it cannot
        # kill this connection's id 0.
        other = self.client(self.ref)
        other.send({"id": 0, "op": "kill"})
        self.assertEqual(self.final(other, {0})[0]["error"]["code"], "not_found")
        other.send({"id": "o", "op": "exec", "cmd": ["sleep", MARK]})
        self.assertTrue(wait_for(lambda: sleepers() == self.MAX_IN_FLIGHT + 1), sleepers())
        # Once one ends (killed by id), a new one is taken.
        self.c.send({"id": 0, "op": "kill"})
        self.assertTrue(self.final(self.c, {0})[0].get("killed"))
        self.c.send({"id": "again", "op": "exec", "cmd": ["true"]})
        self.assertEqual(self.final(self.c, {"again"})["again"]["exit_code"], 0)
        # The client hangs up: its 63 commands are killed, the other connection's is not.
        self.c.close()
        self.assertTrue(wait_for(lambda: sleepers() == 1), sleepers())
        other.send({"id": "o", "op": "kill", "signal": 15})
        self.assertEqual(self.final(other, {"o"})["o"]["signal"], 15)
        self.assertTrue(other.request("ping").get("ok"))
        other.close()


if __name__ == "__main__":
    unittest.main()
