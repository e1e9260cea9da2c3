/* cowbox fsck: check a workspace's stored state (blobs, base, base cache, meta.db) and, with
 * --repair, repair what can be repaired without touching the agent's files. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/fsck.h"

static const char fsck_usage[] =
    "usage: cowbox fsck REF [--repair] [--base DIR] [--json]\n"
    "Check every blob and base file the workspace's turns need (read and hashed), every\n"
    "base-cache row, meta.db and the mark log (marks lost to damage); print each problem\n"
    "with the turns it breaks. Exit 0 when nothing is wrong (or everything found was\n"
    "repaired), 1 otherwise.\n"
    "--repair drops unusable base-cache rows, journals every path that lost marks may have\n"
    "held (upper/ against the last turn), and rebuilds a missing, empty, corrupt or\n"
    "incomplete meta.db from every row SQLite can still read of it (the turns before the\n"
    "first one with rows lost are kept; the lost ones are named) over the intact upper\n"
    "layer (the workspace must be unmounted; the old file is kept as meta.db.damaged-TIME; the\n"
    "agent's files are never touched). --base DIR gives the base for a rebuild when the\n"
    "recorded one is lost.\n";

static void fsck_turns_text(const struct cb_fsck_problem *p, char *buf, size_t len)
{
	if (!strcmp(p->kind, "base_cache") || !strcmp(p->kind, "meta.db") ||
	    !strcmp(p->kind, "marks") || !strcmp(p->kind, "apply_temp") ||
	    !strcmp(p->kind, "staging"))
		snprintf(buf, len, "-");
	else if (p->last_turn < 0)
		snprintf(buf, len, "%lld and later", p->first_turn);
	else if (p->last_turn == p->first_turn)
		snprintf(buf, len, "%lld", p->first_turn);
	else
		snprintf(buf, len, "%lld-%lld", p->first_turn, p->last_turn);
}

int cmd_fsck(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"repair", no_argument, NULL, 'r'},
	    {"base", required_argument, NULL, 'b'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	struct cb_fsck_report r;
	const char *base = NULL;
	int c, status, repair = 0, left = 0;

	while ((c = cli_getopt(argc, argv, "rb:", opts, &common, fsck_usage, &status)) > 0) {
		if (c == 'r')
			repair = 1;
		else
			base = optarg;
	}
	if (cli_one_ref(c, argc, argv, fsck_usage, &status))
		return status;
	if ((status = cb_ws_fsck(argv[optind], repair, base, &r)))
		return cli_fail_rc("fsck", status);
	for (size_t i = 0; i < r.n; i++)
		left += !r.p[i].repaired;
	if (common.json) {
		long long unrepaired;
		json_t *j = cb_fsck_report_json(&r, &unrepaired);

		json_object_set_new(j, "ok", json_boolean(!left));
		cb_ws_fsck_free(&r);
		cli_print_json(j);
		return left ? CLI_FAIL : CLI_OK;
	}
	for (size_t i = 0; i < r.n; i++) {
		char turns[64];

		fsck_turns_text(&r.p[i], turns, sizeof(turns));
		printf("%s %s: %s (turns: %s)\n", r.p[i].repaired ? "repaired" : "PROBLEM",
		       r.p[i].kind, cli_q_text(r.p[i].detail), turns);
	}
	printf("%s: %lld blobs, %lld base files, %lld base-cache rows checked; %zu problems, %d "
	       "left\n",
	       r.ref, r.blobs_checked, r.base_checked, r.cache_rows, r.n, left);
	cb_ws_fsck_free(&r);
	return left ? CLI_FAIL : CLI_OK;
}
