/* Directory listing: the merged entries of upper and base (minus whiteouts and what upper
 * hides), read once per pass so offsets stay stable; readdirplus, fsyncdir. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ov.h"

struct ov_dirent {
	char *name;
	ino_t ino;
	unsigned char type;
};

struct ov_dir {
	struct ov_handle h; /* first: a listing is its handle */
	struct cb_overlay *overlay;
	struct ov_dirent *ents;
	size_t count, cap;
	char **seen; /* names in upper (open addressing), for merging with the base */
	size_t seen_cap, seen_count;
	pthread_mutex_t lock;
};

static uint64_t ov_str_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

static int ov_seen_add(struct ov_dir *d, const char *name)
{
	size_t i;

	if (d->seen_cap == 0 || (d->seen_count + 1) * 2 > d->seen_cap) {
		size_t cap = d->seen_cap ? d->seen_cap * 2 : 64, j;
		char **n = calloc(cap, sizeof(*n));
		if (!n)
			return -ENOMEM;
		for (j = 0; j < d->seen_cap; j++) {
			if (!d->seen[j])
				continue;
			for (i = ov_str_hash(d->seen[j]) & (cap - 1); n[i]; i = (i + 1) & (cap - 1))
				;
			n[i] = d->seen[j];
		}
		free(d->seen);
		d->seen = n;
		d->seen_cap = cap;
	}
	for (i = ov_str_hash(name) & (d->seen_cap - 1); d->seen[i]; i = (i + 1) & (d->seen_cap - 1))
		if (strcmp(d->seen[i], name) == 0)
			return 0;
	d->seen[i] = strdup(name);
	if (!d->seen[i])
		return -ENOMEM;
	d->seen_count++;
	return 0;
}

static int ov_seen_has(const struct ov_dir *d, const char *name)
{
	size_t i;

	if (!d->seen_cap)
		return 0;
	for (i = ov_str_hash(name) & (d->seen_cap - 1); d->seen[i]; i = (i + 1) & (d->seen_cap - 1))
		if (strcmp(d->seen[i], name) == 0)
			return 1;
	return 0;
}

static void ov_dir_clear(struct ov_dir *d)
{
	size_t i;

	for (i = 0; i < d->count; i++)
		free(d->ents[i].name);
	for (i = 0; i < d->seen_cap; i++)
		free(d->seen[i]);
	free(d->seen);
	d->seen = NULL;
	d->seen_cap = d->seen_count = 0;
	d->count = 0;
}

static int ov_dir_add(struct ov_dir *d, const char *name, ino_t ino, unsigned char type)
{
	if (d->count == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 32;
		struct ov_dirent *n = realloc(d->ents, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		d->ents = n;
		d->cap = cap;
	}
	d->ents[d->count].name = strdup(name);
	if (!d->ents[d->count].name)
		return -ENOMEM;
	d->ents[d->count].ino = ino;
	d->ents[d->count].type = type;
	d->count++;
	return 0;
}

/* Reads one layer's directory at path into d; upper whiteouts and names are remembered so
 * the base pass skips them. */
static int ov_dir_read_layer(struct cb_overlay *ov, struct ov_dir *d, int layer, const char *path,
			     int merged)
{
	int fd = ov_openat(ov_layer_fd(ov, layer), path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	int r = 0;
	DIR *dir;
	struct dirent *de;

	if (fd < 0)
		return layer == OV_BASE && (errno == ENOENT || errno == ENOTDIR) ? 0 : -errno;
	dir = fdopendir(fd);
	if (!dir) {
		r = -errno;
		close(fd);
		return r;
	}
	while (r == 0 && (de = readdir(dir))) {
		ino_t ino = de->d_ino;
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (layer == OV_BASE) {
			if (!ov_seen_has(d, de->d_name))
				r = ov_dir_add(d, de->d_name, ino, de->d_type);
			continue;
		}
		if (de->d_type == DT_CHR || de->d_type == DT_UNKNOWN) {
			struct stat st;
			if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    ov_is_whiteout(&st)) {
				if (merged)
					r = ov_seen_add(d, de->d_name);
				continue;
			}
		}
		{
			struct ov_inode *in;
			cb_mutex_lock(&ov->tab.lock);
			in = ov_table_find(&ov->tab, ov->root->dev, ino);
			if (in)
				ino = in->st_ino;
			cb_mutex_unlock(&ov->tab.lock);
		}
		r = ov_dir_add(d, de->d_name, ino, de->d_type);
		if (r == 0 && merged)
			r = ov_seen_add(d, de->d_name);
	}
	closedir(dir);
	return r;
}

/* (Re)reads the merged listing of in. Caller holds ns read and d->lock. */
static int ov_dir_load(struct cb_overlay *ov, struct ov_inode *in, struct ov_dir *d)
{
	char *path;
	int r;

	ov_dir_clear(d);
	r = ov_path(&ov->tab, in, NULL, &path);
	if (r < 0)
		return r;
	/* glibc hides entries whose inode number is 0 */
	if ((r = ov_dir_add(d, ".", in->st_ino, DT_DIR)) < 0 ||
	    (r = ov_dir_add(d, "..", in->names ? in->names->parent->st_ino : in->st_ino, DT_DIR)) <
		0)
		goto out;
	if (atomic_load(&in->layer) == OV_UPPER)
		r = ov_dir_read_layer(ov, d, OV_UPPER, path, in->merged);
	if (r == 0 && in->merged)
		r = ov_dir_read_layer(ov, d, OV_BASE, path, 0);
out:
	free(path);
	return r;
}

static void ov_dir_free(struct ov_handle *h)
{
	struct ov_dir *d = (struct ov_dir *)h;

	ov_handle_del(d->overlay, h);
	ov_dir_clear(d);
	free(d->ents);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

/* OPENDIR: a listing handle; the merged listing is read at the first READDIR. */
void ov_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ov_dir *d = calloc(1, sizeof(*d));

	(void)ino;
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	pthread_mutex_init(&d->lock, NULL);
	d->overlay = ov_of(req);
	ov_handle_add(d->overlay, &d->h, ov_dir_free);
	fi->fh = (uint64_t)(uintptr_t)d;
	/* every change to a directory goes through the kernel, which then drops its cached
	 * listing: let it keep listings between opens */
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	if (fuse_reply_open(req, fi) == -ENOENT)
		ov_dir_free(&d->h);
}

static void ov_readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			      struct fuse_file_info *fi, int plus)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	struct ov_dir *d = (struct ov_dir *)(uintptr_t)fi->fh;
	char *buf = malloc(size), *p = buf;
	size_t rem = size, i;
	int r = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	cb_rwlock_read(&ov->tab.ns);
	pthread_mutex_lock(&d->lock);
	if (off == 0 || d->count == 0)
		r = ov_dir_load(ov, in, d);
	for (i = (size_t)off; r == 0 && i < d->count; i++) {
		struct ov_dirent *de = &d->ents[i];
		size_t n;
		if (plus) {
			struct fuse_entry_param e;
			int dot = strcmp(de->name, ".") == 0 || strcmp(de->name, "..") == 0;
			if (dot || ov_lookup_child(ov, in, de->name, &e) < 0) {
				memset(&e, 0, sizeof(e));
				e.attr.st_ino = de->ino;
				e.attr.st_mode = (mode_t)de->type << 12;
				if (!dot)
					continue; /* gone since the listing was read */
			}
			n = fuse_add_direntry_plus(req, p, rem, de->name, &e, (off_t)i + 1);
			if (n > rem) {
				if (e.ino)
					ov_forget_one(ov, ov_inode_get(ov, e.ino), 1);
				break;
			}
		} else {
			struct stat st = {.st_ino = de->ino, .st_mode = (mode_t)de->type << 12};
			n = fuse_add_direntry(req, p, rem, de->name, &st, (off_t)i + 1);
			if (n > rem)
				break;
		}
		p += n;
		rem -= n;
	}
	pthread_mutex_unlock(&d->lock);
	cb_rwlock_unlock(&ov->tab.ns);
	if (r < 0 && p == buf)
		fuse_reply_err(req, -r);
	else
		fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

/* READDIR: the merged listing of upper and base, whiteouts hidden. */
void ov_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	ov_readdir_common(req, ino, size, off, fi, 0);
}

/* READDIRPLUS: READDIR with each entry looked up (one kernel reference each). */
void ov_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	ov_readdir_common(req, ino, size, off, fi, 1);
}

/* RELEASEDIR: frees the listing handle. */
void ov_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ov_dir *d = (struct ov_dir *)(uintptr_t)fi->fh;

	(void)ino;
	ov_dir_free(&d->h);
	fuse_reply_err(req, 0);
}

/* FSYNCDIR: the upper directory reaches the disk, then the journal. */
void ov_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	char *path = NULL;
	int fd = -1, r = 0;

	(void)fi;
	cb_rwlock_read(&ov->tab.ns);
	if (atomic_load(&in->layer) == OV_UPPER && ov_path(&ov->tab, in, NULL, &path) >= 0)
		fd = ov_openat(ov->upper_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (fd >= 0) {
		if ((datasync ? fdatasync(fd) : fsync(fd)) < 0)
			r = errno;
		close(fd);
	}
	ov_journal_sync(ov);
	fuse_reply_err(req, r);
}
