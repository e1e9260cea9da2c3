/* The table of backends and what every one shares around it: opening a workspace's backend,
 * creating it once (or joining its daemon's from the CLI), hooks and leftovers. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/image.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"

extern const struct cb_backend_ops cb_backend_ns, cb_backend_local, cb_backend_docker,
    cb_backend_vm;

static const struct cb_backend_ops *const backend_tables[] = {
    &cb_backend_ns,
    &cb_backend_local,
    &cb_backend_docker,
    &cb_backend_vm,
};

#define N_BACKENDS (sizeof backend_tables / sizeof *backend_tables)

const struct cb_backend_ops *cb_backend_find(const char *kind)
{
	if (!kind)
		return backend_tables[0];
	for (size_t i = 0; i < N_BACKENDS; i++)
		if (!strcmp(backend_tables[i]->name, kind))
			return backend_tables[i];
	return NULL;
}

static char kinds[256];

static void list_kinds(void)
{
	size_t n = 0;

	for (size_t i = 0; i < N_BACKENDS && n < sizeof kinds; i++)
		n += (size_t)snprintf(kinds + n, sizeof kinds - n, "%s%s",
				      !i		    ? ""
				      : i + 1 == N_BACKENDS ? " or "
							    : ", ",
				      backend_tables[i]->name);
}

const char *cb_backend_kinds(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, list_kinds);
	return kinds;
}

int cb_backend_workdir(const char *kind, const char *mountpoint, const char *working_dir,
		       char **out)
{
	const struct cb_backend_ops *ops = cb_backend_find(kind);
	int wd = working_dir && *working_dir;

	*out = NULL;
	if (!ops)
		return cb_error_set(EINVAL, "unknown backend '%s' (%s)", kind, cb_backend_kinds());
	if (asprintf(out, "%s%s%s", ops->workdir(mountpoint), wd ? "/" : "",
		     wd ? working_dir : "") < 0) {
		*out = NULL;
		return cb_error_set(ENOMEM, "out of memory");
	}
	return 0;
}

int cb_backend_open(const char *ref, const char *dir, const char *root, const char *hostname,
		    struct cb_backend **out)
{
	struct cb_backend *b = calloc(1, sizeof(*b));
	int rc;

	*out = NULL;
	if (!b)
		return cb_error_set(ENOMEM, "backend: out of memory");
	pthread_mutex_init(&b->lock, NULL);
	b->netns_fd = -1;
	if ((rc = cb_backend_options_load(dir, &b->opt)) < 0)
		goto out;
	if ((rc = cb_exec_keep_new(&b->keep)) < 0)
		goto out;
	b->ops = cb_backend_find(b->opt.kind);
	b->ref = strdup(ref);
	b->dir = strdup(dir);
	b->root = strdup(root);
	b->hostname = strdup(hostname ? hostname : ref);
	if (!b->ref || !b->dir || !b->root || !b->hostname) {
		rc = cb_error_set(ENOMEM, "backend: out of memory");
		goto out;
	}
	*out = b;
	b = NULL;
out:
	cb_backend_free(b);
	return rc;
}

void cb_backend_free(struct cb_backend *b)
{
	if (!b)
		return;
	/* Kept background jobs first: they may use the namespace, the mount, the forwarders. */
	cb_exec_keep_free(b->keep);
	/* Forwarders and the proxy next: they listen in the namespace that close lets go of. */
	cb_forwarder_stop_all(b);
	cb_publish_stop_all(b);
	cb_backend_proxy_stop(b);
	if (b->created && b->ops)
		b->ops->close(b);
	cb_backend_options_free(&b->opt);
	free(b->ref);
	free(b->dir);
	free(b->root);
	free(b->hostname);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

/* The hooks run once per workspace: a marker in its directory says they did. */
static int backend_first_create(struct cb_backend *b)
{
	struct cb_backend_limits lim;
	char marker[4096];
	int rc = 0, fd;

	snprintf(marker, sizeof(marker), "%s/backend.created", b->dir);
	if (access(marker, F_OK) == 0)
		return 0;
	cb_backend_limits_of(&b->opt, &lim);
	if (b->opt.on_create[0] || b->opt.setup_script)
		cb_backend_phase(b, "running the on-create hooks and setup script");
	for (int i = 0; !rc && i < CB_BACKEND_MAX_HOOKS && b->opt.on_create[i]; i++)
		rc = cb_backend_hook(b, "on_create hook", b->opt.on_create[i], lim.timeout);
	if (!rc && b->opt.setup_script)
		rc = cb_backend_hook(b, "setup script", b->opt.setup_script,
				     b->opt.setup_timeout > 0 ? b->opt.setup_timeout : 600);
	if (rc)
		return rc;
	fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return cb_error_set(errno, "create %s: %s", marker, strerror(errno));
	close(fd);
	return 0;
}

/* The persistent home: <workspace dir>/home, outside the upper layer (snapshots cover the
 * project only), removed with the workspace; under the disk quota its own capped filesystem
 * (backends/home.c). */
static int backend_home(struct cb_backend *b)
{
	return cb_backend_home_ready(b);
}

/* What a command needs on disk before any runs: its working_dir and (confined) its home. */
static int backend_dirs(struct cb_backend *b)
{
	int rc = b->opt.working_dir ? cb_backend_mkdirs(b, b->opt.working_dir) : 0;

	if (!rc && b->ops->confined)
		rc = backend_home(b);
	return rc;
}

int cb_backend_join(struct cb_backend *b, int netns_fd)
{
	int rc;

	if (!b->ops->join)
		return cb_error_set(EOPNOTSUPP,
				    "the %s backend's commands run through the workspace's daemon",
				    b->ops->name);
	pthread_mutex_lock(&b->lock);
	rc = b->created ? 0 : backend_dirs(b);
	if (!rc && !b->created && !(rc = b->ops->join(b, netns_fd)))
		b->created = 1;
	pthread_mutex_unlock(&b->lock);
	return rc;
}

void cb_backend_phase(struct cb_backend *b, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	if (!b->phase)
		return;
	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
	}
	b->phase(b->phase_arg, fmt ? what : NULL);
}

int cb_backend_ensure(struct cb_backend *b)
{
	int rc = 0;

	pthread_mutex_lock(&b->lock);
	if (!b->created) {
		rc = backend_dirs(b);
		if (!rc)
			rc = b->ops->create(b);
		if (!rc) {
			b->created = 1;
			rc = backend_first_create(b);
		}
		/* A failed hook leaves nothing half-made: the next op tries it all again. */
		if (rc && b->created) {
			b->ops->close(b);
			b->created = 0;
		}
		cb_backend_phase(b, NULL);
	}
	pthread_mutex_unlock(&b->lock);
	return rc;
}
int cb_backend_hook(struct cb_backend *b, const char *what, const char *shell, double timeout)
{
	struct cb_backend_cmd cmd = {.shell = shell, .timeout = timeout > 0 ? timeout : -1};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;
	int rc = b->ops->exec(b, &cmd, NULL, &h);

	if (rc)
		return cb_error_wrap(rc, "%s '%s'", what, shell);
	rc = b->ops->wait(b, h, &res);
	cb_exec_free(h);
	if (rc)
		cb_error_wrap(rc, "%s '%s'", what, shell);
	else if (res.timed_out)
		rc = cb_error_set(ETIMEDOUT, "%s '%s' timed out after %g s", what, shell, timeout);
	else if (res.exit_code)
		rc = cb_error_set(EIO, "%s '%s' exited with %d: %.300s", what, shell, res.exit_code,
				  res.err_len ? res.err : res.out);
	cb_exec_result_free(&res);
	return rc;
}

int cb_backend_remove_leftovers(const char *ref_or_name)
{
	struct cb_backend_options opt;
	char ref[CB_WS_REF_LEN + 1], *dir = NULL;
	int rc;

	if (cb_ws_resolve(ref_or_name, ref) < 0 || cb_ws_path(ref, NULL, &dir) < 0) {
		cb_error_clear();
		free(dir);
		return 0; /* nothing cowbox knows: whoever removes it says so */
	}
	/* a crashed daemon's home filesystem: unmounted before its directory goes */
	cb_backend_home_release(dir);
	rc = cb_backend_options_load(dir, &opt);
	free(dir);
	if (rc < 0)
		return rc;
	if (cb_backend_find(opt.kind)->remove_leftovers)
		rc = cb_backend_find(opt.kind)->remove_leftovers(ref);
	cb_backend_options_free(&opt);
	return rc;
}
