/* The upper layer's quota: bytes and inodes counted once at mount (a walk of upper/), then
 * kept exact by the operations, each checked before it changes upper/ and adjusted after. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

#define OV_QUOTA_BLOCK 4096ULL

/* See ov.h. Apparent size, not blocks: a sparse file costs its length, so a hole cannot be
 * used to get past the quota. */
unsigned long long ov_quota_cost(mode_t mode, off_t size)
{
	if (!S_ISREG(mode))
		return OV_QUOTA_BLOCK;
	return size <= 0 ? 0
			 : ((unsigned long long)size + OV_QUOTA_BLOCK - 1) & ~(OV_QUOTA_BLOCK - 1);
}

/* See ov.h. */
unsigned long long ov_quota_xattr_cost(const char *path)
{
	ssize_t n = llistxattr(path, NULL, 0);
	unsigned long long cost = 0;
	char *names;

	if (n <= 0 || !(names = malloc((size_t)n)))
		return 0;
	n = llistxattr(path, names, (size_t)n);
	for (char *p = names; n > 0 && p < names + n; p += strlen(p) + 1) {
		ssize_t v = ov_name_is_private(p) ? -1 : lgetxattr(path, p, NULL, 0);

		if (v >= 0)
			cost += strlen(p) + (unsigned long long)v;
	}
	free(names);
	return cost;
}

/* See ov.h. */
long long ov_quota_xattr_gone(struct cb_overlay *ov, const char *path, const struct stat *st)
{
	unsigned long long cost;
	char *p = NULL;
	int held = -1;

	/* another name keeps a hard-linked file's xattrs; a symlink's cannot be user.* */
	if (!atomic_load(&ov->quota_on) || S_ISLNK(st->st_mode) ||
	    (S_ISREG(st->st_mode) && st->st_nlink > 1) ||
	    ov_proc_path(ov->upper_fd, path, &p, &held))
		return 0;
	cost = ov_quota_xattr_cost(p);
	ov_proc_path_free(p, held);
	return (long long)cost;
}

/* See ov.h. */
long long ov_quota_xattr_copied(struct cb_overlay *ov, const char *path, const struct stat *st)
{
	unsigned long long cost;
	char *p = NULL;
	int held = -1;

	/* the walk of upper/ counts no symlink's xattrs either */
	if (!atomic_load(&ov->quota_on) || S_ISLNK(st->st_mode) ||
	    ov_proc_path(ov->base_fd, path, &p, &held))
		return 0;
	cost = ov_quota_xattr_cost(p);
	ov_proc_path_free(p, held);
	return (long long)cost;
}

/* The largest size a file of upper/ may have: found with an unnamed file (O_TMPFILE) that
 * ftruncate makes sparse (no block is used) by halving; 2^63-1 when it cannot be found. */
static long long ov_upper_max_size(struct cb_overlay *ov)
{
	long long lo = 1LL << 20, hi = 0x7fffffffffffffffLL;
	int fd = openat(ov->upper_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0 || ftruncate(fd, lo) < 0) {
		if (fd >= 0)
			close(fd);
		return hi;
	}
	if (ftruncate(fd, hi) == 0) {
		close(fd);
		return hi;
	}
	/* lo fits, hi does not */
	while (hi - lo > 1) {
		long long mid = lo + (hi - lo) / 2;

		if (ftruncate(fd, mid) == 0)
			lo = mid;
		else if (errno == EFBIG || errno == EINVAL)
			hi = mid;
		else
			break;
	}
	close(fd);
	return lo;
}

/* See ov.h. */
int ov_quota_take(struct cb_overlay *ov, long long bytes, long long inodes)
{
	unsigned long long lim_b = atomic_load(&ov->quota_bytes);
	unsigned long long lim_i = atomic_load(&ov->quota_inodes);

	if (!atomic_load(&ov->quota_on))
		return 0;
	pthread_mutex_lock(&ov->quota_lock);
	if ((bytes > 0 && lim_b && ov->used_bytes + (unsigned long long)bytes > lim_b) ||
	    (inodes > 0 && lim_i && ov->used_inodes + (unsigned long long)inodes > lim_i)) {
		pthread_mutex_unlock(&ov->quota_lock);
		return -ENOSPC;
	}
	ov->used_bytes += (unsigned long long)bytes;
	ov->used_inodes += (unsigned long long)inodes;
	pthread_mutex_unlock(&ov->quota_lock);
	return 0;
}

/* See ov.h. Never fails and never goes below 0 (a count that drifted heals at the next
 * mount's walk). */
void ov_quota_give(struct cb_overlay *ov, long long bytes, long long inodes)
{
	if (!atomic_load(&ov->quota_on))
		return;
	pthread_mutex_lock(&ov->quota_lock);
	if (bytes < 0 || (unsigned long long)bytes <= ov->used_bytes)
		ov->used_bytes -= (unsigned long long)bytes;
	else
		ov->used_bytes = 0;
	if (inodes < 0 || (unsigned long long)inodes <= ov->used_inodes)
		ov->used_inodes -= (unsigned long long)inodes;
	else
		ov->used_inodes = 0;
	pthread_mutex_unlock(&ov->quota_lock);
}

/* See ov.h. */
int ov_quota_resize_begin(struct cb_overlay *ov, struct ov_inode *in, int fd, off_t new_end,
			  struct ov_quota_resize *q)
{
	struct stat st;
	int r;

	q->in = NULL;
	if (!atomic_load(&ov->quota_on) || !atomic_load(&ov->quota_bytes))
		return 0;
	if (ov->upper_max_size && new_end > ov->upper_max_size)
		return -EFBIG; /* what the filesystem itself would say: no quota could allow it */
	cb_mutex_lock(&in->lock);
	if (fstat(fd, &st) < 0) {
		r = -errno;
		cb_mutex_unlock(&in->lock);
		return r;
	}
	q->in = in;
	q->fd = fd;
	q->before = ov_quota_cost(S_IFREG, st.st_size);
	q->taken =
	    new_end > st.st_size ? (long long)(ov_quota_cost(S_IFREG, new_end) - q->before) : 0;
	r = ov_quota_take(ov, q->taken, 0);
	if (r < 0) {
		q->in = NULL;
		cb_mutex_unlock(&in->lock);
	}
	return r;
}

/* See ov.h. */
void ov_quota_resize_end(struct cb_overlay *ov, struct ov_quota_resize *q)
{
	struct stat st;
	long long after;

	if (!q->in)
		return;
	after = fstat(q->fd, &st) == 0 ? (long long)ov_quota_cost(S_IFREG, st.st_size)
				       : (long long)q->before + q->taken;
	/* what the operation really did, against what was taken for it */
	ov_quota_give(ov, (long long)q->before + q->taken - after, 0);
	cb_mutex_unlock(&q->in->lock);
	q->in = NULL;
}

/* See ov.h. */
void ov_quota_gone(struct cb_overlay *ov, const struct stat *st)
{
	if (S_ISREG(st->st_mode) && st->st_nlink > 1)
		return; /* another name keeps the bytes */
	ov_quota_give(ov, (long long)ov_quota_cost(st->st_mode, st->st_size), 1);
}

struct ov_quota_walk {
	unsigned long long bytes, inodes;
	struct {
		dev_t dev;
		ino_t ino;
	} * linked; /* hard-linked files seen, so that each counts once */
	size_t nlinked, caplinked;
};

static int ov_quota_seen(struct ov_quota_walk *w, const struct stat *st)
{
	for (size_t i = 0; i < w->nlinked; i++)
		if (w->linked[i].dev == st->st_dev && w->linked[i].ino == st->st_ino)
			return 1;
	if (w->nlinked == w->caplinked) {
		size_t cap = w->caplinked ? w->caplinked * 2 : 64;
		void *p = realloc(w->linked, cap * sizeof(*w->linked));

		if (!p)
			return 0; /* counted twice: too much, never too little */
		w->linked = p;
		w->caplinked = cap;
	}
	w->linked[w->nlinked].dev = st->st_dev;
	w->linked[w->nlinked].ino = st->st_ino;
	w->nlinked++;
	return 0;
}

/* Adds what the directory dirfd (closed here) holds, whiteouts excepted. */
static int ov_quota_walk_dir(struct ov_quota_walk *w, int dirfd)
{
	DIR *d = fdopendir(dirfd);
	struct dirent *de;
	int r = 0;

	if (!d) {
		r = -errno;
		close(dirfd);
		return r;
	}
	while (r == 0 && (de = readdir(d))) {
		struct stat st;
		int fd;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT)
				r = -errno;
			continue;
		}
		if (ov_is_whiteout(&st) ||
		    (S_ISREG(st.st_mode) && st.st_nlink > 1 && ov_quota_seen(w, &st)))
			continue;
		w->bytes += ov_quota_cost(st.st_mode, st.st_size);
		w->inodes++;
		if (!S_ISLNK(st.st_mode)) {
			char path[64 + 256];

			snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dirfd, de->d_name);
			w->bytes += ov_quota_xattr_cost(path);
		}
		if (!S_ISDIR(st.st_mode))
			continue;
		fd = openat(dirfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			r = -errno;
		else
			r = ov_quota_walk_dir(w, fd);
	}
	closedir(d);
	return r;
}

/* See overlay.h. */
int cb_overlay_set_quota(struct cb_overlay *ov, unsigned long long bytes, unsigned long long inodes)
{
	struct ov_quota_walk w = {0};
	int fd, r = 0;

	atomic_store(&ov->quota_bytes, bytes);
	atomic_store(&ov->quota_inodes, inodes);
	if (!bytes && !inodes) {
		atomic_store(&ov->quota_on, 0);
		return 0;
	}
	if (atomic_load(&ov->quota_on))
		return 0; /* counting already */
	ov->upper_max_size = ov_upper_max_size(ov);
	fd = openat(ov->upper_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	r = fd < 0 ? -errno : ov_quota_walk_dir(&w, fd);
	free(w.linked);
	if (r < 0)
		return cb_error_set(-r, "quota: counting the upper layer: %s", strerror(-r));
	pthread_mutex_lock(&ov->quota_lock);
	ov->used_bytes = w.bytes;
	ov->used_inodes = w.inodes;
	pthread_mutex_unlock(&ov->quota_lock);
	atomic_store(&ov->quota_on, 1);
	return 0;
}

/* See ov.h. Below max(64 MiB, 2% of the quota) left, files opened for writing skip the
 * writeback cache, so that write(2) itself meets the quota. */
int ov_quota_low(struct cb_overlay *ov)
{
	unsigned long long lim = atomic_load(&ov->quota_bytes), left, near;

	if (!lim || !atomic_load(&ov->quota_on))
		return 0;
	pthread_mutex_lock(&ov->quota_lock);
	left = ov->used_bytes < lim ? lim - ov->used_bytes : 0;
	pthread_mutex_unlock(&ov->quota_lock);
	near = lim / 50 > (64ULL << 20) ? lim / 50 : 64ULL << 20;
	return left < near;
}

/* See overlay.h. */
void cb_overlay_quota_info(struct cb_overlay *ov, struct cb_overlay_quota *out)
{
	memset(out, 0, sizeof(*out));
	if (!ov)
		return;
	out->limit_bytes = atomic_load(&ov->quota_bytes);
	out->limit_inodes = atomic_load(&ov->quota_inodes);
	if (!atomic_load(&ov->quota_on))
		return;
	pthread_mutex_lock(&ov->quota_lock);
	out->used_bytes = ov->used_bytes;
	out->used_inodes = ov->used_inodes;
	pthread_mutex_unlock(&ov->quota_lock);
}
