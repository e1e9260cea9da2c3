"""libcowbox for embedders: examples/embed.c, built against the build tree, runs a whole agent
turn; `make install DESTDIR=...` ships what a program needs to build with pkg-config."""

import os
import re
import subprocess
import unittest

import cbtest

SRCDIR = os.environ.get("COWBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILDDIR = os.environ.get("COWBOX_BUILDDIR", "")
CC = os.environ.get("CC", "cc")


def pkg_config(*args, env=None):
    out = subprocess.run(["pkg-config"] + list(args), env=env, capture_output=True, text=True,
                         check=True).stdout
    return out.split()


def find(root, name):
    for dirpath, _, files in os.walk(root):
        if name in files:
            return os.path.join(dirpath, name)
    return None


# A program that only an installed, pkg-config-described libcowbox can build: it uses box.h,
# error.h and jansson (whose json_t box.h hands out).
PROBE = r"""
#include <cowbox/box.h>
#include <cowbox/error.h>
#include <stdio.h>

int main(void)
{
	struct cb_box *box = NULL;
	json_t *j = json_pack("{s:i}", "ok", 1);
	int rc = cb_box_open("no-such-box", &box);

	printf("open: %d %s\n", rc, cb_box_last_code());
	printf("destroy: %d\n", cb_box_destroy("cb-0123456789abcdef0123456789abcdef"));
	printf("json: %d\n", (int)json_integer_value(json_object_get(j, "ok")));
	json_decref(j);
	return 0;
}
"""


@unittest.skipUnless(BUILDDIR, "COWBOX_BUILDDIR names the build tree (make check sets it)")
class LibCowboxTest(cbtest.CowboxTestCase):
    def setUp(self):
        super().setUp()
        # A library built with the sanitizers needs programs linked with them as well.
        self.san = cbtest.makefile_var("SANITIZER_FLAGS").split()
        self.env["COWBOX_BIN"] = cbtest.COWBOX

    def compile(self, sources, out, cflags, libs):
        cmd = [CC, "-std=gnu11", "-Wall", "-Wextra", "-Werror"] + self.san + cflags + \
            sources + ["-o", out] + libs
        proc = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, "%s\n%s" % (" ".join(cmd), proc.stderr))

    def test_embed_example(self):
        base = self.make_base({"src/main.c": "int main(void) { return 0; }\n",
                               "README": "the sample\n"})
        exe = os.path.join(self.tmp, "embed")
        libdir = os.path.join(BUILDDIR, ".libs")
        self.compile([os.path.join(SRCDIR, "examples", "embed.c")], exe,
                     ["-I" + os.path.join(SRCDIR, "include")] + pkg_config("--cflags", "jansson"),
                     ["-L" + libdir, "-Wl,-rpath," + libdir, "-lcowbox"] +
                     pkg_config("--libs", "jansson"))
        proc = subprocess.run([exe, base], env=self.env, capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(proc.returncode, 0, "stdout:\n%s\nstderr:\n%s" % (proc.stdout,
                                                                          proc.stderr))
        lines = proc.stdout.splitlines()
        m = re.fullmatch(r"create: (cb-[0-9a-f]{32}) workdir /workspace", lines[0])
        self.assertTrue(m, lines[0])
        ref = m.group(1)
        self.assertEqual(lines[1:4], ["run: exit 0", "README", "src"])
        self.assertEqual(lines[4:6], ["exec stdout: got hello", "exec: exit 0"])
        self.assertEqual(lines[6], "snapshot: turn 1, 2 files")
        self.assertEqual(lines[7], "write+read: 21 bytes: written by the agent")
        self.assertEqual(lines[8:11], ["diff 1..2: 2 events", "  created notes",
                                       "  created notes/agent.txt"])
        self.assertEqual(lines[11:], ["rollback: to turn 1, recorded as turn 3",
                                      "rollback: notes/agent.txt is gone (not_found)",
                                      "destroy: " + ref])
        # Destroyed means gone from disk; the base was never written to.
        self.assertFalse(os.path.exists(os.path.join(self.home, "workspaces", ref)))
        self.assertEqual(sorted(os.listdir(base)), ["README", "src"])

    def test_install_and_pkg_config(self):
        dest = os.path.join(self.tmp, "dest")
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
        proc = subprocess.run(["make", "-s", "-C", BUILDDIR, "install", "DESTDIR=" + dest],
                              env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        root = dest + cbtest.makefile_var("prefix")
        for rel in ("bin/cowbox", "include/cowbox/box.h", "include/cowbox/client.h",
                    "include/cowbox/error.h"):
            self.assertTrue(os.path.isfile(os.path.join(root, rel)), rel)
        self.assertTrue(os.access(os.path.join(root, "bin/cowbox"), os.X_OK))
        pc, lib = find(dest, "cowbox.pc"), find(dest, "libcowbox.so")
        self.assertTrue(pc and lib, "cowbox.pc and libcowbox.so are installed")
        self.assertTrue(find(dest, "cowbox.1"), "the man page is installed")

        pkg_env = dict(env, PKG_CONFIG_PATH=os.path.dirname(pc), PKG_CONFIG_SYSROOT_DIR=dest)
        cflags = pkg_config("--cflags", "cowbox", env=pkg_env)
        libs = pkg_config("--libs", "cowbox", env=pkg_env)
        self.assertIn("-lcowbox", libs)
        self.assertIn("-I" + os.path.join(root, "include"), cflags)
        src, exe = os.path.join(self.tmp, "probe.c"), os.path.join(self.tmp, "probe")
        with open(src, "w") as f:
            f.write(PROBE)
        self.compile([src], exe, cflags,
                     libs + ["-Wl,-rpath," + os.path.dirname(os.path.realpath(lib))])
        ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
        self.assertIn(os.path.realpath(lib).rsplit(".so", 1)[0], ldd)
        run = subprocess.run([exe], env=self.env, capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.splitlines(), ["open: -2 not_found", "destroy: 0",
                                                   "json: 1"])
        # The installed command runs against the installed library.
        ver = subprocess.run([os.path.join(root, "bin/cowbox"), "--version"],
                             env=dict(self.env, LD_LIBRARY_PATH=os.path.dirname(lib)),
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(ver.stdout.strip(), "cowbox " + cbtest.makefile_var("PACKAGE_VERSION"))


if __name__ == "__main__":
    unittest.main()
