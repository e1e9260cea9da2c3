/* Ownership as a workspace's sandbox sees it: host ids below 65536 live in the sandbox's own
 * host range [id_base, id_base + 65536), and no setuid/setgid bit names an owner outside it. */
#include "config.h"

#include <stdlib.h>

#include "ov.h"

#define OV_IDS 65536UL

uid_t ov_id_store(const struct cb_overlay *ov, uid_t id)
{
	unsigned long base = atomic_load_explicit(&ov->id_base, memory_order_relaxed);
	if (!base || id == (uid_t)-1 || id >= OV_IDS)
		return id;
	return (uid_t)(base + id);
}

void ov_ids_present(const struct cb_overlay *ov, struct stat *st)
{
	st->st_uid = ov_id_store(ov, st->st_uid);
	st->st_gid = (gid_t)ov_id_store(ov, (uid_t)st->st_gid);
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

void cb_overlay_set_id_base(struct cb_overlay *ov, unsigned long id_base)
{
	fuse_ino_t *inos = NULL;
	size_t n = 0, cap = 0;

	if (atomic_exchange(&ov->id_base, id_base) == id_base)
		return;
	/* every inode the kernel may hold attributes of; a stale one is ignored by it */
	pthread_mutex_lock(&ov->tab_lock);
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
	pthread_mutex_unlock(&ov->tab_lock);
	for (size_t i = 0; ov->se && i < n; i++)
		fuse_lowlevel_notify_inval_inode(ov->se, inos[i], -1, 0);
	free(inos);
}
