"""The Python client's errors against the C table (daemon/errcode.c): the same codes, one
exception class each, carrying the errno the C client returns for the code; and a few errnos
of the daemon checked end to end, EACCES among them (it was invalid_path, then EINVAL)."""

import errno
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from cowbox import errors  # noqa: E402

SRCDIR = os.environ.get("COWBOX_SRCDIR", os.path.join(HERE, "..", "..", ".."))


def c_table():
    """{code: (client errno, [daemon errnos])} from daemon/errcode.c's rows."""
    with open(os.path.join(SRCDIR, "daemon", "errcode.c")) as f:
        text = f.read()
    rows = re.findall(r'^\s*\{"([a-z_]+)", (E[A-Z]+), \{([^}]*)\}\},\s*(?:/\*.*\*/)?$', text,
                      re.M)
    table = {}
    for code, client, daemon in rows:
        names = [n.strip() for n in daemon.split(",") if n.strip() and n.strip() != "0"]
        table[code] = (getattr(errno, client), [getattr(errno, n) for n in names])
    return table


class ErrorTableTest(unittest.TestCase):
    def setUp(self):
        self.table = c_table()

    def test_the_table_parses(self):
        self.assertGreaterEqual(len(self.table), 9)
        self.assertIn("unavailable", self.table)

    def test_same_codes_and_errnos_as_c(self):
        self.assertEqual(errors.CODE_ERRNO, {k: v[0] for k, v in self.table.items()})
        self.assertEqual(set(errors._BY_CODE), set(self.table))

    def test_each_exception_carries_its_code_and_errno(self):
        for code, (client, _) in self.table.items():
            with self.subTest(code=code):
                exc = errors.error_from_reply({"code": code, "message": "m"})
                self.assertEqual(type(exc).code, code)
                self.assertEqual((exc.code, exc.errno), (code, client))
        unknown = errors.error_from_reply({"code": "something_new", "message": "m"})
        self.assertEqual((type(unknown), unknown.errno), (errors.WorkspaceError, errno.EIO))

    def test_no_errno_is_two_codes(self):
        seen = {}
        for code, (_, daemon) in self.table.items():
            for e in daemon:
                self.assertNotIn(e, seen, "%s is both %s and %s" % (errno.errorcode[e],
                                                                   seen.get(e), code))
                seen[e] = code

    def test_permission_is_access_denied_both_ways(self):
        # A permission failure in the daemon is access_denied, which both clients give back
        # as EACCES (a PermissionError in Python).
        code = next(c for c, (_, daemon) in self.table.items() if errno.EACCES in daemon)
        self.assertEqual(code, "access_denied")
        exc = errors.error_from_reply({"code": code, "message": "m"})
        self.assertIsInstance(exc, PermissionError)
        self.assertEqual(exc.errno, errno.EACCES)


if __name__ == "__main__":
    unittest.main()
