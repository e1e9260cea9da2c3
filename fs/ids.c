/* Ownership as a workspace's sandbox sees it: host ids below 65536 live in the sandbox's own
 * host range [id_base, id_base + 65536), and no setuid/setgid bit names an owner outside it. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ov.h"

#define OV_IDS 65536UL

uid_t ov_id_store(const struct cb_overlay *ov, uid_t id)
{
	unsigned long base = atomic_load_explicit(&ov->id_base, memory_order_relaxed);
	if (!base || id == (uid_t)-1 || id >= OV_IDS)
		return id;
	return (uid_t)(base + id);
}

/* With owner_squash, the sandbox's root (host id_base) and the folder's owner are one owner:
 * stored as the owner, so that the user's folder keeps the user's files; shown as root, so
 * that the sandbox may change them. Only in place (the upper layer is the user's folder). */
static int ov_squashing(const struct cb_overlay *ov, unsigned long *base)
{
	*base = atomic_load_explicit(&ov->id_base, memory_order_relaxed);
	return ov->owner_squash && *base;
}

uid_t ov_uid_disk(const struct cb_overlay *ov, uid_t id)
{
	unsigned long base;
	uid_t host = ov_id_store(ov, id);

	return ov_squashing(ov, &base) && host == (uid_t)base ? ov->owner_uid : host;
}

gid_t ov_gid_disk(const struct cb_overlay *ov, gid_t id)
{
	unsigned long base;
	gid_t host = (gid_t)ov_id_store(ov, (uid_t)id);

	return ov_squashing(ov, &base) && host == (gid_t)base ? ov->owner_gid : host;
}

void ov_ids_present(const struct cb_overlay *ov, struct stat *st)
{
	unsigned long base;
	int squash = ov_squashing(ov, &base);

	st->st_uid =
	    squash && st->st_uid == ov->owner_uid ? (uid_t)base : ov_id_store(ov, st->st_uid);
	st->st_gid = squash && st->st_gid == ov->owner_gid
			 ? (gid_t)base
			 : (gid_t)ov_id_store(ov, (uid_t)st->st_gid);
}

mode_t ov_mode_allowed(const struct cb_overlay *ov, mode_t mode, uid_t uid, gid_t gid)
{
	unsigned long base = atomic_load_explicit(&ov->id_base, memory_order_relaxed);
	if (!base)
		return mode;
	/* as the kernel does on chown: a set-id bit would hand its owner to whoever runs it */
	if (!(uid >= base && uid - base < OV_IDS))
		mode &= ~(mode_t)S_ISUID;
	if (!S_ISDIR(mode) && !(gid >= base && gid - base < OV_IDS))
		mode &= ~(mode_t)S_ISGID;
	return mode;
}

/* 1 for the xattrs that hold a POSIX ACL (they name users and groups by id). */
int ov_acl_xattr(const char *name)
{
	return !strcmp(name, "system.posix_acl_access") ||
	       !strcmp(name, "system.posix_acl_default");
}

/* The xattr form of an ACL (the kernel's posix_acl_xattr_header and _entry): a le32 version
 * (2), then 8-byte entries of le16 tag, le16 perm and le32 id; only ACL_USER and ACL_GROUP
 * entries carry an id. */
#define OV_ACL_VERSION 2
#define OV_ACL_USER    0x02
#define OV_ACL_GROUP   0x08

static unsigned long le_get(const unsigned char *p, int bytes)
{
	unsigned long v = 0;

	for (int i = bytes - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* The ids of an ACL get the same shift as owners (ov_id_store): the kernel hands us the
 * sandbox's ids already in the host's view (B + id), but a host caller's or a base file's
 * ids below 65536 would otherwise grant host users access in upper/ and show as nobody
 * inside. refuse: an id that lands outside [B, B + 65536) is -EINVAL (what the sandbox's
 * own kernel says for an id it has no mapping for), for a value being set. */
int ov_acl_shift(const struct cb_overlay *ov, void *value, size_t size, int refuse)
{
	unsigned long base = atomic_load_explicit(&ov->id_base, memory_order_relaxed);
	unsigned char *p = value;

	if (!base)
		return 0;
	/* Not an ACL the kernel would take: it refuses it itself, we change nothing. */
	if (size < 4 || (size - 4) % 8 || le_get(p, 4) != OV_ACL_VERSION)
		return 0;
	for (size_t off = 4; off < size; off += 8) {
		unsigned long tag = le_get(p + off, 2), id = le_get(p + off + 4, 4), shifted;

		if (tag != OV_ACL_USER && tag != OV_ACL_GROUP)
			continue;
		shifted = ov_id_store(ov, (uid_t)id);
		if (refuse && !(shifted >= base && shifted - base < OV_IDS))
			return -EINVAL;
		for (int i = 0; i < 4; i++)
			p[off + 4 + i] = (unsigned char)(shifted >> (8 * i));
	}
	return 0;
}

void cb_overlay_set_id_base(struct cb_overlay *ov, unsigned long id_base)
{
	fuse_ino_t *inos = NULL;
	size_t n = 0, cap = 0;

	if (atomic_exchange(&ov->id_base, id_base) == id_base)
		return;
	/* every inode the kernel may hold attributes of; a stale one is ignored by it */
	cb_mutex_lock(&ov->tab.lock);
	for (struct ov_inode *in = ov->tab.all; in; in = in->all_next)
		if (in->nlookup || in->is_root) {
			if (n == cap) {
				size_t ncap = cap ? 2 * cap : 64;
				fuse_ino_t *grown = realloc(inos, ncap * sizeof(*inos));
				if (!grown)
					break;
				inos = grown;
				cap = ncap;
			}
			inos[n++] = in->is_root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
		}
	cb_mutex_unlock(&ov->tab.lock);
	for (size_t i = 0; ov->se && i < n; i++)
		fuse_lowlevel_notify_inval_inode(ov->se, inos[i], -1, 0);
	free(inos);
}
