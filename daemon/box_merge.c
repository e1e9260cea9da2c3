/* cb_box_merge: libcowbox's call for the merge op (a fork's changes brought back into the
 * box's workspace as one turn; docs/turns.md, "Merge"). */
#include "config.h"

#include <errno.h>

#include "cowbox/apply.h"
#include "cowbox/box.h"
#include "box_private.h"

int cb_box_merge(struct cb_box *box, const char *source, long long turn, const char *strategy,
		 bool dry_run, json_t **report)
{
	json_t *req, *reply = NULL, *result = NULL;
	int rc;

	cb_box_set_code("");
	if (report)
		*report = NULL;
	req = json_pack("{s:s, s:s, s:s, s:b}", "op", "merge", "source", source ? source : "",
			"strategy", strategy ? strategy : "merge", "dry_run", dry_run);
	if (req && turn >= 0)
		json_object_set_new(req, "turn", json_integer(turn));
	rc = cb_box_request(box, "merge", req, &reply, &result);
	if (report && rc == -EEXIST) {
		*report = result;
		result = NULL;
	} else if (report && !rc) {
		*report = reply;
		reply = NULL;
	}
	json_decref(result);
	json_decref(reply);
	return cb_box_finish(rc);
}
