/* libcowbox's network calls (include/cowbox/box_net.h): reaches, net_log, publish and
 * unpublish, one request each. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "box_private.h"
#include "cowbox/box_net.h"
#include "cowbox/error.h"

/* A copy of reply's string field key into *out ("" when absent). */
static int dup_field(json_t *reply, const char *key, char **out)
{
	if (!(*out = strdup(json_string_value(json_object_get(reply, key)) ?: "")))
		return cb_error_set(ENOMEM, "out of memory");
	return 0;
}

int cb_box_reaches(struct cb_box *box, const char *dest, char **rule)
{
	char what[300];
	json_t *reply = NULL;
	int rc;

	cb_box_set_code("");
	if (rule)
		*rule = NULL;
	snprintf(what, sizeof(what), "reaches %.256s", dest ? dest : "(null)");
	rc = cb_box_request(box, what,
			    json_pack("{s:s,s:s}", "op", "reaches", "dest", dest ? dest : ""),
			    &reply, NULL);
	if (!rc && rule)
		rc = dup_field(reply, "rule", rule);
	if (!rc)
		rc = json_is_true(json_object_get(reply, "allowed"));
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_net_log(struct cb_box *box, long long turn, json_t **rows)
{
	json_t *req = json_pack("{s:s}", "op", "net_log"), *reply = NULL;
	int rc;

	cb_box_set_code("");
	*rows = NULL;
	if (req && turn > 0)
		json_object_set_new(req, "turn", json_integer(turn));
	rc = cb_box_request(box, "net_log", req, &reply, NULL);
	if (!rc) {
		*rows = json_incref(json_object_get(reply, "rows"));
		if (!*rows)
			*rows = json_array();
		rc = (int)json_array_size(*rows);
	}
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_publish(struct cb_box *box, int port, char **address)
{
	return cb_box_port_op(box, "publish", port, "address", address);
}

int cb_box_unpublish(struct cb_box *box, int port)
{
	return cb_box_port_op(box, "unpublish", port, NULL, NULL);
}
