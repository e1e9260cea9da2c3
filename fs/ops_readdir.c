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
	ino_t ino;  /* what the listing reports */
	ino_t rino; /* the entry's inode number in its layer (0 for "." and "..") */
	unsigned char type;
	unsigned char layer; /* OV_UPPER or OV_BASE */
};

/* One pass's merged listing of a directory, hung on its inode (no OPENDIR gives us a handle
 * to keep it in: the kernel opens directories itself). A READDIR offset names the listing and
 * the index in it, so a pass continues in the snapshot it started with even when another pass
 * of the same directory began meanwhile. */
struct ov_listing {
	uint32_t id;
	struct ov_dirent *ents;
	size_t count, cap;
	char **seen; /* while loading: names in upper (open addressing), merged with the base */
	size_t seen_cap, seen_count;
	struct ov_listing *older; /* the previous pass's listing, for a pass still reading it */
};

/* Offsets: the listing's id above bit 32, the index of the next entry below (0: start). */
#define OV_OFF_ID(off)	  ((uint32_t)((uint64_t)(off) >> 32))
#define OV_OFF_INDEX(off) ((size_t)((uint64_t)(off)&0xffffffffu))
#define OV_OFF(id, i)	  ((off_t)(((uint64_t)(id) << 32) | (uint64_t)(i)))

static _Atomic uint32_t ov_listing_ids;

static uint64_t ov_str_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;

	while (*s)
		h = (h ^ (unsigned char)*s++) * 1099511628211ull;
	return h;
}

static int ov_seen_add(struct ov_listing *d, const char *name)
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

static int ov_seen_has(const struct ov_listing *d, const char *name)
{
	size_t i;

	if (!d->seen_cap)
		return 0;
	for (i = ov_str_hash(name) & (d->seen_cap - 1); d->seen[i]; i = (i + 1) & (d->seen_cap - 1))
		if (strcmp(d->seen[i], name) == 0)
			return 1;
	return 0;
}

static void ov_seen_clear(struct ov_listing *d)
{
	size_t i;

	for (i = 0; i < d->seen_cap; i++)
		free(d->seen[i]);
	free(d->seen);
	d->seen = NULL;
	d->seen_cap = d->seen_count = 0;
}

/* See ov.h: frees l and the older listings it keeps. */
void ov_listing_free(struct ov_listing *l)
{
	struct ov_listing *older;
	size_t i;

	for (; l; l = older) {
		older = l->older;
		for (i = 0; i < l->count; i++)
			free(l->ents[i].name);
		ov_seen_clear(l);
		free(l->ents);
		free(l);
	}
}

static int ov_dir_add(struct ov_listing *d, const char *name, ino_t ino, unsigned char type,
		      int layer, ino_t rino)
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
	d->ents[d->count].rino = rino;
	d->ents[d->count].type = type;
	d->ents[d->count].layer = (unsigned char)layer;
	d->count++;
	return 0;
}

/* Reads one layer's directory at path into d; upper whiteouts and names are remembered so
 * the base pass skips them. */
static int ov_dir_read_layer(struct cb_overlay *ov, struct ov_listing *d, int layer,
			     const char *path, int merged)
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
				r = ov_dir_add(d, de->d_name, ino, de->d_type, OV_BASE, ino);
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
		r = ov_dir_add(d, de->d_name, ino, de->d_type, OV_UPPER, de->d_ino);
		if (r == 0 && merged)
			r = ov_seen_add(d, de->d_name);
	}
	closedir(dir);
	return r;
}

/* A new listing of in, the merged entries of its layers now. Caller holds ns read. */
static int ov_dir_load(struct cb_overlay *ov, struct ov_inode *in, struct ov_listing **out)
{
	struct ov_listing *d = calloc(1, sizeof(*d));
	char *path = NULL;
	int r;

	*out = NULL;
	if (!d)
		return -ENOMEM;
	while (!(d->id = atomic_fetch_add(&ov_listing_ids, 1) & 0x7fffffffu))
		;
	r = ov_path(&ov->tab, in, NULL, &path);
	if (r < 0)
		goto out;
	/* glibc hides entries whose inode number is 0 */
	if ((r = ov_dir_add(d, ".", in->st_ino, DT_DIR, OV_UPPER, 0)) < 0 ||
	    (r = ov_dir_add(d, "..", in->names ? in->names->parent->st_ino : in->st_ino, DT_DIR,
			    OV_UPPER, 0)) < 0)
		goto out;
	if (atomic_load(&in->layer) == OV_UPPER)
		r = ov_dir_read_layer(ov, d, OV_UPPER, path, in->merged);
	if (r == 0 && in->merged)
		r = ov_dir_read_layer(ov, d, OV_BASE, path, 0);
out:
	free(path);
	ov_seen_clear(d);
	if (r < 0)
		ov_listing_free(d);
	else
		*out = d;
	return r;
}

/* The listing a pass at off reads: a new one at the start of a pass (the one before it kept
 * for a pass still reading it), else the one off names; a listing gone meanwhile (a third pass
 * began) is read again and continued at the same index, as if the directory had changed.
 * Caller holds ns read and the inode's listing lock. */
static int ov_listing_for(struct cb_overlay *ov, struct ov_inode *in, off_t off,
			  struct ov_listing **out)
{
	struct ov_listing *l = in->listing;
	int r;

	if (off != 0) {
		for (; l; l = l->older)
			if (l->id == OV_OFF_ID(off))
				break;
		if (l) {
			*out = l;
			return 0;
		}
	}
	r = ov_dir_load(ov, in, &l);
	if (r < 0)
		return r;
	if (in->listing) {
		ov_listing_free(in->listing->older);
		in->listing->older = NULL;
	}
	l->older = in->listing;
	in->listing = l;
	*out = l;
	return 0;
}

/* Lets go of l, read to its end (a pass still reading an older one keeps that). A pass that
 * stops early leaves its listing until the next pass of the directory or its FORGET. */
static void ov_listing_done(struct ov_inode *in, struct ov_listing *l)
{
	struct ov_listing **p;

	for (p = &in->listing; *p && *p != l; p = &(*p)->older)
		;
	if (*p) {
		*p = l->older;
		l->older = NULL;
		ov_listing_free(l);
	}
}

static pthread_mutex_t *ov_listing_lock(struct cb_overlay *ov, const struct ov_inode *in)
{
	return &ov->listing_locks[((uintptr_t)in >> 6) % OV_LISTING_LOCKS];
}

/* Whether the kernel already holds the inode dir/de->name is (a LOOKUP answered it and no FORGET
 * took it back): then READDIRPLUS need not look the entry up again. Not for directories: the
 * kernel can hold one's inode without its dentry (after an untar, rm -rf then sent a LOOKUP
 * for every directory a bare entry left unlinked), and a full entry puts the dentry back as
 * before; they are few beside the files. Caller holds ns read. */
static int ov_entry_known(struct cb_overlay *ov, struct ov_inode *dir, const struct ov_dirent *de)
{
	struct ov_inode *in;
	int known;

	if (!de->rino || de->type == DT_DIR || de->type == DT_UNKNOWN)
		return 0;
	cb_mutex_lock(&ov->tab.lock);
	in =
	    ov_table_find(&ov->tab, de->layer == OV_UPPER ? ov->root->dev : ov->base_dev, de->rino);
	known = in && in->nlookup > 0 && atomic_load(&in->layer) == de->layer &&
		ov_inode_has_name(&ov->tab, in, dir, de->name);
	cb_mutex_unlock(&ov->tab.lock);
	return known;
}

static void ov_readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	pthread_mutex_t *lock = ov_listing_lock(ov, in);
	struct ov_listing *d = NULL;
	char *buf = malloc(size), *p = buf;
	size_t rem = size, i;
	int r = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	cb_rwlock_read(&ov->tab.ns);
	pthread_mutex_lock(lock);
	r = ov_listing_for(ov, in, off, &d);
	for (i = off ? OV_OFF_INDEX(off) : 0; r == 0 && i < d->count; i++) {
		struct ov_dirent *de = &d->ents[i];
		size_t n;
		if (plus) {
			struct fuse_entry_param e;
			/* An entry without a node id (".", "..", a name the kernel already holds)
			 * leaves the kernel's dentry and attributes of that name as they are:
			 * they are ours, and a changed base invalidates them (base_changed.c).
			 * Looking a held name up again would cost a stat in the layer for nothing,
			 * per entry: git status lists every directory right after it lstat'ed
			 * every file in it. */
			int bare = strcmp(de->name, ".") == 0 || strcmp(de->name, "..") == 0 ||
				   ov_entry_known(ov, in, de);
			if (bare || ov_lookup_child(ov, in, de->name, &e) < 0) {
				memset(&e, 0, sizeof(e));
				e.attr.st_ino = de->ino;
				e.attr.st_mode = (mode_t)de->type << 12;
				if (!bare)
					continue; /* gone since the listing was read */
			}
			n = fuse_add_direntry_plus(req, p, rem, de->name, &e, OV_OFF(d->id, i + 1));
			if (n > rem) {
				if (e.ino)
					ov_forget_one(ov, ov_inode_get(ov, e.ino), 1);
				break;
			}
		} else {
			struct stat st = {.st_ino = de->ino, .st_mode = (mode_t)de->type << 12};
			n = fuse_add_direntry(req, p, rem, de->name, &st, OV_OFF(d->id, i + 1));
			if (n > rem)
				break;
		}
		p += n;
		rem -= n;
	}
	if (r == 0 && p == buf)
		ov_listing_done(in, d); /* the end of the pass */
	pthread_mutex_unlock(lock);
	cb_rwlock_unlock(&ov->tab.ns);
	if (r < 0 && p == buf)
		fuse_reply_err(req, -r);
	else
		fuse_reply_buf(req, buf, size - rem);
	free(buf);
}

/* OPENDIR: nothing to keep per open (listings hang on the inode). Where the kernel can open
 * directories itself, ENOSYS tells it to, and it stops sending OPENDIR and RELEASEDIR (two
 * round trips per directory a find or git status opens) and caches listings as below. */
void ov_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	if (atomic_load(&ov_of(req)->no_opendir)) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	fi->fh = 0;
	/* every change to a directory goes through the kernel, which then drops its cached
	 * listing: let it keep listings between opens */
	fi->cache_readdir = 1;
	fi->keep_cache = 1;
	fuse_reply_open(req, fi);
}

/* READDIR: the merged listing of upper and base, whiteouts hidden. */
void ov_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	(void)fi;
	ov_readdir_common(req, ino, size, off, 0);
}

/* READDIRPLUS: READDIR with each entry looked up (one kernel reference each). */
void ov_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	(void)fi;
	ov_readdir_common(req, ino, size, off, 1);
}

/* RELEASEDIR: nothing to free (a listing goes at the end of its pass, or with its inode). */
void ov_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
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
