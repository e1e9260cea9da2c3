/* Backend options: their JSON form (the configure op's, backend.json), each checked, the
 * backend's own limits left to its table's validate; saved and loaded per workspace. */
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
#include "cowbox/workspace.h"
#include "util/beneath.h"

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

/* The O_PATH fd of the absolute directory path, reached from / through no symlink and no
 * "..": the rule the sandbox cannot bend by swapping a component of it for a symlink. */
static int volume_open_nofollow(const char *path)
{
	int root, fd;

	if (path[0] != '/' || !path[1 + strspn(path + 1, "/")])
		return cb_error_set(EINVAL, "volume %s: not an absolute directory below /", path);
	if ((root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
		return cb_error_set(errno, "open /: %s", strerror(errno));
	fd = cb_beneath_open(root, path + strspn(path, "/"), O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
	close(root);
	return fd;
}

int cb_backend_volume_open(const struct cb_backend_volume *v)
{
	struct stat st;
	int fd = volume_open_nofollow(v->src);

	if (fd < 0)
		return cb_error_wrap(fd,
				     "volume %s (its host path no longer leads to it through "
				     "directories alone; refusing to bind it): ",
				     v->dst);
	if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode)) {
		int err = fstat(fd, &st) < 0 ? errno : ENOTDIR;

		close(fd);
		return cb_error_set(err, "volume %s: %s: %s", v->dst, v->src, strerror(err));
	}
	if (v->ino &&
	    ((unsigned long long)st.st_dev != v->dev || (unsigned long long)st.st_ino != v->ino)) {
		close(fd);
		return cb_error_set(ESTALE,
				    "volume %s: %s is no longer the directory it named when the "
				    "volume was given (device %llu inode %llu, now %llu/%llu); "
				    "refusing to bind it (give the volume again if this is meant)",
				    v->dst, v->src, v->dev, v->ino, (unsigned long long)st.st_dev,
				    (unsigned long long)st.st_ino);
	}
	return fd;
}

/* One volume: [HOST_DIR, PATH] or [HOST_DIR, PATH, "ro"|"rw"] (read-only unless asked).
 * Given anew (id is NULL and !stored), HOST_DIR is resolved here once (realpath: the
 * caller's own symlinks are followed now, never again) and its device and inode kept. Read
 * back from backend.json (stored), it is taken as it was resolved then: id holds what it
 * named ([DEV, INO]), checked by every command's bind (cb_backend_volume_open); a file
 * without ids has its identity taken through no symlink now, and nothing is refused here
 * (a volume gone or swapped is refused when a command would bind it, not when the
 * workspace is read). The host directory must lie outside $COWBOX_HOME (the workspaces,
 * their databases and control sockets) and outside every in-place folder (a sandbox writes
 * it: it could swap the volume's path); the path inside is absolute, outside what the
 * sandbox builds itself. */
static int opt_volume(json_t *v, json_t *id, int stored, struct cb_backend_volume *out)
{
	static const char *const reserved[] = {
	    "/usr",    "/etc",	     "/bin", "/sbin", "/lib", "/lib32",	      "/lib64",
	    "/libx32", "/workspace", "/tmp", "/proc", "/dev", CB_BACKEND_HOME};
	const char *src = json_string_value(json_array_get(v, 0));
	const char *dst = json_string_value(json_array_get(v, 1));
	const char *mode = json_string_value(json_array_get(v, 2));
	char *home = NULL;
	int rc = 0, fd = -1;
	struct stat st;

	if (!json_is_array(v) || json_array_size(v) < 2 || json_array_size(v) > 3 || !src || !dst ||
	    (json_array_size(v) == 3 && (!mode || (strcmp(mode, "ro") && strcmp(mode, "rw")))))
		return cb_error_set(EINVAL, "backend option volumes: each is [HOST_DIR, PATH] or "
					    "[HOST_DIR, PATH, \"ro\"|\"rw\"]");
	out->writable = mode && !strcmp(mode, "rw");
	if (src[0] != '/') {
		rc = cb_error_set(EINVAL,
				  "backend option volumes: %s: give an absolute host "
				  "directory",
				  src);
		goto out;
	}
	if (stored) {
		if (!(out->src = strdup(src))) {
			rc = cb_error_set(ENOMEM, "backend options: out of memory");
			goto out;
		}
	} else if (!(out->src = realpath(src, NULL))) {
		rc = cb_error_set(EINVAL, "backend option volumes: %s: %s", src, strerror(errno));
		goto out;
	}
	if (json_is_array(id) && json_is_integer(json_array_get(id, 0)) &&
	    json_is_integer(json_array_get(id, 1))) {
		out->dev = (unsigned long long)json_integer_value(json_array_get(id, 0));
		out->ino = (unsigned long long)json_integer_value(json_array_get(id, 1));
	} else if ((fd = volume_open_nofollow(out->src)) < 0 || fstat(fd, &st) < 0 ||
		   !S_ISDIR(st.st_mode)) {
		if (stored) {
			cb_error_clear(); /* refused at the bind, with its reason */
		} else {
			rc = cb_error_set(ENOTDIR, "backend option volumes: %s: not a directory",
					  src);
			goto out;
		}
	} else {
		out->dev = (unsigned long long)st.st_dev;
		out->ino = (unsigned long long)st.st_ino;
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

	/* Read-only too when given anew: the folder's sandbox could put a symlink on this
	 * volume's path (one kept from before is left to the bind's checks). */
	if ((out->writable || !stored) && (rc = cb_ws_in_place_overlap(out->src, &folder)) == 1)
		rc = cb_error_set(EINVAL,
				  "backend option volumes: %s holds or is under %s, an in-place "
				  "folder: a sandbox writes it (bind it through the workspace, "
				  "or a folder outside it)",
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
	if (fd >= 0)
		close(fd);
	free(home);
	return rc;
}

/* ids: backend.json's volume_ids (NULL: the volumes are given anew). A volume inside (or
 * holding) another one that is read-write is refused: the sandbox writes that one, so it
 * could swap this one's path. */
static int opt_volumes(json_t *v, json_t *ids, struct cb_backend_options *o)
{
	size_t i;
	json_t *e;
	int rc;

	if (!json_is_array(v) || json_array_size(v) > CB_BACKEND_MAX_VOLUMES)
		return cb_error_set(EINVAL, "backend option volumes: a list of at most %d",
				    CB_BACKEND_MAX_VOLUMES);
	json_array_foreach(v, i, e)
	{
		rc = opt_volume(e, json_array_get(ids, i), ids != NULL, &o->volumes[o->n_volumes]);
		o->n_volumes++; /* freed with the options, also half made */
		if (rc)
			return rc;
	}
	for (i = 0; !ids && i < o->n_volumes; i++)
		for (size_t k = 0; k < o->n_volumes; k++) {
			const struct cb_backend_volume *a = &o->volumes[i], *b = &o->volumes[k];

			if (i != k && b->writable && path_under(a->src, b->src))
				return cb_error_set(EINVAL,
						    "backend option volumes: %s is inside %s, a "
						    "read-write volume: the sandbox could swap its "
						    "path (give one of them only)",
						    a->src, b->src);
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

/* The egress proxy's cap on connections: 1 to 65536 (0 or absent: the default, 256). */
static int opt_proxy_conns(json_t *v, unsigned long *out)
{
	json_int_t n = json_is_integer(v) ? json_integer_value(v) : -1;

	if (n < 0 || n > 65536)
		return cb_error_set(EINVAL, "backend option proxy_conns: a count of connections, "
					    "1 to 65536 (0: the default, 256)");
	*out = (unsigned long)n;
	return 0;
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
	const struct cb_backend_ops *ops = NULL;
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
		else if (!strcmp(key, "image_max_mb"))
			rc = opt_limit(v, key, &out->image_max_mb);
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
		else if (!strcmp(key, "proxy_conns"))
			rc = opt_proxy_conns(v, &out->proxy_conns);
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
			rc = opt_volumes(v, json_object_get(j, "volume_ids"), out);
		else if (!strcmp(key, "volume_ids"))
			rc = json_is_array(v)
				 ? 0
				 : cb_error_set(EINVAL, "backend option volume_ids: a list");
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
	if (!rc && !out->kind && !(out->kind = strdup(cb_backend_find(NULL)->name)))
		rc = cb_error_set(ENOMEM, "backend options: out of memory");
	if (!rc && !(ops = cb_backend_find(out->kind)))
		rc = cb_error_set(EINVAL, "unknown backend '%s' (%s)", out->kind,
				  cb_backend_kinds());
	if (!rc && ops->validate)
		rc = ops->validate(out, j);
	if (!rc && out->user && out->privileged)
		rc = cb_error_set(EINVAL, "backend option user: a privileged sandbox keeps no "
					  "capability to switch users with");
	if (!rc && out->allow && out->net != CB_BACKEND_NET_ALLOW)
		rc = cb_error_set(EINVAL, "backend option allow: only with network allow");
	if (!rc && out->proxy_conns && !cb_backend_net_proxied(out))
		rc = cb_error_set(EINVAL, "backend option proxy_conns: only with network public "
					  "or allow (the egress proxy's)");
	if (!rc && out->n_secrets && !cb_backend_net_proxied(out))
		rc = cb_error_set(EINVAL, "backend option secrets: only with network public or "
					  "allow (the egress proxy sets them)");
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
	json_object_set_new(j, "backend",
			    json_string(o->kind ? o->kind : cb_backend_find(NULL)->name));
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
	if (o->proxy_conns)
		json_object_set_new(j, "proxy_conns", json_integer((json_int_t)o->proxy_conns));
	/* the limits in effect, 0 for none: loading this again gives the same ones */
	cb_backend_limits_of(o, &lim);
	json_object_set_new(j, "timeout", json_real(lim.timeout));
	json_object_set_new(j, "cpus", json_real(o->cpus));
	if (!cb_backend_find(o->kind) || cb_backend_find(o->kind)->confined) {
		json_object_set_new(j, "memory_mb", json_integer((json_int_t)lim.memory_mb));
		json_object_set_new(j, "pids", json_integer((json_int_t)lim.pids));
	}
	json_object_set_new(j, "disk_mb", json_integer((json_int_t)(lim.disk_bytes >> 20)));
	json_object_set_new(j, "disk_inodes", json_integer((json_int_t)lim.disk_inodes));
	if (o->image_max_mb)
		json_object_set_new(j, "image_max_mb",
				    json_integer(o->image_max_mb == CB_BACKEND_NO_LIMIT
						     ? 0
						     : (json_int_t)o->image_max_mb));
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
		/* what each named when given, checked by every bind (cb_backend_volume_open) */
		json_t *ids = json_array();

		for (size_t i = 0; i < o->n_volumes; i++)
			json_array_append_new(ids, o->volumes[i].ino
						       ? json_pack("[I,I]",
								   (json_int_t)o->volumes[i].dev,
								   (json_int_t)o->volumes[i].ino)
						       : json_null());
		json_object_set_new(j, "volume_ids", ids);
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
	const struct cb_backend_ops *ops;
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
	/* Its volumes were resolved when given: never again through a symlink (an older file
	 * without their ids has them taken that way, see opt_volume). */
	if (j && json_object_get(j, "volumes") && !json_object_get(j, "volume_ids"))
		json_object_set_new(j, "volume_ids", json_array());
	/* a file an older cowbox saved, brought up to date by its backend */
	if (j && (ops = cb_backend_find(json_string_value(json_object_get(j, "backend")))) &&
	    ops->upgrade)
		ops->upgrade(j);
	rc = cb_backend_options_from_json(j, out);
	json_decref(j);
	if (!rc && (rc = cb_backend_secrets_load(dir, out)) < 0)
		cb_backend_options_free(out);
	if (rc)
		cb_error_wrap(rc, "%s", path);
	return rc;
}
