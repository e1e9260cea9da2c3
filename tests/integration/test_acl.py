#!/usr/bin/env python3
"""POSIX ACLs are shifted like owners: an ACL entry of the sandbox's user 1000 is stored in
upper/ as the workspace's B + 1000 (never host uid 1000), a base file's ACL and one set from
the host's view of the mount get the same shift, the sandbox sees its own ids back, and an
ACL naming an id outside the workspace's range is refused."""

import os
import shutil
import struct
import subprocess
import unittest

from cbtest import COWBOX, CowboxTestCase

ACL = "system.posix_acl_access"
ACL_USER, ACL_GROUP = 0x02, 0x08


def acl_ids(path, name=ACL):
    """The (tag, id) of the user and group entries of path's ACL xattr (as stored)."""
    v = os.getxattr(path, name, follow_symlinks=False)
    version, = struct.unpack_from("<I", v)
    assert version == 2, version
    out = []
    for off in range(4, len(v), 8):
        tag, _, uid = struct.unpack_from("<HHI", v, off)
        if tag in (ACL_USER, ACL_GROUP):
            out.append((tag, uid))
    return sorted(out)


@unittest.skipUnless(shutil.which("setfacl") and shutil.which("getfacl"),
                     "needs setfacl and getfacl (Debian package acl: scripts/setup)")
class AclShiftTest(CowboxTestCase):
    def sandbox(self, script):
        p = subprocess.run([COWBOX, "exec", self.ref, "--", "sh", "-c", script], env=self.env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, "stdout: %s\nstderr: %s" % (p.stdout, p.stderr))
        return p.stdout

    def test_acls_are_shifted_like_owners(self):
        base = self.make_base({"shared": "base\n", "d/x": "x\n"})
        subprocess.run(["setfacl", "-m", "u:1000:r,g:1001:r", os.path.join(base, "shared")],
                       check=True)
        subprocess.run(["setfacl", "-d", "-m", "u:1000:rwx", os.path.join(base, "d")],
                       check=True)
        self.ref = self.create(base)
        self.mount(self.ref)
        with open(os.path.join(self.ws_dir(self.ref), "ids")) as f:
            b = int(f.read())
        upper = os.path.join(self.ws_dir(self.ref), "upper")
        mnt = self.mountpoint(self.ref)

        out = self.sandbox(
            "cd /workspace && getfacl -n shared d | grep -E '^(default:)?(user|group):[0-9]'; "
            "echo new > f && setfacl -m u:1000:rw,g:1000:r f && getfacl -n f | "
            "grep -E '^(user|group):[0-9]'; echo more >> shared; "
            "if setfacl -m u:70000:r f 2>/dev/null; then echo set-outside; fi")
        # the sandbox sees its own ids: the base's host 1000 is its 1000 (as owners are)
        self.assertEqual(out.split(), ["user:1000:r--", "group:1001:r--",
                                       "default:user:1000:rwx", "user:1000:rw-",
                                       "group:1000:r--"])
        # upper/ holds the workspace's range: the sandbox's own ACL and the copied-up base's
        self.assertEqual(acl_ids(os.path.join(upper, "f")),
                         [(ACL_USER, b + 1000), (ACL_GROUP, b + 1000)])
        self.assertEqual(acl_ids(os.path.join(upper, "shared")),
                         [(ACL_USER, b + 1000), (ACL_GROUP, b + 1001)])

        # from the host's view of the mount: the same shift, and ids outside refused
        host = os.path.join(mnt, "h")
        with open(host, "w") as f:
            f.write("h\n")
        subprocess.run(["setfacl", "-m", "u:1000:r", host], check=True)
        self.assertEqual(acl_ids(os.path.join(upper, "h")), [(ACL_USER, b + 1000)])
        p = subprocess.run(["setfacl", "-m", "u:70000:r", host], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0, "an ACL for host uid 70000 was stored")
        self.assertIn("Invalid argument", p.stderr)
        self.assertEqual(acl_ids(os.path.join(upper, "h")), [(ACL_USER, b + 1000)])
        p = subprocess.run(["getfacl", "-n", host], capture_output=True, text=True, check=True)
        self.assertIn("user:%d:r--" % (b + 1000), p.stdout)  # the host sees B + id, as ls -n
        self.assertIn("user:1000:r--", self.sandbox("getfacl -n /workspace/h"))


if __name__ == "__main__":
    unittest.main()
