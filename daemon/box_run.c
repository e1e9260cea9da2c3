/* libcowbox's high-level API, commands: run (collected) and exec (streamed, with stdin and
 * kill) over the daemon's run and exec ops. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "box_private.h"
#include "cowbox/client.h"
#include "cowbox/error.h"

#define PROC_CHUNK (1u << 20) /* stdin bytes per frame */

struct cb_box_proc {
	struct cb_client *client; /* the process's own connection */
	long long id;
	json_t *final; /* the exec's final reply, once it came */
};

/* The request fields run and exec share. */
static int command_json(const char *op, const char *const *argv, const char *shell,
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
static int result_fill(json_t *msg, struct cb_box_result *res)
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
	if ((rc = command_json("run", argv, shell, opts, &req)))
		return cb_box_finish(rc);
	if (opts && opts->stdin_len)
		json_object_set_new(req, "stdin",
				    cb_api_b64_json(opts->stdin_data, opts->stdin_len));
	if (opts && opts->strict)
		json_object_set_new(req, "strict", json_true());
	rc = cb_box_request(box, "run", req, &reply, &partial);
	if (!rc) {
		rc = result_fill(reply, res);
	} else if (partial) {
		/* A strict run's timeout or cap: the error stands, and so does what it did. */
		char msg[1024], code[32];

		snprintf(msg, sizeof(msg), "%s", cb_error_message());
		snprintf(code, sizeof(code), "%s", cb_box_last_code());
		result_fill(partial, res);
		cb_error_set(rc, "%s", msg);
		cb_box_set_code(code);
	}
	json_decref(reply);
	json_decref(partial);
	return cb_box_finish(rc);
}

int cb_box_exec(struct cb_box *box, const char *const *argv, const char *shell,
		const struct cb_box_run_options *opts, struct cb_box_proc **out)
{
	struct cb_box_proc *p = NULL;
	json_t *req = NULL;
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if ((rc = command_json("exec", argv, shell, opts, &req)))
		goto out;
	json_object_set_new(req, "stdin", json_true());
	/* A ping boots the daemon if it is not running, like any other first use. */
	if ((rc = cb_box_request(box, "exec", json_pack("{s:s}", "op", "ping"), NULL, NULL)))
		goto out;
	if (!(p = calloc(1, sizeof(*p)))) {
		rc = cb_error_set(ENOMEM, "exec: out of memory");
		goto out;
	}
	if ((rc = cb_daemon_connect(box->ref, &p->client))) {
		cb_box_set_code("unavailable");
		goto out;
	}
	rc = cb_client_send(p->client, req, &p->id);
	req = NULL;
	if (!rc) {
		*out = p;
		p = NULL;
	}
out:
	json_decref(req);
	cb_box_proc_free(p);
	return cb_box_finish(rc);
}

int cb_box_proc_write(struct cb_box_proc *p, const void *data, size_t len)
{
	int rc = 0;

	cb_box_set_code("");
	for (size_t off = 0; !rc && off < len; off += PROC_CHUNK) {
		size_t n = len - off < PROC_CHUNK ? len - off : PROC_CHUNK;

		rc = cb_client_send(p->client,
				    json_pack("{s:I,s:s,s:o}", "id", (json_int_t)p->id, "op",
					      "stdin", "data",
					      cb_api_b64_json((const char *)data + off, n)),
				    NULL);
	}
	if (rc)
		cb_error_wrap(rc, "exec stdin");
	return cb_box_finish(rc);
}

int cb_box_proc_close_stdin(struct cb_box_proc *p)
{
	int rc;

	cb_box_set_code("");
	rc = cb_client_send(
	    p->client, json_pack("{s:I,s:s,s:b}", "id", (json_int_t)p->id, "op", "stdin", "eof", 1),
	    NULL);
	return cb_box_finish(rc ? cb_error_wrap(rc, "exec stdin") : 0);
}

int cb_box_proc_kill(struct cb_box_proc *p, int sig)
{
	int rc;

	cb_box_set_code("");
	if (p->final)
		return 0; /* it has ended: nothing left to signal */
	rc = cb_client_send(
	    p->client,
	    json_pack("{s:I,s:s,s:i}", "id", (json_int_t)p->id, "op", "kill", "signal", sig), NULL);
	return cb_box_finish(rc ? cb_error_wrap(rc, "exec kill") : 0);
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One frame of the exec: output to on_output, the final reply kept in p->final. */
static int proc_frame(struct cb_box_proc *p, json_t *msg, cb_box_output_fn on_output, void *arg)
{
	const char *stream = json_string_value(json_object_get(msg, "stream"));
	void *data = NULL;
	size_t n = 0;
	int rc;

	if (json_integer_value(json_object_get(msg, "id")) != p->id)
		return 0; /* not ours (an error for a stdin line is answered with our id too) */
	if (stream) {
		rc = cb_api_b64_decode(
		    "data", json_string_value(json_object_get(msg, "data")) ?: "", &data, &n);
		if (!rc && on_output && n)
			on_output(strcmp(stream, "stderr") ? 1 : 2, data, n, arg);
		free(data);
		return rc;
	}
	/* stdin and kill lines are answered only when no exec runs under the id, i.e. after
	 * its final reply: an error before that is the exec's own. */
	p->final = json_incref(msg);
	return 0;
}

int cb_box_proc_poll(struct cb_box_proc *p, int timeout_ms, cb_box_output_fn on_output, void *arg,
		     struct cb_box_result *res)
{
	long long deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
	int rc = 0;

	cb_box_set_code("");
	if (res)
		memset(res, 0, sizeof(*res));
	while (!p->final) {
		long long left = deadline < 0 ? -1 : deadline - mono_ms();
		json_t *msg = NULL;

		if (deadline >= 0 && left <= 0)
			left = 1; /* still take what has already arrived */
		rc = cb_client_recv(p->client, (int)left, &msg);
		if (rc == -ETIMEDOUT && deadline >= 0) {
			cb_error_clear();
			return cb_box_finish(0);
		}
		if (rc) {
			cb_box_set_code("unavailable");
			return cb_box_finish(cb_error_wrap(rc, "exec"));
		}
		rc = proc_frame(p, msg, on_output, arg);
		json_decref(msg);
		if (rc)
			return cb_box_finish(rc);
	}
	if (json_object_get(p->final, "error"))
		return cb_box_finish(cb_box_reply_error("exec", p->final, NULL));
	if (res && (rc = result_fill(p->final, res)))
		return cb_box_finish(rc);
	return cb_box_finish(1);
}

void cb_box_proc_free(struct cb_box_proc *p)
{
	if (!p)
		return;
	cb_client_close(p->client);
	json_decref(p->final);
	free(p);
}
