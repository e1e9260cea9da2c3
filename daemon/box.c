/* libcowbox's high-level API (include/cowbox/box.h): workspaces as sandboxes over the daemon's
 * control protocol: requests with stable error codes, and the lifecycle (create to destroy). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "box_private.h"
#include "errcode.h"
#include "cowbox/access.h"
#include "cowbox/client.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"

#define BOX_START_MS 60000 /* a daemon that needs longer to mount is broken */
#define BOX_STOP_MS  30000

static __thread char last_code[32];

const char *cb_box_last_code(void)
{
	return last_code;
}

void cb_box_set_code(const char *code)
{
	snprintf(last_code, sizeof(last_code), "%s", code ? code : "");
}

int cb_box_finish(int rc)
{
	if (rc >= 0) {
		cb_box_set_code("");
		return rc;
	}
	if (!last_code[0])
		cb_box_set_code(cb_daemon_error_code_listed(rc));
	return rc;
}

int cb_box_reply_error(const char *what, json_t *msg, json_t **result)
{
	json_t *err = json_object_get(msg, "error");
	const char *code = json_string_value(json_object_get(err, "code"));
	const char *text = json_string_value(json_object_get(err, "message"));

	if (result && json_is_object(json_object_get(err, "result")))
		*result = json_incref(json_object_get(err, "result"));
	cb_box_set_code(code ? code : "unavailable");
	return cb_error_set(cb_client_code_errno(code), "%s: %s: %s", what, code ? code : "error",
			    text ? text : "the daemon gave no reason");
}

/* What an info or access reply says this box's connection may do. */
static void box_level_seen(struct cb_box *box, json_t *reply)
{
	const char *name = json_string_value(json_object_get(reply, "access"));
	int level = name ? cb_access_parse(name) : CB_ACCESS_FULL;

	cb_error_clear();
	box->level = level < 0 ? CB_ACCESS_NONE : level;
}

/* Boot (if needed) and connect to the workspace's daemon; a box lowered to a level lowers
 * every connection it makes, also after the daemon was restarted. */
static int box_connect(struct cb_box *box)
{
	json_t *msg = NULL;
	int rc;

	if (box->client)
		return 0;
	if ((rc = cb_daemon_ensure(box->ref, NULL, BOX_START_MS, &box->daemon_pid)) ||
	    (rc = cb_daemon_connect(box->ref, &box->client))) {
		cb_box_set_code("unavailable");
		return rc;
	}
	if (box->access < 0)
		return 0;
	rc = cb_client_send(
	    box->client,
	    json_pack("{s:s, s:s}", "op", "access", "level", cb_access_name(box->access)), NULL);
	if (!rc && !(rc = cb_client_recv(box->client, BOX_START_MS, &msg)) &&
	    json_object_get(msg, "error"))
		rc = cb_box_reply_error("access", msg, NULL);
	if (!rc)
		box_level_seen(box, msg);
	json_decref(msg);
	if (rc) {
		cb_client_close(box->client);
		box->client = NULL;
	}
	return rc;
}

int cb_box_access_need(struct cb_box *box, int level, const char *what)
{
	if (box->level >= level)
		return 0;
	cb_box_set_code("access_denied");
	return cb_error_set(EACCES, "%s refused: this box has access %s, and %s needs %s", what,
			    cb_access_name(box->level), what, cb_access_name(level));
}

int cb_box_set_access(struct cb_box *box, const char *level)
{
	int want, old = box->access, rc;

	cb_box_set_code("");
	if ((want = cb_access_parse(level)) < 0) {
		cb_box_set_code("invalid_request");
		return cb_box_finish(want);
	}
	/* A fresh connection asks for the new level (the old one keeps the old level). */
	cb_client_close(box->client);
	box->client = NULL;
	box->access = want;
	if ((rc = box_connect(box)))
		box->access = old;
	return cb_box_finish(rc);
}

int cb_box_wait_reply(struct cb_client *c, const long long *ids, size_t n, size_t *which,
		      const char *what, json_t **reply, json_t **result)
{
	json_t *msg;
	size_t k;
	int rc;

	for (;;) {
		if ((rc = cb_client_recv(c, -1, &msg))) {
			cb_box_set_code("unavailable");
			return cb_error_wrap(rc, "%s", what);
		}
		for (k = 0; k < n && json_integer_value(json_object_get(msg, "id")) != ids[k]; k++)
			;
		if (k == n || json_object_get(msg, "stream")) {
			json_decref(msg);
			continue;
		}
		if (which)
			*which = k;
		if (json_object_get(msg, "error")) {
			rc = cb_box_reply_error(what, msg, result);
			json_decref(msg);
			return rc;
		}
		if (reply)
			*reply = msg;
		else
			json_decref(msg);
		return 0;
	}
}

int cb_box_request(struct cb_box *box, const char *what, json_t *req, json_t **reply,
		   json_t **result)
{
	long long id;
	int rc = -ENOMEM;

	if (reply)
		*reply = NULL;
	if (!req)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	/* A daemon closed elsewhere (or crashed) since the last request: the send fails and
	 * the next daemon gets the request, as the next use boots the workspace again. */
	for (int attempt = 0; attempt < 2; attempt++) {
		if ((rc = box_connect(box)))
			break;
		json_object_del(req, "id");
		rc = cb_client_send(box->client, json_incref(req), &id);
		if (rc == 0) {
			/* Sent: a daemon dying now may have done it, so it is not sent again. */
			rc = cb_box_wait_reply(box->client, &id, 1, NULL, what, reply, result);
			if (rc == -ECONNRESET) {
				cb_client_close(box->client);
				box->client = NULL;
			}
			break;
		}
		cb_client_close(box->client);
		box->client = NULL;
		if (rc != -EPIPE && rc != -ECONNRESET)
			break;
		cb_box_set_code("");
	}
	json_decref(req);
	return rc;
}

/* Take backend, working_dir, the mount point and where commands start (the daemon's
 * "workdir": each backend says where it shows the workspace) from the daemon's view. */
static int box_apply_options(struct cb_box *box, json_t *reply)
{
	json_t *opts = json_object_get(reply, "options"), *info = NULL;
	const char *backend = json_string_value(json_object_get(opts, "backend"));
	const char *wd = json_string_value(json_object_get(opts, "working_dir"));
	const char *workdir = json_string_value(json_object_get(reply, "workdir"));
	int rc;

	if ((rc = cb_box_request(box, "info", json_pack("{s:s}", "op", "info"), &info, NULL)))
		return rc;
	free(box->mountpoint);
	free(box->backend);
	free(box->workdir);
	free(box->working_dir);
	box->working_dir = wd && *wd ? strdup(wd) : NULL;
	box->mountpoint = strdup(json_string_value(json_object_get(info, "mountpoint")) ?: "");
	box_level_seen(box, info);
	box->backend = strdup(backend ? backend : "");
	box->workdir = strdup(workdir ? workdir : "");
	json_decref(info);
	if (!box->mountpoint || !box->backend || !box->workdir)
		return cb_error_set(ENOMEM, "out of memory");
	return 0;
}

/* A daemon this process started is its child (cb_daemon_ensure forks it): once stopped it
 * must be reaped here, since nothing else will (PID 1 may not reap orphans either). */
static void reap_daemon(pid_t pid)
{
	for (int i = 0; pid > 0 && i < 200; i++) {
		pid_t r = waitpid(pid, NULL, WNOHANG);

		if (r == pid || (r < 0 && errno != EINTR))
			return;
		usleep(10000);
	}
}

int cb_box_attach(const char *ref, json_t *options, struct cb_box **out, pid_t *pid)
{
	struct cb_box *box = calloc(1, sizeof(*box));
	json_t *req = json_pack("{s:s}", "op", "configure"), *reply = NULL;
	int rc;

	*out = NULL;
	if (!box || !req) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	snprintf(box->ref, sizeof(box->ref), "%s", ref);
	box->access = -1;
	box->level = CB_ACCESS_FULL;
	if (options)
		json_object_set(req, "options", options);
	rc = cb_box_request(box, "configure", req, &reply, NULL);
	req = NULL;
	if (!rc)
		rc = box_apply_options(box, reply);
	if (pid)
		*pid = box->daemon_pid;
	if (!rc) {
		*out = box;
		box = NULL;
	}
out:
	json_decref(reply);
	json_decref(req);
	json_decref(options);
	cb_box_detach(box);
	return rc;
}

int cb_box_open(const char *ref_or_name, struct cb_box **out)
{
	char ref[CB_WS_REF_LEN + 1];
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if ((rc = cb_ws_resolve(ref_or_name ? ref_or_name : "", ref)))
		return cb_box_finish(rc);
	if ((rc = cb_box_attach(ref, NULL, out, NULL)))
		cb_error_wrap(rc, "open %s", ref_or_name);
	return cb_box_finish(rc);
}

/* "KEY=VALUE" strings into a JSON object, refusing ones without '='. */
int cb_box_env_json(const char *const *env, const char *what, json_t **out)
{
	*out = json_object();
	if (!*out)
		return cb_error_set(ENOMEM, "out of memory");
	for (size_t i = 0; env && env[i]; i++) {
		const char *eq = strchr(env[i], '=');

		if (!eq || eq == env[i]) {
			json_decref(*out);
			*out = NULL;
			return cb_error_set(EINVAL, "%s: '%s' is not KEY=VALUE", what, env[i]);
		}
		char *key = strndup(env[i], (size_t)(eq - env[i]));

		if (!key || json_object_set_new(*out, key, json_string(eq + 1))) {
			free(key);
			json_decref(*out);
			*out = NULL;
			return cb_error_set(ENOMEM, "%s: out of memory", what);
		}
		free(key);
	}
	return 0;
}

static json_t *strings_json(const char *const *list)
{
	json_t *a = json_array();

	for (size_t i = 0; a && list && list[i]; i++)
		json_array_append_new(a, json_string(list[i]));
	return a;
}

/* The daemon's backend options for opts; the daemon checks the values themselves. */
/* A limit: 0 keeps the default (no key), CB_BOX_NO_LIMIT is the protocol's 0 (none). */
static void limit_json(json_t *j, const char *key, unsigned long v)
{
	if (v)
		json_object_set_new(j, key, json_integer(v == CB_BOX_NO_LIMIT ? 0 : (json_int_t)v));
}

static int options_json(const struct cb_box_options *o, json_t **out)
{
	json_t *j = json_object(), *env = NULL;
	int rc;

	*out = NULL;
	if (!j)
		return cb_error_set(ENOMEM, "out of memory");
	if ((rc = cb_box_env_json(o->env, "create: env", &env))) {
		json_decref(j);
		return rc;
	}
	json_object_set_new(j, "backend", json_string(o->backend ? o->backend : "ns"));
	json_object_set_new(j, "env", env);
	if (o->working_dir)
		json_object_set_new(j, "working_dir", json_string(o->working_dir));
	if (o->network)
		json_object_set_new(j, "network", json_string(o->network));
	if (o->allow)
		json_object_set_new(j, "allow", strings_json(o->allow));
	if (o->cpus > 0)
		json_object_set_new(j, "cpus", json_real(o->cpus));
	limit_json(j, "memory_mb", o->memory_mb);
	limit_json(j, "pids", o->pids);
	limit_json(j, "disk_mb", o->disk_mb);
	limit_json(j, "disk_inodes", o->disk_inodes);
	if (o->proxy_conns)
		json_object_set_new(j, "proxy_conns", json_integer((json_int_t)o->proxy_conns));
	if (o->image)
		json_object_set_new(j, "image", json_string(o->image));
	if (o->timeout != 0)
		json_object_set_new(j, "timeout", json_real(o->timeout > 0 ? o->timeout : 0));
	if (o->on_create)
		json_object_set_new(j, "on_create", strings_json(o->on_create));
	if (o->on_destroy)
		json_object_set_new(j, "on_destroy", strings_json(o->on_destroy));
	if (o->setup_script)
		json_object_set_new(j, "setup_script", json_string(o->setup_script));
	if (o->setup_timeout > 0)
		json_object_set_new(j, "setup_timeout", json_real(o->setup_timeout));
	if (o->shell)
		json_object_set_new(j, "shell", json_string(o->shell));
	if (o->user)
		json_object_set_new(j, "user", json_string(o->user));
	if (o->background)
		json_object_set_new(j, "background", json_string(o->background));
	for (size_t i = 0; o->volumes && o->volumes[i]; i++) {
		json_t *v = NULL, *vols = json_object_get(j, "volumes");

		if ((rc = cb_backend_volume_spec(o->volumes[i], &v)) < 0) {
			json_decref(j);
			return rc;
		}
		if (!vols)
			json_object_set_new(j, "volumes", vols = json_array());
		json_array_append_new(vols, v);
	}
	*out = j;
	return 0;
}

int cb_box_create(const struct cb_box_options *opts, struct cb_box **out)
{
	static const struct cb_box_options none;
	char ref[CB_WS_REF_LEN + 1];
	json_t *options = NULL;
	pid_t pid = 0;
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if (!opts)
		opts = &none;
	if ((rc = options_json(opts, &options)))
		return cb_box_finish(rc);
	if (opts->access && (rc = cb_access_parse(opts->access)) < 0) {
		json_decref(options);
		cb_box_set_code("invalid_request");
		return cb_box_finish(cb_error_wrap(rc, "create"));
	}
	if ((rc = opts->in_place ? cb_ws_create_in_place(opts->base, opts->name, NULL, ref)
				 : cb_ws_create(opts->base, opts->name, NULL, ref))) {
		json_decref(options);
		return cb_box_finish(cb_error_wrap(rc, "create"));
	}
	/* Lowered once configured: configure with options needs full. */
	if (!(rc = cb_box_attach(ref, options, out, &pid)) && opts->access)
		rc = cb_box_request(*out, "access",
				    json_pack("{s:s, s:s, s:b}", "op", "access", "level",
					      opts->access, "workspace", 1),
				    NULL, NULL);
	if (!rc && opts->idle_timeout)
		rc = cb_box_request(*out, "idle",
				    json_pack("{s:s, s:f}", "op", "idle", "timeout",
					      opts->idle_timeout < 0 ? 0.0 : opts->idle_timeout),
				    NULL, NULL);
	if (!rc && opts->access)
		(*out)->access = (*out)->level = cb_access_parse(opts->access);
	if (rc) {
		cb_box_detach(*out);
		*out = NULL;
		/* Refused options: the fresh workspace is of no use to anyone. */
		char msg[1024], code[sizeof(last_code)];

		snprintf(msg, sizeof(msg), "%s", cb_error_message());
		snprintf(code, sizeof(code), "%s", last_code);
		cb_daemon_stop(ref, BOX_STOP_MS);
		cb_ws_remove(ref);
		reap_daemon(pid);
		cb_error_set(rc, "create: %s", msg);
		cb_box_set_code(code);
	}
	return cb_box_finish(rc);
}

const char *cb_box_ref(const struct cb_box *box)
{
	return box->ref;
}

const char *cb_box_workdir(const struct cb_box *box)
{
	return box->workdir;
}

const char *cb_box_mountpoint(const struct cb_box *box)
{
	return box->mountpoint;
}

void cb_box_detach(struct cb_box *box)
{
	if (!box)
		return;
	cb_client_close(box->client);
	free(box->mountpoint);
	free(box->workdir);
	free(box->working_dir);
	free(box->backend);
	json_decref(box->map);
	free(box);
}

int cb_box_close(struct cb_box *box)
{
	int rc;

	if (!box)
		return 0;
	cb_box_set_code("");
	cb_client_close(box->client);
	box->client = NULL;
	rc = cb_daemon_stop(box->ref, BOX_STOP_MS);
	if (!rc)
		reap_daemon(box->daemon_pid);
	cb_box_detach(box);
	return cb_box_finish(rc);
}

int cb_box_destroy(const char *arg)
{
	char ref[CB_WS_REF_LEN + 1];
	struct cb_box box = {0};
	int rc;

	cb_box_set_code("");
	rc = cb_ws_resolve(arg ? arg : "", ref);
	if (rc == -ENOENT) {
		cb_error_clear();
		return 0;
	}
	/* An interrupted creation (or a broken db) has no daemon to ask: just remove it. */
	if (rc && arg && cb_ws_ref_syntax(arg))
		return cb_box_finish(cb_ws_remove(arg));
	if (rc)
		return cb_box_finish(rc);
	snprintf(box.ref, sizeof(box.ref), "%s", ref);
	/* The on_destroy hooks and the container need the daemon; a broken daemon must not
	 * keep the disk alive, so its failure only shows if the removal fails too. */
	cb_box_request(&box, "destroy", json_pack("{s:s}", "op", "destroy"), NULL, NULL);
	cb_client_close(box.client);
	cb_daemon_stop(ref, BOX_STOP_MS);
	cb_box_set_code("");
	rc = cb_ws_remove(ref);
	reap_daemon(box.daemon_pid);
	if (rc)
		cb_error_wrap(rc, "destroy %s", ref);
	return cb_box_finish(rc);
}
