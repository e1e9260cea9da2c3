"""Workspaces as OCI images (issue 36): cowbox export writes a workspace of 5 turns (creates,
modifies, deletes, a directory removed and made again, a file turned into a directory) as an
OCI layout; create --from in a fresh COWBOX_HOME rebuilds it, and every turn's tree, map,
diff and metadata equal the source's; a real registry on loopback (Debian's docker-registry)
gets it through skopeo, a later export pushes only the new layer, and the pull rebuilds it;
podman runs the image with the workspace at /workspace; a tampered layer, a '..' path, a
device node, a wrong map digest and a non-cowbox image are refused leaving nothing; kill -9
mid-import and mid-export leave no usable workspace."""

import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
import unittest
import io

import cbtest
import ociutil
import turnutil

WHY = (None if shutil.which("skopeo") and shutil.which("docker-registry") else
       "skopeo or docker-registry is not installed (scripts/setup)")


def layout_manifest(layout, tag):
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    for d in index["manifests"]:
        if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return index, d, read_blob(layout, d["digest"])
    raise KeyError(tag)


def read_blob(layout, digest):
    with open(os.path.join(layout, "blobs", "sha256", digest.split(":", 1)[1]), "rb") as f:
        return json.loads(f.read())


def put_blob(layout, data):
    return ociutil._put_blob(layout, data)


def forge(src, dst, tag, layer=None, layer_bytes=None, config_edit=None):
    """A copy of layout src (blobs copied, not linked) whose image tag has layer number layer
    replaced by layer_bytes and its config changed by config_edit, every digest made right
    again: only cowbox's own checks can find what is wrong."""
    shutil.copytree(src, dst)
    index, desc, manifest = layout_manifest(dst, tag)
    config = read_blob(dst, manifest["config"]["digest"])
    if layer_bytes is not None:
        b = put_blob(dst, layer_bytes)
        manifest["layers"][layer].update(b)
        config["rootfs"]["diff_ids"][layer] = b["digest"]
    if config_edit:
        config_edit(config)
    manifest["config"].update(put_blob(dst, json.dumps(config).encode()))
    desc.update(put_blob(dst, json.dumps(manifest).encode()))
    with open(os.path.join(dst, "index.json"), "w") as f:
        json.dump(index, f)


def tar_of(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def registry_blobs(d):
    """The blobs (layers, configs, manifests) the registry stores."""
    root = os.path.join(d, "storage", "docker", "registry", "v2", "blobs")
    return {os.path.basename(dp) for dp, _, files in os.walk(root) if "data" in files}


@unittest.skipIf(WHY, WHY)
class OciExport(cbtest.CowboxTestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="cboci")
        cls.registry, cls.addr = ociutil.start_registry(cls.dir)

    @classmethod
    def tearDownClass(cls):
        ociutil.stop_registry(cls.registry)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def fresh_home(self):
        """A new COWBOX_HOME (the previous one's daemons ended, its files removed)."""
        self.setUp()

    def build_source(self):
        """Workspace w over a small base with 5 turns; returns (ref, per-turn record)."""
        base = self.make_base({"README": "hello\n", "src/a.c": "int a;\n", "src/b.c": "int b;\n",
                               "docs/x.md": "x\n", "lib/old/one.txt": "1\n",
                               "lib/old/two.txt": "2\n"})
        os.symlink("README", os.path.join(base, "link"))
        ref = self.create(base, "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        p = lambda rel: os.path.join(mnt, rel)  # noqa: E731

        def t1():
            with open(p("top.txt"), "w") as f:
                f.write("top\n")
            os.makedirs(p("new/deep"))
            with open(p("new/deep/f.txt"), "w") as f:
                f.write("deep\n")

        def t2():
            with open(p("src/a.c"), "a") as f:
                f.write("int a2;\n")
            os.chmod(p("src/b.c"), 0o600)
            os.symlink("top.txt", p("link2"))

        def t3():
            os.unlink(p("README"))
            os.unlink(p("docs/x.md"))

        def t4():
            shutil.rmtree(p("lib/old"))

        def t5():
            os.mkdir(p("lib/old"))
            with open(p("lib/old/three.txt"), "w") as f:
                f.write("3\n")
            os.unlink(p("src/b.c"))
            os.mkdir(p("src/b.c"))
            with open(p("src/b.c/inner"), "wb") as f:
                f.write(os.urandom(1 << 20))

        record = {}
        for n, step in enumerate((t1, t2, t3, t4, t5), 1):
            step()
            out = self.cowbox("snapshot", ref, "--label", "step %d" % n,
                              "--format", "map").stdout
            self.assertTrue(out.startswith("turn %d\n" % n), out)
            record[n] = {"map": out.split("\n", 1)[1], "tree": turnutil.tree_state(mnt)}
        for n in range(1, 6):
            record[n]["diff"] = self.diff(ref, n - 1, n)
        record["turns"] = self.turns(ref)
        return ref, record

    def diff(self, ref, a, b):
        return self.cowbox_json("diff", ref, str(a), str(b))["events"]

    def turns(self, ref):
        return [(t["turn"], t["label"], t["changes"], round(t["time"], 3))
                for t in self.cowbox_json("turns", ref)["turns"]]

    def check_same(self, ref, record, upto=5):
        """Every turn of ref (imported) equals the source's: diff events, the turn list, and
        (after a rollback to it) its tree and its map."""
        self.assertEqual(self.turns(ref), record["turns"][:upto])
        for n in range(1, upto + 1):
            self.assertEqual(self.diff(ref, n - 1, n), record[n]["diff"], "turn %d" % n)
        self.mount(ref)
        mnt = self.mountpoint(ref)
        self.assertEqual(turnutil.tree_state(mnt), record[upto]["tree"])
        for n in range(upto, 0, -1):
            self.cowbox("rollback", ref, str(n))
            self.assertEqual(turnutil.tree_state(mnt), record[n]["tree"], "turn %d" % n)
            out = self.cowbox("snapshot", ref, "--format", "map").stdout
            self.assertEqual(out.split("\n", 1)[1], record[n]["map"], "turn %d" % n)

    def nothing_left(self):
        """No workspace, no staging directory, no unpacked base."""
        self.assertEqual(self.cowbox_json("ls"), [])
        ws = os.path.join(self.home, "workspaces")
        self.assertEqual(os.listdir(ws) if os.path.isdir(ws) else [], [])
        bases = os.path.join(self.home, "bases")
        self.assertEqual(os.listdir(bases) if os.path.isdir(bases) else [], [])

    def test_export_import_push_pull_and_bad_input(self):
        t0 = time.monotonic()
        ref, record = self.build_source()
        layout = os.path.join(self.dir, "layout")
        st = self.cowbox_json("export", ref, "oci:%s:v5" % layout)
        self.assertEqual((st["turn"], st["layers_written"], st["layers_reused"]), (5, 6, 0))
        # the layers: base, then one per turn with its whiteouts and opaque directory
        _, _, manifest = layout_manifest(layout, "v5")
        self.assertEqual(manifest["annotations"]["dev.cowbox.export"], "1")
        kinds = [(l["annotations"]["dev.cowbox.layer"], l["annotations"].get("dev.cowbox.turn"))
                 for l in manifest["layers"]]
        self.assertEqual(kinds, [("base", None)] + [("turn", str(n)) for n in range(1, 6)])
        names = []
        for l in manifest["layers"]:
            with tarfile.open(os.path.join(layout, "blobs", "sha256",
                                           l["digest"].split(":")[1])) as tar:
                names.append(tar.getnames())
        self.assertIn("workspace/src/a.c", names[0])
        self.assertIn("workspace/.wh.README", names[3])
        self.assertIn("workspace/docs/.wh.x.md", names[3])
        # turn 4 removed lib/old: its whiteout, and lib itself, whose time the removal moved
        # (a turn keeps directories' metadata)
        self.assertEqual(names[4], ["workspace/lib", "workspace/lib/.wh.old"])
        self.assertIn("workspace/lib/old/.wh..wh..opq", names[5])
        # an export of the same turns again writes nothing new
        again = self.cowbox_json("export", ref, "oci:%s:again" % layout)
        self.assertEqual((again["layers_written"], again["layers_reused"]), (0, 6))
        # turns up to 4 pushed, then 5: only turn 5's layer (with a config and a manifest)
        repo = "docker://%s/cowbox/w" % self.addr
        other = registry_blobs(self.dir)  # what other tests of the class pushed
        st4 = self.cowbox_json("export", ref, "--turn", "4", repo + ":t4")
        self.assertEqual(st4["turn"], 4)
        before = registry_blobs(self.dir)
        self.assertEqual(len(before - other), 5 + 2)
        st5 = self.cowbox_json("export", ref, "--turn", "last", repo + ":t5")
        self.assertEqual((st5["layers_written"], st5["layers_reused"]), (1, 5))
        moved = registry_blobs(self.dir) - before
        self.assertEqual(len(moved), 3, moved)
        # skopeo compressed the layers on the way: the registry's t5 is t4's layers and one
        # more, the one that moved
        pushed = {t: json.loads(subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", "%s:%s" % (repo, t)],
            check=True, capture_output=True, text=True, timeout=60).stdout)["layers"]
            for t in ("t4", "t5")}
        self.assertEqual(pushed["t5"][:5], pushed["t4"])
        self.assertIn(pushed["t5"][5]["digest"].split(":")[1], moved)
        # a fresh home: from the layout, and from the registry
        self.fresh_home()
        r2 = self.cowbox("create", "--from", "oci:%s:v5" % layout, "--name", "w2").stdout.strip()
        self.check_same(r2, record)
        # create --from --turn: only the turns up to 3
        r3 = self.cowbox("create", "--from", "oci:%s:v5" % layout, "--turn", "3").stdout.strip()
        self.check_same(r3, record, upto=3)
        self.fresh_home()
        r4 = self.cowbox("create", "--from", repo + ":t5").stdout.strip()
        self.check_same(r4, record)
        # fork and diff across the imported history
        fork = self.cowbox_json("fork", r4, "2", "--name", "f")
        self.mount(fork["ref"])
        self.assertEqual(turnutil.tree_state(self.mountpoint(fork["ref"])), record[2]["tree"])
        # --base: a directory holding exactly the base is taken; another one is refused
        base_dir = os.path.join(self.home, "bases", os.listdir(os.path.join(self.home, "bases"))[0])
        mine = self.make_base()
        shutil.rmtree(mine)
        shutil.copytree(base_dir, mine, symlinks=True)
        r5 = self.cowbox_json("create", "--from", "oci:%s:v5" % layout, "--base", mine)
        self.assertEqual(r5["base"], os.path.realpath(mine))
        with open(os.path.join(mine, "src", "a.c"), "a") as f:
            f.write("changed\n")
        self.assert_fails(["create", "--from", "oci:%s:v5" % layout, "--base", mine],
                          "does not hold the exported base")

        # bad input in a fresh home: nothing is left of any
        self.fresh_home()
        bad = os.path.join(self.dir, "bad")
        idx, _, manifest = layout_manifest(layout, "v5")
        top = os.path.join(layout, "blobs", "sha256", manifest["layers"][5]["digest"][7:])
        with open(top, "rb") as f:
            data = bytearray(f.read())

        def tampered(tag):
            shutil.copytree(layout, bad + tag)
            path = os.path.join(bad + tag, "blobs", "sha256", manifest["layers"][5]["digest"][7:])
            data2 = bytearray(data)
            data2[len(data2) // 2] ^= 0xFF
            if tag == "-truncated":
                data2 = data2[:len(data2) // 2]
            with open(path, "wb") as f:
                f.write(data2)
            return bad + tag

        for what, src, message in (
                ("tampered", tampered("-tampered"), "digest mismatch"),
                ("truncated", tampered("-truncated"), "digest mismatch"),
        ):
            with self.subTest(what):
                self.assert_fails(["create", "--from", "oci:%s:v5" % src], message)
                self.nothing_left()

        def info(name, kind=tarfile.REGTYPE, data=None):
            i = tarfile.TarInfo(name)
            i.type = kind
            i.size = len(data) if data else 0
            if kind == tarfile.CHRTYPE:
                i.devmajor, i.devminor = 1, 3
            if kind == tarfile.LNKTYPE:
                i.linkname = "workspace/src/a.c"
            return i, data

        cases = {
            "dotdot": (tar_of([info("workspace/../evil", data=b"x")]), None, "'..' component"),
            "abs": (tar_of([info("etc/passwd", data=b"x")]), None, "outside workspace/"),
            "device": (tar_of([info("workspace/dev0", tarfile.CHRTYPE)]), None, "device node"),
            "hardlink": (tar_of([info("workspace/top.txt", tarfile.LNKTYPE)]), None,
                         "hard link"),
            "unlisted": (tar_of([info("workspace/extra", data=b"x")]), None,
                         "not in the turn's change list"),
            "map": (None, lambda c: c["cowbox"]["turns"][2].update(map="0" * 64),
                    "map digest"),
            "base": (tar_of([info("workspace/.wh.x")]), None, "whiteout"),
        }
        for what, (layer_bytes, edit, message) in cases.items():
            with self.subTest(what):
                dst = bad + "-" + what
                forge(layout, dst, "v5", 0 if what == "base" else 5, layer_bytes, edit)
                self.assert_fails(["create", "--from", "oci:%s:v5" % dst], message)
                self.nothing_left()
        plain = os.path.join(self.dir, "plain")
        ociutil.add_image(plain, None, "x", [ociutil.entry("etc/x", data=b"x\n")])
        self.assert_fails(["create", "--from", "oci:%s:x" % plain], "not a cowbox export")
        self.nothing_left()
        print("round trip, push, pull and refusals: %.1f s" % (time.monotonic() - t0))

    def test_kill_mid_import_and_mid_export(self):
        base = self.make_base({"d%d/f%d" % (i % 40, i): "%d\n" % i * 50 for i in range(3000)})
        ref = self.create(base, "big")
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "new.txt"), "w") as f:
            f.write("new\n")
        self.cowbox("snapshot", ref)
        layout = os.path.join(self.dir, "big")
        # mid-export: killed once it writes a blob; no image is tagged, nothing imports
        proc = subprocess.Popen([cbtest.COWBOX, "export", ref, "oci:%s:big" % layout],
                                env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        sha = os.path.join(layout, "blobs", "sha256")
        cbtest.wait_for(lambda: proc.poll() is not None or
                        (os.path.isdir(sha) and os.listdir(sha)), 60, 0.001, "a blob")
        proc.kill()
        proc.wait()
        self.assertFalse(os.path.exists(os.path.join(layout, "index.json")))
        self.assert_fails(["create", "--from", "oci:%s:big" % layout], "index.json")
        self.cowbox("export", ref, "oci:%s:big" % layout)
        # the killed export's temporary blob was swept
        self.assertEqual([n for n in os.listdir(sha) if n.startswith(".")], [])
        self.fresh_home()
        # mid-import, at two points: while the base is unpacked, and in the staging dir
        for where in ("bases", "workspaces"):
            proc = subprocess.Popen([cbtest.COWBOX, "create", "--from", "oci:%s:big" % layout],
                                    env=self.env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            d = os.path.join(self.home, where)
            cbtest.wait_for(lambda: proc.poll() is not None or
                            (os.path.isdir(d) and any(n.startswith((".tmp-", ".unpublished-"))
                                                      for n in os.listdir(d))),
                            60, 0.001, "the import to start in " + where)
            self.assertIsNone(proc.poll(), "the import ended before it was killed")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # ls sweeps a dead builder's staging directory: no workspace, usable or not
            self.assertEqual(self.cowbox_json("ls"), [])
            self.assertEqual(os.listdir(os.path.join(self.home, "workspaces")), [])
        r = self.cowbox("create", "--from", "oci:%s:big" % layout).stdout.strip()
        # the next import swept the killed one's half-unpacked base
        self.assertEqual(len(os.listdir(os.path.join(self.home, "bases"))), 1)
        self.mount(r)
        with open(os.path.join(self.mountpoint(r), "d7", "f7")) as f:
            self.assertEqual(f.read(), "7\n" * 50)

    def test_cleanup_of_bases_exports_and_pulls(self):
        """rm takes the workspace's oci-export/ (the layout a push is built in) with it;
        image prune removes the imported bases no workspace uses and keeps those in use; a
        create --from docker:// killed mid-pull leaves its /var/tmp/cowbox-pull-PID-* only
        until the next pull sweeps it."""
        base = self.make_base({"d%d/f%d" % (i % 20, i): "%d\n" % i * 400 for i in range(2000)})
        ref = self.create(base, "w")
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "new.txt"), "w") as f:
            f.write("new\n")
        self.cowbox("snapshot", ref)
        repo = "docker://%s/cowbox/sweep:1" % self.addr
        self.cowbox("export", ref, repo, timeout=300)
        export_dir = os.path.join(self.ws_dir(ref), "oci-export")
        self.assertTrue(os.path.isdir(export_dir))
        self.cowbox("rm", "-f", ref)
        self.assertFalse(os.path.exists(export_dir))
        self.fresh_home()

        def pulls(pid):
            return [n for n in os.listdir("/var/tmp") if n.startswith("cowbox-pull-%d-" % pid)]
        # killed (with its skopeo) while it pulls
        proc = subprocess.Popen([cbtest.COWBOX, "create", "--from", repo], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        cbtest.wait_for(lambda: proc.poll() is not None or pulls(proc.pid), 120, 0.001,
                        "the pull to start")
        self.assertIsNone(proc.poll(), "create --from ended before it was killed")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # its skopeo, adopted by this (subreaper) process, reaped
        cbtest.wait_for(lambda: cbtest.reap_children() or subprocess.run(
            ["pgrep", "-s", str(proc.pid)], capture_output=True).returncode != 0,
            30, 0.05, "the killed session to end")
        self.assertTrue(pulls(proc.pid))
        self.assertEqual(self.cowbox_json("ls"), [])
        # the next pull sweeps it; two workspaces share one unpacked base
        r1 = self.cowbox("create", "--from", repo, timeout=300).stdout.strip()
        self.assertEqual(pulls(proc.pid), [])
        r2 = self.cowbox("create", "--from", repo, "--name", "second",
                         timeout=300).stdout.strip()
        bases = os.path.join(self.home, "bases")
        self.assertEqual(len(os.listdir(bases)), 1)
        # in use: kept
        out = self.cowbox_json("image", "prune")
        self.assertEqual((out["bases_removed"], out["bases_busy"]), ([], False))
        self.assertEqual(len(os.listdir(bases)), 1)
        self.cowbox("rm", "-f", r1)
        self.assertEqual(self.cowbox_json("image", "prune")["bases_removed"], [])
        self.mount(r2)
        with open(os.path.join(self.mountpoint(r2), "d7", "f7")) as f:
            self.assertEqual(f.read(), "7\n" * 400)
        # no workspace uses it: removed, and its bytes counted
        self.cowbox("rm", "-f", r2)
        out = self.cowbox_json("image", "prune")
        self.assertEqual(len(out["bases_removed"]), 1, out)
        self.assertGreater(out["bases_bytes"], 2000 * 800)
        self.assertEqual(os.listdir(bases), [])
        self.assertIn("imported base(s) removed", self.cowbox("image", "prune").stdout)

    def test_base_trusted_by_stat_key(self):
        """The base layer writes base files whose stat is still the base cache's row without
        hashing them; a base file rewritten behind cowbox's back (same size, its mtime put
        back) has a new ctime, is hashed, and fails the export naming it."""
        base = self.make_base({"f%d.txt" % i: "%d\n" % i * 100 for i in range(20)})
        ref = self.create(base, "w")
        self.mount(ref)
        self.cowbox("snapshot", ref)  # hashes the base into its cache
        st = self.cowbox_json("export", ref, "oci:%s:a" % os.path.join(self.dir, "trust-a"))
        self.assertEqual((st["files_trusted"], st["files_hashed"]), (20, 0), st)
        victim = os.path.join(base, "f7.txt")
        old = os.stat(victim)
        with open(victim, "r+") as f:
            f.write("X")
        os.utime(victim, ns=(old.st_atime_ns, old.st_mtime_ns))
        self.assert_fails(["export", ref, "oci:%s:b" % os.path.join(self.dir, "trust-b")],
                          "f7.txt: the base file no longer holds the bytes the turn recorded")

    def test_prune_during_export(self):
        """A prune while an export runs (held at COWBOX_TEST_EXPORT_GATE between the base
        layer and the turns') fails the export naming the blob it removed: no image tagged,
        never a layer of other bytes; the next export is of the pruned history."""
        ref = self.create(self.make_base({"a.txt": "base\n"}), "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        for n in range(1, 4):
            with open(os.path.join(mnt, "a.txt" if n < 3 else "b.txt"), "wb") as f:
                f.write(os.urandom(8192))
            self.cowbox("snapshot", ref)
        blobs = os.path.join(self.ws_dir(ref), "blobs")
        before = set(os.listdir(blobs))
        layout = os.path.join(self.dir, "pruned")
        gate = os.path.join(self.dir, "gate")
        proc = subprocess.Popen([cbtest.COWBOX, "export", ref, "oci:%s:p" % layout],
                                env=dict(self.env, COWBOX_TEST_EXPORT_GATE=gate),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            cbtest.wait_for(lambda: proc.poll() is not None or os.path.exists(gate + ".ready"),
                            120, 0.01, "the export to reach its gate")
            self.assertIsNone(proc.poll(), "the export ended before its gate")
            self.cowbox("prune", ref, "--keep", "1")
            gone = before - set(os.listdir(blobs))
            # turn 1's a.txt is needed by no kept turn: its blob went
            self.assertEqual(len(gone), 1, (before, gone))
        finally:
            open(gate, "w").close()
            out, err = proc.communicate(timeout=300)
        self.assertNotEqual(proc.returncode, 0, out)
        self.assertIn(gone.pop(), err)
        self.assertIn("a.txt", err)
        index = os.path.join(layout, "index.json")
        if os.path.exists(index):
            with open(index) as f:
                self.assertEqual(json.load(f)["manifests"], [])
        # the next export is of the pruned history (one turn), and imports as it
        self.assertEqual(self.cowbox_json("export", ref, "oci:%s:p" % layout, "--json")["turn"],
                         3)
        _, _, manifest = layout_manifest(layout, "p")
        self.assertEqual(len(manifest["layers"]), 2)

    @unittest.skipIf(ociutil.why_not_ready(), ociutil.why_not_ready())
    def test_podman_runs_the_image(self):
        ref = self.create(self.make_base({"README": "hello\n", "gone/x": "x\n"}), "w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        shutil.rmtree(os.path.join(mnt, "gone"))
        with open(os.path.join(mnt, "made.txt"), "w") as f:
            f.write("made\n")
        self.cowbox("snapshot", ref)
        layout = os.path.join(self.dir, "run")
        image_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}",
                                   ociutil.STORE_IMAGE], check=True, capture_output=True,
                                  text=True).stdout.strip()
        self.cowbox("export", ref, "--image", "containers-storage:" + image_id,
                    "oci:%s:run" % layout, timeout=300)
        hexid = ociutil.config_hex(layout, "run")
        try:
            out = subprocess.run(["podman", "run", "--rm", "oci:%s:run" % layout, "sh", "-c",
                                  "pwd; ls /workspace; cat /workspace/made.txt"],
                                 env=ociutil.podman_env(), capture_output=True, text=True,
                                 timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout, "/workspace\nREADME\nmade.txt\nmade\n")
        finally:
            subprocess.run(["podman", "rmi", "-f", hexid], capture_output=True)


if __name__ == "__main__":
    unittest.main()
