/* `cowbox exec --dir DIR`: a plain directory, no workspace and no options: the sandbox
 * built here from the flags alone, or the host (--backend local). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/image.h"
#include "cowbox/sandbox.h"
#include "exec.h"
#include "util/beneath.h"

/* entry ("KEY=VALUE") in env, replacing KEY's earlier one; a failed strdup leaves a NULL
 * that dir_env finds. */
static void env_set(char **env, size_t *n, const char *entry)
{
	size_t klen = strcspn(entry, "=") + 1, j;

	for (j = 0; j < *n; j++)
		if (env[j] && !strncmp(env[j], entry, klen))
			break;
	if (j < *n)
		free(env[j]);
	else
		j = (*n)++;
	env[j] = strdup(entry);
}

/* Built from scratch in the sandbox (TERM from here, HOME a private /tmp), the host's minus
 * credentials with --backend local; the image's, then --env, over it. */
static char **dir_env(const struct cli_exec_opts *o, int local,
		      const struct cb_backend_image_config *cfg)
{
	char **host = NULL;
	size_t n = 0, cap = (size_t)o->n_env + 8;
	for (size_t i = 0; cfg->env && cfg->env[i]; i++)
		cap++;
	if (local) {
		if (cb_exec_env_host_stripped(&host) < 0)
			return NULL;
		while (host[n])
			n++;
		cap += n;
	}
	char **env = calloc(cap + 1, sizeof *env);
	if (!env) {
		cb_exec_env_free(host);
		return NULL;
	}
	if (local) {
		memcpy(env, host, n * sizeof *env);
		free(host);
	} else {
		const char *term = getenv("TERM");
		char buf[256];
		snprintf(buf, sizeof buf, "TERM=%s", term && *term ? term : "dumb");
		env[n++] =
		    strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
		env[n++] = strdup("HOME=/tmp");
		env[n++] = strdup(buf);
		env[n++] = strdup("LANG=C.UTF-8");
	}
	/* the image's (its PATH, say) over the base but under --env; HOME stays the sandbox's */
	for (size_t i = 0; cfg->env && cfg->env[i]; i++)
		if (strncmp(cfg->env[i], "HOME=", 5))
			env_set(env, &n, cfg->env[i]);
	for (int i = 0; i < o->n_env; i++)
		env_set(env, &n, o->env[i]);
	for (size_t j = 0; j < n; j++)
		if (!env[j]) {
			cb_exec_env_free(env);
			return NULL;
		}
	return env;
}

/* --backend local: the host, where a confined backend would build a sandbox. */
static int dir_on_host(const struct cli_exec_opts *o)
{
	return o->backend && !cb_backend_find(o->backend)->confined;
}

/* --dir's usage errors (exit 2), said on stderr. */
int cli_exec_dir_usage(const struct cli_exec_opts *o, const char *cmd)
{
	int local = dir_on_host(o);

	if (local && o->user) {
		fprintf(stderr, "cowbox %s: --user needs the ns backend\n", cmd);
		return 2;
	}
	if (local && (o->image || o->cpus > 0 || o->memory || o->pids || o->privileged ||
		      (o->net && strcmp(o->net, "host")))) {
		fprintf(stderr,
			"cowbox %s: --image, --network, --cpus, --memory, --pids and "
			"--privileged need the ns backend\n",
			cmd);
		return 2;
	}
	/* On the host nothing else keeps --cwd inside the directory: the workspace path rule. */
	if (local && o->cwd && cb_beneath_check(o->cwd) < 0) {
		fprintf(stderr, "cowbox %s: --cwd %s: must be a path inside the workspace (%s)\n",
			cmd, o->cwd, cb_error_message());
		return 2;
	}
	return 0;
}

int cli_exec_dir(const struct cli_exec_opts *o, struct cli_run *r)
{
	struct cb_sandbox sb = {0};
	struct cb_exec_spec spec = {0};
	struct cb_backend_limits lim = {0};
	struct cb_backend_options defaults = {0};
	struct cb_backend_image_config cfg = {0};
	struct cli_user_net net = {.netns_fd = -1};
	static char *shell_argv[] = {"/bin/sh", "-i", NULL},
		    *bash_argv[] = {"/bin/bash", "-i", NULL};
	char *dir = NULL, *image_root = NULL, **env = NULL, *cwd = NULL, probe[4096];
	int local = dir_on_host(o), image_hold = -1, rc;
	struct cb_backend_image_cap cap;
	sigset_t set;

	if (!(dir = realpath(o->dir, NULL)))
		return cb_error_set(errno, "--dir %s: %s", o->dir, strerror(errno));
	cb_backend_limits_of(&defaults, &lim);
	if (local)
		lim.pids = lim.memory_mb = 0, lim.oom_score_adj = 0;
	if (o->set & CLI_SET_TIMEOUT)
		lim.timeout = o->timeout;
	else if (o->shell_mode)
		lim.timeout = 0;
	if (o->set & CLI_SET_MEMORY)
		lim.memory_mb = o->memory;
	if (o->set & CLI_SET_PIDS)
		lim.pids = o->pids;
	r->timeout = lim.timeout;
	r->memory_mb = lim.memory_mb;
	/* an OCI image: unpacked once into the cache */
	/* held until the command ends: cowbox image prune leaves it alone meanwhile */
	cb_backend_image_cap_of(NULL, &cap);
	if (!local && o->image &&
	    (rc = cb_backend_image_root_capped(o->image, &cap, &image_root, &cfg, &image_hold)) < 0)
		goto out;
	rc = -ENOMEM;
	if (!(env = dir_env(o, local, &cfg)))
		goto out;
	spec.env = env;
	spec.timeout = lim.timeout;
	if (local) {
		fprintf(stderr,
			"cowbox: warning: the local backend runs on the host in %s, NOT "
			"isolated\n",
			dir);
		if (asprintf(&cwd, "%s/%s", dir, o->cwd ? o->cwd : "") < 0) {
			cwd = NULL;
			goto out;
		}
		spec.cwd = cwd;
	} else {
		const char *base = strrchr(dir, '/');

		sb.workspace = dir;
		sb.image = image_root;
		sb.hostname = base && base[1] ? base + 1 : "cowbox";
		sb.privileged = o->privileged;
		if (o->net && !strcmp(o->net, "host")) {
			fprintf(stderr, "cowbox: warning: --network host: the command shares the "
					"host's network namespace (its loopback services, its "
					"abstract unix sockets)\n");
			sb.net = CB_NET_ALL;
		} else if (o->net && !strcmp(o->net, "all")) {
			if ((rc = cli_user_net_start(&net)) < 0)
				goto out;
			sb.net = CB_NET_JOIN;
			sb.netns_fd = net.netns_fd;
		} else {
			sb.net = CB_NET_NONE;
		}
		sb.cpus = o->cpus;
		sb.memory_mb = lim.memory_mb;
		sb.pids = lim.pids;
		sb.oom_score_adj = lim.oom_score_adj;
		sb.limits_optional = !(o->set & (CLI_SET_MEMORY | CLI_SET_PIDS));
		sb.user = o->user;
		if (!sb.user && !sb.privileged)
			sb.user = cfg.user; /* the image's User */
		if (sb.privileged && geteuid() == 0)
			fprintf(stderr, "cowbox: warning: privileged: the command runs as host "
					"uid 0 (no capabilities), not in a user namespace\n");
		spec.sandbox = &sb;
		spec.cwd = o->cwd;
	}
	if (o->shell_mode || o->tty) { /* a shell, or exec -t */
		spec.tty = 1;
		cli_tty_size(&spec.tty_rows, &spec.tty_cols);
	}
	if (o->shell_mode) {
		snprintf(probe, sizeof probe, "%s/usr/bin/bash", image_root ? image_root : "");
		spec.argv = access(probe, X_OK) == 0 ? bash_argv : shell_argv;
	} else if (o->shell) {
		spec.shell = o->shell;
	} else if (o->n_cmd == 1 && strchr(o->cmd[0], ' ')) {
		spec.shell = o->cmd[0];
	} else {
		spec.argv = o->cmd;
	}
	spec.stdin_kind = CB_EXEC_STDIN_FD;
	spec.stdin_fd = 0;
	cli_exec_signals(&set);
	if ((rc = cb_exec_start(
		 &spec, o->json ? NULL : &(struct cb_exec_callbacks){cli_exec_forward, NULL},
		 &r->h)) < 0)
		goto out;
	rc = cli_exec_wait(r, spec.tty);
out:
	cli_user_net_stop(&net);
	cb_exec_env_free(env);
	cb_backend_image_config_free(&cfg);
	if (image_hold >= 0)
		close(image_hold);
	free(image_root);
	free(cwd);
	free(dir);
	return rc;
}
