/* The turn commands: snapshot, diff, rollback, prune, fork and turns. Each sends one op to
 * the workspace's daemon (starting it on first use) and prints the reply. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "commands.h"
#include "map_print.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"

/* One line of progress bar on stderr from a daemon's progress frame. */
static void draw_progress(json_t *f)
{
	long long done = json_integer_value(json_object_get(f, "files_done"));
	long long total = json_integer_value(json_object_get(f, "files_total"));
	long long bdone = json_integer_value(json_object_get(f, "bytes_done"));
	long long btotal = json_integer_value(json_object_get(f, "bytes_total"));
	double frac = btotal > 0 ? (double)bdone / (double)btotal : 1.0;
	int fill = (int)(frac * 30);

	fprintf(stderr, "\rhashing base [%.*s%*s] %lld/%lld files %3d%%", fill,
		"##############################", 30 - fill, "", done, total, (int)(frac * 100));
	fflush(stderr);
}

/* What the frames of a request other than progress go to (the rows of a streamed map):
 * text, if set, gets each stream frame's line first and returns 1 when it handled it, 0 to
 * have it parsed and given to fn, or -errno to fail the request. */
struct frame_sink {
	void (*fn)(json_t *frame, void *arg);
	int (*text)(char *line, void *arg);
	void *arg;
};

/* Wait for the reply to request id, drawing the progress frames that come first and handing
 * other frames to sink. */
static int wait_reply(const char *cmd, struct cb_client *c, long long id,
		      const struct frame_sink *sink, json_t **reply)
{
	char head[64], *line;
	int drawn = 0, rc;
	json_t *msg, *err;
	json_error_t jerr;
	size_t len;

	snprintf(head, sizeof(head), "{\"id\":%lld,\"stream\":", id);
	for (;;) {
		if ((rc = cb_client_recv_line(c, -1, &line, &len)))
			break;
		if (sink && sink->text && !strncmp(line, head, strlen(head))) {
			rc = sink->text(line, sink->arg);
			if (rc < 0)
				break;
			if (rc > 0) {
				if (drawn)
					fputc('\n', stderr);
				drawn = 0;
				rc = 0;
				continue;
			}
		}
		if (!(msg = json_loadb(line, len, 0, &jerr))) {
			rc = cb_error_set(EPROTO, "daemon sent bad JSON: %s", jerr.text);
			break;
		}
		if (json_integer_value(json_object_get(msg, "id")) != id) {
			json_decref(msg);
			continue;
		}
		if (json_object_get(msg, "stream")) {
			if (!strcmp(json_string_value(json_object_get(msg, "stream")) ?: "",
				    "progress")) {
				draw_progress(msg);
				drawn = 1;
			} else if (sink) {
				if (drawn)
					fputc('\n', stderr);
				drawn = 0;
				sink->fn(msg, sink->arg);
			}
			json_decref(msg);
			continue;
		}
		err = json_object_get(msg, "error");
		if (err)
			rc =
			    cb_error_set(EIO, "%s: %s: %s", cmd,
					 json_string_value(json_object_get(err, "code")) ?: "error",
					 json_string_value(json_object_get(err, "message")) ?: "");
		if (err)
			json_decref(msg);
		else
			*reply = msg;
		break;
	}
	if (drawn)
		fputc('\n', stderr);
	return rc;
}

/* Send req (consumed) to the daemon of ref_arg and wait for its reply. With progress (and
 * stderr a terminal), the daemon streams progress frames drawn as a bar on stderr; sink (may
 * be NULL) gets the request's other frames. */
static int turns_request_ex(const char *cmd, const char *ref_arg, json_t *req, int progress,
			    const struct frame_sink *sink, json_t **reply)
{
	char ref[CB_WS_REF_LEN + 1];
	struct cb_client *c = NULL;
	long long id;
	int rc;

	*reply = NULL;
	if ((rc = cb_ws_resolve(ref_arg, ref)) || (rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) ||
	    (rc = cb_daemon_connect(ref, &c))) {
		json_decref(req);
		cb_client_close(c);
		return cli_fail_rc(cmd, rc);
	}
	if ((progress && isatty(STDERR_FILENO)) || sink) {
		if (progress && isatty(STDERR_FILENO))
			json_object_set_new(req, "progress", json_true());
		rc = cb_client_send(c, req, &id);
		if (!rc)
			rc = wait_reply(cmd, c, id, sink, reply);
	} else {
		rc = cb_client_request(c, req, -1, reply);
	}
	cb_client_close(c);
	return rc ? cli_fail_rc(cmd, rc) : CLI_OK;
}

static int turns_request(const char *cmd, const char *ref_arg, json_t *req, json_t **reply)
{
	return turns_request_ex(cmd, ref_arg, req, 0, NULL, reply);
}

static int parse_turn(const char *s, long long *out)
{
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	return errno || end == s || *end || *out < 0 ? -1 : 0;
}

/* The turn "last~N" (N >= 0) or label names among the recorded turns (oldest first). */
static int turn_named(json_t *turns, const char *s, long long *out)
{
	size_t n = json_array_size(turns), i;
	long long back = 0;
	json_t *t;

	if (!strcmp(s, "last") || !strncmp(s, "last~", 5)) {
		if (s[4] && parse_turn(s + 5, &back))
			return cb_error_set(EINVAL, "'%s': last~N takes a number N >= 0", s);
		/* the base, turn 0, is before the first recorded turn */
		if ((long long)n < back)
			return cb_error_set(ENOENT, "'%s': only %zu turn%s before the last", s,
					    n ? n - 1 : 0, n == 2 ? "" : "s");
		if ((long long)n == back) {
			*out = 0;
			return 0;
		}
		*out = json_integer_value(
		    json_object_get(json_array_get(turns, n - 1 - back), "turn"));
		return 0;
	}
	for (i = n; i-- > 0;) { /* the latest turn of that label */
		t = json_array_get(turns, i);
		if (!strcmp(json_string_value(json_object_get(t, "label")) ?: "", s)) {
			*out = json_integer_value(json_object_get(t, "turn"));
			return 0;
		}
	}
	return cb_error_set(ENOENT,
			    "no turn labelled '%s' (a turn is a number, last, last~N or a "
			    "label)",
			    s);
}

int cli_turn(const char *ref_arg, const char *s, long long *out)
{
	char ref[CB_WS_REF_LEN + 1];
	struct cb_client *c = NULL;
	json_t *reply = NULL;
	int rc;

	if (!parse_turn(s, out))
		return 0;
	if (!*s)
		return cb_error_set(EINVAL, "an empty turn");
	if (!(rc = cb_ws_resolve(ref_arg, ref)) &&
	    !(rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) &&
	    !(rc = cb_daemon_connect(ref, &c)) &&
	    !(rc = cb_client_request(c, json_pack("{s:s}", "op", "turns"), -1, &reply)))
		rc = turn_named(json_object_get(reply, "turns"), s, out);
	json_decref(reply);
	cb_client_close(c);
	return rc;
}

/* A map frame that came parsed (not in the daemon's own text form). */
static void files_frame(json_t *frame, void *arg)
{
	struct cli_map_printer *p = arg;

	if (strcmp(json_string_value(json_object_get(frame, "stream")) ?: "", "files"))
		return;
	cli_map_begin(p, json_integer_value(json_object_get(frame, "turn")));
	cli_map_rows(p, json_object_get(frame, "files"));
}

static int files_text(char *line, void *arg)
{
	return cli_map_frame_text(arg, line);
}

static const char *short_hash(json_t *e)
{
	const char *h = json_string_value(json_object_get(e, "sha256"));
	const char *target = json_string_value(json_object_get(e, "target"));

	return h ? h : target ? target : "-";
}

static void print_event(json_t *ev)
{
	json_t *old = json_object_get(ev, "old"), *new = json_object_get(ev, "new");
	const char *kind = json_string_value(json_object_get(ev, "event"));
	const char *comm = json_string_value(json_object_get(ev, "comm"));
	json_t *shown =
	    strcmp(json_string_value(json_object_get(new, "type")), "absent") ? new : old;

	printf("%-12s %-7s %s", kind, json_string_value(json_object_get(shown, "type")),
	       cli_q(json_string_value(json_object_get(ev, "path")) ?: ""));
	if (!strcmp(kind, "modified") || !strcmp(kind, "type_changed"))
		printf("  %.12s -> %.12s", short_hash(old), short_hash(new));
	else if (!strcmp(kind, "created"))
		printf("  %.12s", short_hash(new));
	if (json_integer_value(json_object_get(old, "mode")) !=
		json_integer_value(json_object_get(new, "mode")) &&
	    (!strcmp(kind, "mode_changed") || !strcmp(kind, "modified")))
		printf("  mode %04llo -> %04llo",
		       (unsigned long long)json_integer_value(json_object_get(old, "mode")),
		       (unsigned long long)json_integer_value(json_object_get(new, "mode")));
	if (json_integer_value(json_object_get(ev, "pid")))
		printf("  (pid %lld %s)", (long long)json_integer_value(json_object_get(ev, "pid")),
		       comm ? cli_q(comm) : "?");
	putchar('\n');
}

static const char snapshot_usage[] =
    "usage: cowbox snapshot REF [--label TEXT] [--json | --format sha256sum|map] [--changes]\n"
    "Record a new turn. Nothing changed since the latest turn and no --label: no turn is\n"
    "recorded and the latest one is the answer (\"no changes since turn 5\" on a terminal).\n"
    "On a terminal it prints one line, \"turn 5: 2 created, 1 modified,\n"
    "0 deleted\"; on a pipe, with --json or --format map, every regular file's path and\n"
    "SHA-256 (only what changed since the previous turn with --changes). --format sha256sum\n"
    "prints exactly what sha256sum prints at the mount root, so `sha256sum -c` verifies it\n"
    "there. The map is written as it streams from the daemon, sorted by path.\n";

/* snapshot on a terminal: the turn and how many paths it created, modified and deleted. */
static int snapshot_summary(const char *ref_arg, const char *label)
{
	long long created = 0, modified = 0, deleted = 0;
	json_t *reply, *ev;
	size_t i;
	int status;

	status = turns_request_ex(
	    "snapshot", ref_arg,
	    json_pack("{s:s, s:s?, s:b}", "op", "snapshot", "label", label, "changes", 1), 1, NULL,
	    &reply);
	if (status)
		return status;
	if (json_is_false(json_object_get(reply, "recorded"))) {
		printf("no changes since turn %lld\n",
		       (long long)json_integer_value(json_object_get(reply, "turn")));
		json_decref(reply);
		return CLI_OK;
	}
	json_array_foreach(json_object_get(reply, "changes"), i, ev)
	{
		const char *kind = json_string_value(json_object_get(ev, "event")) ?: "";

		if (!strcmp(kind, "created"))
			created++;
		else if (!strcmp(kind, "deleted"))
			deleted++;
		else
			modified++; /* modified, type_changed, mode_changed */
	}
	printf("turn %lld: %lld created, %lld modified, %lld deleted\n",
	       (long long)json_integer_value(json_object_get(reply, "turn")), created, modified,
	       deleted);
	json_decref(reply);
	return CLI_OK;
}

int cmd_snapshot(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"label", required_argument, NULL, 'l'},
	    {"format", required_argument, NULL, 'f'},
	    {"changes", no_argument, NULL, 'c'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	const char *label = NULL;
	int c, status, changes = 0, sha256sum = 0, map = 0;
	json_t *reply, *ev;
	size_t i;

	while ((c = cli_getopt(argc, argv, "l:f:c", opts, &common, snapshot_usage, &status)) > 0) {
		if (c == 'l')
			label = optarg;
		else if (c == 'c')
			changes = 1;
		else if (!strcmp(optarg, "sha256sum"))
			sha256sum = 1;
		else if (!strcmp(optarg, "map"))
			map = 1;
		else
			return cli_usage_error(snapshot_usage, "unknown --format '%s'", optarg);
	}
	if (cli_one_ref(c, argc, argv, snapshot_usage, &status))
		return status;
	if (sha256sum && (common.json || changes))
		return cli_usage_error(snapshot_usage,
				       "--format sha256sum goes with neither --json nor --changes");
	/* a person at a terminal reads one line; a pipe, --json or --format get the map */
	if (!changes && !common.json && !sha256sum && !map && isatty(STDOUT_FILENO))
		return snapshot_summary(argv[optind], label);
	if (!changes) {
		/* The map is written as it streams in: the CLI never holds it whole. */
		struct cli_map_printer p = {.json = common.json, .sha256sum = sha256sum};
		struct frame_sink sink = {files_frame, files_text, &p};
		static char outbuf[1 << 16];

		setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));

		status = turns_request_ex("snapshot", argv[optind],
					  json_pack("{s:s, s:s?, s:b, s:b}", "op", "snapshot",
						    "label", label, "files", 1, "stream", 1),
					  1, &sink, &reply);
		if (status) {
			cli_map_end(&p);
			return status;
		}
		cli_map_begin(&p, json_integer_value(json_object_get(reply, "turn")));
		/* An older daemon that does not stream sends the map in the reply. */
		cli_map_rows(&p, json_object_get(reply, "files"));
		cli_map_end(&p);
		json_decref(reply);
		return fflush(stdout) ? cli_fail("snapshot", "write: %s", strerror(errno)) : CLI_OK;
	}
	status = turns_request_ex(
	    "snapshot", argv[optind],
	    json_pack("{s:s, s:s?, s:b}", "op", "snapshot", "label", label, "changes", 1), 1, NULL,
	    &reply);
	if (status)
		return status;
	if (common.json) {
		json_t *out = json_pack("{s:O, s:O}", "turn", json_object_get(reply, "turn"),
					"changes", json_object_get(reply, "changes"));

		json_decref(reply);
		return cli_print_json(out);
	}
	printf(json_is_false(json_object_get(reply, "recorded")) ? "no changes since turn %lld\n"
								 : "turn %lld\n",
	       (long long)json_integer_value(json_object_get(reply, "turn")));
	json_array_foreach(json_object_get(reply, "changes"), i, ev) print_event(ev);
	json_decref(reply);
	return CLI_OK;
}

/* A NUL in the first 8000 bytes makes a file binary (what diff and git decide by). */
static int is_binary(int fd)
{
	char buf[8000];
	ssize_t n;

	if (fd < 0)
		return 0;
	n = pread(fd, buf, sizeof(buf), 0);
	return n > 0 && memchr(buf, 0, (size_t)n) != NULL;
}

/* Open the source the daemon named for one side of a file event: src is ROOT/PATH (the mount
 * or the base, where the sandbox can plant symlinks and FIFOs: opened beneath ROOT through
 * util/beneath) or a blob of the daemon's own store. -1 for no side; -errno, message set. */
static int patch_source(const char *src, const char *path)
{
	size_t ls, lp = strlen(path);
	char *root;
	int rfd, fd;

	if (!src)
		return -1;
	ls = strlen(src);
	if (ls > lp + 1 && src[ls - lp - 1] == '/' && !strcmp(src + ls - lp, path)) {
		if (!(root = strndup(src, ls - lp - 1)))
			return cb_error_set(ENOMEM, "out of memory");
		rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
		fd = rfd < 0 ? cb_error_set(errno, "%s: %s", root, strerror(errno))
			     : cb_beneath_open(rfd, path, O_RDONLY, 0);
		if (rfd >= 0)
			close(rfd);
		free(root);
		return fd;
	}
	fd = open(src, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "%s: %s", src, strerror(errno));
	return fd;
}

/* Unified diff of one file event through diff(1), which reads the two sides from fds this
 * process opened safely (as /dev/fd/3 and /dev/fd/4); binary files are named only. */
static int print_patch(json_t *ev)
{
	const char *path = json_string_value(json_object_get(ev, "path"));
	const char *a = json_string_value(json_object_get(ev, "old_src"));
	const char *b = json_string_value(json_object_get(ev, "new_src"));
	char la[4200], lb[4200];
	int fa = -1, fb = -1, rc = 0, st;
	pid_t pid;

	if (!a && !b)
		return 0;
	if (!path)
		return cli_fail("diff", "an event without a path");
	if ((a && (fa = patch_source(a, path)) < 0) || (b && (fb = patch_source(b, path)) < 0)) {
		rc = cli_fail("diff", "%s", cb_error_message());
		goto out;
	}
	snprintf(la, sizeof(la), "a/%s", path);
	snprintf(lb, sizeof(lb), "b/%s", path);
	if (is_binary(fa) || is_binary(fb)) {
		printf("Binary files %s and %s differ\n", a ? cli_q(la) : "/dev/null",
		       b ? cli_q(lb) : "/dev/null");
		goto out;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		rc = cli_fail("diff", "fork: %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		/* 3 and 4 are free in the child once both are moved there (dup2 clears CLOEXEC). */
		int ta = fa >= 0 ? fcntl(fa, F_DUPFD_CLOEXEC, 10) : -1;
		int tb = fb >= 0 ? fcntl(fb, F_DUPFD_CLOEXEC, 10) : -1;

		if ((ta >= 0 && dup2(ta, 3) < 0) || (tb >= 0 && dup2(tb, 4) < 0))
			_exit(127);
		execlp("diff", "diff", "-u", "--label", a ? la : "/dev/null", "--label",
		       b ? lb : "/dev/null", a ? "/dev/fd/3" : "/dev/null",
		       b ? "/dev/fd/4" : "/dev/null", (char *)NULL);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!(WIFEXITED(st) && WEXITSTATUS(st) <= 1))
		rc = cli_fail("diff", "diff -u %s failed", path);
out:
	if (fa >= 0)
		close(fa);
	if (fb >= 0)
		close(fb);
	return rc;
}

static const char diff_usage[] = "usage: cowbox diff REF A [B] [--json] [--patch] [--net]\n"
				 "A turn is a number (0: the base), last, last~N (N turns before "
				 "the last)\nor a label (its latest turn).\n"
				 "What changed from turn A to turn B (default: the live tree): "
				 "created, modified,\ndeleted, type_changed, mode_changed, with "
				 "hashes, modes and who changed it.\n--net: then what the egress "
				 "proxy let through or refused in those turns\n(net-log's table; "
				 "\"network\" in --json).\n";

int cmd_diff(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"patch", no_argument, NULL, 'p'},
	    {"net", no_argument, NULL, 'n'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	int c, status, patch = 0, net = 0;
	long long a, b = -1;
	json_t *reply, *ev, *req;
	size_t i;

	while ((c = cli_getopt(argc, argv, "p", opts, &common, diff_usage, &status)) > 0)
		*(c == 'n' ? &net : &patch) = 1;
	if (c < 0)
		return status;
	if (optind + 2 != argc && optind + 3 != argc)
		return cli_usage_error(diff_usage, "diff takes a workspace and one or two turns");
	if ((status = cli_turn(argv[optind], argv[optind + 1], &a)) ||
	    (optind + 3 == argc && (status = cli_turn(argv[optind], argv[optind + 2], &b))))
		return cli_fail_rc("diff", status);
	req = json_pack("{s:s, s:I, s:b}", "op", "diff", "a", (json_int_t)a, "sources", patch);
	if (net)
		json_object_set_new(req, "network", json_true());
	if (b >= 0)
		json_object_set_new(req, "b", json_integer(b));
	status = turns_request("diff", argv[optind], req, &reply);
	if (status)
		return status;
	if (common.json) {
		json_array_foreach(json_object_get(reply, "events"), i, ev)
		{
			json_object_del(ev, "old_src");
			json_object_del(ev, "new_src");
		}
		return cli_print_reply_json(reply);
	}
	json_array_foreach(json_object_get(reply, "events"), i, ev)
	{
		/* --patch: content changes as unified diffs; what has no content to diff
		 * (directories, symlinks, a mode alone) as the one-line event. */
		if (patch &&
		    (json_is_string(json_object_get(ev, "old_src")) ||
		     json_is_string(json_object_get(ev, "new_src"))) &&
		    strcmp(json_string_value(json_object_get(ev, "event")), "mode_changed"))
			status = print_patch(ev) ? CLI_FAIL : status;
		else
			print_event(ev);
	}
	if (net) {
		printf("\nnetwork:\n");
		cli_print_net_rows(json_object_get(reply, "network"));
	}
	json_decref(reply);
	return status;
}

static const char rollback_usage[] =
    "usage: cowbox rollback REF TURN [--json]\n"
    "Make the live workspace exactly what it was at TURN (0: the base; last, last~N or a\n"
    "label, as diff takes them). Changes made since the last snapshot are first recorded as\n"
    "a turn of their own (\"before rollback to TURN\"), and the rollback is recorded as a new\n"
    "turn, so rolling back to the turn before it undoes it, every byte.\n";

int cmd_rollback(int argc, char **argv)
{
	struct cli_common common = {0};
	int c, status;
	long long turn, kept;
	json_t *reply;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, rollback_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (optind + 2 != argc)
		return cli_usage_error(rollback_usage, "rollback takes a workspace and a turn");
	if ((status = cli_turn(argv[optind], argv[optind + 1], &turn)))
		return cli_fail_rc("rollback", status);
	cli_phase("rollback", "making %s what it was at turn %lld", argv[optind], turn);
	status = turns_request("rollback", argv[optind],
			       json_pack("{s:s, s:I}", "op", "rollback", "turn", (json_int_t)turn),
			       &reply);
	cli_phase_done();
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	kept = json_integer_value(json_object_get(reply, "kept_turn"));
	if (kept > 0)
		printf("the changes since the last snapshot are kept as turn %lld (cowbox rollback "
		       "%s %lld gives them back)\n",
		       kept, argv[optind], kept);
	printf("rolled back to turn %lld: %lld paths restored, recorded as turn %lld\n", turn,
	       (long long)json_integer_value(json_object_get(reply, "restored")),
	       (long long)json_integer_value(json_object_get(reply, "turn")));
	json_decref(reply);
	return CLI_OK;
}

static const char prune_usage[] = "usage: cowbox prune REF --keep N [--json]\n"
				  "Keep the newest N turns, drop the older ones and every blob "
				  "no kept turn needs.\n";

int cmd_prune(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"keep", required_argument, NULL, 'k'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	long long keep = -1;
	int c, status;
	json_t *reply;
	char size[32];

	while ((c = cli_getopt(argc, argv, "k:", opts, &common, prune_usage, &status)) > 0)
		if (parse_turn(optarg, &keep) || keep < 1)
			return cli_usage_error(prune_usage, "--keep takes a number >= 1");
	if (c < 0)
		return status;
	if (optind + 1 != argc || keep < 1)
		return cli_usage_error(prune_usage, "prune takes a workspace and --keep N");
	status =
	    turns_request("prune", argv[optind],
			  json_pack("{s:s, s:I}", "op", "prune", "keep", (json_int_t)keep), &reply);
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	printf("dropped %lld turns, freed %s\n",
	       (long long)json_integer_value(json_object_get(reply, "dropped")),
	       cli_size(json_integer_value(json_object_get(reply, "freed_bytes")), size,
			sizeof(size)));
	json_decref(reply);
	return CLI_OK;
}

static const char fork_usage[] =
    "usage: cowbox fork REF TURN --name NEW [--json]\n"
    "Create workspace NEW starting at REF's TURN (a number, last, "
    "last~N or a label),\nsharing its base and blobs; prints its ref.\n";

int cmd_fork(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"name", required_argument, NULL, 'n'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	const char *name = NULL;
	long long turn;
	int c, status;
	json_t *reply;

	while ((c = cli_getopt(argc, argv, "n:", opts, &common, fork_usage, &status)) > 0)
		name = optarg;
	if (c < 0)
		return status;
	if (optind + 2 != argc)
		return cli_usage_error(fork_usage, "fork takes a workspace and a turn");
	if (!name)
		return cli_usage_error(fork_usage, "fork needs --name NEW");
	if ((status = cb_ws_name_check(name)))
		return cli_fail_rc("fork", status);
	if ((status = cli_turn(argv[optind], argv[optind + 1], &turn)))
		return cli_fail_rc("fork", status);
	cli_phase("fork", "copying turn %lld of %s into %s", turn, argv[optind], name);
	status = turns_request(
	    "fork", argv[optind],
	    json_pack("{s:s, s:I, s:s}", "op", "fork", "turn", (json_int_t)turn, "name", name),
	    &reply);
	cli_phase_done();
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	printf("%s\n", json_string_value(json_object_get(reply, "ref")));
	json_decref(reply);
	return CLI_OK;
}

static const char turns_usage[] = "usage: cowbox turns REF [--json]\n"
				  "List the recorded turns and the blob store's size.\n";

int cmd_turns(int argc, char **argv)
{
	struct cli_common common = {0};
	json_t *reply, *t;
	char size[32], when[32];
	int c, status;
	size_t i;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, turns_usage, &status)) > 0)
		;
	if (cli_one_ref(c, argc, argv, turns_usage, &status))
		return status;
	status = turns_request("turns", argv[optind], json_pack("{s:s}", "op", "turns"), &reply);
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	printf("%6s  %-19s  %7s  %s\n", "turn", "time (UTC)", "changes", "label");
	json_array_foreach(json_object_get(reply, "turns"), i, t)
	{
		time_t secs = (time_t)json_real_value(json_object_get(t, "time"));
		struct tm tm;

		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", gmtime_r(&secs, &tm));
		printf("%6lld  %s  %7lld  %s\n",
		       (long long)json_integer_value(json_object_get(t, "turn")), when,
		       (long long)json_integer_value(json_object_get(t, "changes")),
		       cli_q(json_string_value(json_object_get(t, "label")) ?: ""));
	}
	printf(
	    "open turn: %lld; blobs: %lld (%s)\n",
	    (long long)json_integer_value(json_object_get(reply, "open_turn")),
	    (long long)json_integer_value(json_object_get(reply, "blob_count")),
	    cli_size(json_integer_value(json_object_get(reply, "blob_bytes")), size, sizeof(size)));
	json_decref(reply);
	return CLI_OK;
}
