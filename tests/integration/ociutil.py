"""OCI image layouts for the image tests: one copied out of the local podman store (what
scripts/setup-podman imports; no registry), and images made here a layer on top of it."""

import atexit
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile

import cbtest

STORE_IMAGE = os.environ.get("COWBOX_DOCKER_IMAGE", "cowbox-debian:bookworm")
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


def why_not_ready():
    """None when the store's image and the tools are here, else why the tests skip."""
    if os.geteuid() != 0:
        return "needs root (podman's store, umoci keeping owners)"
    for tool in ("podman", "skopeo", "umoci"):
        if not shutil.which(tool):
            return "%s is not installed (scripts/setup)" % tool
    if subprocess.run(["podman", "image", "exists", STORE_IMAGE]).returncode != 0:
        return "no %s in the local podman store (scripts/setup-podman)" % STORE_IMAGE
    return None


def podman_env():
    """The environment podman runs containers in here: scripts/setup-podman's containers.conf
    (runc, cgroupfs, ulimits this machine allows) when it made one."""
    conf = "/var/cache/cowbox/containers.conf"
    return dict(os.environ, CONTAINERS_CONF=conf) if os.path.exists(conf) else dict(os.environ)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_registry(d):
    """A real OCI registry (Debian's docker-registry) on a free loopback port, its storage
    under d: returns (process, "127.0.0.1:PORT"); stop it with stop_registry."""
    port = free_port()
    addr = "127.0.0.1:%d" % port
    with open(d + "/registry.yml", "w") as f:
        f.write("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s/storage\n"
                "http:\n  addr: %s\n" % (d, addr))
    with open(d + "/registry.log", "w") as log:
        proc = subprocess.Popen(["docker-registry", "serve", d + "/registry.yml"],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        cbtest.wait_for(lambda: cbtest.tcp_reachable("127.0.0.1", port), 20,
                        what="the registry")
    except BaseException:
        stop_registry(proc)
        raise
    return proc, addr


def stop_registry(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def copy_from_store(layout, tag="base"):
    """skopeo copy of the store's image into the OCI layout directory layout, tagged tag."""
    # by its ID: skopeo takes a short name for docker.io's, podman for localhost's
    image_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", STORE_IMAGE],
                              check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(["skopeo", "copy", "--quiet", "containers-storage:" + image_id,
                    "oci:%s:%s" % (layout, tag)], check=True, capture_output=True, timeout=300)


def clone_layout(src, dst):
    """A copy of the layout src that add_image can change: blobs hard-linked (never written
    in place), index.json and oci-layout copied."""
    shutil.copytree(src, dst, copy_function=os.link)
    for name in ("index.json", "oci-layout"):
        os.unlink(os.path.join(dst, name))
        shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def _put_blob(layout, data):
    digest = hashlib.sha256(data).hexdigest()
    d = os.path.join(layout, "blobs", "sha256")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, digest), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + digest, "size": len(data)}


def _get_blob(layout, desc):
    with open(os.path.join(layout, "blobs", "sha256", desc["digest"].split(":", 1)[1]),
              "rb") as f:
        return json.loads(f.read())


def _index(layout):
    with open(os.path.join(layout, "index.json")) as f:
        return json.load(f)


def config_hex(layout, tag):
    """The config digest's hex of the image tagged tag: the cache's key."""
    for m in _index(layout)["manifests"]:
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return _get_blob(layout, m)["config"]["digest"].split(":", 1)[1]
    raise KeyError(tag)


def add_image(layout, base_tag, tag, entries, settings=None):
    """A new image tagged tag in layout: base_tag's (None: no base) plus one layer of entries,
    each a (tarfile.TarInfo, bytes or None), and settings (e.g. {"Env": [...], "User": ...})
    over its config's. Returns the config digest's hex."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    layer = dict(_put_blob(layout, buf.getvalue()), mediaType=LAYER)
    index = _index(layout) if os.path.exists(os.path.join(layout, "index.json")) else {
        "schemaVersion": 2, "manifests": []}
    if base_tag:
        base = [m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == base_tag]
        manifest = _get_blob(layout, base[0])
        config = _get_blob(layout, manifest["config"])
    else:
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST, "layers": []}
        config = {"architecture": "amd64", "os": "linux", "config": {},
                  "rootfs": {"type": "layers", "diff_ids": []}}
    config["rootfs"]["diff_ids"].append(layer["digest"])
    config.setdefault("config", {}).update(settings or {})
    manifest["config"] = dict(_put_blob(layout, json.dumps(config).encode()),
                              mediaType="application/vnd.oci.image.config.v1+json")
    manifest["layers"].append(layer)
    desc = dict(_put_blob(layout, json.dumps(manifest).encode()), mediaType=MANIFEST,
                annotations={"org.opencontainers.image.ref.name": tag})
    index["manifests"].append(desc)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump(index, f)
    return manifest["config"]["digest"].split(":", 1)[1]


def entry(name, kind=tarfile.REGTYPE, data=None, mode=0o644, link="", dev=(0, 0)):
    """One tar entry for add_image."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    info.devmajor, info.devminor = dev
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info, data if kind == tarfile.REGTYPE else None


_made = {}


def _remove_made():
    for name in _made.values():
        subprocess.run(["podman", "rmi", "-f", name], capture_output=True)


def store_image_with(name, settings):
    """The store's image with settings over its config, in the local podman store as
    localhost/name (layers shared with it), made once per process and removed at its exit;
    returns that name."""
    if name in _made:
        return _made[name]
    full = "localhost/" + name
    with tempfile.TemporaryDirectory() as tmp:
        layout = os.path.join(tmp, "layout")
        copy_from_store(layout, "base")
        add_image(layout, "base", "derived",
                  [entry("etc/cowbox-derived", data=b"derived\n")], settings=settings)
        subprocess.run(["skopeo", "copy", "--quiet", "oci:%s:derived" % layout,
                        "containers-storage:" + full], check=True, capture_output=True,
                       timeout=300)
    if not _made:
        atexit.register(_remove_made)
    _made[name] = full
    return full
