/* The ns backend (the default): each command in the namespace sandbox with the workspace at
 * /workspace; all commands share one network namespace per workspace (loopback only under
 * network none, served by pasta under all), so that host_url's forwarder listens where they
 * connect and pasta starts once per workspace. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "cowbox/error.h"
#include "cowbox/image.h"
#include "cowbox/sandbox.h"
#include "cowbox/workspace.h"

struct ns_state {
	int netns_fd; /* the workspace's network namespace; -1: the host's or a fresh one each */
	struct cb_pasta *pasta; /* network all: the user-mode networking of netns_fd */
	char *image_root;	/* the image option's root directory (NULL: the host's) */
	int image_hold;		/* keeps image_root from cowbox image prune (-1: none) */
	struct cb_backend_image_config image; /* an OCI image's Env and User */
};

static void ns_state_free(struct ns_state *s)
{
	if (!s)
		return;
	cb_pasta_stop(s->pasta);
	if (s->image_hold >= 0)
		close(s->image_hold);
	free(s->image_root);
	cb_backend_image_config_free(&s->image);
	if (s->netns_fd >= 0)
		close(s->netns_fd);
	free(s);
}

/* The state both create and join start from: the image's root and config, no namespace. */
static int ns_state_new(struct cb_backend *b, struct ns_state **out)
{
	struct ns_state *s = calloc(1, sizeof(*s));
	struct cb_backend_image_cap cap;
	int rc = 0;

	*out = NULL;
	if (!s)
		return cb_error_set(ENOMEM, "ns backend: out of memory");
	s->netns_fd = -1;
	s->image_hold = -1;
	/* an OCI image is unpacked on the first workspace's boot, then reused from the cache */
	cb_backend_image_cap_of(&b->opt, &cap);
	if (b->opt.image && (rc = cb_backend_image_root_capped(b->opt.image, &cap, &s->image_root,
							       &s->image, &s->image_hold)) < 0)
		goto out;
	if (s->image.user && (rc = cb_backend_user_check("its User", s->image.user)) < 0) {
		cb_error_wrap(rc, "image %s: ", b->opt.image);
		goto out;
	}
	*out = s;
	s = NULL;
out:
	ns_state_free(s);
	return rc;
}

static void ns_state_set(struct cb_backend *b, struct ns_state *s)
{
	b->priv = s;
	b->image_env = s->image.env;
	b->netns_fd = s->netns_fd;
}

static int ns_create(struct cb_backend *b)
{
	struct ns_state *s = NULL;
	char log[4200], pid[4200];
	int rc;

	if ((rc = ns_state_new(b, &s)) < 0)
		goto out;
	if (b->opt.net == CB_BACKEND_NET_HOST) {
		fprintf(stderr,
			"cowbox: warning: workspace %s: network host: its commands share the "
			"host's network namespace (its loopback services, its abstract unix "
			"sockets)\n",
			b->ref);
	} else if (geteuid() == 0) {
		if ((rc = cb_netns_new(&s->netns_fd)) < 0)
			goto out;
		snprintf(log, sizeof(log), "%s/pasta.log", b->dir);
		snprintf(pid, sizeof(pid), "%s/pasta.pid", b->dir);
		if (b->opt.net == CB_BACKEND_NET_ALL &&
		    (rc = cb_pasta_start(s->netns_fd, log, pid, &s->pasta)) < 0)
			goto out;
		/* public, allow: no route but the proxy's listener on the namespace's loopback */
		if ((rc = cb_backend_proxy_start(b, s->netns_fd)) < 0)
			goto out;
	} else if (cb_backend_net_proxied(&b->opt)) {
		rc = cb_error_set(EOPNOTSUPP,
				  "network %s: needs the daemon to run as root (its proxy listens "
				  "in the workspace's network namespace)",
				  cb_backend_net_name(b->opt.net));
		goto out;
	} else if (b->opt.net == CB_BACKEND_NET_ALL) {
		/* Without root each command gets a fresh namespace from the sandbox itself, and
		 * host_url says it is unavailable. */
		rc = cb_error_set(EOPNOTSUPP, "network all: needs the daemon to run as root");
		goto out;
	}
	ns_state_set(b, s);
	s = NULL;
out:
	ns_state_free(s);
	return rc;
}

/* The daemon's namespace (its forwarders, pasta or proxy) is joined as it is; -1: each
 * command gets a fresh loopback-only one, as the daemon's would without root. */
static int ns_join(struct cb_backend *b, int netns_fd)
{
	struct ns_state *s = NULL;
	int rc;

	if ((rc = ns_state_new(b, &s)) < 0)
		return rc;
	if (netns_fd >= 0 && (s->netns_fd = fcntl(netns_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		rc = cb_error_set(errno, "ns backend: the network namespace: %s", strerror(errno));
		ns_state_free(s);
		return rc;
	}
	ns_state_set(b, s);
	return 0;
}

/* ns: a directory or an OCI image (cowbox/image.h), checked now so that configure refuses
 * a bad one. */
static int ns_validate(struct cb_backend_options *o, json_t *j)
{
	(void)j;
	return o->image ? cb_backend_image_check(o->image) : 0;
}

static const char *ns_workdir(const char *mountpoint)
{
	(void)mountpoint;
	return "/workspace";
}

static int ns_exec(struct cb_backend *b, const struct cb_backend_cmd *cmd,
		   const struct cb_exec_callbacks *cb, struct cb_exec **out)
{
	struct ns_state *s = b->priv;
	struct cb_sandbox sb = {0};
	struct cb_exec_spec spec = {0};
	struct cb_backend_limits lim;
	struct cb_sandbox_bind binds[1 + CB_BACKEND_MAX_VOLUMES];
	char **env = NULL, *cwd = NULL, home[4200], bundle[4200];
	char vol_paths[CB_BACKEND_MAX_VOLUMES][32];
	int vol_fds[CB_BACKEND_MAX_VOLUMES], home_fd = -1, rc;

	for (size_t i = 0; i < CB_BACKEND_MAX_VOLUMES; i++)
		vol_fds[i] = -1;

	if ((rc = cb_backend_env(b, cmd->env, &env)) < 0)
		return rc;
	if ((rc = cb_backend_cwd(b, cmd->cwd, 1, &cwd)) < 0)
		goto out;
	sb.workspace = b->root;
	sb.image = s->image_root;
	sb.hostname = b->hostname;
	/* Every command joins the workspace's namespace, where host_url's listeners are. */
	sb.net = b->opt.net == CB_BACKEND_NET_HOST ? CB_NET_ALL
		 : s->netns_fd >= 0		   ? CB_NET_JOIN
						   : CB_NET_NONE;
	sb.netns_fd = s->netns_fd;
	sb.cpus = b->opt.cpus;
	cb_backend_limits_of(&b->opt, &lim);
	sb.memory_mb = lim.memory_mb;
	sb.pids = lim.pids;
	sb.oom_score_adj = lim.oom_score_adj;
	sb.limits_optional = !b->opt.memory_mb && !b->opt.pids;
	sb.privileged = b->opt.privileged;
	sb.user = cb_backend_user(b, cmd);
	/* the image's User, as docker runs its commands (a privileged sandbox switches none) */
	if (!sb.user && !sb.privileged)
		sb.user = s->image.user;
	/* mounted again if its filesystem went (a daemon stop released it meanwhile), and
	 * bound from a handle on it */
	if ((home_fd = cb_backend_home_open(b)) < 0) {
		rc = home_fd;
		goto out;
	}
	snprintf(home, sizeof(home), "/proc/self/fd/%d", home_fd);
	binds[0] = (struct cb_sandbox_bind){.src = home, .dst = CB_BACKEND_HOME, .writable = 1};
	/* Each volume is bound from a handle on the very directory it named when given,
	 * reached through no symlink now: a sandbox that can write a parent of its host path
	 * cannot point it elsewhere (the bind clones what the handle holds, not a path). */
	for (size_t i = 0; i < b->opt.n_volumes; i++) {
		if ((vol_fds[i] = cb_backend_volume_open(&b->opt.volumes[i])) < 0) {
			rc = vol_fds[i];
			goto out;
		}
		snprintf(vol_paths[i], sizeof(vol_paths[i]), "/proc/self/fd/%d", vol_fds[i]);
		binds[1 + i] = (struct cb_sandbox_bind){.src = vol_paths[i],
							.dst = b->opt.volumes[i].dst,
							.writable = b->opt.volumes[i].writable};
	}
	sb.binds = binds;
	sb.n_binds = 1 + b->opt.n_volumes;
	/* header secrets: the sandbox's TLS clients trust the workspace's CA */
	snprintf(bundle, sizeof(bundle), "%s/" CB_NET_CA_BUNDLE, b->dir);
	sb.ca_bundle = b->opt.n_secrets ? bundle : NULL;
	/* the range the daemon's mount shows the workspace's files in (none: not root, or a
	 * plain directory, which the sandbox binds through an idmapped mount) */
	if (!sb.privileged && geteuid() == 0 && (rc = cb_ws_ids_get(b->dir, &sb.id_base)) < 0 &&
	    rc != -ENOENT)
		goto out;
	cb_error_clear();
	spec.argv = cmd->argv;
	spec.shell = cmd->shell;
	spec.shell_program = cb_backend_shell_program(b);
	spec.keep = cb_backend_keep(b, cmd);
	spec.env = env;
	spec.cwd = *cwd ? cwd : NULL;
	spec.timeout = cb_backend_timeout(b, cmd);
	spec.output_limit = cmd->output_limit;
	spec.stdin_kind = cmd->stdin_kind;
	spec.stdin_data = cmd->stdin_data;
	spec.stdin_len = cmd->stdin_len;
	spec.stdin_fd = cmd->stdin_fd;
	spec.tty = cmd->tty;
	spec.tty_rows = cmd->tty_rows;
	spec.tty_cols = cmd->tty_cols;
	spec.sandbox = &sb;
	rc = cb_exec_start(&spec, cb, out);
out:
	if (home_fd >= 0)
		close(home_fd);
	for (size_t i = 0; i < CB_BACKEND_MAX_VOLUMES; i++)
		if (vol_fds[i] >= 0)
			close(vol_fds[i]);
	free(cwd);
	cb_exec_env_free(env);
	return rc;
}

/* Looked up inside the sandbox, whose image may differ from the host. */
static int ns_which(struct cb_backend *b, const char *binary, char **path)
{
	char *argv[] = {"/bin/sh", "-c", CB_BACKEND_WHICH_SCRIPT, "sh", (char *)binary, NULL};
	struct cb_backend_cmd cmd = {.argv = argv, .timeout = 30};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;
	int rc;

	*path = NULL;
	if ((rc = b->ops->exec(b, &cmd, NULL, &h)) < 0)
		return rc;
	rc = b->ops->wait(b, h, &res);
	cb_exec_free(h);
	if (rc < 0) {
		cb_exec_result_free(&res);
		return rc;
	}
	return cb_backend_which_result(&res, binary, "sandbox", path);
}

static int ns_host_url(struct cb_backend *b, int port, char **url)
{
	struct ns_state *s = b->priv;
	int rc;

	if (b->opt.net != CB_BACKEND_NET_HOST) {
		if (s->netns_fd < 0)
			return cb_error_set(EOPNOTSUPP,
					    "host_url: needs the daemon to run as root under "
					    "network none");
		if ((rc = cb_forwarder_add(b, s->netns_fd, port)) < 0)
			return rc;
	} else if (port < 1 || port > 65535) {
		return cb_error_set(EINVAL, "host_url: port %d is not in 1-65535", port);
	}
	if (asprintf(url, "http://127.0.0.1:%d", port) < 0) {
		*url = NULL;
		return cb_error_set(ENOMEM, "host_url: out of memory");
	}
	return 0;
}

static void ns_close(struct cb_backend *b)
{
	b->image_env = NULL;
	b->netns_fd = -1;
	ns_state_free(b->priv);
	b->priv = NULL;
}

static int ns_destroy(struct cb_backend *b)
{
	(void)b;
	return 0; /* nothing outlives the daemon but the workspace itself */
}

const struct cb_backend_ops cb_backend_ns = {
    .name = "ns",
    .confined = 1,
    .image_root = 1,
    .validate = ns_validate,
    .workdir = ns_workdir,
    .join = ns_join,
    .create = ns_create,
    .exec = ns_exec,
    .wait = cb_backend_wait_plain,
    .kill = cb_backend_kill_plain,
    .which = ns_which,
    .host_url = ns_host_url,
    .close = ns_close,
    .destroy = ns_destroy,
};
