"""libcowbox's public line: the built libcowbox.so exports exactly what cowbox.map lists, every
name there is declared in an installed header, only the public headers are installed, each
compiles as C++ (extern "C") on its own, and the example builds against them alone."""

import os
import re
import subprocess
import tempfile
import unittest

SRCDIR = os.environ.get("COWBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILDDIR = os.environ.get("COWBOX_BUILDDIR", "")

# What the library promises: the headers `make install` puts under include/cowbox/.
PUBLIC_HEADERS = {"box.h", "box_net.h", "access.h", "apply.h", "client.h", "daemon.h",
                  "error.h", "exec.h", "sandbox.h"}


def map_symbols():
    """The global names of cowbox.map."""
    with open(os.path.join(SRCDIR, "cowbox.map")) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    body = re.search(r"global:(.*?)local:", text, re.S).group(1)
    return {n.strip() for n in body.split(";") if n.strip()}


def declared_functions(path):
    """The cb_ functions a header declares (a return type, the name, an open parenthesis)."""
    with open(path) as f:
        text = f.read()
    return set(re.findall(r"^[a-z][^(=;#]*?[ *](cb_[a-z0-9_]+)\(", text, re.M))


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] != "A":  # A: the version node itself
            names.add(parts[2].split("@", 1)[0])
    return names


def makefile_var(name):
    with open(os.path.join(BUILDDIR, "Makefile")) as f:
        for line in f:
            if line.startswith(name + " ="):
                return line.split("=", 1)[1].strip()
    return ""


@unittest.skipUnless(BUILDDIR, "COWBOX_BUILDDIR names the build tree (make check sets it)")
class PublicApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="cb-api-")
        dest = os.path.join(cls.tmp.name, "dest")
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
        proc = subprocess.run(["make", "-s", "-C", BUILDDIR, "install-libLTLIBRARIES",
                               "install-pkgincludeHEADERS", "DESTDIR=" + dest],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        cls.root = dest + makefile_var("prefix")
        cls.incdir = os.path.join(cls.root, "include")
        cls.san = makefile_var("SANITIZER_FLAGS").split()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exports_are_the_map(self):
        lib = os.path.join(BUILDDIR, ".libs", "libcowbox.so")
        want, got = map_symbols(), exported(lib)
        self.assertGreater(len(want), 50)
        self.assertEqual(sorted(got - want), [], "exported but not in cowbox.map")
        self.assertEqual(sorted(want - got), [], "in cowbox.map but not exported")

    def test_installed_headers_are_the_public_ones(self):
        got = set(os.listdir(os.path.join(self.incdir, "cowbox")))
        self.assertEqual(got, PUBLIC_HEADERS)
        declared = set()
        for h in PUBLIC_HEADERS:
            declared |= declared_functions(os.path.join(self.incdir, "cowbox", h))
        # Every exported name is declared in an installed header, and every function an
        # installed header declares is exported.
        self.assertEqual(sorted(map_symbols() - declared), [])
        self.assertEqual(sorted(declared - map_symbols()), [])

    def compile(self, lang, source, extra=()):
        cc = "c++" if lang == "c++" else os.environ.get("CC", "cc")
        std = "-std=c++17" if lang == "c++" else "-std=gnu11"
        jansson = subprocess.run(["pkg-config", "--cflags", "jansson"], capture_output=True,
                                 text=True, check=True).stdout.split()
        cmd = [cc, "-x", lang, std, "-Wall", "-Wextra", "-Werror", "-I" + self.incdir] + \
            jansson + list(extra) + [source]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=self.tmp.name)
        self.assertEqual(proc.returncode, 0, "%s\n%s" % (" ".join(cmd), proc.stderr))

    def test_each_header_is_cxx_clean(self):
        # Each header alone, as C++: it includes what it needs and wraps its declarations
        # in extern "C", so a C++ caller links to the C names.
        for h in sorted(PUBLIC_HEADERS):
            with open(os.path.join(self.incdir, "cowbox", h)) as f:
                self.assertIn('#ifdef __cplusplus\nextern "C" {', f.read(), h)
            src = os.path.join(self.tmp.name, "use_%s.cc" % h[:-2])
            with open(src, "w") as f:
                f.write("#include <cowbox/%s>\nint main() { return 0; }\n" % h)
            with self.subTest(header=h):
                self.compile("c++", src, ["-fsyntax-only"])
        # and one that links: the names it calls resolve against the installed library
        src = os.path.join(self.tmp.name, "link.cc")
        with open(src, "w") as f:
            f.write("#include <cowbox/box.h>\n#include <cowbox/error.h>\n"
                    "int main() { cb_error_clear(); return *cb_box_last_code(); }\n")
        libdir = next(d for d, _, files in os.walk(self.root) if "libcowbox.so" in files)
        self.compile("c++", src, self.san + ["-o", os.path.join(self.tmp.name, "link"),
                                             "-L" + libdir, "-lcowbox"])

    def test_example_builds_against_installed_headers(self):
        self.compile("c", os.path.join(SRCDIR, "examples", "embed.c"), ["-fsyntax-only"])


if __name__ == "__main__":
    unittest.main()
