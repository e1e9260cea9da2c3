/* The user a sandboxed command runs as: NAME|UID[:GROUP|GID] resolved in the sandbox root's
 * own etc/passwd and etc/group (read beneath the image, never through a symlink out of it). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "internal.h"
#include "util/beneath.h"

#define DB_MAX (4u << 20) /* a passwd or group file larger than this is not one */

/* A whole decimal id, or -1. */
static long parse_id(const char *s, size_t len)
{
	long v = 0;

	if (!len || len > 9)
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v;
}

/* Field i (0-based) of a colon-separated line, as start and length; -1 if it has none. */
static int field(const char *line, int i, const char **start, size_t *len)
{
	const char *p = line;

	for (; i > 0; i--) {
		p = strchr(p, ':');
		if (!p)
			return -1;
		p++;
	}
	*start = p;
	*len = strcspn(p, ":\n");
	return 0;
}

/* The line of db (name in field 0, id in field 2) matching key: by name, else by id when
 * key is numeric. Returns the line or NULL. */
static const char *db_find(const char *db, const char *key, size_t klen)
{
	long id = parse_id(key, klen);

	for (const char *line = db; line && *line; line = strchr(line, '\n'), line += !!line) {
		const char *f;
		size_t n;

		if (field(line, 0, &f, &n) == 0 && n == klen && !memcmp(f, key, klen))
			return line;
		if (id >= 0 && field(line, 2, &f, &n) == 0 && parse_id(f, n) == id)
			return line;
	}
	return NULL;
}

/* Is name a member listed in field 3 of a group line? */
static int group_lists(const char *line, const char *name, size_t nlen)
{
	const char *f;
	size_t n;

	if (field(line, 3, &f, &n) < 0)
		return 0;
	while (n) {
		size_t m = strcspn(f, ",\n");

		if (m > n)
			m = n;
		if (m == nlen && !memcmp(f, name, nlen))
			return 1;
		f += m;
		n -= m;
		if (n) {
			f++;
			n--;
		}
	}
	return 0;
}

static int read_db(int root, const char *path, char **out)
{
	void *data = NULL;
	size_t n = 0;
	off_t size;
	int rc = cb_beneath_read_file(root, path, 0, DB_MAX, &data, &n, &size);

	*out = NULL;
	if (rc == -ENOENT) {
		cb_error_clear();
		*out = calloc(1, 1); /* no such file: no names, ids still work */
		return *out ? 0 : cb_error_set(ENOMEM, "sandbox: out of memory");
	}
	if (rc < 0)
		return rc;
	*out = data;
	return 0;
}

int cb_ns_user_resolve(const struct cb_sandbox *sb, struct cb_ns_plan *p)
{
	const char *u = sb->user, *colon, *line, *f;
	char *passwd = NULL, *group = NULL;
	size_t ulen, n;
	long uid, gid = -1;
	int root = -1, rc = 0;

	if (!u)
		return 0;
	if (!p->userns)
		return cb_error_set(EINVAL,
				    "sandbox: user %s: a privileged sandbox keeps no capability "
				    "to switch users with",
				    u);
	colon = strchr(u, ':');
	ulen = colon ? (size_t)(colon - u) : strlen(u);
	if (!ulen || (colon && !colon[1])) {
		rc = cb_error_set(EINVAL, "sandbox: user '%s': give NAME|UID[:GROUP|GID]", u);
		goto out;
	}
	root = open(sb->image ? sb->image : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		rc = cb_error_set(errno, "sandbox: %s: %s", sb->image ? sb->image : "/",
				  strerror(errno));
		goto out;
	}
	if ((rc = read_db(root, "etc/passwd", &passwd)) < 0 ||
	    (rc = read_db(root, "etc/group", &group)) < 0) {
		cb_error_wrap(rc, "sandbox: user %s", u);
		goto out;
	}
	line = db_find(passwd, u, ulen);
	uid = parse_id(u, ulen);
	if (line && field(line, 2, &f, &n) == 0 && parse_id(f, n) >= 0) {
		/* a numeric name that is also someone else's id: the name wins, as in getpwnam */
		uid = parse_id(f, n);
		if (field(line, 3, &f, &n) == 0)
			gid = parse_id(f, n);
	} else if (uid < 0) {
		rc = cb_error_set(ENOENT, "sandbox: user %.*s: no such user in %s/etc/passwd",
				  (int)ulen, u, sb->image ? sb->image : "");
		goto out;
	}
	if (colon) {
		const char *g = db_find(group, colon + 1, strlen(colon + 1));

		gid = parse_id(colon + 1, strlen(colon + 1));
		if (g && field(g, 2, &f, &n) == 0 && parse_id(f, n) >= 0)
			gid = parse_id(f, n);
		else if (gid < 0) {
			rc =
			    cb_error_set(ENOENT, "sandbox: group %s: no such group in %s/etc/group",
					 colon + 1, sb->image ? sb->image : "");
			goto out;
		}
	}
	if (gid < 0)
		gid = 0; /* a uid without a passwd entry: group 0, as docker --user does */
	if ((unsigned long)uid >= p->map_count || (unsigned long)gid >= p->map_count) {
		rc = cb_error_set(EINVAL,
				  "sandbox: user %s: uid %ld / gid %ld are not mapped in the "
				  "sandbox (ids 0-%lu are)",
				  u, uid, gid, p->map_count - 1);
		goto out;
	}
	p->set_user = 1;
	p->uid = (uid_t)uid;
	p->gid = (gid_t)gid;
	p->groups[p->n_groups++] = (gid_t)gid;
	/* supplementary groups: those that list the user by name (only with a passwd name) */
	for (const char *gl = group; line && gl && *gl; gl = strchr(gl, '\n'), gl += !!gl) {
		const char *name;
		size_t nlen;
		long id;

		field(line, 0, &name, &nlen);
		if (field(gl, 2, &f, &n) < 0 || (id = parse_id(f, n)) < 0 ||
		    (unsigned long)id >= p->map_count || id == gid ||
		    !group_lists(gl, name, nlen) || p->n_groups >= CB_NS_MAX_GROUPS)
			continue;
		p->groups[p->n_groups++] = (gid_t)id;
	}
out:
	if (root >= 0)
		close(root);
	free(passwd);
	free(group);
	return rc;
}

int cb_exec_ids_resolve(const char *root, const char *user, struct cb_exec_ids *ids,
			gid_t groups[CB_EXEC_MAX_GROUPS])
{
	struct cb_sandbox sb = {.user = user, .image = root};
	/* every id is the caller's to take: no namespace maps them */
	struct cb_ns_plan p = {.userns = 1, .map_count = 1000000000UL};
	int rc = cb_ns_user_resolve(&sb, &p);

	if (rc < 0)
		return rc;
	if (!p.set_user)
		return cb_error_set(EINVAL, "user: none given");
	memcpy(groups, p.groups, p.n_groups * sizeof(gid_t));
	*ids = (struct cb_exec_ids){
	    .uid = p.uid, .gid = p.gid, .groups = groups, .n_groups = p.n_groups};
	return 0;
}
