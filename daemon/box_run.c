/* libcowbox's high-level API, commands: run (collected) over the daemon's run op, and the
 * request fields and results it shares with exec (daemon/box_proc.c). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "box_private.h"
#include "cowbox/error.h"

/* The request fields run and exec share. */
int cb_box_command_json(const char *op, const char *const *argv, const char *shell,
			const struct cb_box_run_options *o, json_t **out)
{
	json_t *req = json_pack("{s:s}", "op", op), *env = NULL;
	int rc = 0;

	*out = NULL;
	if (!req)
		return cb_error_set(ENOMEM, "%s: out of memory", op);
	if (!argv == !shell) {
		rc = cb_error_set(EINVAL, "%s: give either argv or shell, exactly one", op);
	} else if (shell) {
		json_object_set_new(req, "shell", json_string(shell));
	} else if (!argv[0]) {
		rc = cb_error_set(EINVAL, "%s: argv is empty", op);
	} else {
		json_t *cmd = json_array();

		for (size_t i = 0; cmd && argv[i]; i++)
			json_array_append_new(cmd, json_string(argv[i]));
		json_object_set_new(req, "cmd", cmd);
	}
	if (!rc && o && o->env && !(rc = cb_box_env_json(o->env, op, &env)))
		json_object_set_new(req, "env", env);
	if (!rc && o && o->cwd)
		json_object_set_new(req, "cwd", json_string(o->cwd));
	if (!rc && o && o->user)
		json_object_set_new(req, "user", json_string(o->user));
	if (!rc && o && o->background)
		json_object_set_new(req, "background", json_string(o->background));
	if (!rc && o && o->timeout > 0)
		json_object_set_new(req, "timeout", json_real(o->timeout));
	if (!rc && o && o->output_limit > 0)
		json_object_set_new(req, "output_limit", json_integer(o->output_limit));
	if (rc)
		json_decref(req);
	else
		*out = req;
	return rc;
}

/* Decode base64 field of msg into a NUL-terminated buffer. */
static int result_bytes(json_t *msg, const char *field, char **out, size_t *len)
{
	void *data = NULL;
	char *buf;
	int rc = cb_api_b64_decode(field, json_string_value(json_object_get(msg, field)) ?: "",
				   &data, len);

	if (rc)
		return rc;
	buf = realloc(data, *len + 1);
	if (!buf) {
		free(data);
		return cb_error_set(ENOMEM, "out of memory");
	}
	buf[*len] = '\0';
	*out = buf;
	return 0;
}

/* Fill res from an exec/run reply (or a strict error's result). */
int cb_box_result_fill(json_t *msg, struct cb_box_result *res)
{
	int rc;

	memset(res, 0, sizeof(*res));
	res->exit_code = (int)json_integer_value(json_object_get(msg, "exit_code"));
	res->signal = (int)json_integer_value(json_object_get(msg, "signal"));
	res->timed_out = json_is_true(json_object_get(msg, "timed_out"));
	res->output_limited = json_is_true(json_object_get(msg, "output_limited"));
	res->killed = json_is_true(json_object_get(msg, "killed"));
	res->oom_killed = json_is_true(json_object_get(msg, "oom_killed"));
	res->duration = json_number_value(json_object_get(msg, "duration"));
	if ((rc = result_bytes(msg, "stdout", &res->out, &res->out_len)) ||
	    (rc = result_bytes(msg, "stderr", &res->err, &res->err_len)))
		cb_box_result_free(res);
	return rc;
}

void cb_box_result_free(struct cb_box_result *res)
{
	if (!res)
		return;
	free(res->out);
	free(res->err);
	res->out = res->err = NULL;
	res->out_len = res->err_len = 0;
}

int cb_box_run(struct cb_box *box, const char *const *argv, const char *shell,
	       const struct cb_box_run_options *opts, struct cb_box_result *res)
{
	json_t *req = NULL, *reply = NULL, *partial = NULL;
	int rc;

	cb_box_set_code("");
	memset(res, 0, sizeof(*res));
	if (opts && opts->stdin_len && !opts->stdin_data)
		return cb_box_finish(
		    cb_error_set(EINVAL, "run: stdin_len %zu without stdin_data", opts->stdin_len));
	if ((rc = cb_box_command_json("run", argv, shell, opts, &req)))
		return cb_box_finish(rc);
	if (opts && opts->stdin_len)
		json_object_set_new(req, "stdin",
				    cb_api_b64_json(opts->stdin_data, opts->stdin_len));
	if (opts && opts->strict)
		json_object_set_new(req, "strict", json_true());
	rc = cb_box_request(box, "run", req, &reply, &partial);
	if (!rc) {
		rc = cb_box_result_fill(reply, res);
	} else if (partial) {
		/* A strict run's timeout or cap: the error stands, and so does what it did. */
		char msg[1024], code[32];

		snprintf(msg, sizeof(msg), "%s", cb_error_message());
		snprintf(code, sizeof(code), "%s", cb_box_last_code());
		cb_box_result_fill(partial, res);
		cb_error_set(rc, "%s", msg);
		cb_box_set_code(code);
	}
	json_decref(reply);
	json_decref(partial);
	return cb_box_finish(rc);
}
