/* Commands around a workspace's daemon and journal: mount (start it), umount (stop it),
 * serve (be it) and log (the changes it journaled). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/client.h"
#include "cowbox/daemon.h"
#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/workspace.h"

static const char mount_usage[] =
    "usage: cowbox mount REF [DIR] [--foreground] [--idle] [--json]\n"
    "Start the workspace daemon in the background and return once the overlay is mounted at\n"
    "DIR (default: the workspace's mnt/). --foreground runs it here, logging on stderr.\n"
    "The mount stays until `cowbox umount`; with --idle it is started (or left) as the API\n"
    "starts it: it stops once no client has held it for the workspace's idle_timeout.\n";

/* Keep a running daemon mounted until it is told to stop (op idle, pin). */
static int mount_pin(const char *ref)
{
	struct cb_client *c = NULL;
	int rc = cb_daemon_connect(ref, &c);

	if (!rc)
		rc = cb_client_request(c, json_pack("{s:s, s:b}", "op", "idle", "pin", 1), 10000,
				       NULL);
	cb_client_close(c);
	return rc;
}

int cmd_mount(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"foreground", no_argument, NULL, 'f'},
	    {"idle", no_argument, NULL, 'i'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	int c, status, foreground = 0, idle = 0;
	struct cb_ws_info info;
	pid_t pid = 0;

	while ((c = cli_getopt(argc, argv, "f", opts, &common, mount_usage, &status)) > 0) {
		if (c == 'f')
			foreground = 1;
		else
			idle = 1;
	}
	if (c < 0)
		return status;
	if (optind + 1 != argc && optind + 2 != argc)
		return cli_usage_error(mount_usage, "mount takes a workspace and an optional DIR");
	const char *ref = argv[optind], *dir = optind + 2 == argc ? argv[optind + 1] : NULL;

	if (foreground) {
		struct cb_daemon_options opt = {ref, dir, 1, 0, !idle};

		return (status = cb_daemon_serve(&opt)) ? cli_fail_rc("mount", status) : CLI_OK;
	}
	if ((status = cb_daemon_ensure(ref, dir, 30000, &pid)) ||
	    (!idle && (status = mount_pin(ref))) || (status = cb_ws_info(ref, &info)))
		return cli_fail_rc("mount", status);
	if (common.json) {
		json_t *j =
		    json_pack("{s:s, s:s, s:I, s:b}", "ref", info.ref, "mountpoint",
			      info.mountpoint, "pid", (json_int_t)pid, "in_place", info.in_place);

		cb_ws_info_free(&info);
		return cli_print_json(j);
	}
	printf("%s mounted at %s (daemon pid %d)\n", info.ref, info.mountpoint, (int)pid);
	cb_ws_info_free(&info);
	return CLI_OK;
}

static const char umount_usage[] =
    "usage: cowbox umount REF [--json]\n"
    "Unmount the workspace and stop its daemon; the upper layer and journal stay on disk.\n";

int cmd_umount(int argc, char **argv)
{
	struct cli_common common = {0};
	struct cb_ws_info info;
	int c, status, was_mounted;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, umount_usage, &status)) > 0)
		;
	if (cli_one_ref(c, argc, argv, umount_usage, &status))
		return status;
	if ((status = cb_ws_info(argv[optind], &info)))
		return cli_fail_rc("umount", status);
	was_mounted = info.state == CB_WS_MOUNTED;
	/* A dead daemon's mount and socket go too, so umount always leaves a clean state. */
	if ((status = cb_daemon_stop(info.ref, 30000)) || (status = cb_ws_clear_stale(info.ref))) {
		cb_ws_info_free(&info);
		return cli_fail_rc("umount", status);
	}
	if (common.json)
		cli_print_json(
		    json_pack("{s:s, s:b}", "ref", info.ref, "was_mounted", was_mounted));
	else if (!was_mounted)
		printf("%s was not mounted\n", info.ref);
	cb_ws_info_free(&info);
	return CLI_OK;
}

static const char serve_usage[] =
    "usage: cowbox serve REF [--mountpoint DIR] [--foreground] [--debug]\n"
    "Be the workspace daemon: mount the overlay and serve the control socket until\n"
    "unmounted, closed or sent SIGTERM. Logs go to the workspace's daemon.log unless\n"
    "--foreground (stderr). --debug traces FUSE requests. `cowbox mount` runs this for you.\n";

int cmd_serve(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"mountpoint", required_argument, NULL, 'm'},
	    {"foreground", no_argument, NULL, 'f'},
	    {"debug", no_argument, NULL, 'd'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	struct cb_daemon_options opt = {0};
	int c, status;

	while ((c = cli_getopt(argc, argv, "m:fd", opts, &common, serve_usage, &status)) > 0) {
		if (c == 'm')
			opt.mountpoint = optarg;
		else if (c == 'f')
			opt.foreground = 1;
		else
			opt.debug = 1;
	}
	if (cli_one_ref(c, argc, argv, serve_usage, &status))
		return status;
	opt.ref = argv[optind];
	return (status = cb_daemon_serve(&opt)) ? cli_fail_rc("serve", status) : CLI_OK;
}

struct log_state {
	int json;
	json_t *rows;
};

static int log_row(const struct cb_journal_row *r, void *arg)
{
	struct log_state *s = arg;
	char stamp[32];
	time_t t = (time_t)r->time;
	struct tm tm;

	if (s->json)
		return json_array_append_new(
		    s->rows,
		    json_pack("{s:I, s:I, s:s, s:s, s:b, s:f, s:I, s:s?}", "id", (json_int_t)r->id,
			      "turn", (json_int_t)r->turn, "path", r->path, "kind",
			      cb_change_kind_name(r->kind), "subtree", r->subtree, "time", r->time,
			      "pid", (json_int_t)r->pid, "comm", r->comm));
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
	printf("%-4lld %s  %-11s %s%s  (pid %d %s)\n", r->turn, stamp, cb_change_kind_name(r->kind),
	       cli_q(r->path), r->subtree ? "/**" : "", (int)r->pid,
	       r->comm ? cli_q(r->comm) : "?");
	return 0;
}

static const char log_usage[] =
    "usage: cowbox log REF [--turn N] [--json]\n"
    "Show the journal: the first change to each path in each turn, with its kind, time and\n"
    "the pid and command that made it. --turn N shows one turn only (a number, last,\n"
    "last~N or a label, as diff takes a turn).\n";

int cmd_log(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"turn", required_argument, NULL, 't'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	struct log_state s = {0};
	char ref[CB_WS_REF_LEN + 1], *path = NULL;
	const char *turn_arg = NULL;
	struct cb_db *db = NULL;
	long long turn = 0;
	int c, status, rc;

	while ((c = cli_getopt(argc, argv, "t:", opts, &common, log_usage, &status)) > 0)
		turn_arg = optarg;
	if (cli_one_ref(c, argc, argv, log_usage, &status))
		return status;
	if (turn_arg && (rc = cli_turn(argv[optind], turn_arg, &turn)) < 0)
		return cli_fail_rc("log", rc);
	if (turn_arg && turn < 1)
		return cli_usage_error(log_usage, "bad turn '%s': a turn from 1", turn_arg);
	/* The journal is read straight from meta.db: WAL lets us read while the daemon writes. */
	if ((rc = cb_ws_resolve(argv[optind], ref)) || (rc = cb_ws_path(ref, "meta.db", &path)) ||
	    (rc = cb_db_open(path, &db))) {
		free(path);
		return cli_fail_rc("log", rc);
	}
	s.json = common.json;
	if (s.json)
		s.rows = json_array();
	rc = cb_journal_list(db, turn, log_row, &s);
	cb_db_close(db);
	free(path);
	if (rc) {
		json_decref(s.rows);
		return cli_fail_rc("log", rc);
	}
	return s.json ? cli_print_json(s.rows) : CLI_OK;
}
