"""OCI image unpacks against the host's disk (issue 30, 6): a small compressed layer that
expands hugely is refused before umoci writes anything (its cap: the image_max_mb option,
else the workspace's disk quota; inodes: disk_inodes), leaving nothing in the cache; and
`cowbox image ls` / `cowbox image prune` list and collect the unpacked roots no workspace
uses, idempotently and without taking one from under a create racing it."""

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import unittest

import cbtest
import ociutil

SKIP = None if os.geteuid() == 0 and all(
    subprocess.run(["sh", "-c", "command -v " + t], capture_output=True).returncode == 0
    for t in ("umoci", "tar")) else "needs root and umoci"


def put_blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    d = os.path.join(layout, "blobs", "sha256")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def host_file(path):
    with open(path, "rb") as f:
        return f.read()


# cat and what it needs, from the host: a root a sandbox can run something in
CAT_ROOT = {"usr/bin/cat": "/usr/bin/cat",
            "lib/x86_64-linux-gnu/libc.so.6": "/lib/x86_64-linux-gnu/libc.so.6",
            "lib64/ld-linux-x86-64.so.2": "/lib64/ld-linux-x86-64.so.2"}


def gzip_image(layout, tag, files):
    """An image tagged tag of one gzip layer: files {name: size of zeros, or a count of empty
    files when given as ("many", N)}. Returns the compressed layer's size and the config's
    hex. The zeros are gzip members of 1 MiB each, repeated: a tiny blob, made fast."""
    parts, digest = [], hashlib.sha256()
    zero_mib = bytes(1 << 20)
    zero_member = gzip.compress(zero_mib, 9)

    def put(raw, member=None):
        digest.update(raw)
        parts.append(member or gzip.compress(raw, 9))

    for name, size in files.items():
        if isinstance(size, tuple):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            out = [d.tobuf(tarfile.GNU_FORMAT)]
            out += [tarfile.TarInfo("%s/f%d" % (name, i)).tobuf(tarfile.GNU_FORMAT)
                    for i in range(size[1])]
            put(b"".join(out))
            continue
        info = tarfile.TarInfo(name)
        if isinstance(size, bytes):  # a file's contents
            info.size, info.mode = len(size), 0o755
            pad = (512 - len(size) % 512) % 512
            put(info.tobuf(tarfile.GNU_FORMAT) + size + bytes(pad))
            continue
        info.size = size
        put(info.tobuf(tarfile.GNU_FORMAT))
        assert size % (1 << 20) == 0
        for _ in range(size >> 20):
            put(zero_mib, zero_member)
    put(bytes(1024))  # the archive's end
    layer_raw_digest = digest.hexdigest()
    layer = dict(put_blob(layout, b"".join(parts)),
                 mediaType="application/vnd.oci.image.layer.v1.tar+gzip")
    config = {"architecture": "amd64", "os": "linux", "config": {},
              "rootfs": {"type": "layers",
                         "diff_ids": ["sha256:" + layer_raw_digest]}}
    manifest = {"schemaVersion": 2, "mediaType": ociutil.MANIFEST, "layers": [layer],
                "config": dict(put_blob(layout, json.dumps(config).encode()),
                               mediaType="application/vnd.oci.image.config.v1+json")}
    index_path = os.path.join(layout, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index["manifests"].append(dict(put_blob(layout, json.dumps(manifest).encode()),
                                   mediaType=ociutil.MANIFEST,
                                   annotations={"org.opencontainers.image.ref.name": tag}))
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(index_path, "w") as f:
        json.dump(index, f)
    return layer["size"], manifest["config"]["digest"].split(":", 1)[1]


@unittest.skipIf(SKIP, SKIP)
class ImageCapsTest(cbtest.CowboxTestCase):

    @classmethod
    def setUpClass(cls):
        cls.shared = tempfile.mkdtemp(prefix="cbtest-imagecaps-")
        cls.layout = os.path.join(cls.shared, "layout")
        # 64 MiB of zeros in a layer of under 100 KiB
        cls.big_size, cls.big_hex = gzip_image(cls.layout, "big", {"zeros": 64 << 20})
        small = {name: host_file(path) for name, path in CAT_ROOT.items()}
        small["usr/x"] = 1 << 20
        cls.small_size, cls.small_hex = gzip_image(cls.layout, "small", small)
        cls.many_size, cls.many_hex = gzip_image(cls.layout, "many", {"usr": ("many", 3000)})

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)

    def images(self):
        d = os.path.join(self.home, "images")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def test_a_layer_that_expands_past_the_cap_is_refused_and_leaves_nothing(self):
        self.assertLess(self.big_size, 100 << 10)
        p = self.assert_fails(["create", "--disk-mb", "16", "--image",
                               "oci:%s:big" % self.layout], "cap")
        self.assertIn("oci:%s:big" % self.layout, p.stderr)
        self.assertEqual([n for n in self.images() if not n.endswith(".lock")], [])
        # inodes too: 3001 entries against a quota of 1000
        self.assert_fails(["create", "--disk-inodes", "1000", "--image",
                           "oci:%s:many" % self.layout], "inodes")
        # under its cap it unpacks and runs
        ref = self.cowbox("create", "--disk-mb", "16", "--image",
                          "oci:%s:small" % self.layout).stdout.strip()
        self.assertIn(self.small_hex, self.images())
        # the cap is per unpack: the cached root is reused, whatever the next cap
        self.assertTrue(ref)

    def test_image_ls_and_prune(self):
        ref = self.cowbox("create", "--image", "oci:%s:small" % self.layout).stdout.strip()
        other = self.cowbox("create", "--image", "oci:%s:many" % self.layout).stdout.strip()
        ls = json.loads(self.cowbox("image", "ls", "--json").stdout)
        roots = {r["id"]: r for r in ls["images"]}
        self.assertEqual(set(roots), {self.small_hex, self.many_hex})
        self.assertEqual(roots[self.small_hex]["workspaces"], [ref])
        self.assertGreaterEqual(roots[self.small_hex]["bytes"], 1 << 20)
        self.assertGreaterEqual(roots[self.many_hex]["inodes"], 3000)
        self.assertIn(self.small_hex[:12], self.cowbox("image", "ls").stdout)
        # nothing is pruned while both are used
        self.assertEqual(json.loads(self.cowbox("image", "prune", "--json").stdout)["removed"],
                         [])
        self.cowbox("rm", other)
        out = json.loads(self.cowbox("image", "prune", "--json").stdout)
        self.assertEqual(out["removed"], [self.many_hex])
        self.assertGreater(out["bytes"], 0)
        self.assertEqual([n for n in self.images() if not n.endswith(".lock")],
                         [self.small_hex, self.small_hex + ".json"])
        # idempotent
        self.assertEqual(json.loads(self.cowbox("image", "prune", "--json").stdout)["removed"],
                         [])
        self.assertEqual(self.cowbox("exec", ref, "--", "cat", "/usr/x").returncode, 0)

    def test_prune_racing_creates_never_breaks_one(self):
        # creates of an image no workspace had yet, while prune runs in a loop: each create
        # must succeed and its workspace run (a root pruned meanwhile is unpacked again)
        stop = threading.Event()
        errors, removed = [], []

        def prune_loop():
            while not stop.is_set():
                p = self.cowbox("image", "prune", "--json", check=False)
                if p.returncode != 0:
                    errors.append(p.stderr)
                else:
                    removed.extend(json.loads(p.stdout)["removed"])

        t = threading.Thread(target=prune_loop)
        t.start()
        try:
            for _ in range(4):
                ref = self.cowbox("create", "--image", "oci:%s:small" % self.layout)
                ref = ref.stdout.strip()
                p = self.cowbox("exec", ref, "--", "cat", "/usr/x", check=False)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.cowbox("rm", ref)
        finally:
            stop.set()
            t.join()
        self.assertEqual(errors, [])
        # the root went between the creates (each rm left it unused) and came back each time
        self.assertGreater(len(removed), 0)
        print("prune race: %d removals" % len(removed))


if __name__ == "__main__":
    unittest.main()
