/* What every backend shares: its options (JSON, backend.json), the table lookup, opening a
 * workspace's backend, creating it once, command environments and hooks. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
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

extern const struct cb_backend_ops cb_backend_ns, cb_backend_local, cb_backend_docker;

static const struct cb_backend_ops *const backend_tables[] = {
    &cb_backend_ns,
    &cb_backend_local,
    &cb_backend_docker,
};

const struct cb_backend_ops *cb_backend_find(const char *kind)
{
	for (size_t i = 0; i < sizeof backend_tables / sizeof *backend_tables; i++)
		if (!strcmp(backend_tables[i]->name, kind))
			return backend_tables[i];
	return NULL;
}

void cb_backend_options_free(struct cb_backend_options *o)
{
	free(o->kind);
	cb_exec_env_free(o->env);
	free(o->working_dir);
	free(o->image);
	for (int i = 0; i < CB_BACKEND_MAX_HOOKS; i++) {
		free(o->on_create[i]);
		free(o->on_destroy[i]);
	}
	free(o->setup_script);
	free(o->shell);
	free(o->user);
	for (size_t i = 0; i < o->n_volumes; i++) {
		free(o->volumes[i].src);
		free(o->volumes[i].dst);
	}
	cb_exec_env_free(o->allow);
	cb_backend_secrets_free(o);
	memset(o, 0, sizeof(*o));
}

static const char *const net_names[] = {"none", "all", "host", "public", "allow"};

const char *cb_backend_net_name(enum cb_backend_net net)
{
	return net_names[net];
}

int cb_backend_net_parse(const char *s, enum cb_backend_net *out)
{
	for (size_t i = 0; s && i < sizeof net_names / sizeof *net_names; i++)
		if (!strcmp(s, net_names[i])) {
			*out = (enum cb_backend_net)i;
			return 0;
		}
	return cb_error_set(EINVAL,
			    "backend option network: none, all, host, public or allow, not '%s'",
			    s ? s : "(not a string)");
}

static int opt_string(json_t *v, const char *key, char **out)
{
	if (!json_is_string(v))
		return cb_error_set(EINVAL, "backend option %s: needs a string", key);
	*out = strdup(json_string_value(v));
	return *out ? 0 : cb_error_set(ENOMEM, "backend option %s: out of memory", key);
}

/* Is path (resolved) under dir (resolved), or dir itself? */
static int path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		n--;
	return !strncmp(path, dir, n) && (path[n] == '/' || !path[n] || n == 1);
}

/* One volume: [HOST_DIR, PATH] or [HOST_DIR, PATH, "ro"|"rw"] (read-only unless asked).
 * The host directory must exist and lie outside $COWBOX_HOME (the workspaces, their
 * databases and control sockets); the path inside is absolute, outside what the sandbox
 * builds itself. */
static int opt_volume(json_t *v, struct cb_backend_volume *out)
{
	static const char *const reserved[] = {
	    "/usr",    "/etc",	     "/bin", "/sbin", "/lib", "/lib32",	      "/lib64",
	    "/libx32", "/workspace", "/tmp", "/proc", "/dev", CB_BACKEND_HOME};
	const char *src = json_string_value(json_array_get(v, 0));
	const char *dst = json_string_value(json_array_get(v, 1));
	const char *mode = json_string_value(json_array_get(v, 2));
	char *home = NULL;
	int rc = 0;

	if (!json_is_array(v) || json_array_size(v) < 2 || json_array_size(v) > 3 || !src || !dst ||
	    (json_array_size(v) == 3 && (!mode || (strcmp(mode, "ro") && strcmp(mode, "rw")))))
		return cb_error_set(EINVAL, "backend option volumes: each is [HOST_DIR, PATH] or "
					    "[HOST_DIR, PATH, \"ro\"|\"rw\"]");
	out->writable = mode && !strcmp(mode, "rw");
	if (src[0] != '/' || !(out->src = realpath(src, NULL))) {
		rc = cb_error_set(EINVAL, "backend option volumes: %s: %s", src,
				  src[0] != '/' ? "give an absolute host directory"
						: strerror(errno));
		goto out;
	}
	struct stat st;
	if (stat(out->src, &st) < 0 || !S_ISDIR(st.st_mode)) {
		rc = cb_error_set(ENOTDIR, "backend option volumes: %s: not a directory", src);
		goto out;
	}
	if (cb_ws_home(&home) == 0) {
		char *real = realpath(home, NULL);

		if (path_under(out->src, real ? real : home) ||
		    path_under(real ? real : home, out->src))
			rc = cb_error_set(EINVAL,
					  "backend option volumes: %s holds or is under "
					  "$COWBOX_HOME (%s): the workspaces and their control "
					  "sockets stay out of every sandbox",
					  src, home);
		free(real);
	} else {
		cb_error_clear(); /* no home to find: nothing of it to keep out either */
	}
	if (rc)
		goto out;
	char *folder = NULL;

	if (out->writable && (rc = cb_ws_in_place_overlap(out->src, &folder)) == 1)
		rc = cb_error_set(EINVAL,
				  "backend option volumes: %s holds or is under %s, an in-place "
				  "folder: it is written only through its workspace's mount "
				  "(bind it read-only)",
				  src, folder);
	free(folder);
	if (rc)
		goto out;
	if (strpbrk(out->src, ":,\n") || strpbrk(dst, ":,\n")) {
		rc = cb_error_set(EINVAL,
				  "backend option volumes: %s:%s: no ':', ',' or newline in "
				  "either path",
				  src, dst);
		goto out;
	}
	if (dst[0] != '/' || !dst[1] || strstr(dst, "..") || strlen(dst) > 1024) {
		rc = cb_error_set(EINVAL,
				  "backend option volumes: %s: give an absolute path "
				  "inside the sandbox, without ..",
				  dst);
		goto out;
	}
	for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
		if (path_under(dst, reserved[i])) {
			rc = cb_error_set(EINVAL,
					  "backend option volumes: %s is inside %s, which the "
					  "sandbox builds itself",
					  dst, reserved[i]);
			goto out;
		}
	if (!(out->dst = strdup(dst)))
		rc = cb_error_set(ENOMEM, "backend options: out of memory");
out:
	free(home);
	return rc;
}

static int opt_volumes(json_t *v, struct cb_backend_options *o)
{
	size_t i;
	json_t *e;
	int rc;

	if (!json_is_array(v) || json_array_size(v) > CB_BACKEND_MAX_VOLUMES)
		return cb_error_set(EINVAL, "backend option volumes: a list of at most %d",
				    CB_BACKEND_MAX_VOLUMES);
	json_array_foreach(v, i, e)
	{
		rc = opt_volume(e, &o->volumes[o->n_volumes]);
		o->n_volumes++; /* freed with the options, also half made */
		if (rc)
			return rc;
	}
	return 0;
}

int cb_backend_volume_spec(const char *spec, json_t **out)
{
	char *copy = strdup(spec ? spec : ""), *path, *mode;
	int rc = 0;

	*out = NULL;
	if (!copy)
		return cb_error_set(ENOMEM, "out of memory");
	path = strchr(copy, ':');
	mode = path ? strchr(path + 1, ':') : NULL;
	if (path)
		*path++ = 0;
	if (mode)
		*mode++ = 0;
	if (!path || !*copy || !*path)
		rc = cb_error_set(EINVAL, "volume '%s': give HOST_DIR:PATH[:ro|rw]",
				  spec ? spec : "");
	else if (!(*out = json_pack("[s,s,s]", copy, path, mode ? mode : "ro")))
		rc = cb_error_set(ENOMEM, "out of memory");
	free(copy);
	return rc;
}

int cb_backend_bg_parse(const char *what, const char *s, enum cb_backend_bg *out)
{
	if (s && !strcmp(s, "keep"))
		*out = CB_BACKEND_BG_KEEP;
	else if (s && !strcmp(s, "kill"))
		*out = CB_BACKEND_BG_KILL;
	else
		return cb_error_set(EINVAL, "%s: keep or kill, not '%s'", what,
				    s ? s : "(not a string)");
	return 0;
}

int cb_backend_user_check(const char *what, const char *s)
{
	const char *colon = strchr(s, ':');
	size_t n = strlen(s);

	if (!n || n > 64 || s[0] == '-' ||
	    (colon && (colon == s || !colon[1] || colon[1] == '-' || strchr(colon + 1, ':'))) ||
	    strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:") != n)
		return cb_error_set(EINVAL, "%s: NAME|UID[:GROUP|GID], not '%s'", what, s);
	return 0;
}

/* user: a string (NAME|UID[:GROUP]) or a uid as a number. */
static int opt_user(json_t *v, char **out)
{
	int rc;

	if (json_is_integer(v) && json_integer_value(v) >= 0) {
		if (asprintf(out, "%lld", (long long)json_integer_value(v)) < 0) {
			*out = NULL;
			return cb_error_set(ENOMEM, "backend option user: out of memory");
		}
		return 0;
	}
	if (!json_is_string(v))
		return cb_error_set(EINVAL, "backend option user: a name or a uid");
	if ((rc = cb_backend_user_check("backend option user", json_string_value(v))) < 0)
		return rc;
	return opt_string(v, "user", out);
}

static int opt_number(json_t *v, const char *key, double *out)
{
	if (!json_is_number(v) || json_number_value(v) < 0)
		return cb_error_set(EINVAL, "backend option %s: needs a non-negative number", key);
	*out = json_number_value(v);
	return 0;
}

/* A limit: a missing key keeps the default (0), an explicit 0 means none. */
static int opt_limit(json_t *v, const char *key, unsigned long *out)
{
	double num = 0;
	int rc = opt_number(v, key, &num);

	if (rc == 0)
		*out = num >= 1 ? (unsigned long)num : CB_BACKEND_NO_LIMIT;
	return rc;
}

static unsigned long limit_or(unsigned long v, unsigned long def)
{
	return v == CB_BACKEND_NO_LIMIT ? 0 : v ? v : def;
}

void cb_backend_limits_of(const struct cb_backend_options *o, struct cb_backend_limits *out)
{
	int local = o->kind && !strcmp(o->kind, "local");

	memset(out, 0, sizeof(*out));
	out->timeout = o->timeout < 0	? 0
		       : o->timeout > 0 ? o->timeout
					: CB_BACKEND_DEFAULT_TIMEOUT;
	out->disk_bytes = (unsigned long long)limit_or(o->disk_mb, CB_BACKEND_DEFAULT_DISK_MB)
			  << 20;
	out->disk_inodes = limit_or(o->disk_inodes, CB_BACKEND_DEFAULT_DISK_INODES);
	if (local)
		return;
	out->pids = limit_or(o->pids, CB_BACKEND_DEFAULT_PIDS);
	out->memory_mb = limit_or(o->memory_mb, CB_BACKEND_DEFAULT_MEMORY_MB);
	out->oom_score_adj = CB_BACKEND_OOM_SCORE_ADJ;
}

json_t *cb_backend_limits_json(const struct cb_backend_limits *l)
{
	return json_pack("{s:f, s:I, s:I, s:i, s:I, s:I}", "timeout", l->timeout, "memory_mb",
			 (json_int_t)l->memory_mb, "pids", (json_int_t)l->pids, "oom_score_adj",
			 l->oom_score_adj, "disk_bytes", (json_int_t)l->disk_bytes, "disk_inodes",
			 (json_int_t)l->disk_inodes);
}

static int opt_hooks(json_t *v, const char *key, char **out)
{
	size_t i;
	json_t *e;

	if (!json_is_array(v) || json_array_size(v) > CB_BACKEND_MAX_HOOKS)
		return cb_error_set(EINVAL,
				    "backend option %s: needs a list of at most %d commands", key,
				    CB_BACKEND_MAX_HOOKS);
	json_array_foreach(v, i, e)
	{
		int rc = opt_string(e, key, &out[i]);

		if (rc)
			return rc;
	}
	return 0;
}

/* The allow entries, each checked now so that a bad one is refused at create. */
static int opt_allow(json_t *v, char ***out)
{
	struct cb_net_entry e;
	size_t i;
	json_t *s;
	int rc;

	if (!json_is_array(v))
		return cb_error_set(EINVAL, "backend option allow: needs a list of entries");
	if (!(*out = calloc(json_array_size(v) + 1, sizeof(char *))))
		return cb_error_set(ENOMEM, "backend option allow: out of memory");
	json_array_foreach(v, i, s)
	{
		if (!json_is_string(s))
			return cb_error_set(EINVAL,
					    "backend option allow: entry %zu is not a string", i);
		if ((rc = cb_net_entry_parse(json_string_value(s), &e)) < 0)
			return cb_error_wrap(rc, "backend option allow");
		free(e.text);
		free(e.host);
		if (!((*out)[i] = strdup(json_string_value(s))))
			return cb_error_set(ENOMEM, "backend option allow: out of memory");
	}
	return 0;
}

int cb_backend_env_from_json(json_t *obj, const char *what, char ***out)
{
	const char *k;
	json_t *v;
	size_t n = 0;

	*out = NULL;
	if (!json_is_object(obj))
		return cb_error_set(EINVAL, "%s: needs an object of strings", what);
	*out = calloc(json_object_size(obj) + 1, sizeof(char *));
	if (!*out)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	json_object_foreach(obj, k, v)
	{
		if (!json_is_string(v) || !*k || strchr(k, '='))
			return cb_error_set(
			    EINVAL, "%s %s: needs a string value and a name without '='", what, k);
		if (asprintf(&(*out)[n], "%s=%s", k, json_string_value(v)) < 0) {
			(*out)[n] = NULL;
			return cb_error_set(ENOMEM, "%s: out of memory", what);
		}
		n++;
	}
	return 0;
}

int cb_backend_options_from_json(json_t *j, struct cb_backend_options *out)
{
	const char *key;
	json_t *v;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (!json_is_object(j))
		return cb_error_set(EINVAL, "backend options: need a JSON object");
	json_object_foreach(j, key, v)
	{
		if (!strcmp(key, "backend"))
			rc = opt_string(v, key, &out->kind);
		else if (!strcmp(key, "env"))
			rc = cb_backend_env_from_json(v, "backend option env", &out->env);
		else if (!strcmp(key, "working_dir"))
			rc = opt_string(v, key, &out->working_dir);
		else if (!strcmp(key, "image"))
			rc = opt_string(v, key, &out->image);
		else if (!strcmp(key, "setup_script"))
			rc = opt_string(v, key, &out->setup_script);
		else if (!strcmp(key, "timeout")) {
			rc = opt_number(v, key, &out->timeout);
			if (!rc && out->timeout == 0)
				out->timeout = -1; /* explicitly none */
		} else if (!strcmp(key, "pids"))
			rc = opt_limit(v, key, &out->pids);
		else if (!strcmp(key, "disk_mb"))
			rc = opt_limit(v, key, &out->disk_mb);
		else if (!strcmp(key, "disk_inodes"))
			rc = opt_limit(v, key, &out->disk_inodes);
		else if (!strcmp(key, "setup_timeout"))
			rc = opt_number(v, key, &out->setup_timeout);
		else if (!strcmp(key, "cpus"))
			rc = opt_number(v, key, &out->cpus);
		else if (!strcmp(key, "memory_mb"))
			rc = opt_limit(v, key, &out->memory_mb);
		else if (!strcmp(key, "network")) {
			rc = cb_backend_net_parse(json_string_value(v), &out->net);
		} else if (!strcmp(key, "allow"))
			rc = opt_allow(v, &out->allow);
		else if (!strcmp(key, "secrets"))
			rc = cb_backend_secrets_from_json(v, out);
		else if (!strcmp(key, "on_create"))
			rc = opt_hooks(v, key, out->on_create);
		else if (!strcmp(key, "on_destroy"))
			rc = opt_hooks(v, key, out->on_destroy);
		else if (!strcmp(key, "shell")) {
			rc = opt_string(v, key, &out->shell);
			if (!rc && strcmp(out->shell, "sh") && strcmp(out->shell, "bash"))
				rc = cb_error_set(EINVAL,
						  "backend option shell: sh or bash, not '%s'",
						  out->shell);
		} else if (!strcmp(key, "user"))
			rc = opt_user(v, &out->user);
		else if (!strcmp(key, "volumes"))
			rc = opt_volumes(v, out);
		else if (!strcmp(key, "background"))
			rc = cb_backend_bg_parse("backend option background", json_string_value(v),
						 &out->background);
		else if (!strcmp(key, "privileged")) {
			if (!json_is_boolean(v))
				rc = cb_error_set(EINVAL,
						  "backend option privileged: true or false");
			out->privileged = json_is_true(v);
		} else
			rc = cb_error_set(EINVAL, "unknown backend option '%s'", key);
		if (rc)
			break;
	}
	if (!rc && !out->kind && !(out->kind = strdup("ns")))
		rc = cb_error_set(ENOMEM, "backend options: out of memory");
	if (!rc && !cb_backend_find(out->kind))
		rc = cb_error_set(EINVAL, "unknown backend '%s' (ns, local or docker)", out->kind);
	/* The local backend isolates nothing: refuse what it could not enforce rather than
	 * pretend, and say that its network is the host's. */
	if (!rc && !strcmp(out->kind, "local")) {
		json_t *net = json_object_get(j, "network");

		if (out->cpus > 0 || (out->memory_mb && out->memory_mb != CB_BACKEND_NO_LIMIT) ||
		    (out->pids && out->pids != CB_BACKEND_NO_LIMIT) || out->image)
			rc = cb_error_set(EINVAL,
					  "the local backend cannot enforce cpus, memory_mb, "
					  "pids or image; use ns or docker");
		else if (net && out->net != CB_BACKEND_NET_HOST)
			rc = cb_error_set(EINVAL, "the local backend runs on the host's network "
						  "(network host) and cannot keep a command from "
						  "going around a proxy; network none, all, public "
						  "or allow needs ns or docker");
		out->net = CB_BACKEND_NET_HOST;
	}
	/* ns: a directory or an OCI image (cowbox/image.h); docker: a name the CLI takes, never
	 * one of its options */
	if (!rc && out->image && !strcmp(out->kind, "ns"))
		rc = cb_backend_image_check(out->image);
	else if (!rc && out->image && (!*out->image || *out->image == '-'))
		rc = cb_error_set(EINVAL, "backend option image: an image name, not empty and not "
					  "starting with '-'");
	if (!rc && out->n_volumes && !strcmp(out->kind, "local"))
		rc = cb_error_set(EINVAL, "backend option volumes: the local backend runs on the "
					  "host, which has no sandbox to bind them into");
	if (!rc && out->user && !strcmp(out->kind, "local"))
		rc = cb_error_set(EINVAL, "backend option user: the local backend runs commands as "
					  "the daemon's own user; use ns or docker");
	if (!rc && out->user && out->privileged)
		rc = cb_error_set(EINVAL, "backend option user: a privileged sandbox keeps no "
					  "capability to switch users with");
	if (!rc && out->allow && out->net != CB_BACKEND_NET_ALLOW)
		rc = cb_error_set(EINVAL, "backend option allow: only with network allow");
	if (!rc && out->n_secrets && !cb_backend_net_proxied(out))
		rc = cb_error_set(EINVAL, "backend option secrets: only with network public or "
					  "allow (the egress proxy sets them)");
	if (!rc && out->privileged && strcmp(out->kind, "ns"))
		rc = cb_error_set(EINVAL, "backend option privileged: only the ns backend has a "
					  "user namespace to leave out");
	/* An absolute working_dir is taken as the sandbox sees it: under /workspace. */
	if (!rc && out->working_dir && !strncmp(out->working_dir, "/workspace", 10) &&
	    (!out->working_dir[10] || out->working_dir[10] == '/')) {
		char *wd = out->working_dir, *rel = wd + 10 + strspn(wd + 10, "/");

		out->working_dir = *rel ? strdup(rel) : NULL;
		if (*rel && !out->working_dir)
			rc = cb_error_set(ENOMEM, "backend options: out of memory");
		free(wd);
	}
	if (!rc && out->working_dir && cb_beneath_check(out->working_dir) < 0)
		rc =
		    cb_error_wrap(EINVAL, "backend option working_dir: must be under /workspace or "
					  "relative to the workspace root, without ..");
	if (rc)
		cb_backend_options_free(out);
	return rc;
}

json_t *cb_backend_options_to_json(const struct cb_backend_options *o)
{
	json_t *j = json_object(), *env = json_object(), *c = json_array(), *d = json_array();
	struct cb_backend_limits lim;

	for (size_t i = 0; o->env && o->env[i]; i++) {
		char *k = strdup(o->env[i]), *eq = k ? strchr(k, '=') : NULL;

		if (eq) {
			*eq = 0;
			json_object_set_new(env, k, json_string(eq + 1));
		}
		free(k);
	}
	for (int i = 0; i < CB_BACKEND_MAX_HOOKS; i++) {
		if (o->on_create[i])
			json_array_append_new(c, json_string(o->on_create[i]));
		if (o->on_destroy[i])
			json_array_append_new(d, json_string(o->on_destroy[i]));
	}
	json_object_set_new(j, "backend", json_string(o->kind ? o->kind : "ns"));
	json_object_set_new(j, "env", env);
	json_object_set_new(j, "network", json_string(cb_backend_net_name(o->net)));
	if (o->net == CB_BACKEND_NET_ALLOW) {
		json_t *a = json_array();

		for (size_t i = 0; o->allow && o->allow[i]; i++)
			json_array_append_new(a, json_string(o->allow[i]));
		json_object_set_new(j, "allow", a);
	}
	if (o->n_secrets)
		json_object_set_new(j, "secrets", cb_backend_secrets_to_json(o));
	/* the limits in effect, 0 for none: loading this again gives the same ones */
	cb_backend_limits_of(o, &lim);
	json_object_set_new(j, "timeout", json_real(lim.timeout));
	json_object_set_new(j, "cpus", json_real(o->cpus));
	if (!o->kind || strcmp(o->kind, "local")) {
		json_object_set_new(j, "memory_mb", json_integer((json_int_t)lim.memory_mb));
		json_object_set_new(j, "pids", json_integer((json_int_t)lim.pids));
	}
	json_object_set_new(j, "disk_mb", json_integer((json_int_t)(lim.disk_bytes >> 20)));
	json_object_set_new(j, "disk_inodes", json_integer((json_int_t)lim.disk_inodes));
	json_object_set_new(j, "on_create", c);
	json_object_set_new(j, "on_destroy", d);
	json_object_set_new(j, "setup_timeout", json_real(o->setup_timeout));
	if (o->privileged)
		json_object_set_new(j, "privileged", json_true());
	json_object_set_new(j, "shell", json_string(o->shell ? o->shell : "sh"));
	json_object_set_new(j, "background",
			    json_string(o->background == CB_BACKEND_BG_KILL ? "kill" : "keep"));
	if (o->user)
		json_object_set_new(j, "user", json_string(o->user));
	if (o->n_volumes) {
		json_t *vols = json_array();

		for (size_t i = 0; i < o->n_volumes; i++)
			json_array_append_new(
			    vols, json_pack("[s,s,s]", o->volumes[i].src, o->volumes[i].dst,
					    o->volumes[i].writable ? "rw" : "ro"));
		json_object_set_new(j, "volumes", vols);
	}
	if (o->working_dir)
		json_object_set_new(j, "working_dir", json_string(o->working_dir));
	if (o->image)
		json_object_set_new(j, "image", json_string(o->image));
	if (o->setup_script)
		json_object_set_new(j, "setup_script", json_string(o->setup_script));
	return j;
}

int cb_backend_options_save(const char *dir, const struct cb_backend_options *o)
{
	char path[4096], tmp[4200];
	json_t *j = cb_backend_options_to_json(o);
	int rc = 0;

	snprintf(path, sizeof(path), "%s/backend.json", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	if (!j || json_dump_file(j, tmp, JSON_INDENT(1)) < 0)
		rc = cb_error_set(EIO, "write %s: cannot save the backend options", tmp);
	else if (rename(tmp, path) < 0)
		rc = cb_error_set(errno, "rename %s: %s", path, strerror(errno));
	if (rc)
		unlink(tmp);
	json_decref(j);
	/* the values beside it (or a stale secrets.json removed) */
	if (!rc)
		rc = cb_backend_secrets_save(dir, strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir,
					     o);
	return rc;
}

int cb_backend_options_load(const char *dir, struct cb_backend_options *out)
{
	char path[4096];
	json_error_t jerr;
	json_t *j;
	int rc;

	snprintf(path, sizeof(path), "%s/backend.json", dir);
	if (access(path, F_OK) < 0 && errno == ENOENT) {
		j = json_object();
	} else if (!(j = json_load_file(path, 0, &jerr))) {
		return cb_error_set(EIO, "%s: line %d: %s", path, jerr.line, jerr.text);
	}
	/* Before network host existed the local backend saved its network as "all"; such a file
	 * still loads (as host), while a request for local with "all" is refused. */
	if (j && json_is_string(json_object_get(j, "backend")) &&
	    !strcmp(json_string_value(json_object_get(j, "backend")), "local") &&
	    json_is_string(json_object_get(j, "network")) &&
	    !strcmp(json_string_value(json_object_get(j, "network")), "all"))
		json_object_set_new(j, "network", json_string("host"));
	rc = cb_backend_options_from_json(j, out);
	json_decref(j);
	if (!rc && (rc = cb_backend_secrets_load(dir, out)) < 0)
		cb_backend_options_free(out);
	if (rc)
		cb_error_wrap(rc, "%s", path);
	return rc;
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
 * project only), removed with the workspace. Sticky and writable by all, like /tmp: it
 * belongs to no sandbox id, and any user option's user keeps its files there. */
static int backend_home(struct cb_backend *b)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/home", b->dir);
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return cb_error_set(errno, "mkdir %s: %s", path, strerror(errno));
	if (chmod(path, 01777) < 0)
		return cb_error_set(errno, "chmod %s: %s", path, strerror(errno));
	return 0;
}

int cb_backend_ensure(struct cb_backend *b)
{
	int rc = 0;

	pthread_mutex_lock(&b->lock);
	if (!b->created) {
		rc = b->opt.working_dir ? cb_backend_mkdirs(b, b->opt.working_dir) : 0;
		if (!rc && strcmp(b->ops->name, "local"))
			rc = backend_home(b);
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
	}
	pthread_mutex_unlock(&b->lock);
	return rc;
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

	if (!strcmp(b->ops->name, "local") && (rc = cb_exec_env_host_stripped(&host)) < 0)
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
	rc = cb_backend_options_load(dir, &opt);
	free(dir);
	if (rc < 0)
		return rc;
	if (!strcmp(opt.kind, "docker"))
		rc = cb_backend_docker_remove(ref);
	cb_backend_options_free(&opt);
	return rc;
}
