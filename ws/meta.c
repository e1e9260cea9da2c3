/* The metadata a turn keeps of a file, directory or symlink besides its content (docs/turns.md):
 * owner and group as the sandbox sees them, user.* xattrs and the POSIX ACL, the modification
 * time; read through the live tree and given back to what is restored, never by a path that
 * could be followed. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "turns_int.h"

/* The POSIX ACL's xattr (linux/posix_acl_xattr.h): a version, then entries of tag, perm and
 * an id that only ACL_USER and ACL_GROUP use. */
#define META_ACL	 "system.posix_acl_access"
#define META_ACL_VERSION 2
#define META_ACL_USER	 0x02
#define META_ACL_GROUP	 0x08
#define META_XATTR_MAX	 (64 * 1024)

/* user.* (the sandbox's own) and the ACL: never security.* (a file capability restored would
 * grant privileges), nor trusted.* (the sandbox cannot set them). */
static int meta_kept_name(const char *name)
{
	return !strncmp(name, "user.", 5) || !strcmp(name, META_ACL);
}

static void meta_put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t meta_get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Move the named ids of an ACL value between host ids and the sandbox's: to_base < 0 turns
 * ids of any workspace range into the sandbox's own (id % range size), else the sandbox's
 * own (below the range size) become to_base + id. Other ids stay. */
static void meta_acl_ids(unsigned char *v, size_t len, long long to_base)
{
	if (len < 4 || meta_get32(v) != META_ACL_VERSION)
		return;
	for (size_t off = 4; off + 8 <= len; off += 8) {
		unsigned tag = (unsigned)v[off] | (unsigned)v[off + 1] << 8;
		uint32_t id = meta_get32(v + off + 4);

		if (tag != META_ACL_USER && tag != META_ACL_GROUP)
			continue;
		if (to_base < 0 && id >= CB_WS_IDS_FIRST && id < CB_WS_IDS_END)
			meta_put32(v + off + 4, (uint32_t)(id % CB_WS_IDS_SIZE));
		else if (to_base >= 0 && id < CB_WS_IDS_SIZE)
			meta_put32(v + off + 4, (uint32_t)(to_base + id));
	}
}

static int meta_name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Append [name length][name][value length][value] to the blob. */
static int meta_append(unsigned char **blob, size_t *len, const char *name, const void *value,
		       size_t vlen)
{
	size_t nlen = strlen(name), add = 8 + nlen + vlen;
	unsigned char *p = realloc(*blob, *len + add);

	if (!p)
		return -ENOMEM;
	*blob = p;
	p += *len;
	meta_put32(p, (uint32_t)nlen);
	memcpy(p + 4, name, nlen);
	meta_put32(p + 4 + nlen, (uint32_t)vlen);
	memcpy(p + 8 + nlen, value, vlen);
	*len += add;
	return 0;
}

/* The kept xattrs of the file open as fd (an O_PATH descriptor is fine: they are read through
 * /proc/self/fd, which names that very inode, never a path in the tree), sorted by name. */
static int meta_read_xattrs(int fd, const char *path, struct cb_entry *out)
{
	char proc[64], *list = NULL, **names = NULL;
	unsigned char *value = NULL;
	ssize_t n, vlen;
	size_t count = 0;
	int ret = 0;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = listxattr(proc, NULL, 0);
	if (n <= 0) {
		/* no xattrs, or a filesystem without them: nothing to keep */
		if (n < 0 && errno != ENOTSUP && errno != ENOSYS)
			ret = cb_error_set(errno, "%s: list xattrs: %s", path, strerror(errno));
		return ret;
	}
	list = malloc((size_t)n + 1);
	value = malloc(META_XATTR_MAX);
	names = calloc((size_t)n, sizeof(*names));
	if (!list || !value || !names) {
		ret = cb_error_set(ENOMEM, "%s: xattrs: out of memory", path);
		goto out;
	}
	n = listxattr(proc, list, (size_t)n);
	if (n < 0) {
		/* ERANGE: one was added meanwhile; the journal names the path again */
		ret = cb_error_set(errno, "%s: list xattrs: %s", path, strerror(errno));
		goto out;
	}
	list[n] = '\0';
	for (char *p = list; p < list + n; p += strlen(p) + 1)
		if (meta_kept_name(p))
			names[count++] = p;
	qsort(names, count, sizeof(*names), meta_name_cmp);
	for (size_t i = 0; i < count && !ret; i++) {
		vlen = getxattr(proc, names[i], value, META_XATTR_MAX);
		if (vlen < 0 && errno == ENODATA)
			continue; /* removed meanwhile */
		if (vlen < 0) {
			ret = cb_error_set(errno, "%s: xattr %s: %s", path, names[i],
					   strerror(errno));
			break;
		}
		if (!strcmp(names[i], META_ACL))
			meta_acl_ids(value, (size_t)vlen, -1);
		if (meta_append(&out->xattrs, &out->xattrs_len, names[i], value, (size_t)vlen))
			ret = cb_error_set(ENOMEM, "%s: xattrs: out of memory", path);
	}
out:
	free(list);
	free(value);
	free(names);
	return ret;
}

int ws_meta_read(int fd, const struct stat *st, const char *path, struct cb_entry *out)
{
	free(out->xattrs);
	out->xattrs = NULL;
	out->xattrs_len = 0;
	/* The mount shows the sandbox's ids as host ids of its range; kept as the sandbox's. */
	out->has_owner = st->st_uid >= CB_WS_IDS_FIRST && st->st_uid < CB_WS_IDS_END &&
			 st->st_gid >= CB_WS_IDS_FIRST && st->st_gid < CB_WS_IDS_END;
	out->uid = out->has_owner ? (unsigned)(st->st_uid % CB_WS_IDS_SIZE) : 0;
	out->gid = out->has_owner ? (unsigned)(st->st_gid % CB_WS_IDS_SIZE) : 0;
	/* a symlink can have no user.* xattr nor ACL (and /proc/self/fd would follow it) */
	return S_ISLNK(st->st_mode) ? 0 : meta_read_xattrs(fd, path, out);
}

int ws_restore_owner(int dst, const struct cb_entry *e, long long id_base)
{
	if (!e->has_owner || id_base < 0)
		return 0;
	if (fchown(dst, (uid_t)(id_base + e->uid), (gid_t)(id_base + e->gid)) < 0)
		return cb_error_set(errno, "restore the owner of %s: %s", e->path, strerror(errno));
	return 0;
}

/* 1 if the serialized xattrs of e hold name. */
static int meta_recorded(const struct cb_entry *e, const char *name)
{
	const unsigned char *p = e->xattrs, *end = e->xattrs + e->xattrs_len;
	size_t len = strlen(name);

	while (p && p + 8 <= end) {
		uint32_t nlen = meta_get32(p);

		if (p + 8 + nlen > end)
			return 0;
		if (nlen == len && !memcmp(p + 4, name, len))
			return 1;
		p += 8 + nlen + meta_get32(p + 4 + nlen);
	}
	return 0;
}

/* Remove from the inode at proc the kept xattrs e did not record (acl 0: the ACL stays). */
static int meta_prune(const char *proc, const struct cb_entry *e, int acl)
{
	char *list = NULL;
	ssize_t n = listxattr(proc, NULL, 0);
	int ret = 0;

	if (n <= 0)
		return n < 0 && errno != ENOTSUP && errno != ENOSYS
			   ? cb_error_set(errno, "%s: list xattrs: %s", e->path, strerror(errno))
			   : 0;
	if (!(list = malloc((size_t)n + 1)))
		return cb_error_set(ENOMEM, "%s: xattrs: out of memory", e->path);
	n = listxattr(proc, list, (size_t)n);
	if (n < 0)
		ret = cb_error_set(errno, "%s: list xattrs: %s", e->path, strerror(errno));
	for (char *p = list; n > 0 && p < list + n && !ret; p += strlen(p) + 1) {
		if (!meta_kept_name(p) || (!acl && !strcmp(p, META_ACL)) || meta_recorded(e, p))
			continue;
		if (removexattr(proc, p) < 0 && errno != ENODATA)
			ret = cb_error_set(errno, "remove xattr %s of %s: %s", p, e->path,
					   strerror(errno));
	}
	free(list);
	return ret;
}

int ws_restore_xattrs(int dst, const struct cb_entry *e, long long id_base, int acl, int prune)
{
	const unsigned char *p = e->xattrs, *end = e->xattrs + e->xattrs_len;
	unsigned char *value = NULL;
	char name[256], proc[64];
	int ret = 0;

	/* by the /proc name of the descriptor: an O_PATH one (a directory or a file whose
	 * content stays) is fine, and that name is the inode itself, never a path */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dst);
	if (prune && (ret = meta_prune(proc, e, acl)))
		return ret;
	while (p && p + 8 <= end && !ret) {
		uint32_t nlen = meta_get32(p), vlen;

		if (nlen == 0 || nlen >= sizeof(name) || p + 8 + nlen > end ||
		    p + 8 + nlen + meta_get32(p + 4 + nlen) > end)
			return cb_error_set(EBADMSG, "%s: its recorded xattrs are damaged",
					    e->path);
		vlen = meta_get32(p + 4 + nlen);
		memcpy(name, p + 4, nlen);
		name[nlen] = '\0';
		if (!meta_kept_name(name))
			return cb_error_set(EBADMSG,
					    "%s: recorded xattr %s is not one cowbox keeps",
					    e->path, name);
		free(value);
		if (!(value = malloc(vlen ? vlen : 1)))
			return cb_error_set(ENOMEM, "%s: xattrs: out of memory", e->path);
		memcpy(value, p + 8 + nlen, vlen);
		p += 8 + nlen + vlen;
		if (!acl && !strcmp(name, META_ACL))
			continue;
		/* An ACL's named ids: the sandbox's own, made host ids of the range written to
		 * (without one, as recorded). */
		if (!strcmp(name, META_ACL) && id_base >= 0)
			meta_acl_ids(value, vlen, id_base);
		if (setxattr(proc, name, value, vlen, 0) < 0)
			ret = cb_error_set(errno, "restore xattr %s of %s: %s", name, e->path,
					   strerror(errno));
	}
	free(value);
	return ret;
}

/* e's recorded time as utimensat's pair, the access time left as it is. */
static void meta_times(const struct cb_entry *e, struct timespec ts[2])
{
	ts[0] = (struct timespec){.tv_nsec = UTIME_OMIT};
	ts[1].tv_sec = (time_t)(e->mtime_ns / 1000000000LL);
	ts[1].tv_nsec = (long)(e->mtime_ns % 1000000000LL);
	if (ts[1].tv_nsec < 0) { /* before 1970 */
		ts[1].tv_sec--;
		ts[1].tv_nsec += 1000000000L;
	}
}

int ws_restore_time_at(int root, const struct cb_entry *e)
{
	struct timespec ts[2];
	int ret;

	if (!e->has_mtime)
		return 0;
	meta_times(e, ts);
	ret = cb_beneath_utimens(root, e->path, ts);
	return ret ? cb_error_wrap(ret, "restore the time of %s", e->path) : 0;
}

int ws_restore_meta_at(int root, const struct cb_entry *e, long long id_base, int acl,
		       const struct cb_beneath_setid *setid, int time)
{
	int fd, ret = 0;

	if (e->has_owner && id_base >= 0)
		ret = cb_beneath_chown(root, e->path, (uid_t)(id_base + e->uid),
				       (gid_t)(id_base + e->gid));
	/* the mode after the owner (a chown drops set-id bits), the xattrs after the mode (an
	 * ACL and the mode share the group bits) */
	if (!ret && e->type != CB_ENTRY_SYMLINK)
		ret = cb_beneath_chmod(root, e->path, e->mode, setid);
	if (ret)
		return cb_error_wrap(ret, "restore %s", e->path);
	if (e->type != CB_ENTRY_SYMLINK) {
		fd = cb_beneath_open(root, e->path, O_PATH | O_NOFOLLOW, 0);
		if (fd < 0)
			return cb_error_wrap(fd, "restore %s", e->path);
		/* an entry without a recorded time recorded no xattrs either: left */
		ret = e->has_mtime ? ws_restore_xattrs(fd, e, id_base, acl, 1) : 0;
		close(fd);
	}
	return !ret && time ? ws_restore_time_at(root, e) : ret;
}

int ws_restore_mtime(int dst, const struct cb_entry *e, int src)
{
	struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {0}};
	struct stat st;

	if (e->has_mtime) {
		meta_times(e, ts);
	} else if (src >= 0 && fstat(src, &st) == 0) {
		ts[1] = st.st_mtim;
	} else {
		return 0;
	}
	if (futimens(dst, ts) < 0)
		return cb_error_set(errno, "restore the time of %s: %s", e->path, strerror(errno));
	return 0;
}
