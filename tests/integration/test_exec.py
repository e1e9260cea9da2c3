"""cowbox exec and cowbox shell through the built binary: exit codes, output, environment,
working directory, timeouts that leave nothing behind, the local backend, an image root, a
pty shell, and a real cowbox workspace (FUSE mount) at /workspace."""

import os
import pty
import shutil
import signal
import subprocess
import time
import unittest

from cbtest import COWBOX, CowboxTestCase, pid_alive


def host_pids_with(marker):
    """Host pids whose command line contains marker."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


class ExecTestCase(CowboxTestCase):
    def setUp(self):
        super().setUp()
        self.ws = os.path.join(self.tmp, "proj")
        os.mkdir(self.ws)
        with open(os.path.join(self.ws, "hello.txt"), "w") as f:
            f.write("hello from the workspace\n")
        os.mkdir(os.path.join(self.ws, "sub"))

    def run_exec(self, *args, check=False, timeout=60, input=None):
        return self.cowbox("exec", "--dir", self.ws, *args, check=check, timeout=timeout,
                           input=input)


class TestExecDir(ExecTestCase):
    def test_exit_code_and_streams(self):
        p = self.run_exec("--", "sh", "-c", "cat hello.txt; echo oops >&2; exit 3")
        self.assertEqual(p.returncode, 3)
        self.assertEqual(p.stdout, "hello from the workspace\n")
        self.assertEqual(p.stderr, "oops\n")

    def test_workspace_root_cwd_and_hostname(self):
        p = self.run_exec("--", "sh", "-c", "pwd; hostname")
        self.assertEqual(p.stdout, "/workspace\nproj\n", p.stderr)
        p = self.run_exec("--cwd", "sub", "--", "pwd")
        self.assertEqual(p.stdout, "/workspace/sub\n", p.stderr)
        p = self.run_exec("--cwd", "nope", "--", "pwd")
        self.assertEqual(p.returncode, 125)
        self.assertIn("chdir /workspace/nope", p.stderr)

    def test_environment_is_only_the_defaults_and_env(self):
        env = dict(self.env, ANTHROPIC_API_KEY="sk-secret", SOMETHING_ELSE="x")
        p = subprocess.run([COWBOX, "exec", "--dir", self.ws, "--env", "FOO=bar baz", "--",
                            "env"], env=env, capture_output=True, text=True, timeout=60)
        names = sorted(line.split("=", 1)[0] for line in p.stdout.splitlines())
        self.assertEqual(names, ["FOO", "HOME", "LANG", "PATH", "TERM"], p.stdout)
        self.assertIn("FOO=bar baz\n", p.stdout)
        self.assertNotIn("sk-secret", p.stdout)

    def test_shell_string(self):
        p = self.run_exec("--", "echo one two | wc -w")
        self.assertEqual(p.stdout.strip(), "2", p.stderr)
        p = self.run_exec("--shell", "echo $((6 * 7))")
        self.assertEqual(p.stdout, "42\n", p.stderr)

    def test_missing_program_is_127_and_named(self):
        p = self.run_exec("--", "no-such-tool-here", "--flag")
        self.assertEqual(p.returncode, 127)
        self.assertIn("no-such-tool-here", p.stderr)

    def test_killed_by_signal_is_128_plus_n(self):
        p = self.run_exec("--", "sh", "-c", "kill -KILL $$")
        self.assertEqual(p.returncode, 137)

    def test_timeout_kills_the_tree_and_exits_124(self):
        marker = "1000.%d" % os.getpid()
        t0 = time.monotonic()
        p = self.run_exec("--timeout", "0.5", "--", "sh", "-c",
                          "echo started; setsid sleep %s & sleep %s & sleep %s" %
                          (marker, marker, marker))
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(p.returncode, 124)
        self.assertEqual(p.stdout, "started\n")
        self.assertIn("timed out", p.stderr)
        self.assertEqual(host_pids_with(marker), [])

    def test_background_job_does_not_hold_the_call(self):
        # The promise: the call returns at most 2 s after the command exits, whatever its
        # background jobs do. Measured against the same call without a job, so that a
        # loaded machine's slower start is not counted against it.
        t0 = time.monotonic()
        self.run_exec("--", "sh", "-c", "echo done")
        plain = time.monotonic() - t0
        t0 = time.monotonic()
        p = self.run_exec("--", "sh", "-c", "sleep 60 & echo done")
        self.assertLess(time.monotonic() - t0, plain + 3)
        self.assertEqual((p.returncode, p.stdout), (0, "done\n"))

    def test_signals_to_cowbox_reach_the_command(self):
        proc = subprocess.Popen([COWBOX, "exec", "--dir", self.ws, "--", "sh", "-c",
                                 "trap 'echo got-int; exit 3' INT; echo ready; "
                                 "while :; do sleep 0.05; done"],
                                env=self.env, stdout=subprocess.PIPE, text=True)
        self.assertEqual(proc.stdout.readline(), "ready\n")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
        self.assertEqual((proc.returncode, out), (3, "got-int\n"))

    def test_nothing_outlives_the_call(self):
        marker = "300.%d" % os.getpid()
        for backend in ("ns", "local"):
            p = self.run_exec("--backend", backend, "--", "sh", "-c",
                              "setsid sleep %s >/dev/null 2>&1 & echo started" % marker)
            self.assertEqual(p.stdout, "started\n", p.stderr)
            self.assertEqual(host_pids_with(marker), [], backend)

    def test_jobs_end_with_the_command(self):
        # `cowbox exec` ends what its command started with itself, at once (not after the
        # 2 s output drain): a job that holds stdout (&), a setsid'd one and a double-forked
        # one, each seen running before the command exits, write nothing 1 s later; by
        # --dir (ns, local) and by REF (in-process, whatever the workspace's background).
        script = ("(echo > ran-amp; sleep 1; echo > late-amp) & "
                  "setsid sh -c 'echo > ran-setsid; sleep 1; echo > late-setsid' & "
                  "sh -c '(sh -c \"echo > ran-fork; sleep 1; echo > late-fork\" "
                  ">/dev/null 2>&1 &) &'; "
                  "for f in ran-amp ran-setsid ran-fork; do "
                  "while [ ! -e $f ]; do sleep 0.01; done; done; echo started")
        ref = self.create(base=self.make_base({"a.txt": "a\n"}), name="jobs")
        mnt = self.cowbox_json("info", ref)["mountpoint"]
        for where, args in ((self.ws, ("--dir", self.ws, "--backend", "ns")),
                            (self.ws, ("--dir", self.ws, "--backend", "local")),
                            (mnt, (ref,))):
            t0 = time.monotonic()
            p = self.cowbox("exec", *args, "--", "sh", "-c", script, timeout=30)
            took = time.monotonic() - t0
            self.assertEqual((p.returncode, p.stdout), (0, "started\n"), (args, p.stderr))
            time.sleep(1.5)
            names = sorted(os.listdir(where))
            self.assertEqual([n for n in names if n.startswith("ran-")],
                             ["ran-amp", "ran-fork", "ran-setsid"], args)
            self.assertEqual([n for n in names if n.startswith("late-")], [], args)
            self.assertLess(took, 1.9, args)  # no 2 s drain held the call
            for n in names:
                if n.startswith("ran-"):
                    os.unlink(os.path.join(where, n))

    def test_stdin_reaches_the_command(self):
        p = self.run_exec("--", "wc", "-c", input="x" * 1000)
        self.assertEqual(p.stdout.strip(), "1000")

    def test_usage_errors(self):
        self.assert_fails(["exec", "--", "true"], "give a workspace REF or --dir", status=2)
        self.assert_fails(["exec", "--dir", self.ws, "--network", "some", "--", "true"],
                          "--network is none, all or host", status=2)
        self.assert_fails(["exec", "--dir", self.ws, "--bogus", "--", "true"],
                          "unknown option '--bogus'", status=2)
        self.assert_fails(["exec", "--dir", self.ws], "no command given", status=2)
        self.assert_fails(["exec", "--dir", self.ws, "--timeout", "soon", "--", "true"],
                          "--timeout needs a non-negative number", status=2)
        self.assert_fails(["exec", "--dir", os.path.join(self.tmp, "missing"), "--", "true"],
                          "missing", status=125)
        self.assert_fails(["exec", "--dir", self.ws, "--image", self.tmp, "--", "true"],
                          "no usr/ directory", status=125)


class TestLocalBackend(ExecTestCase):
    def test_local_runs_on_the_host_without_credentials(self):
        env = dict(self.env, ANTHROPIC_API_KEY="a", OPENAI_API_KEY="b", AWS_SECRET="c",
                   GOOGLE_API_KEY="d", CURSOR_TOKEN="e", KEEP_ME="yes")
        p = subprocess.run([COWBOX, "exec", "--backend", "local", "--dir", self.ws, "--",
                            "sh", "-c", "pwd; env"], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        self.assertEqual(lines[0], os.path.realpath(self.ws))
        for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "AWS_SECRET", "GOOGLE_API_KEY",
                     "CURSOR_TOKEN"):
            self.assertFalse(any(l.startswith(name + "=") for l in lines), name)
        self.assertIn("KEEP_ME=yes", lines)
        self.assertIn("NOT isolated", p.stderr)

    # Every name and pattern the local backend strips (exec/env.c's table); each must be gone.
    SECRET_ENV = {
        "GITHUB_TOKEN": "ghp_x", "GH_TOKEN": "gho_x", "HF_TOKEN": "hf_x", "NPM_TOKEN": "npm_x",
        "VAULT_TOKEN": "s.x", "VAULT_ADDR": "https://vault", "DATABASE_URL": "postgres:///db",
        "REDIS_URL": "redis://cache:6379", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
        "GPG_AGENT_INFO": "/run/gpg:0:1", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
        "KUBECONFIG": "/root/.kube/config", "DOCKER_AUTH_CONFIG": "{}",
        "MY_SERVICE_TOKEN": "t", "my_lower_secret": "s", "DB_PASSWORD": "p",
        "MYSQL_PWD_PASSWD": "p", "STRIPE_API_KEY": "k", "SENDGRID_APIKEY": "k",
        "MINIO_ACCESS_KEY": "k", "DEPLOY_PRIVATE_KEY": "k", "CI_CREDENTIALS": "c",
        "X_CREDENTIAL": "c", "AUTH": "a", "NEXTAUTH_URL": "https://x", "OAUTH_CLIENT": "o",
        "PROXY_AUTHORIZATION": "Basic x", "TWILIO_SESSION_KEY": "k",
        "ANTHROPIC_API_KEY": "a", "OPENAI_ORG": "o", "AWS_REGION": "r", "GOOGLE_API_KEY": "g",
        "AMQP_URL": "amqp://guest:hunter2@mq:5672/", "UPSTREAM": "https://u:p@example.org/x",
        "MONGO_URI": "mongodb://db/x?authSource=a&password=p",
    }
    HARMLESS_ENV = {"AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "a@example.org",
                    "LANG": "C.UTF-8", "HOMEPAGE_URL": "https://example.org/",
                    "GIT_URL": "ssh://git@example.org/r.git", "KEEP_ME": "yes"}

    def test_local_strips_credentials_by_pattern(self):
        env = dict(self.env, **self.SECRET_ENV, **self.HARMLESS_ENV)
        p = subprocess.run([COWBOX, "exec", "--backend", "local", "--dir", self.ws,
                            "--env", "GITHUB_TOKEN=explicit", "--", "env"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
        for name in self.SECRET_ENV:
            if name != "GITHUB_TOKEN":
                self.assertNotIn(name, got)
        # What the caller gives explicitly still wins.
        self.assertEqual(got.get("GITHUB_TOKEN"), "explicit")
        for name, value in self.HARMLESS_ENV.items():
            self.assertEqual(got.get(name), value, name)
        for name in ("PATH", "HOME"):
            self.assertEqual(got.get(name), os.environ[name], name)

    def test_local_cwd_stays_in_the_workspace(self):
        p = self.run_exec("--backend", "local", "--cwd", "sub", "--", "pwd")
        self.assertEqual(p.stdout.strip(), os.path.join(os.path.realpath(self.ws), "sub"))
        for bad in ("/etc", "../..", "sub/../../x"):
            self.assert_fails(["exec", "--dir", self.ws, "--backend", "local", "--cwd", bad, "--",
                               "pwd"], "must be a path inside the workspace", status=2)

    def test_local_timeout_kills_setsid_grandchildren(self):
        marker = "2000.%d" % os.getpid()
        p = self.cowbox("exec", "--backend", "local", "--dir", self.ws, "--timeout", "0.5",
                        "--", "sh", "-c", "setsid sleep %s & sleep %s" % (marker, marker),
                        check=False)
        self.assertEqual(p.returncode, 124)
        self.assertEqual(host_pids_with(marker), [])


class TestImageAndShell(ExecTestCase):
    def make_image(self):
        """A tiny root image: dash and the libraries it needs, and an /etc marker."""
        img = os.path.join(self.tmp, "image")
        ldd = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True).stdout
        files = ["/usr/bin/dash"] + [w for w in ldd.split() if w.startswith("/")]
        for path in files:
            real = os.path.realpath(path)
            dst = os.path.join(img, path.lstrip("/"))
            if path.startswith("/lib"):
                dst = os.path.join(img, "usr", path.lstrip("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(real, dst)
        for link in ("bin", "lib", "lib64"):
            os.makedirs(os.path.join(img, "usr", link), exist_ok=True)
            os.symlink("usr/" + link, os.path.join(img, link))
        os.makedirs(os.path.join(img, "etc"))
        with open(os.path.join(img, "etc", "marker"), "w") as f:
            f.write("from-the-image\n")
        return img

    def test_image_root(self):
        img = self.make_image()
        p = self.run_exec("--image", img, "--", "/bin/dash", "-c",
                          "read x < /etc/marker; echo $x; [ -e /usr/bin/python3 ] || echo "
                          "no-host-usr; read y < /workspace/hello.txt; echo $y")
        self.assertEqual(p.stdout, "from-the-image\nno-host-usr\nhello from the workspace\n",
                         p.stderr)

    def test_shell_has_a_pty(self):
        p = self.cowbox("shell", "--dir", self.ws, input="tty; echo $((6*7)); exit 5\n",
                        check=False, timeout=30)
        self.assertEqual(p.returncode, 5, p.stdout + p.stderr)
        self.assertIn("/dev/pts/", p.stdout)
        self.assertIn("42", p.stdout)

    def test_shell_on_a_terminal(self):
        master, slave = pty.openpty()
        proc = subprocess.Popen([COWBOX, "shell", "--dir", self.ws], stdin=slave, stdout=slave,
                                stderr=slave, env=self.env, start_new_session=True)
        os.close(slave)
        os.write(master, b"echo in-$(hostname)-$((1+2)); exit 0\n")
        out = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and b"in-proj-3" not in out:
            try:
                out += os.read(master, 4096)
            except OSError:
                break
        self.assertEqual(proc.wait(timeout=20), 0)
        os.close(master)
        self.assertIn(b"in-proj-3", out)


class TestRealWorkspace(CowboxTestCase):
    def test_exec_in_a_cowbox_workspace(self):
        base = self.make_base({"src/a.txt": "base text\n"})
        ref = self.create(base=base, name="fixbug")
        p = self.cowbox("exec", ref, "--", "sh", "-c",
                        "hostname; cat src/a.txt; echo changed > src/a.txt; echo new > b.txt")
        self.assertEqual(p.stdout, "fixbug\nbase text\n")
        mnt = self.cowbox_json("info", ref)["mountpoint"]
        with open(os.path.join(mnt, "src", "a.txt")) as f:
            self.assertEqual(f.read(), "changed\n")
        with open(os.path.join(base, "src", "a.txt")) as f:
            self.assertEqual(f.read(), "base text\n")  # copy-on-write: the base is intact
        self.assertTrue(os.path.exists(os.path.join(mnt, "b.txt")))
        p = self.cowbox("exec", "fixbug", "--", "cat", "b.txt")
        self.assertEqual(p.stdout, "new\n")
        self.assert_fails(["exec", "not-a-workspace", "--", "true"], "not-a-workspace",
                          status=125)

    def test_exec_in_a_served_workspace_needs_no_database(self):
        # Once its daemon serves, exec finds the workspace from the lock and the mount
        # table: with meta.db moved away (the daemon keeps its open file) it still runs,
        # named as before, by ref and by name; `info` (the full route) cannot.
        ref = self.create(base=self.make_base({"a.txt": "a\n"}), name="served")
        self.assertEqual(self.cowbox("exec", ref, "--", "hostname").stdout, "served\n")
        db = os.path.join(self.home, "workspaces", ref, "meta.db")
        os.rename(db, db + ".away")
        try:
            for arg in (ref, "served"):
                p = self.cowbox("exec", arg, "--", "sh", "-c", "hostname; cat a.txt")
                self.assertEqual(p.stdout, "served\na\n")
            self.assertNotEqual(self.cowbox("info", ref, check=False).returncode, 0)
        finally:
            os.rename(db + ".away", db)

    def test_exec_after_the_daemon_died_starts_another(self):
        ref = self.create(base=self.make_base({"a.txt": "a\n"}), name="phoenix")
        self.cowbox("exec", ref, "--", "true")
        pid = self.daemon_pid(ref)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        # the dead daemon's mount and lock are no proof of service: the full route restarts
        p = self.cowbox("exec", ref, "--", "sh", "-c", "hostname; cat a.txt")
        self.assertEqual(p.stdout, "phoenix\na\n")
        self.assertNotIn(self.daemon_pid(ref), (0, pid))


if __name__ == "__main__":
    unittest.main()
