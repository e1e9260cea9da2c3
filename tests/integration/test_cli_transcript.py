"""The CLI a person meets, as transcripts: each case runs cowbox commands and compares their
standard output, standard error and exit status with what a user is promised (issue 33: one
clean error line, usage errors, --json errors and exit statuses; issue 30: quoted names)."""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess

from cbtest import COWBOX, CowboxTestCase, makefile_var

# A transcript: "$ cowbox ARGS" runs a command; the lines after it are its standard output
# ("! " lines: its standard error), in order, then "[N]" its exit status. "<*>" in an expected
# line matches any text, <NAME> is the case's value NAME, and an expected line that opens with
# "{" or "[{" is JSON, compared as a value; "<empty>" is an empty line.


def _fill(line, values):
    return re.sub(r"<(\w+)>", lambda m: values[m.group(1)], line)


class TranscriptCase(CowboxTestCase):
    def _same(self, want, got, where):
        if want.startswith(("{", "[{")) and "<*>" not in want:
            try:
                value = json.loads(got)
            except ValueError:
                self.fail("not JSON: %r\n%s" % (got, where))
            self.assertEqual(value, json.loads(want), where)
        else:
            pattern = "^" + ".*".join(re.escape(p) for p in want.split("<*>")) + "$"
            self.assertRegex(got, pattern, where)

    def transcript(self, text, **values):
        cmd, out, err = None, [], []
        for raw in text.strip("\n").splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("$ cowbox "):
                cmd = shlex.split(_fill(line[len("$ cowbox "):], values))
                out, err = [], []
            elif re.fullmatch(r"\[\d+\]", line):
                self._run(cmd, out, err, int(line[1:-1]))
                cmd = None
            elif line.startswith("!"):
                err.append(_fill(line[2:], values))
            else:  # "<empty>": an empty line
                out.append("" if line == "<empty>" else _fill(line, values))
        self.assertIsNone(cmd, "a transcript's command lacks its [status]")

    def _run(self, args, out, err, status):
        proc = self.cowbox(*args, check=False)
        # the ref cowbox create logs as it makes a workspace is not part of a transcript
        got_err = [l for l in proc.stderr.splitlines()
                   if not l.startswith("cowbox: creating workspace ")]
        where = "$ cowbox %s\nexit %d\nstdout:\n%s\nstderr:\n%s" % (
            " ".join(args), proc.returncode, proc.stdout, proc.stderr)
        self.assertEqual(proc.returncode, status, where)
        for want, got, name in ((out, proc.stdout.splitlines(), "stdout"),
                                (err, got_err, "stderr")):
            self.assertEqual(len(got), len(want), "%s lines: %s" % (name, where))
            for w, g in zip(want, got):
                self._same(w, g, where)


class TestErrors(TranscriptCase):
    def test_one_clean_error_line_and_its_status(self):
        base = self.make_base({"a.txt": "a\n"})
        self.create(base, name="w")
        self.transcript("""
            $ cowbox diff w 99
            ! cowbox diff: turn 99 does not exist (latest: 0)
            [3]
            $ cowbox diff w 99 --json
            {"error": {"code": "not_found", "message": "turn 99 does not exist (latest: 0)"}}
            ! cowbox diff: turn 99 does not exist (latest: 0)
            [3]
            $ cowbox info nope
            ! cowbox info: no workspace named 'nope'
            [3]
            $ cowbox info nope --json
            {"error": {"code": "not_found", "message": "no workspace named 'nope'"}}
            ! cowbox info: no workspace named 'nope'
            [3]
            $ cowbox create --name w
            ! cowbox create: <*>already used by <*>
            [4]
        """)

    def test_every_command_says_not_found_the_same_way(self):
        extra = {"diff": ["0"], "rollback": ["0"], "fork": ["0", "--name", "f"],
                 "prune": ["--keep", "1"], "reaches": ["example.com"], "publish": ["80"],
                 "unpublish": ["80"], "host-url": ["80"], "merge": ["nope"],
                 "export": ["oci:/nonexistent"]}
        commands = re.findall(r"^  ([a-z-]+) ", self.cowbox("--help").stdout, re.M)
        for cmd in commands:
            if cmd in ("create", "ls", "exec", "shell", "image"):  # no workspace operand
                continue
            with self.subTest(cmd=cmd):
                proc = self.cowbox(cmd, "nope", *extra.get(cmd, []), "--json", check=False)
                self.assertEqual(proc.returncode, 3, proc.stderr)
                self.assertEqual(json.loads(proc.stdout), {"error": {
                    "code": "not_found", "message": "no workspace named 'nope'"}})
                self.assertEqual(proc.stderr, "cowbox %s: no workspace named 'nope'\n" % cmd)

    def test_usage_errors_name_the_token_and_point_at_help(self):
        self.transcript("""
            $ cowbox exec -xt w sh
            ! cowbox exec: unknown option '-x' in '-xt'
            ! usage: cowbox exec REF|--dir DIR [OPTIONS] [--] CMD [ARG...]
            ! see `cowbox exec --help`
            [2]
            $ cowbox diff --frob w 1
            ! cowbox diff: unknown option '--frob'
            ! usage: cowbox diff REF A [B] [--json] [--patch] [--net]
            ! see `cowbox diff --help`
            [2]
            $ cowbox info
            ! cowbox info: missing the workspace (a ref or name)
            ! usage: cowbox info REF [--stats] [--json | -f FIELD]
            ! see `cowbox info --help`
            [2]
            $ cowbox info a b
            ! cowbox info: one workspace only: unexpected 'b'
            ! usage: cowbox info REF [--stats] [--json | -f FIELD]
            ! see `cowbox info --help`
            [2]
            $ cowbox create --disk-inodes lots
            ! cowbox create: --disk-inodes needs a whole number >= 0, not 'lots'
            ! usage: cowbox create <*> ...
            ! see `cowbox create --help`
            [2]
            $ cowbox snapshot --label
            ! cowbox snapshot: missing value for option '--label'
            ! usage: <*>
            ! see `cowbox snapshot --help`
            [2]
            $ cowbox info --json
            {"error": {"code": "usage", "message": "missing the workspace (a ref or name)"}}
            ! cowbox info: missing the workspace (a ref or name)
            ! usage: cowbox info REF [--stats] [--json | -f FIELD]
            ! see `cowbox info --help`
            [2]
        """)

    def test_did_you_mean(self):
        self.transcript("""
            $ cowbox dif w 1
            ! cowbox: unknown command 'dif'
            ! did you mean: diff
            ! see `cowbox --help`
            [2]
            $ cowbox snapshto w
            ! cowbox: unknown command 'snapshto'
            ! did you mean: snapshot
            ! see `cowbox --help`
            [2]
            $ cowbox un w
            ! cowbox: unknown command 'un'
            ! did you mean: unpublish
            ! see `cowbox --help`
            [2]
            $ cowbox frobnicate
            ! cowbox: unknown command 'frobnicate'
            ! see `cowbox --help`
            [2]
        """)

    def test_rm_json_returns_the_real_ref(self):
        ref = self.create(name="gone")
        self.transcript("""
            $ cowbox rm gone --json
            {"ref": "<ref>", "name": "gone", "removed": true}
            [0]
            $ cowbox rm <ref> --json
            {"ref": "<ref>", "name": null, "removed": false}
            [0]
            $ cowbox rm gone
            ! cowbox rm: no workspace named 'gone'
            [3]
        """, ref=ref)

    def test_python_says_the_command_once(self):
        import asyncio

        import cowbox

        async def bad_create():
            with self.assertRaises(cowbox.WorkspaceError) as cm:
                await cowbox.Sandbox.create(None, name="no/slash", cowbox=COWBOX, home=self.home)
            return str(cm.exception)

        message = asyncio.run(bad_create())
        self.assertTrue(message.startswith("cowbox create: "), message)
        self.assertEqual(message.count("cowbox create:"), 1, message)
        self.assertIn("bad workspace name", message)

    def test_python_raises_the_standard_subclasses_and_finds_cowbox_bin(self):
        import asyncio

        import cowbox

        missing = os.path.join(self.tmp, "missing")
        afile = os.path.join(self.tmp, "afile")
        with open(afile, "w") as f:
            f.write("x")

        async def body():
            with self.assertRaises(FileNotFoundError) as cm:
                await cowbox.Sandbox.create(missing, cowbox=COWBOX, home=self.home)
            self.assertIsInstance(cm.exception, cowbox.WorkspaceError)
            with self.assertRaises(NotADirectoryError):
                await cowbox.Sandbox.create(afile, cowbox=COWBOX, home=self.home)
            box = await cowbox.Sandbox.create(None, cowbox=COWBOX, home=self.home)
            try:
                with self.assertRaises(FileNotFoundError) as cm:
                    await box.read("no/such/file")
                self.assertIsInstance(cm.exception, cowbox.WorkspaceNotFoundError)
            finally:
                await box.close()
            # the binary from COWBOX_BIN, with a hint when it is not there
            saved = dict(os.environ)
            os.environ.pop("COWBOX", None)
            os.environ["COWBOX_BIN"] = os.path.join(self.tmp, "no-cowbox")
            try:
                with self.assertRaises(FileNotFoundError) as cm:
                    await cowbox.Sandbox.create(None, home=self.home)
                self.assertIn("COWBOX_BIN", str(cm.exception))
                os.environ["COWBOX_BIN"] = COWBOX
                rows = await cowbox.Sandbox.list(home=self.home)
                self.assertEqual(len(rows), 1)
            finally:
                os.environ.clear()
                os.environ.update(saved)

        asyncio.run(body())

    def test_exit_statuses_are_the_man_pages(self):
        # the table of man/cowbox.1's EXIT STATUS is the one the CLI keeps (cli/cmd_common.h)
        top = os.path.join(os.path.dirname(__file__), "..", "..")
        with open(os.path.join(top, "man", "cowbox.1")) as f:
            man = f.read()
        table = man[man.index(".SH EXIT STATUS"):man.index(".SH ENVIRONMENT")]
        rows = dict(re.findall(r"^(\d)\t([^\t]*)\t", table, re.M))
        with open(os.path.join(top, "cli", "cmd_common.h")) as f:
            header = f.read()
        defined = {int(v) for v in re.findall(r"#define CLI_\w+\s+(\d)", header)}
        self.assertEqual({int(k) for k in rows}, defined)
        self.assertEqual(rows["3"], "not_found")
        self.assertEqual(rows["2"], "usage")


TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LONG_OPT = r"(?<![\w-])--[a-z][a-z0-9-]*"


def _man_sections(commands):
    """Each command's entry of man/cowbox.1 (from its ".TP/.B CMD" line to the next command's,
    or the next section), with roff's dashes and font changes taken out."""
    with open(os.path.join(TOP, "man", "cowbox.1")) as f:
        lines = f.read().split("\n")

    def norm(text):
        return re.sub(r"\\f[BIRP]", "", text.replace("\\-", "-"))

    starts = [(i, norm(m.group(1))) for i, l in enumerate(lines)
              for m in [re.match(r"^\.B (\S+)", l)]
              if m and i and lines[i - 1] == ".TP" and norm(m.group(1)) in commands]
    sections = {}
    for k, (i, cmd) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        for j in range(i + 1, end):
            if lines[j].startswith((".SS", ".SH")):
                end = j
                break
        sections[cmd] = norm("\n".join(lines[i:end]))
    return sections


class TestOptionsAndManPage(TranscriptCase):
    # CLI-only spellings of an API option (docker's units) and the parts of one (a secret's
    # prefix and suffix belong to the --secret before them)
    CLI_ONLY = {"--memory": "memory_mb", "--disk": "disk_mb", "--secret-prefix": "header_bindings",
                "--secret-suffix": "header_bindings"}
    # the API's plural option, the CLI's repeatable flag; from_ (a keyword) and its turn
    API_TO_FLAG = {"volumes": "--volume", "header_bindings": "--secret", "secrets": "--secret",
                   "from_": "--from", "from_turn": "--turn"}
    NOT_OPTIONS = {"cls", "cowbox", "home"}  # COWBOX_BIN and COWBOX_HOME, not the workspace's

    def test_create_takes_every_option_of_the_api_and_no_other(self):
        import inspect

        import cowbox

        api = set(inspect.signature(cowbox.Sandbox.create).parameters) - self.NOT_OPTIONS
        api |= {"allow"}  # cowbox.Network.allow(hosts=...): the backend option allow
        flags = set(re.findall(LONG_OPT, self.cowbox("create", "--help").stdout))
        flags -= {"--help", "--json"}
        flag_of = {a: self.API_TO_FLAG.get(a, "--" + a.replace("_", "-")) for a in api}
        self.assertEqual(sorted(a for a in api if flag_of[a] not in flags), [],
                         "API options without a create flag")
        known = set(flag_of.values()) | set(self.CLI_ONLY)
        self.assertEqual(sorted(flags - known), [], "create flags the API does not have")
        # and the daemon's own list: every backend option configure knows has its flag
        ref = self.create()
        self.mount(ref)
        options = self.client(ref).request("configure")["options"]
        for key in options:
            self.assertIn(self.API_TO_FLAG.get(key, "--" + key.replace("_", "-")),
                          flags, key)

    def test_the_man_page_and_help_name_the_same_options(self):
        commands = re.findall(r"^  ([a-z-]+) ", self.cowbox("--help").stdout, re.M)
        self.assertIn("create", commands)
        sections = _man_sections(commands)
        for cmd in commands:
            with self.subTest(cmd=cmd):
                self.assertIn(cmd, sections, "man/cowbox.1 has no entry for " + cmd)
                helped = set(re.findall(LONG_OPT, self.cowbox(cmd, "--help").stdout))
                manned = set(re.findall(LONG_OPT, sections[cmd]))
                # every command takes --help and --json (said once, at the top of the page)
                helped -= {"--help", "--json"}
                manned -= {"--help", "--json"}
                self.assertEqual(sorted(helped - manned), [], "in --help, not the man page")
                self.assertEqual(sorted(manned - helped), [], "in the man page, not --help")

    def test_create_options_land_as_the_api_keeps_them(self):
        self.env["CB_T_HOST"] = "from the host"
        self.transcript("""
            $ cowbox create --backend vm --name v
            <*>
            [0]
            $ cowbox create --backend nope
            ! cowbox create: --backend is <*>, not 'nope'
            ! usage: <*>
            ! see `cowbox create --help`
            [2]
            $ cowbox create --memory 1g --disk 2g --pids 50 --timeout 30 --cpus 0.5 --env A=1 --env CB_T_HOST --working-dir sub --on-destroy true --name o
            <*>
            [0]
            $ cowbox create --memory lots
            ! cowbox create: --memory-mb: a size in MiB or with a unit (512m, 2g) is expected, not 'lots'
            ! usage: <*>
            ! see `cowbox create --help`
            [2]
            $ cowbox create --env CB_T_UNSET
            ! cowbox create: --env CB_T_UNSET: CB_T_UNSET is not set here
            ! usage: <*>
            ! see `cowbox create --help`
            [2]
        """)
        self.assertEqual(self.cowbox_json("info", "v")["backend"], "vm")
        with open(os.path.join(self.ws_dir(self.cowbox_json("info", "o")["ref"]),
                               "backend.json")) as f:
            opts = json.load(f)
        self.assertEqual((opts["memory_mb"], opts["disk_mb"], opts["pids"], opts["timeout"],
                          opts["cpus"], opts["working_dir"], opts["on_destroy"]),
                         (1024, 2048, 50, 30, 0.5, "sub", ["true"]))
        self.assertEqual(opts["env"], {"A": "1", "CB_T_HOST": "from the host"})

    def test_create_runs_its_hooks_as_the_api_does(self):
        out = self.cowbox_json("create", "--name", "h", "--on-create", "echo a > a.txt",
                               "--setup-script", "echo s > s.txt")
        self.assertEqual(out["baseline_turn"], 1)
        turns = self.cowbox_json("turns", "h")["turns"]
        self.assertEqual([(t["turn"], t["label"]) for t in turns], [(1, "on_create")])
        paths = [e["path"] for e in self.cowbox_json("diff", "h", "0")["events"]]
        self.assertEqual(sorted(paths), ["a.txt", "s.txt"])
        # with a narrower access too: the hooks run first, then the level applies
        out = self.cowbox_json("create", "--name", "narrow", "--on-create", "echo n > n.txt",
                               "--access", "files")
        self.assertEqual(out["baseline_turn"], 1)
        self.assertEqual(self.cowbox("access", "narrow").stdout.strip(), "files")
        self.assertEqual(self.cowbox("exec", "narrow", "--", "true", check=False).returncode,
                         125)
        self.cowbox("rm", "narrow")
        # a failing hook fails the create and leaves nothing
        proc = self.cowbox("create", "--name", "bad", "--on-create", "exit 3", check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertEqual([w["name"] for w in self.cowbox_json("ls")], ["h"])


class TestTurnReferences(TranscriptCase):
    def test_last_last_n_and_labels_wherever_a_turn_is_taken(self):
        base = self.make_base({"a.txt": "a\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        with open(os.path.join(mnt, "one.txt"), "w") as f:
            f.write("1\n")
        self.cowbox("snapshot", "w", "--label", "first")
        with open(os.path.join(mnt, "two.txt"), "w") as f:
            f.write("2\n")
        self.cowbox("snapshot", "w")
        self.transcript("""
            $ cowbox diff w last~1 last
            created      file    two.txt  <*>
            [0]
            $ cowbox diff w last~2 first
            created      file    one.txt  <*>
            [0]
            $ cowbox diff w last~3
            ! cowbox diff: 'last~3': only 1 turn before the last
            [3]
            $ cowbox diff w nosuch
            ! cowbox diff: no turn labelled 'nosuch' (a turn is a number, last, last~N or a label)
            [3]
            $ cowbox log w --turn first
            1    <*>  create      one.txt  (pid <*>)
            [0]
            $ cowbox fork w first --name f
            cb-<*>
            [0]
            $ cowbox rollback w first
            rolled back to turn 1: 1 paths restored, recorded as turn 3
            [0]
            $ cowbox diff w last~1 last
            deleted      file    two.txt  (pid <*>)
            [0]
        """)
        fork = self.cowbox_json("info", "f")["ref"]
        self.mount(fork)
        self.assertEqual(sorted(os.listdir(self.mountpoint(fork))), ["a.txt", "one.txt"])

    def test_info_field_and_host_url(self):
        ref = self.create(name="w")
        self.transcript("""
            $ cowbox info -f ref w
            <ref>
            [0]
            $ cowbox info --field name w
            w
            [0]
            $ cowbox info -f base w
            <empty>
            [0]
            $ cowbox info -f limits.pids w
            1024
            [0]
            $ cowbox info -f nope w
            ! cowbox info: no field 'nope' (fields: ref, name, <*>)
            ! usage: cowbox info REF [--stats] [--json | -f FIELD]
            ! see `cowbox info --help`
            [2]
            $ cowbox host-url w 8080
            http://127.0.0.1:8080
            [0]
            $ cowbox host-url w 0
            ! cowbox host-url: PORT is 1-65535, not '0'
            ! usage: cowbox host-url REF PORT [--json]
            ! see `cowbox host-url --help`
            [2]
        """, ref=ref)


class TestDockerHabits(TranscriptCase):
    def test_exec_short_options_env_from_the_host_and_units(self):
        self.create(name="w")
        self.env["CB_T_HOST"] = "from the host"
        self.transcript("""
            $ cowbox exec -e A=1 -e CB_T_HOST -w . -u 0 w -- sh -c 'echo "$A/$CB_T_HOST"; id -u; pwd'
            1/from the host
            0
            /workspace
            [0]
            $ cowbox exec -t w -- sh -c 'test -t 0 && test -t 1 && echo on a tty'
            on a tty
            [0]
            $ cowbox exec -i w -- sh -c 'test -t 0 || cat'
            [0]
            $ cowbox exec --memory 64m w -- true
            [0]
            $ cowbox exec --memory lots w -- true
            ! cowbox exec: --memory: a size in MiB or with a unit (512m, 2g) is expected, not 'lots'
            ! usage: cowbox exec REF|--dir DIR [OPTIONS] [--] CMD [ARG...]
            ! see `cowbox exec --help`
            [2]
            $ cowbox exec -e CB_T_UNSET w -- true
            ! cowbox exec: --env CB_T_UNSET: CB_T_UNSET is not set here
            ! usage: cowbox exec REF|--dir DIR [OPTIONS] [--] CMD [ARG...]
            ! see `cowbox exec --help`
            [2]
        """)

    def test_detached_server_reached_through_publish(self):
        import time
        import urllib.request

        ref = self.create(name="w")
        self.mount(ref)
        port = 20000 + os.getpid() % 10000  # inside the sandbox's own namespace
        self.transcript("""
            $ cowbox exec -d w -- python3 -m http.server <port> --bind 127.0.0.1
            [0]
            $ cowbox exec -d --dir /tmp -- true
            ! cowbox exec: -d runs a job in a workspace on its own options: no --dir, -t, --json, --image, --network, --privileged, --backend or limits
            ! see `cowbox exec --help`
            [2]
        """, port=str(port))
        address = self.cowbox("publish", "w", str(port)).stdout.strip()
        deadline, body = time.monotonic() + 20, None
        while body is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen("http://%s/" % address, timeout=2) as r:
                    body = r.read()
            except OSError:
                time.sleep(0.2)
        self.assertIsNotNone(body, "the detached server never answered")
        self.assertIn(b"Directory listing", body)
        # publish HOST_PORT:PORT as docker's -p, and info lists what is open
        with socket.socket() as probe:  # a free port of the host's loopback
            probe.bind(("127.0.0.1", 0))
            host_port = probe.getsockname()[1]
        self.transcript("""
            $ cowbox unpublish w <port>
            [0]
            $ cowbox publish w <host>:<port>
            127.0.0.1:<host>
            [0]
            $ cowbox publish w 1<host>:<port>
            ! cowbox publish: HOST_PORT is 1-65535, not '1<host>'
            ! usage: cowbox publish REF [HOST_PORT:]PORT [--json]
            ! see `cowbox publish --help`
            [2]
            $ cowbox info -f published w
            [{"port": <port>, "host_port": <host>, "address": "127.0.0.1:<host>"}]
            [0]
        """, port=str(port), host=str(host_port))
        self.assertIn("published:   127.0.0.1:%d -> port %d inside" % (host_port, port),
                      self.cowbox("info", "w").stdout)
        with urllib.request.urlopen("http://127.0.0.1:%d/" % host_port, timeout=5) as r:
            self.assertIn(b"Directory listing", r.read())

    def test_rm_of_unrecorded_changes_asks_for_force(self):
        ref = self.create(name="w")
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "f.txt"), "w") as f:
            f.write("x\n")
        self.transcript("""
            $ cowbox rm w
            ! cowbox rm: w is mounted with 1 change no snapshot recorded (`cowbox diff w last`); -f removes it anyway
            [4]
            $ cowbox rm w --json
            {"error": {"code": "conflict", "message": "w is mounted with 1 change no snapshot recorded (`cowbox diff w last`); -f removes it anyway"}}
            ! cowbox rm: <*>
            [4]
            $ cowbox snapshot w
            turn 1
            f.txt  <*>
            [0]
            $ cowbox rm w
            [0]
        """)
        ref = self.create(name="v")
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "f.txt"), "w") as f:
            f.write("x\n")
        self.transcript("""
            $ cowbox rm -f v
            [0]
            $ cowbox info v
            ! cowbox info: no workspace named 'v'
            [3]
        """)


class TestQuotedNames(TranscriptCase):
    def test_a_name_cannot_forge_a_line(self):
        # issue 30.7: "notes.txt<TAB>deleted file Makefile.am" made diff and log print a line
        # saying Makefile.am was deleted. Quoted as git's core.quotePath quotes; --json exact.
        forged = "notes.txt\tdeleted file Makefile.am"
        newline = "two\nlines"
        base = self.make_base({"Makefile.am": "x\n"})
        ref = self.create(base, name="q")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        for name in (forged, newline, " lead", "back\\slash", "plain.txt"):
            with open(os.path.join(mnt, name), "w") as f:
                f.write("x\n")
        self.cowbox("snapshot", "q")
        proc = self.cowbox("diff", "q", "0")
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), 5, proc.stdout)
        paths = [re.match(r"^created\s+file\s+(\S.*?)  [0-9a-f]{12}", l).group(1) for l in lines]
        self.assertEqual(sorted(paths), sorted(['" lead"', '"back\\\\slash"',
                                                '"notes.txt\\tdeleted file Makefile.am"',
                                                "plain.txt", '"two\\nlines"']))
        log = self.cowbox("log", "q").stdout
        self.assertEqual(len(log.splitlines()), 5, log)
        self.assertIn('"notes.txt\\tdeleted file Makefile.am"', log)
        self.assertNotIn("\tdeleted", log)
        snap = self.cowbox("snapshot", "q").stdout
        self.assertIn('"two\\nlines"  ', snap)
        # --json stays exact
        events = json.loads(self.cowbox("diff", "q", "0", "--json").stdout)["events"]
        self.assertEqual(sorted(e["path"] for e in events),
                         sorted([forged, newline, " lead", "back\\slash", "plain.txt"]))
        rows = json.loads(self.cowbox("log", "q", "--json").stdout)
        self.assertIn(forged, [r["path"] for r in rows])


class TestOnATerminal(TranscriptCase):
    def test_snapshot_says_one_line_on_a_terminal_and_the_map_on_a_pipe(self):
        base = self.make_base({"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        for name in ("new1", "new2"):
            with open(os.path.join(mnt, name), "w") as f:
                f.write("n\n")
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("changed\n")
        os.unlink(os.path.join(mnt, "b.txt"))
        status, text = self.on_tty("snapshot", "w")
        self.assertEqual(status, 0, text)
        self.assertEqual(text.replace("\r", "").strip().splitlines()[-1],
                         "turn 1: 2 created, 1 modified, 1 deleted")
        # on a pipe (and with --format map) the whole map, as before
        self.transcript("""
            $ cowbox snapshot w
            turn <*>
            a.txt  <*>
            c.txt  <*>
            new1  <*>
            new2  <*>
            [0]
        """)
        status, text = self.on_tty("snapshot", "w", "--format", "map")
        self.assertEqual(len(text.strip().splitlines()), 5, text)

    def test_phases_on_a_terminal_only(self):
        base = self.make_base({"a.txt": "a\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        with open(os.path.join(self.mountpoint(ref), "n.txt"), "w") as f:
            f.write("n\n")
        self.cowbox("snapshot", "w")
        status, text = self.on_tty("rollback", "w", "0")
        self.assertEqual(status, 0, text)
        self.assertIn("cowbox rollback: making w what it was at turn 0...", text)
        self.assertIn("rolled back to turn 0", text)
        proc = self.cowbox("rollback", "w", "1")
        self.assertEqual(proc.stderr, "")  # nothing on a pipe


class TestQuietTurns(TranscriptCase):
    """Issue 33.6: a snapshot with no change records no turn, a rollback's turn counts its
    real changes, and log and diff never show the daemon's temporary names."""

    def test_a_snapshot_with_no_change_records_no_turn(self):
        base = self.make_base({"a.txt": "a\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        a_hash = "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"
        # the first snapshot is recorded even so (the baseline); the next ones answer it
        self.transcript("""
            $ cowbox snapshot w --changes
            turn 1
            [0]
            $ cowbox snapshot w --changes
            no changes since turn 1
            [0]
            $ cowbox snapshot w --json
            {"turn": 1, "files": {"a.txt": "<a>"}}
            [0]
            $ cowbox snapshot w --changes --json
            {"turn": 1, "changes": []}
            [0]
        """, a=a_hash)
        status, text = self.on_tty("snapshot", "w")
        self.assertEqual((status, text.replace("\r", "").strip()),
                         (0, "no changes since turn 1"))
        # a file written with the bytes it had is no change either; its new mtime is
        # (recorded as a row of its own, counted as no change)
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("a\n")
        os.utime(os.path.join(mnt, "a.txt"), (1e9, 1e9))
        self.transcript("""
            $ cowbox snapshot w --changes
            turn 2
            [0]
            $ cowbox snapshot w --changes
            no changes since turn 2
            [0]
        """)
        # a label names this point: it gets a turn of its own, empty or not
        self.transcript("""
            $ cowbox snapshot w --label named --changes
            turn 3
            [0]
            $ cowbox diff w 2 named
            [0]
        """)
        turns = self.cowbox_json("turns", "w")
        self.assertEqual([(t["turn"], t["label"], t["changes"]) for t in turns["turns"]],
                         [(1, None, 0), (2, None, 0), (3, "named", 0)])
        self.assertEqual(turns["open_turn"], 4)
        # the protocol says it, and the Python client's map is the same as before
        reply = self.client(ref).request("snapshot", files=True)
        self.assertEqual((reply["turn"], reply["recorded"], reply["files"]),
                         (3, False, {"a.txt": a_hash}))
        with open(os.path.join(mnt, "b.txt"), "w") as f:
            f.write("b\n")
        self.transcript("""
            $ cowbox snapshot w --changes
            turn 4
            created      file    b.txt  <*>
            [0]
        """)

    def test_a_rollbacks_turn_counts_its_real_changes(self):
        base = self.make_base({"a.txt": "a\n", "keep.txt": "k\n", "d/f": "f\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("changed\n")
        os.unlink(os.path.join(mnt, "d", "f"))
        os.mkdir(os.path.join(mnt, "new"))
        os.symlink("a.txt", os.path.join(mnt, "new", "l"))
        os.chmod(os.path.join(mnt, "d"), 0o700)
        self.cowbox("snapshot", "w")  # turn 1: 5 changes
        # keep.txt rewritten with its own bytes: touched, but no change to count
        with open(os.path.join(mnt, "keep.txt"), "w") as f:
            f.write("k\n")
        self.transcript("""
            $ cowbox rollback w 0
            the changes since the last snapshot are kept as turn 2 (cowbox rollback w 2 gives them back)
            rolled back to turn 0: 5 paths restored, recorded as turn 3
            [0]
            $ cowbox rollback w 0
            rolled back to turn 0: 0 paths restored, recorded as turn 4
            [0]
        """)
        counts = {t["turn"]: t["changes"] for t in self.cowbox_json("turns", "w")["turns"]}
        self.assertEqual(counts, {1: 5, 2: 0, 3: 5, 4: 0})
        for turn in (1, 3, 4):
            events = self.cowbox_json("diff", "w", str(turn - 1), str(turn))["events"]
            self.assertEqual(len(events), counts[turn], events)

    def test_log_and_diff_never_show_the_daemons_temporary_names(self):
        base = self.make_base({"a.txt": "a\n", "d/b.txt": "b\n"})
        ref = self.create(base, name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("one\n")
        with open(os.path.join(mnt, "d", "c.txt"), "w") as f:
            f.write("c\n")
        self.cowbox("snapshot", "w")
        with open(os.path.join(mnt, "a.txt"), "w") as f:
            f.write("two\n")
        os.unlink(os.path.join(mnt, "d", "b.txt"))
        self.cowbox("snapshot", "w")
        # rollback writes files under temporary names and renames them over their paths
        self.cowbox("rollback", "w", "1")
        self.cowbox("rollback", "w", "2")
        # apply writes under temporary names in the folder (a copy of the base)
        out = os.path.join(self.tmp, "applied")
        shutil.copytree(base, out)
        self.cowbox("apply", "w", "--to", out)
        with open(os.path.join(out, "a.txt")) as f:
            self.assertEqual(f.read(), "two\n")
        # fork stages the new workspace's tree; merge writes under temporary names too
        self.cowbox("fork", "w", "1", "--name", "f")
        fref = json.loads(self.cowbox("info", "f", "--json").stdout)["ref"]
        self.mount(fref)
        fmnt = self.mountpoint(fref)
        with open(os.path.join(fmnt, "d", "from-fork.txt"), "w") as f:
            f.write("fork\n")
        with open(os.path.join(fmnt, "d", "c.txt"), "w") as f:
            f.write("c by the fork\n")
        self.cowbox("snapshot", "f")
        merged = self.cowbox_json("merge", "w", "f")
        self.assertTrue(merged["turn"], merged)
        self.cowbox("rollback", "w", "last~1")
        shown = []
        for name in ("w", "f"):
            shown += [r["path"] for r in self.cowbox_json("log", name)]
            shown += self.cowbox("log", name).stdout.splitlines()
            for a, b in (("0", None), ("0", "last"), ("last~1", "last")):
                args = ("diff", name, a) + ((b,) if b else ())
                shown += [e["path"] for e in self.cowbox_json(*args)["events"]]
                shown += self.cowbox(*args).stdout.splitlines()
        self.assertTrue(any("from-fork.txt" in line for line in shown), shown)
        self.assertEqual([line for line in shown if ".cowbox" in line], [])
        # nor does the tree hold any
        for root in (mnt, fmnt, out):
            for top, dirs, files in os.walk(root):
                self.assertEqual([n for n in dirs + files if ".cowbox" in n], [], top)


class TestOnboarding(TranscriptCase):
    def test_embed_builds_with_the_documented_line_from_a_build(self):
        # examples/embed.c says: cc embed.c $(pkg-config --cflags --libs cowbox); a build
        # directory on PKG_CONFIG_PATH serves it through cowbox-uninstalled.pc
        build = os.environ.get("COWBOX_BUILDDIR", "")
        self.assertTrue(os.path.exists(os.path.join(build, "cowbox-uninstalled.pc")))
        env = dict(self.env, PKG_CONFIG_PATH=build)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cowbox"], env=env,
                               capture_output=True, text=True, check=True).stdout.split()
        exe = os.path.join(self.tmp, "embed")
        # a library built with the sanitizers needs programs linked with them as well
        san = makefile_var("SANITIZER_FLAGS").split()
        subprocess.run(["cc"] + san + [os.path.join(TOP, "examples", "embed.c"), "-o", exe] +
                       flags, check=True, env=env)
        base = self.make_base({"README": "the sample\n"})
        proc = subprocess.run([exe, base], env=dict(self.env, COWBOX_BIN=COWBOX),
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout.splitlines()[0], r"^create: cb-[0-9a-f]{32} ")

    def test_the_readme_walkthrough_runs(self):
        with open(os.path.join(TOP, "README.md")) as f:
            readme = f.read()
        block = readme[readme.index("By hand, after"):]
        block = block[block.index("```\n") + 4:]
        block = block[:block.index("```")]
        lines = [l for l in block.splitlines() if l.strip()]
        self.assertLessEqual(len(lines), 10)
        build = os.path.dirname(os.path.abspath(COWBOX))
        script = "set -e\n" + block.replace("$PWD/build", build)
        proc = subprocess.run(["bash", "-c", script], cwd=TOP, env=self.env,
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("rolled back to turn 0", proc.stdout)
        self.assertIn("+edited by hand", proc.stdout)
        self.assertEqual(self.cowbox_json("ls"), [])


class TestDiffCredit(TranscriptCase):
    def test_each_path_is_its_own_first_changes(self):
        # issue 30.9: a file made in a directory made in the same turn was credited to the
        # directory's maker; log was right. Live and between turns, each path is its own.
        ref = self.create(name="w")
        self.mount(ref)
        mnt = self.mountpoint(ref)
        os.mkdir(os.path.join(mnt, "d"))
        subprocess.run(["sh", "-c", "echo x > d/f"], cwd=mnt, check=True)
        subprocess.run(["cp", "/etc/hostname", os.path.join(mnt, "d", "c")], check=True)
        live = self.cowbox_json("diff", "w", "0")["events"]
        self.assertEqual({e["path"]: e["comm"] for e in live},
                         {"d": "python3", "d/f": "sh", "d/c": "cp"})
        logged = {r["path"]: r["comm"] for r in self.cowbox_json("log", "w")}
        self.assertEqual(logged, {"d": "python3", "d/f": "sh", "d/c": "cp"})
        self.cowbox("snapshot", "w")
        turned = self.cowbox_json("diff", "w", "0", "1")["events"]
        self.assertEqual({e["path"]: e["comm"] for e in turned}, logged)
        # a directory moved in whole is still its mover's, below it too
        subprocess.run(["mv", os.path.join(mnt, "d"), os.path.join(mnt, "m")], check=True)
        moved = self.cowbox_json("diff", "w", "last")["events"]
        self.assertEqual({e["path"]: e["comm"] for e in moved if e["event"] == "created"},
                         {"m": "mv", "m/f": "mv", "m/c": "mv"})


if __name__ == "__main__":
    import unittest

    unittest.main()
