"""A minimal PEP 517 build backend (standard library only) for the cowbox client: a pure
Python wheel of the cowbox/ package, so `pip install ./bindings/python` needs no download."""

import base64
import hashlib
import os
import tarfile
import zipfile

NAME, VERSION = "cowbox", "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST_INFO = "%s-%s.dist-info" % (NAME, VERSION)
METADATA = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: asyncio client for cowbox "
            "sandbox workspaces\nRequires-Python: >=3.9\n" % (NAME, VERSION))
WHEEL = "Wheel-Version: 1.0\nGenerator: cowbox_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files():
    pkg = os.path.join(HERE, NAME)
    return sorted(os.path.join(NAME, f) for f in os.listdir(pkg) if f.endswith(".py"))


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    path = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "METADATA"), "w") as f:
        f.write(METADATA)
    with open(os.path.join(path, "WHEEL"), "w") as f:
        f.write(WHEEL)
    return DIST_INFO


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "%s-%s-py3-none-any.whl" % (NAME, VERSION)
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as whl:
        entries = [(rel, open(os.path.join(HERE, rel), "rb").read())
                   for rel in _package_files()]
        entries += [(DIST_INFO + "/METADATA", METADATA.encode()),
                    (DIST_INFO + "/WHEEL", WHEEL.encode())]
        for rel, data in entries:
            whl.writestr(rel, data)
            records.append(_record_line(rel, data))
        records.append(DIST_INFO + "/RECORD,,")
        whl.writestr(DIST_INFO + "/RECORD", "\n".join(records) + "\n")
    return name


def build_sdist(sdist_directory, config_settings=None):
    name = "%s-%s" % (NAME, VERSION)
    with tarfile.open(os.path.join(sdist_directory, name + ".tar.gz"), "w:gz") as tar:
        for rel in _package_files() + ["pyproject.toml", "cowbox_build.py", "README.md"]:
            tar.add(os.path.join(HERE, rel), arcname=os.path.join(name, rel))
    return name + ".tar.gz"
