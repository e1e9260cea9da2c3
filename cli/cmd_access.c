/* `cowbox access REF [LEVEL]`: show the widest access level a workspace serves, or lower it
 * (through its daemon when one runs, so that its connections are bounded at once). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/access.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"

static const char access_usage[] =
    "usage: cowbox access REF [none|files|full] [--json]\n"
    "Show the widest access level the workspace serves, or lower it to LEVEL: files allows\n"
    "read, write and the turn operations but no command; none only what its owner uses\n"
    "(info, snapshot, diff, turns, close, destroy). A level can only be lowered: a wider\n"
    "one is refused.\n";

/* Lower a served workspace through its daemon; 1 when no daemon serves it. */
static int access_through_daemon(const char *ref, int level)
{
	struct cb_client *c = NULL;
	int rc;

	if (cb_daemon_connect(ref, &c) < 0) {
		cb_error_clear();
		return 1;
	}
	rc = cb_client_request(c,
			       json_pack("{s:s, s:s, s:b}", "op", "access", "level",
					 cb_access_name(level), "workspace", 1),
			       10000, NULL);
	cb_client_close(c);
	return rc;
}

int cmd_access(int argc, char **argv)
{
	struct cli_common common = {0};
	char ref[CB_WS_REF_LEN + 1], *dir = NULL;
	int c, status, level = -1, have, rc;

	while ((c = cli_getopt(argc, argv, NULL, NULL, &common, access_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (optind == argc || argc - optind > 2)
		return cli_usage_error(access_usage, "access takes a workspace ref or name and "
						     "an optional level");
	if (argc - optind == 2 && (level = cb_access_parse(argv[optind + 1])) < 0)
		return cli_usage_error(access_usage, "%s", cb_error_message());
	if ((rc = cb_ws_resolve(argv[optind], ref)) < 0 || (rc = cb_ws_path(ref, NULL, &dir)) < 0 ||
	    (rc = have = cb_ws_access_load(dir)) < 0) {
		free(dir);
		return cli_fail_rc("access", rc);
	}
	if (level > have) {
		free(dir);
		cli_set_code("access_denied");
		return cli_fail("access",
				"access %s refused: workspace %s serves at most %s; a level can "
				"only be lowered",
				cb_access_name(level), ref, cb_access_name(have));
	}
	if (level >= 0 && level < have) {
		rc = access_through_daemon(ref, level);
		if (rc == 1)
			rc = cb_ws_access_save(dir, level);
		if (rc < 0) {
			free(dir);
			return cli_fail_rc("access", rc);
		}
		have = level;
	}
	free(dir);
	if (common.json)
		return cli_print_json(
		    json_pack("{s:s, s:s}", "ref", ref, "supported_access", cb_access_name(have)));
	printf("%s\n", cb_access_name(have));
	return CLI_OK;
}
