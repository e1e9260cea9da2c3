/* What a command gets from its workspace's options: its limits (defaults filled in) and its
 * environment (the backend's base, the image's, the proxy's, the options', the command's). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"

static unsigned long limit_or(unsigned long v, unsigned long def)
{
	return v == CB_BACKEND_NO_LIMIT ? 0 : v ? v : def;
}

void cb_backend_limits_of(const struct cb_backend_options *o, struct cb_backend_limits *out)
{
	const struct cb_backend_ops *ops = cb_backend_find(o->kind);

	memset(out, 0, sizeof(*out));
	out->timeout = o->timeout < 0	? 0
		       : o->timeout > 0 ? o->timeout
					: CB_BACKEND_DEFAULT_TIMEOUT;
	out->disk_bytes = (unsigned long long)limit_or(o->disk_mb, CB_BACKEND_DEFAULT_DISK_MB)
			  << 20;
	out->disk_inodes = limit_or(o->disk_inodes, CB_BACKEND_DEFAULT_DISK_INODES);
	if (ops && !ops->confined)
		return; /* it isolates nothing, so it caps nothing either */
	out->pids = limit_or(o->pids, CB_BACKEND_DEFAULT_PIDS);
	out->memory_mb = limit_or(o->memory_mb, CB_BACKEND_DEFAULT_MEMORY_MB);
	out->oom_score_adj = CB_BACKEND_OOM_SCORE_ADJ;
	out->home_bytes = out->disk_bytes;
}

json_t *cb_backend_limits_json(const struct cb_backend_limits *l)
{
	return json_pack("{s:f, s:I, s:I, s:i, s:I, s:I, s:I}", "timeout", l->timeout, "memory_mb",
			 (json_int_t)l->memory_mb, "pids", (json_int_t)l->pids, "oom_score_adj",
			 l->oom_score_adj, "disk_bytes", (json_int_t)l->disk_bytes, "disk_inodes",
			 (json_int_t)l->disk_inodes, "home_bytes", (json_int_t)l->home_bytes);
}

static int env_put(char **env, size_t *n, const char *entry)
{
	size_t klen = strcspn(entry, "=") + 1, j;

	for (j = 0; j < *n; j++)
		if (!strncmp(env[j], entry, klen))
			break;
	if (j == *n)
		(*n)++;
	else
		free(env[j]);
	env[j] = strdup(entry);
	return env[j] ? 0 : -ENOMEM;
}

int cb_backend_env(const struct cb_backend *b, char *const *extra, char ***out)
{
	static const char *const base[] = {
	    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	    "HOME=" CB_BACKEND_HOME, /* the workspace's own, kept between commands */
	    "LANG=C.UTF-8",
	    NULL,
	};
	char **host = NULL, **env;
	size_t n = 0, cap = 8;
	int rc = 0;

	if (b->ops->host_env && (rc = b->ops->host_env(&host)) < 0)
		return rc;
	for (size_t i = 0; host && host[i]; i++)
		cap++;
	for (size_t i = 0; b->opt.env && b->opt.env[i]; i++)
		cap++;
	for (size_t i = 0; b->image_env && b->image_env[i]; i++)
		cap++;
	for (size_t i = 0; extra && extra[i]; i++)
		cap++;
	for (size_t i = 0; cb_backend_proxy_env[i]; i++)
		cap++;
	for (size_t i = 0; cb_backend_trust_env[i]; i++)
		cap++;
	env = calloc(cap + 1, sizeof(*env));
	rc = env ? 0 : -ENOMEM;
	for (size_t i = 0; !rc && host && host[i]; i++)
		rc = env_put(env, &n, host[i]);
	for (size_t i = 0; !rc && !host && base[i]; i++)
		rc = env_put(env, &n, base[i]);
	/* the image's (its PATH, say) over the base, but HOME stays the workspace's own */
	for (size_t i = 0; !rc && b->image_env && b->image_env[i]; i++)
		if (strncmp(b->image_env[i], "HOME=", 5))
			rc = env_put(env, &n, b->image_env[i]);
	for (size_t i = 0; !rc && cb_backend_net_proxied(&b->opt) && cb_backend_proxy_env[i]; i++)
		rc = env_put(env, &n, cb_backend_proxy_env[i]);
	/* header secrets: TLS clients trust the workspace's CA */
	for (size_t i = 0; !rc && b->opt.n_secrets && cb_backend_trust_env[i]; i++)
		rc = env_put(env, &n, cb_backend_trust_env[i]);
	for (size_t i = 0; !rc && b->opt.env && b->opt.env[i]; i++)
		rc = env_put(env, &n, b->opt.env[i]);
	for (size_t i = 0; !rc && extra && extra[i]; i++)
		rc = env_put(env, &n, extra[i]);
	cb_exec_env_free(host);
	if (rc) {
		cb_exec_env_free(env);
		return cb_error_set(ENOMEM, "environment: out of memory");
	}
	*out = env;
	return 0;
}
