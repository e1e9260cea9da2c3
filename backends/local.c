/* The local backend: commands run on the host in the workspace's mount, NOT isolated, with
 * the host's environment minus provider credentials; which searches the host PATH. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "cowbox/error.h"

static int local_create(struct cb_backend *b)
{
	(void)b;
	return 0;
}

static int local_exec(struct cb_backend *b, const struct cb_backend_cmd *cmd,
		      const struct cb_exec_callbacks *cb, struct cb_exec **out)
{
	struct cb_exec_spec spec = {0};
	char **env = NULL, *rel = NULL, *cwd = NULL;
	int rc;

	if (cmd->user)
		return cb_error_set(EINVAL, "user: the local backend runs commands as the daemon's "
					    "own user; use ns or docker");
	if ((rc = cb_backend_env(b, cmd->env, &env)) < 0)
		return rc;
	if ((rc = cb_backend_cwd(b, cmd->cwd, 0, &rel)) < 0)
		goto out;
	if (asprintf(&cwd, "%s/%s", b->root, rel) < 0) {
		cwd = NULL;
		rc = cb_error_set(ENOMEM, "local backend: out of memory");
		goto out;
	}
	spec.argv = cmd->argv;
	spec.shell = cmd->shell;
	spec.shell_program = cb_backend_shell_program(b);
	spec.keep = cb_backend_keep(b, cmd);
	spec.env = env;
	spec.cwd = cwd;
	spec.timeout = cb_backend_timeout(b, cmd);
	spec.output_limit = cmd->output_limit;
	spec.stdin_kind = cmd->stdin_kind;
	spec.stdin_data = cmd->stdin_data;
	spec.stdin_len = cmd->stdin_len;
	spec.stdin_fd = cmd->stdin_fd;
	spec.tty = cmd->tty;
	spec.tty_rows = cmd->tty_rows;
	spec.tty_cols = cmd->tty_cols;
	rc = cb_exec_start(&spec, cb, out);
out:
	free(rel);
	free(cwd);
	cb_exec_env_free(env);
	return rc;
}

static int local_which(struct cb_backend *b, const char *binary, char **path)
{
	const char *p = getenv("PATH");
	char *copy, *save = NULL;
	int rc = -ENOENT;

	(void)b;
	*path = NULL;
	if (strchr(binary, '/'))
		return cb_error_set(EINVAL, "which %s: give a program name, not a path", binary);
	copy = strdup(p && *p ? p : "/usr/local/bin:/usr/bin:/bin");
	if (!copy)
		return cb_error_set(ENOMEM, "which: out of memory");
	for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
		char *cand;

		if (asprintf(&cand, "%s/%s", *dir ? dir : ".", binary) < 0)
			break;
		if (access(cand, X_OK) == 0) {
			*path = cand;
			rc = 0;
			break;
		}
		free(cand);
	}
	free(copy);
	if (rc)
		cb_error_set(ENOENT, "which %s: not found on the host PATH", binary);
	return rc;
}

static int local_host_url(struct cb_backend *b, int port, char **url)
{
	(void)b;
	if (port < 1 || port > 65535)
		return cb_error_set(EINVAL, "host_url: port %d is not in 1-65535", port);
	if (asprintf(url, "http://127.0.0.1:%d", port) < 0) {
		*url = NULL;
		return cb_error_set(ENOMEM, "host_url: out of memory");
	}
	return 0;
}

static void local_close(struct cb_backend *b)
{
	(void)b;
}

static int local_destroy(struct cb_backend *b)
{
	(void)b;
	return 0;
}

/* It isolates nothing: refuse what it could not enforce rather than pretend, and say that
 * its network is the host's. */
static int local_validate(struct cb_backend_options *o, json_t *j)
{
	if (o->cpus > 0 || (o->memory_mb && o->memory_mb != CB_BACKEND_NO_LIMIT) ||
	    (o->pids && o->pids != CB_BACKEND_NO_LIMIT) || o->image)
		return cb_error_set(EINVAL, "the local backend cannot enforce cpus, memory_mb, "
					    "pids or image; use ns or docker");
	if (json_object_get(j, "network") && o->net != CB_BACKEND_NET_HOST)
		return cb_error_set(EINVAL, "the local backend runs on the host's network "
					    "(network host) and cannot keep a command from going "
					    "around a proxy; network none, all, public or allow "
					    "needs ns or docker");
	o->net = CB_BACKEND_NET_HOST;
	if (o->n_volumes)
		return cb_error_set(EINVAL, "backend option volumes: the local backend runs on the "
					    "host, which has no sandbox to bind them into");
	if (o->user)
		return cb_error_set(EINVAL, "backend option user: the local backend runs commands "
					    "as the daemon's own user; use ns or docker");
	if (o->privileged)
		return cb_error_set(EINVAL, "backend option privileged: only the ns backend has a "
					    "user namespace to leave out");
	return 0;
}

/* Before network host existed it saved its network as "all": such a file loads as host,
 * while a request for local with "all" is refused. */
static void local_upgrade(json_t *j)
{
	json_t *net = json_object_get(j, "network");

	if (json_is_string(net) && !strcmp(json_string_value(net), "all"))
		json_object_set_new(j, "network", json_string("host"));
}

static const char *local_workdir(const char *mountpoint)
{
	return mountpoint; /* the host's own path: no sandbox shows it elsewhere */
}

static int local_join(struct cb_backend *b, int netns_fd)
{
	(void)b;
	(void)netns_fd; /* the host's network, always */
	return 0;
}

const struct cb_backend_ops cb_backend_local = {
    .name = "local",
    .validate = local_validate,
    .upgrade = local_upgrade,
    .host_env = cb_exec_env_host_stripped,
    .workdir = local_workdir,
    .join = local_join,
    .create = local_create,
    .exec = local_exec,
    .wait = cb_backend_wait_plain,
    .kill = cb_backend_kill_plain,
    .which = local_which,
    .host_url = local_host_url,
    .close = local_close,
    .destroy = local_destroy,
};
