/* `cowbox apply REF [--turn N] [--to DIR]`: write a turn's changes (or all of them since the
 * base) onto the base or another folder, through the workspace's daemon. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"

static const char apply_usage[] =
    "usage: cowbox apply REF [--turn N] [--to DIR] [--json]\n"
    "N is a number, last, last~N or a label, as diff takes a turn.\n"
    "Write the changes of turn N (from turn N-1), or without --turn all of them since the\n"
    "base (a snapshot is recorded first, when anything changed since the latest turn), onto\n"
    "the base folder or DIR. Every path is checked\n"
    "first: where the folder no longer holds what the workspace recorded (a file edited\n"
    "there since), nothing is written and the conflicts are listed (exit 1). A path already\n"
    "as the turn has it is left alone. Files are written to a temporary name and renamed;\n"
    "no symlink in DIR is followed.\n";

int cmd_apply(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"turn", required_argument, NULL, 't'},
	    {"to", required_argument, NULL, 'o'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	json_t *req = json_pack("{s:s}", "op", "apply"), *msg = NULL, *err;
	char ref[CB_WS_REF_LEN + 1], *to = NULL;
	const char *turn = NULL;
	struct cb_client *c = NULL;
	int ch, status = CLI_FAIL, rc;
	long long id;

	while ((ch = cli_getopt(argc, argv, "", opts, &common, apply_usage, &status)) > 0) {
		if (ch == 't') {
			turn = optarg;
		} else if (ch == 'o') {
			free(to);
			if (!(to = realpath(optarg, NULL))) {
				json_decref(req);
				return cli_fail("apply", "--to %s: %s", optarg, strerror(errno));
			}
			json_object_set_new(req, "to", json_string(to));
		}
	}
	free(to);
	if (cli_one_ref(ch, argc, argv, apply_usage, &status)) {
		json_decref(req);
		return status;
	}
	if (turn) {
		long long n;

		if ((rc = cli_turn(argv[optind], turn, &n)) < 0) {
			json_decref(req);
			return cli_fail_rc("apply", rc);
		}
		if (n < 1) {
			json_decref(req);
			return cli_usage_error(apply_usage, "--turn needs a turn >= 1, not %lld",
					       n);
		}
		json_object_set_new(req, "turn", json_integer(n));
	}
	if ((rc = cb_ws_resolve(argv[optind], ref)) ||
	    (rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) || (rc = cb_daemon_connect(ref, &c)) ||
	    (rc = cb_client_send(c, req, &id))) {
		if (!c) /* not sent: cb_client_send takes req */
			json_decref(req);
		status = cli_fail_rc("apply", rc);
		goto out;
	}
	cli_phase("apply", "writing the changes of %s", argv[optind]);
	while (!(rc = cb_client_recv(c, -1, &msg)) &&
	       json_integer_value(json_object_get(msg, "id")) != id) {
		json_decref(msg);
		msg = NULL;
	}
	cli_phase_done();
	if (rc) {
		status = cli_fail_rc("apply", rc);
		goto out;
	}
	if ((err = json_object_get(msg, "error"))) {
		json_t *list = json_object_get(err, "conflicts"), *v;
		size_t i;

		const char *code = json_string_value(json_object_get(err, "code")) ?: "failed";

		if (common.json) {
			cli_print_json(json_pack("{s:O}", "error", err));
		} else if (json_array_size(list)) {
			fprintf(stderr, "cowbox apply: refused, nothing written: %zu conflict%s\n",
				json_array_size(list), json_array_size(list) == 1 ? "" : "s");
			json_array_foreach(list, i, v)
			    fprintf(stderr, "  %s\n", cli_q_text(json_string_value(v) ?: ""));
		} else {
			fprintf(stderr, "cowbox apply: %s\n",
				json_string_value(json_object_get(err, "message")));
		}
		/* the exit status of its code (4 for a conflict), as cli_fail gives it */
		status = !strcmp(code, "conflict") || !strcmp(code, "in_use") ? CLI_CONFLICT
			 : !strcmp(code, "not_found")			      ? CLI_NOT_FOUND
			 : !strcmp(code, "access_denied")		      ? CLI_REFUSED
									      : CLI_FAIL;
		goto out;
	}
	if (common.json) {
		status = cli_print_reply_json(json_incref(msg));
		goto out;
	}
	printf("applied turns %lld..%lld onto %s: %lld written, %lld deleted, %lld already so\n",
	       (long long)json_integer_value(json_object_get(msg, "from_turn")),
	       (long long)json_integer_value(json_object_get(msg, "to_turn")),
	       cli_q(json_string_value(json_object_get(msg, "to")) ?: ""),
	       (long long)json_integer_value(json_object_get(msg, "written")),
	       (long long)json_integer_value(json_object_get(msg, "deleted")),
	       (long long)json_integer_value(json_object_get(msg, "unchanged")));
	status = CLI_OK;
out:
	json_decref(msg);
	cb_client_close(c);
	return status;
}
