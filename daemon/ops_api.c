/* The API's command ops: exec (streamed frames, stdin frames, kill) and run (collected),
 * each on a thread of its own so a connection keeps serving while its commands run. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "cowbox/error.h"

/* A command started by exec or run, findable by (connection, id) for stdin and kill. */
struct api_exec {
	struct cb_daemon *d;
	struct cb_daemon_conn *conn;
	json_t *id;
	int stream; /* exec: frames out; run: collected */
	int strict; /* run: a timeout or the output cap is an error reply */
	struct cb_backend_cmd cmd;
	char **argv, **env;
	char *shell, *cwd, *user;
	void *stdin_buf;
	struct cb_backend *b;
	struct cb_exec *h;
	int refs;      /* stdin writers using h; guarded by d->running_lock */
	int started;   /* h is set and running; guarded by d->running_lock */
	int stop_sent; /* the daemon's stop killed it */
	int hangup;    /* the client went away: nobody wants the command any more */
	int early_sig; /* a kill that came before the command existed; guarded by d->running_lock.
			  b and h are only used once started is set: until then the kill is
			  kept here and sent as soon as the command runs (SIGKILL: it never
			  starts). */
	struct api_exec *next;
};

static void api_exec_free(struct api_exec *e)
{
	cb_api_backend_put(e->d, e->b);
	cb_exec_env_free(e->argv);
	cb_exec_env_free(e->env);
	free(e->shell);
	free(e->cwd);
	free(e->user);
	free(e->stdin_buf);
	json_decref(e->id);
	if (e->conn)
		cb_daemon_conn_unref(e->conn);
	free(e);
}

static int strings_from(json_t *arr, const char *field, char ***out)
{
	size_t i;
	json_t *v;

	*out = calloc(json_array_size(arr) + 1, sizeof(char *));
	if (!*out)
		return cb_error_set(ENOMEM, "%s: out of memory", field);
	json_array_foreach(arr, i, v)
	{
		if (!json_is_string(v))
			return cb_error_set(EINVAL, "%s[%zu]: needs a string", field, i);
		if (!((*out)[i] = strdup(json_string_value(v))))
			return cb_error_set(ENOMEM, "%s: out of memory", field);
	}
	return 0;
}

/* The request's command fields, checked before anything runs. */
static int cmd_parse(json_t *req, struct api_exec *e)
{
	json_t *cmd = json_object_get(req, "cmd"), *shell = json_object_get(req, "shell");
	json_t *env = json_object_get(req, "env"), *cwd = json_object_get(req, "cwd");
	json_t *tmo = json_object_get(req, "timeout"), *in = json_object_get(req, "stdin");
	json_t *lim = json_object_get(req, "output_limit"), *user = json_object_get(req, "user");
	json_t *bg = json_object_get(req, "background");
	int rc = 0;

	if (!cmd == !shell || (cmd && (!json_is_array(cmd) || !json_array_size(cmd))) ||
	    (shell && !json_is_string(shell)))
		return cb_error_set(EINVAL,
				    "give \"cmd\" (a non-empty list of strings) or \"shell\" "
				    "(a string), one of them");
	if (cmd && (rc = strings_from(cmd, "cmd", &e->argv)) < 0)
		return rc;
	if (shell && !(e->shell = strdup(json_string_value(shell))))
		return cb_error_set(ENOMEM, "shell: out of memory");
	if (env && !json_is_null(env) && (rc = cb_backend_env_from_json(env, "env", &e->env)) < 0)
		return rc;
	if (cwd && !json_is_null(cwd)) {
		if (!json_is_string(cwd))
			return cb_error_set(EINVAL, "cwd: needs a string");
		if (!(e->cwd = strdup(json_string_value(cwd))))
			return cb_error_set(ENOMEM, "cwd: out of memory");
	}
	if (user && !json_is_null(user)) {
		if (json_is_integer(user) && json_integer_value(user) >= 0)
			rc = asprintf(&e->user, "%lld", (long long)json_integer_value(user)) < 0
				 ? (e->user = NULL, -ENOMEM)
				 : 0;
		else if (!json_is_string(user))
			return cb_error_set(EINVAL, "user: a name or a uid");
		else if ((rc = cb_backend_user_check("user", json_string_value(user))) == 0 &&
			 !(e->user = strdup(json_string_value(user))))
			rc = -ENOMEM;
		if (rc == -ENOMEM)
			return cb_error_set(ENOMEM, "user: out of memory");
		if (rc < 0)
			return rc;
	}
	if (bg && !json_is_null(bg) &&
	    (rc = cb_backend_bg_parse("background", json_string_value(bg), &e->cmd.background)) < 0)
		return rc;
	if (tmo && !json_is_null(tmo)) {
		if (!json_is_number(tmo) || json_number_value(tmo) <= 0)
			return cb_error_set(EINVAL, "timeout: needs a number of seconds > 0");
		e->cmd.timeout = json_number_value(tmo);
	}
	if (lim && !json_is_null(lim)) {
		if (!json_is_integer(lim) || json_integer_value(lim) <= 0)
			return cb_error_set(EINVAL, "output_limit: needs a byte count > 0");
		e->cmd.output_limit = (size_t)json_integer_value(lim);
	}
	if (in && json_is_true(in) && e->stream) {
		e->cmd.stdin_kind = CB_EXEC_STDIN_STREAM;
	} else if (in && json_is_string(in)) {
		if ((rc = cb_api_b64_decode("stdin", json_string_value(in), &e->stdin_buf,
					    &e->cmd.stdin_len)) < 0)
			return rc;
		e->cmd.stdin_kind = CB_EXEC_STDIN_BYTES;
		e->cmd.stdin_data = e->stdin_buf;
	} else if (in && !json_is_null(in) && !json_is_false(in)) {
		return cb_error_set(EINVAL, "stdin: needs base64 data%s",
				    e->stream ? " or true (stdin frames follow)" : "");
	}
	e->cmd.argv = e->argv;
	e->cmd.shell = e->shell;
	e->cmd.env = e->env;
	e->cmd.cwd = e->cwd;
	e->cmd.user = e->user;
	return 0;
}

static int api_output(void *arg, int stream, const void *buf, size_t len)
{
	struct api_exec *e = arg;
	json_t *frame = json_object();

	json_object_set_new(frame, "stream", json_string(stream == 2 ? "stderr" : "stdout"));
	json_object_set_new(frame, "data", cb_api_b64_json(buf, len));
	/* Nobody is left to read the output: stop the command. */
	return cb_daemon_send_frame(e->conn, e->id, frame) < 0;
}

static json_t *result_json(const struct api_exec *e, const struct cb_exec_result *res)
{
	json_t *r = json_object();

	json_object_set_new(r, "exit_code", json_integer(res->exit_code));
	json_object_set_new(r, "signal", json_integer(res->term_signal));
	json_object_set_new(r, "timed_out", json_boolean(res->timed_out));
	json_object_set_new(r, "output_limited", json_boolean(res->output_limited));
	json_object_set_new(r, "killed", json_boolean(res->killed));
	json_object_set_new(r, "oom_killed", json_boolean(res->oom_killed));
	json_object_set_new(r, "duration", json_real(res->duration));
	if (!e->stream) {
		json_object_set_new(r, "stdout", cb_api_b64_json(res->out, res->out_len));
		json_object_set_new(r, "stderr", cb_api_b64_json(res->err, res->err_len));
	}
	return r;
}

void cb_daemon_api_hangup(struct cb_daemon *d, struct cb_daemon_conn *conn)
{
	pthread_mutex_lock(&d->running_lock);
	for (struct api_exec *e = d->running; e; e = e->next)
		if (e->conn == conn) {
			e->hangup = 1;
			if (e->started)
				cb_exec_kill(e->h, SIGKILL);
		}
	pthread_mutex_unlock(&d->running_lock);
}

/* Take e off the running list and wait until no stdin or kill request still uses it. */
static void running_remove(struct api_exec *e)
{
	struct cb_daemon *d = e->d;

	pthread_mutex_lock(&d->running_lock);
	for (struct api_exec **p = &d->running; *p; p = &(*p)->next)
		if (*p == e) {
			*p = e->next;
			break;
		}
	while (e->refs)
		pthread_cond_wait(&d->running_cond, &d->running_lock);
	pthread_cond_broadcast(&d->running_cond);
	pthread_mutex_unlock(&d->running_lock);
}

static void *api_exec_main(void *arg)
{
	struct api_exec *e = arg;
	struct cb_exec_callbacks cbs = {api_output, e};
	struct cb_exec_result res = {0};
	pid_t pid = 0;
	int rc, early_kill, early_sig;

	if ((rc = cb_api_backend(e->d, 1, &e->b)) < 0)
		goto fail;
	pthread_mutex_lock(&e->d->running_lock);
	early_kill = e->early_sig == SIGKILL || e->hangup;
	pthread_mutex_unlock(&e->d->running_lock);
	if (early_kill) {
		/* Killed before it existed: it never runs, and ends as a SIGKILL would have. */
		res.killed = 1;
		res.term_signal = SIGKILL;
		res.exit_code = 128 + SIGKILL;
		running_remove(e);
		goto reply;
	}
	cb_daemon_spawn_lock();
	rc = e->b->ops->exec(e->b, &e->cmd, e->stream ? &cbs : NULL, &e->h);
	if (!rc && cb_daemon_child_claim(cb_exec_pid(e->h)) == 0)
		pid = cb_exec_pid(e->h);
	cb_daemon_spawn_unlock();
	if (rc < 0)
		goto fail;
	pthread_mutex_lock(&e->d->running_lock);
	e->started = 1;
	if (e->hangup)
		cb_exec_kill(e->h, SIGKILL);
	early_sig = e->hangup ? 0 : e->early_sig;
	pthread_cond_broadcast(&e->d->running_cond);
	pthread_mutex_unlock(&e->d->running_lock);
	if (early_sig) /* this thread owns e: no lock needed to use h */
		e->b->ops->kill(e->b, e->h, early_sig);
	rc = e->b->ops->wait(e->b, e->h, &res);
	running_remove(e);
	if (pid)
		cb_daemon_child_release(pid);
	cb_exec_free(e->h);
	if (rc < 0) {
		cb_exec_result_free(&res); /* partly filled, also on an error */
		goto fail;
	}
reply:
	if (__atomic_load_n(&e->stop_sent, __ATOMIC_ACQUIRE)) {
		/* Ended by a close or destroy from elsewhere: not the command's own exit 137. */
		json_t *err = json_pack("{s:s, s:s, s:o}", "code", "unavailable", "message",
					"the workspace was closed or destroyed while the command "
					"ran; its tree was killed",
					"result", result_json(e, &res));

		cb_daemon_send_frame(e->conn, e->id, json_pack("{s:o}", "error", err));
	} else if (e->strict && (res.timed_out || res.output_limited)) {
		json_t *err = json_pack("{s:s, s:s, s:o}", "code",
					res.timed_out ? "timeout" : "output_limit", "message",
					res.timed_out ? "the command timed out; its tree was killed"
						      : "the output passed the limit; the command "
							"was stopped",
					"result", result_json(e, &res));

		cb_daemon_send_frame(e->conn, e->id, json_pack("{s:o}", "error", err));
	} else {
		cb_daemon_reply(e->conn, e->id, result_json(e, &res));
	}
	cb_exec_result_free(&res);
	api_exec_free(e);
	return NULL;
fail:
	cb_daemon_reply_error(e->conn, e->id, cb_daemon_error_code(rc), "%s",
			      *cb_error_message() ? cb_error_message() : strerror(-rc));
	running_remove(e);
	/* The backend is gone from under us (a container removed or stopped behind our back):
	 * stop, so that the next use boots the workspace again, container and all. */
	if (rc == -ENXIO)
		cb_daemon_request_stop(e->d);
	api_exec_free(e);
	return NULL;
}

/* The command of (conn, id) on d's list (d->running_lock held); *same gets how many of conn's
 * commands are listed (may be NULL). */
static struct api_exec *running_find(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *id,
				     int *same)
{
	struct api_exec *found = NULL;

	if (same)
		*same = 0;
	for (struct api_exec *e = d->running; e; e = e->next)
		if (e->conn == conn) {
			if (same)
				(*same)++;
			if (!found && json_equal(e->id, id))
				found = e;
		}
	return found;
}

/* The running command of (conn, id) once it has started (a stdin frame may come before its
 * exec's thread got that far), with a reference that running_put drops; NULL if none. */
static struct api_exec *running_get(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *id)
{
	struct api_exec *e;

	pthread_mutex_lock(&d->running_lock);
	while ((e = running_find(d, conn, id, NULL)) && !e->started)
		pthread_cond_wait(&d->running_cond, &d->running_lock);
	if (e)
		e->refs++;
	pthread_mutex_unlock(&d->running_lock);
	return e;
}

static void running_put(struct api_exec *e)
{
	pthread_mutex_lock(&e->d->running_lock);
	e->refs--;
	pthread_cond_broadcast(&e->d->running_cond);
	pthread_mutex_unlock(&e->d->running_lock);
}

/* List e as (conn, id) unless that id runs already or conn has as many commands in flight as
 * one connection may: -EBUSY saying which. The reader thread lists it, and a hang-up is
 * handled by that same thread after this returns, so cb_daemon_api_hangup finds it. */
static int running_add(struct api_exec *e)
{
	struct cb_daemon *d = e->d;
	int rc = 0, same;

	pthread_mutex_lock(&d->running_lock);
	if (running_find(d, e->conn, e->id, &same))
		rc = cb_error_set(EBUSY, "a command with this id is still running");
	else if (same >= CB_PROTOCOL_MAX_IN_FLIGHT)
		rc =
		    cb_error_set(EBUSY,
				 "request refused: %d requests are already running on this "
				 "connection, the most one connection may have in flight; wait for "
				 "a reply (or use another connection)",
				 same);
	if (!rc) {
		e->next = d->running;
		d->running = e;
	}
	pthread_mutex_unlock(&d->running_lock);
	return rc;
}

static int api_start(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req, int stream)
{
	struct api_exec *e = calloc(1, sizeof(*e));
	json_t *id = json_object_get(req, "id");
	pthread_attr_t attr;
	pthread_t t;
	int rc, listed = 0;

	if (!e)
		return cb_error_set(ENOMEM, "exec: out of memory");
	e->d = d;
	e->stream = stream;
	e->strict = json_is_true(json_object_get(req, "strict"));
	e->id = json_incref(id);
	if ((rc = cmd_parse(req, e)) < 0)
		goto fail;
	e->conn = cb_daemon_conn_ref(conn);
	if ((rc = running_add(e)) < 0)
		goto fail;
	listed = 1;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &attr, api_exec_main, e);
	pthread_attr_destroy(&attr);
	if (rc) {
		rc = cb_error_set(rc, "exec thread: %s", strerror(rc));
		goto fail;
	}
	return 0;
fail:
	if (listed)
		running_remove(e);
	api_exec_free(e);
	return rc;
}

static int op_exec(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	return api_start(d, conn, req, 1);
}

static int op_run(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	return api_start(d, conn, req, 0);
}

/* stdin frames are answered only when they fail: the id belongs to the running exec. */
static int op_stdin(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *id = json_object_get(req, "id"), *data = json_object_get(req, "data");
	int eof = json_is_true(json_object_get(req, "eof")), rc = 0;
	void *buf = NULL;
	size_t len = 0;
	struct api_exec *e;

	if (!json_is_string(data) && !eof)
		return cb_error_set(EINVAL, "stdin: needs \"data\" (base64) or \"eof\": true");
	if (data && (rc = cb_api_b64_decode("data", json_string_value(data), &buf, &len)) < 0)
		return rc;
	e = running_get(d, conn, id);
	if (!e || e->cmd.stdin_kind != CB_EXEC_STDIN_STREAM) {
		if (e)
			running_put(e);
		free(buf);
		return cb_error_set(ENOENT, "stdin: no running exec with this id and \"stdin\": "
					    "true on this connection");
	}
	if (len)
		rc = cb_exec_stdin_write(e->h, buf, len);
	if (eof && !rc)
		rc = cb_exec_stdin_close(e->h);
	running_put(e);
	free(buf);
	/* The command closed its stdin or ended: not the client's mistake, nothing to say. */
	return rc == -EPIPE ? 0 : rc;
}

static int op_kill(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *id = json_object_get(req, "id"), *sig = json_object_get(req, "signal");
	int signo = sig ? (int)json_integer_value(sig) : SIGKILL, started = 0;
	struct api_exec *e;

	if ((sig && !json_is_integer(sig)) || signo < 1 || signo > 64)
		return cb_error_set(EINVAL, "kill: \"signal\" needs a signal number 1-64");
	pthread_mutex_lock(&d->running_lock);
	e = running_find(d, conn, id, NULL);
	/* Before its start the command has no handle (nor, maybe, a backend) to signal. */
	if (e && e->started) {
		e->refs++;
		started = 1;
	} else if (e && e->early_sig != SIGKILL)
		e->early_sig = signo;
	pthread_mutex_unlock(&d->running_lock);
	/* Outside the lock (docker's kill runs its CLI); the reference keeps h alive. */
	if (started) {
		e->b->ops->kill(e->b, e->h, signo);
		running_put(e);
	}
	return e ? 0
		 : cb_error_set(ENOENT, "kill: no running command with this id on this "
					"connection");
}

void cb_daemon_api_stop(struct cb_daemon *d)
{
	struct timespec deadline;

	/* The close op and a signal may both stop the daemon; the second waits, finds nothing. */
	pthread_mutex_lock(&d->api_stop_lock);
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 10;
	pthread_mutex_lock(&d->running_lock);
	while (d->running) {
		for (struct api_exec *e = d->running; e; e = e->next)
			if (e->started && !e->stop_sent) {
				__atomic_store_n(&e->stop_sent, 1, __ATOMIC_RELEASE);
				e->b->ops->kill(e->b, e->h, SIGKILL);
			}
		if (pthread_cond_timedwait(&d->running_cond, &d->running_lock, &deadline) ==
		    ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&d->running_lock);
	cb_api_backend_release(d);
	pthread_mutex_unlock(&d->api_stop_lock);
}

extern const struct cb_daemon_op cb_daemon_ops_files[];

const struct cb_daemon_op cb_daemon_ops_api[] = {
    {"exec", op_exec}, {"run", op_run}, {"stdin", op_stdin}, {"kill", op_kill}, {NULL, NULL},
};
