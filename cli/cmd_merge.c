/* `cowbox merge TARGET SOURCE`: bring a fork's changes back into a workspace as one turn,
 * three-way against their common ancestor, through TARGET's daemon. */
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

static const char merge_usage[] =
    "usage: cowbox merge TARGET SOURCE [--turn N] [--dry-run] [--strategy merge|ours|theirs]\n"
    "                    [--json]\n"
    "Apply the changes SOURCE recorded since the fork that relates the two (SOURCE forked\n"
    "from TARGET, TARGET from SOURCE, or both from the same turn) up to its turn N (default:\n"
    "its latest) to TARGET's live tree, recorded as one new turn of TARGET. A path only\n"
    "SOURCE changed takes SOURCE's version; text files both changed are merged line by line,\n"
    "conflicting hunks left between <<<<<<< TARGET and >>>>>>> SOURCE markers; binary, mode,\n"
    "symlink, type and delete/modify conflicts keep TARGET's version. --strategy ours or\n"
    "theirs resolves every conflict (hunks included) toward TARGET or SOURCE. Conflicts are\n"
    "listed (exit 1 when any is left unresolved). --dry-run writes nothing. Nothing is\n"
    "written either when TARGET has changes not yet snapshotted on a path the merge touches.\n"
    "Undo: `cowbox rollback TARGET` to the turn before the merge.\n";

static void print_conflicts(json_t *list)
{
	json_t *v;
	size_t i;

	json_array_foreach(list, i, v)
	{
		const char *res = json_string_value(json_object_get(v, "resolution"));

		printf("  conflict (%s): %s: %s\n", json_string_value(json_object_get(v, "kind")),
		       json_string_value(json_object_get(v, "path")),
		       !strcmp(res, "markers")	? "merged with conflict markers"
		       : !strcmp(res, "source") ? "took SOURCE's"
						: "kept TARGET's");
	}
}

int cmd_merge(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"turn", required_argument, NULL, 't'},
	    {"dry-run", no_argument, NULL, 'n'},
	    {"strategy", required_argument, NULL, 's'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	json_t *req = json_pack("{s:s}", "op", "merge"), *msg = NULL, *err, *v;
	char ref[CB_WS_REF_LEN + 1], *end;
	struct cb_client *c = NULL;
	int ch, status = CLI_FAIL, rc, dry = 0, open_conflicts = 0, resolving = 0;
	long long id;
	size_t i;

	while ((ch = cli_getopt(argc, argv, "", opts, &common, merge_usage, &status)) > 0) {
		if (ch == 't') {
			long long n = strtoll(optarg, &end, 10);

			if (!*optarg || *end || n < 0) {
				json_decref(req);
				return cli_usage_error(merge_usage, "--turn needs a turn number");
			}
			json_object_set_new(req, "turn", json_integer(n));
		} else if (ch == 'n') {
			dry = 1;
			json_object_set_new(req, "dry_run", json_true());
		} else if (ch == 's') {
			if (strcmp(optarg, "merge") && strcmp(optarg, "ours") &&
			    strcmp(optarg, "theirs")) {
				json_decref(req);
				return cli_usage_error(merge_usage,
						       "--strategy is merge, ours or theirs");
			}
			resolving = strcmp(optarg, "merge") != 0;
			json_object_set_new(req, "strategy", json_string(optarg));
		}
	}
	if (ch < 0) {
		json_decref(req);
		return status;
	}
	if (optind + 2 != argc) {
		json_decref(req);
		return cli_usage_error(merge_usage, "merge takes TARGET and SOURCE workspaces");
	}
	json_object_set_new(req, "source", json_string(argv[optind + 1]));
	if ((rc = cb_ws_resolve(argv[optind], ref)) ||
	    (rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) || (rc = cb_daemon_connect(ref, &c))) {
		status = cli_fail_rc("merge", rc);
		goto out;
	}
	rc = cb_client_send(c, req, &id); /* takes req, sent or not */
	req = NULL;
	if (rc) {
		status = cli_fail_rc("merge", rc);
		goto out;
	}
	while (!(rc = cb_client_recv(c, -1, &msg)) &&
	       json_integer_value(json_object_get(msg, "id")) != id) {
		json_decref(msg);
		msg = NULL;
	}
	if (rc) {
		status = cli_fail_rc("merge", rc);
		goto out;
	}
	if ((err = json_object_get(msg, "error"))) {
		/* one line and its exit status by the error's code, as every command says it */
		json_t *list = json_object_get(err, "blocked");
		const char *code = json_string_value(json_object_get(err, "code"));
		const char *text = json_string_value(json_object_get(err, "message"));

		cli_set_code(code ? code : "failed");
		if (json_array_size(list))
			status =
			    cli_fail("merge",
				     "refused, nothing written: TARGET changed %zu path%s the "
				     "merge touches since its latest turn (snapshot it first)",
				     json_array_size(list), json_array_size(list) == 1 ? "" : "s");
		else
			status = cli_fail("merge", "%s", text ? text : "failed");
		json_array_foreach(list, i, v) fprintf(stderr, "  %s\n", json_string_value(v));
		goto out;
	}
	/* Under the merge strategy every conflict is left to the user (markers, or TARGET's
	 * version kept); ours and theirs resolve them all. */
	if (!resolving)
		open_conflicts = (int)json_array_size(json_object_get(msg, "conflicts"));
	if (common.json) {
		cli_print_reply_json(json_incref(msg));
	} else {
		json_t *turn = json_object_get(msg, "turn");

		printf("%s %zu path%s from %s (its turns %lld..%lld)",
		       dry ? "would merge" : "merged",
		       json_array_size(json_object_get(msg, "merged")),
		       json_array_size(json_object_get(msg, "merged")) == 1 ? "" : "s",
		       argv[optind + 1],
		       (long long)json_integer_value(json_object_get(msg, "ancestor_turn")),
		       (long long)json_integer_value(json_object_get(msg, "source_turn")));
		if (json_is_integer(turn))
			printf(", recorded as turn %lld", (long long)json_integer_value(turn));
		printf("\n");
		json_array_foreach(json_object_get(msg, "merged"), i, v)
		    printf("  %s\n", json_string_value(v));
		print_conflicts(json_object_get(msg, "conflicts"));
	}
	status = open_conflicts ? CLI_FAIL : CLI_OK;
out:
	json_decref(req);
	json_decref(msg);
	cb_client_close(c);
	return status;
}
