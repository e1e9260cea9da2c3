"""The ns backend's image option with OCI images: a layout (made from the local podman store's
image) and a store name, unpacked once into a cached root that later workspaces reuse, a
changed image's new root, errors that name the image, hostile layers, a killed unpack."""

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest

import cbtest
import ociutil

SKIP = ociutil.why_not_ready()


@unittest.skipIf(SKIP, SKIP)
class ImageTest(cbtest.CowboxTestCase):
    """One COWBOX_HOME (and so one image cache) for the whole file: the base image is
    unpacked once."""

    @classmethod
    def setUpClass(cls):
        cls.shared = tempfile.mkdtemp(prefix="cbtest-image-")
        cls.layout = os.path.join(cls.shared, "layout")
        ociutil.copy_from_store(cls.layout, "base")
        cls.base_hex = ociutil.config_hex(cls.layout, "base")
        cls.home_shared = os.path.join(cls.shared, "home")
        cls.ws_shared = os.path.join(cls.shared, "ws")
        os.makedirs(cls.ws_shared)
        with open(os.path.join(cls.ws_shared, "f.txt"), "w") as f:
            f.write("from the workspace\n")
        cls.killed = cls.first_unpack_killed_then_whole()

    @classmethod
    def first_unpack_killed_then_whole(cls):
        """The base image's first unpack, killed (-9) half-way, then again whole: what was
        seen after the kill, and how long the whole one took. Done once, as an unpack of the
        base image is the slow part of this file."""
        env = dict(os.environ, COWBOX_HOME=cls.home_shared)
        images = os.path.join(cls.home_shared, "images")
        tmp = os.path.join(images, cls.base_hex + ".tmp")
        argv = [cbtest.COWBOX, "exec", "--dir", cls.ws_shared, "--image",
                "oci:%s:base" % cls.layout, "--", "cat", "/workspace/f.txt"]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        cbtest.wait_for(lambda: os.path.isdir(os.path.join(tmp, "rootfs")), 60,
                        what="the unpack to start")
        time.sleep(0.2)
        p.send_signal(signal.SIGKILL)
        p.wait()
        # its umoci goes with it (the runner's shim ends the tree when its caller is gone)
        cbtest.wait_for(lambda: tmp not in subprocess.run(
            ["pgrep", "-af", "umoci raw unpack"], capture_output=True, text=True).stdout,
            20, what="umoci to end")
        seen = {"root": os.path.exists(os.path.join(images, cls.base_hex)),
                "leftover": os.path.exists(tmp)}
        t0 = time.monotonic()
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        seen["took"] = time.monotonic() - t0
        seen["result"] = (r.returncode, r.stdout, r.stderr)
        seen["after"] = sorted(os.listdir(images))
        return seen

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.home = self.home_shared
        self.env = dict(os.environ, COWBOX_HOME=self.home)
        self.ws = os.path.join(self.tmp, "ws")
        os.makedirs(self.ws)
        with open(os.path.join(self.ws, "f.txt"), "w") as f:
            f.write("from the workspace\n")

    def images(self):
        return os.path.join(self.home, "images")

    def exec_in(self, image, script, check=True):
        return self.cowbox("exec", "--dir", self.ws, "--image", image, "--", "sh", "-c", script,
                           check=check, timeout=300)

    def test_layout_runs_and_its_root_is_reused(self):
        script = ("cat /etc/debian_version; cat /workspace/f.txt; "
                  "command -v python3 || echo no-python3")
        first = self.exec_in("oci:%s:base" % self.layout, script)
        root = os.path.join(self.images(), self.base_hex)
        with open(os.path.join(root, "etc/debian_version")) as f:
            version = f.read()
        # the image's files (minbase has no python3, the host has), the workspace at /workspace
        self.assertEqual(first.stdout, version + "from the workspace\nno-python3\n")
        st, before = os.stat(root), sorted(os.listdir(self.images()))
        # the same image again, through its only tag, and by its name in the store: one root
        for image in ("oci:" + self.layout, ociutil.STORE_IMAGE,
                      "containers-storage:" + ociutil.STORE_IMAGE):
            t0 = time.monotonic()
            again = self.exec_in(image, script)
            took = time.monotonic() - t0
            self.assertEqual(again.stdout, first.stdout, image)
            self.assertLess(took, 5, "%s: a cached root took %.1f s" % (image, took))
        self.assertEqual(os.stat(root).st_ino, st.st_ino)
        self.assertEqual(sorted(os.listdir(self.images())), before)
        print("image: first use %.2f s (unpack), cached %.2f s" % (self.killed["took"], took))

    def test_changed_image_gets_a_new_root(self):
        self.exec_in("oci:%s:base" % self.layout, "true")
        layout = os.path.join(self.tmp, "marked")
        ociutil.clone_layout(self.layout, layout)
        hex2 = ociutil.add_image(layout, "base", "marked", [
            ociutil.entry("etc/cowbox-marker", data=b"marked image\n"),
            ociutil.entry("usr/evil-null", kind=tarfile.CHRTYPE, mode=0o666, dev=(1, 3))],
            settings={"Env": ["MARK=from-the-image", "OVER=image", "HOME=/root"],
                      "User": "nobody"})
        r = self.exec_in("oci:%s:marked" % layout, "cat /etc/cowbox-marker; "
                         "cat /usr/evil-null 2>/dev/null && echo device-opened; true")
        # the image's file; a device node of the image opens nothing (its binds are nodev)
        self.assertEqual(r.stdout, "marked image\n")
        # its config's Env under --env (HOME stays the sandbox's), its User
        r = self.cowbox("exec", "--dir", self.ws, "--image", "oci:%s:marked" % layout,
                        "--env", "OVER=flag", "--", "sh", "-c",
                        "echo $MARK $OVER $HOME; id -un")
        self.assertEqual(r.stdout, "from-the-image flag /tmp\nnobody\n")
        self.assertNotEqual(hex2, self.base_hex)
        self.assertTrue(os.path.isdir(os.path.join(self.images(), hex2)))
        self.assertFalse(os.path.exists(os.path.join(self.images(), self.base_hex,
                                                     "etc/cowbox-marker")))

    def test_errors_name_the_image(self):
        missing = os.path.join(self.tmp, "missing")
        cases = [
            ("oci:" + missing, "image oci:%s: %s: No such file or directory" % (missing,
                                                                                missing)),
            ("oci:" + self.tmp, "is not an OCI image layout"),
            ("oci:%s:nosuch" % self.layout, "no image tagged nosuch in the layout"),
            ("cowbox-no-such:img", "image cowbox-no-such:img: not found in the local podman "
                                   "store"),
            ("-rf", "not starting with '-'"),
            (missing, "image %s: No such file or directory" % missing),
        ]
        for image, msg in cases:
            self.assert_fails(["exec", "--dir", self.ws, "--image", image, "--", "true"], msg,
                              status=125)
        # a layout whose layer is damaged: umoci's check of the digest
        bad = os.path.join(self.tmp, "bad")
        ociutil.clone_layout(self.layout, bad)
        blobs = os.path.join(bad, "blobs", "sha256")
        big = os.path.join(blobs, max(os.listdir(blobs),
                                      key=lambda b: os.path.getsize(os.path.join(blobs, b))))
        with open(big, "rb") as f:
            head = f.read(1000)
        os.unlink(big)  # a link to the shared layout's blob: replaced, not cut in place
        with open(big, "wb") as f:
            f.write(head)
        hex_bad = ociutil.add_image(bad, "base", "other", [ociutil.entry("x", data=b"x")])
        # (the unpack's cap lists the layers first: tar finds it damaged before umoci would)
        p = self.assert_fails(["exec", "--dir", self.ws, "--image", "oci:%s:other" % bad, "--",
                               "true"], "image oci:%s:other: " % bad, status=125)
        self.assertTrue("umoci unpack failed" in p.stderr or "tar cannot list it" in p.stderr,
                        p.stderr)
        # nothing that looks like a root, and no leftover
        self.assertFalse(os.path.exists(os.path.join(self.images(), hex_bad)))
        self.assertFalse(os.path.exists(os.path.join(self.images(), hex_bad + ".tmp")))
        # create refuses it too, and leaves no workspace behind
        self.assert_fails(["create", "--image", "oci:" + missing], "No such file or directory")
        self.assertEqual(self.cowbox_json("ls"), [])

    def test_create_image_then_exec_and_info(self):
        ref = self.cowbox("create", "--base", self.ws, "--image",
                          "oci:%s:base" % self.layout).stdout.strip()
        info = self.cowbox_json("info", ref)
        self.assertEqual((info["backend"], info["image"]), ("ns", "oci:%s:base" % self.layout))
        self.assertIn("image:       oci:%s:base" % self.layout, self.cowbox("info", ref).stdout)
        r = self.cowbox("exec", ref, "--", "sh", "-c", "command -v python3 || cat f.txt")
        self.assertEqual(r.stdout, "from the workspace\n")
        self.cowbox("rm", ref)

    def test_hostile_layer(self):
        # A layer that tries to write out of the root (.., an absolute symlink followed by a
        # file through it, a hard link to /etc/shadow) and whites out a file of
        # the layer below; a small image of its own (create unpacks it, nothing runs in it).
        outside = os.path.join(self.tmp, "outside")
        os.makedirs(outside)
        layout = os.path.join(self.tmp, "hostile")
        T = tarfile
        ociutil.add_image(layout, None, "lower", [
            ociutil.entry("usr", kind=T.DIRTYPE), ociutil.entry("etc", kind=T.DIRTYPE),
            ociutil.entry("etc/victim", data=b"lower\n"),
            ociutil.entry("etc/shadow", data=b"the image's own\n"),
            ociutil.entry("etc/kept", data=b"kept\n")])
        hexh = ociutil.add_image(layout, "lower", "evil", [
            ociutil.entry("etc/.wh.victim"),
            ociutil.entry("../escape-dotdot", data=b"out\n"),
            ociutil.entry("etc/evil", kind=T.SYMTYPE, link=outside),
            ociutil.entry("etc/evil/pwned", data=b"pwned\n"),
            ociutil.entry("etc/hl", kind=T.LNKTYPE, link="/etc/shadow"),
        ])
        proc = self.cowbox("create", "--image", "oci:%s:evil" % layout, check=False)
        root = os.path.join(self.images(), hexh)
        # nothing outside the root, whatever umoci made of the layer
        self.assertEqual(os.listdir(outside), [])
        for d in (self.tmp, os.path.dirname(self.tmp), self.home, self.images()):
            self.assertNotIn("escape-dotdot", os.listdir(d))
        shadow = os.stat("/etc/shadow")
        self.assertEqual(shadow.st_nlink, 1)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(root, "etc/kept")) as f:
            self.assertEqual(f.read(), "kept\n")
        self.assertFalse(os.path.exists(os.path.join(root, "etc/victim")))  # whited out
        self.assertTrue(os.path.islink(os.path.join(root, "etc/evil")))
        # the link's absolute target is taken inside the root: the image's own shadow
        hl = os.lstat(os.path.join(root, "etc/hl"))
        own = os.lstat(os.path.join(root, "etc/shadow"))
        self.assertEqual((hl.st_dev, hl.st_ino), (own.st_dev, own.st_ino))
        self.cowbox("rm", proc.stdout.strip())

    def test_killed_unpack_leaves_no_root(self):
        # setUpClass killed the first unpack half-way: no root under the image's key, only
        # the temporary directory, which the next use removed before unpacking it whole.
        k = self.killed
        self.assertEqual((k["root"], k["leftover"]), (False, True))
        self.assertEqual(k["result"][:2], (0, "from the workspace\n"), k["result"][2])
        self.assertEqual(k["after"], [self.base_hex + s for s in ("", ".json", ".lock")])

if __name__ == "__main__":
    unittest.main()
