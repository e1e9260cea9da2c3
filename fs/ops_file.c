/* FUSE operations on open files: open (copy-up for writing; passthrough to the upper file when
 * the kernel allows), read and write by splice to the layer's fd, fsync, fallocate, etc. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ov.h"

/* Whether f was opened for writing (so it can change the file without asking us). */
int ov_file_writable(const struct ov_file *f)
{
	return (f->flags & O_ACCMODE) != O_RDONLY;
}

#ifdef HAVE_FUSE_PASSTHROUGH
/* Passthrough is for upper files only: a base file's backing would stay the inode's until
 * its last open closes, and the kernel refuses an open with another backing file (the upper
 * one, after a copy-up for writing) meanwhile. Set-id files stay cached, so every write goes
 * by the kernel's suid/sgid clearing through us. */
static int ov_file_backing_ok(struct ov_file *f)
{
	struct stat st;

	if (atomic_load(&f->layer) != OV_UPPER || fstat(f->fd, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	return !(st.st_mode & (S_ISUID | S_ISGID));
}
#endif

/* See ov.h. The kernel fails an open whose mode differs from the inode's other opens, so the
 * counts decide: join the passthrough opens (same backing id), else join the cached ones,
 * else (no other open) passthrough when possible. A failed registration is cached mode. */
void ov_file_choose_mode(fuse_req_t req, struct ov_file *f, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = f->overlay;
	struct ov_inode *in = f->inode;

	(void)req;
	cb_mutex_lock(&in->lock);
#ifdef HAVE_FUSE_PASSTHROUGH
	if (in->backing_opens > 0) {
		in->backing_opens++;
		f->mode = OV_OPEN_BACKING;
		fi->backing_id = in->backing_id;
	} else if (in->cached_opens == 0 && atomic_load(&ov->passthrough) &&
		   !atomic_load(&ov->quota_bytes) && ov_file_backing_ok(f)) {
		/* (a byte quota set after the mount: new opens go through us) */
		int id = fuse_passthrough_open(req, f->fd);

		if (id > 0) {
			in->backing_id = id;
			in->backing_opens = 1;
			f->mode = OV_OPEN_BACKING;
			fi->backing_id = id;
		}
	}
#else
	(void)ov;
#endif
	if (f->mode != OV_OPEN_BACKING) {
		in->cached_opens++;
		f->mode = OV_OPEN_CACHED;
		fi->keep_cache = 1; /* we are the only writer: cached pages stay valid */
	} else {
		fi->keep_cache = 0; /* the backing file's pages are the ones that count */
	}
	cb_mutex_unlock(&in->lock);
}

/* See ov.h. The last passthrough open gives the backing id back (the kernel's open files
 * keep their own reference to the backing file). */
void ov_file_drop_mode(fuse_req_t req, struct ov_file *f)
{
	struct ov_inode *in = f->inode;
	int id = 0, freed = 0;
	struct stat st;

	cb_mutex_lock(&in->lock);
	if (f->mode == OV_OPEN_BACKING && in->backing_opens > 0 && --in->backing_opens == 0) {
		id = in->backing_id;
		in->backing_id = 0;
	} else if (f->mode == OV_OPEN_CACHED && in->cached_opens > 0) {
		in->cached_opens--;
	}
	f->mode = 0;
	/* the last close of an unlinked file: its bytes leave the quota */
	if (in->quota_deferred && !in->backing_opens && !in->cached_opens) {
		in->quota_deferred = 0;
		freed = fstat(f->fd, &st) == 0;
	}
	cb_mutex_unlock(&in->lock);
	if (freed) {
		st.st_nlink = 1;
		ov_quota_gone(f->overlay, &st);
	}
#ifdef HAVE_FUSE_PASSTHROUGH
	if (id > 0 && req)
		fuse_passthrough_close(req, id);
#else
	(void)req;
	(void)id;
#endif
}

/* Marks, in the turn that just began, the inode of every file open for writing in
 * passthrough mode: its writes (also through a shared mapping, which keeps the file open)
 * reach the upper file without asking us, so no later mark would say it changed. Files in
 * cached mode need nothing: each of their writes comes through ov_file_dirty. */
void ov_mark_open_writers(struct cb_overlay *ov)
{
	struct ov_handle *h;
	struct ov_file *f;

	if (!atomic_load(&ov->passthrough))
		return;
	cb_rwlock_read(&ov->tab.ns);
	pthread_mutex_lock(&ov->handles_lock);
	for (h = ov->handles; h; h = h->next) {
		if (h->free != ov_file_free)
			continue;
		f = (struct ov_file *)h;
		if (f->mode == OV_OPEN_BACKING && ov_file_writable(f))
			ov_mark_inode(ov, NULL, f->inode, CB_CHANGE_WRITE);
	}
	pthread_mutex_unlock(&ov->handles_lock);
	cb_rwlock_unlock(&ov->tab.ns);
}

/* With FUSE_HANDLE_KILLPRIV_V2 we clear suid (and sgid when group-executable) on a write or
 * truncating open by someone without CAP_FSETID: we write as root, so the kernel keeps them. */
static void ov_kill_suidgid(int fd)
{
	struct stat st;
	mode_t m;

	if (fstat(fd, &st) < 0 || !(st.st_mode & (S_ISUID | S_ISGID)))
		return;
	m = st.st_mode & 07777 & ~S_ISUID;
	if (st.st_mode & S_IXGRP)
		m &= ~S_ISGID;
	if (m != (st.st_mode & 07777) && fchmod(fd, m) < 0)
		fprintf(stderr, "cowbox fs: clearing set-id bits: %s\n", strerror(errno));
}

/* The fd of f, reopened in upper first if the inode was copied up since f was opened
 * read-only in the base (rare: costs a compare on the hot path). */
static int ov_file_fd(struct cb_overlay *ov, struct ov_file *f)
{
	struct ov_inode *in = f->inode;
	char *path = NULL;
	int fd;

	if (atomic_load(&f->layer) == atomic_load(&in->layer))
		return f->fd;
	cb_rwlock_read(&ov->tab.ns);
	cb_mutex_lock(&in->lock);
	if (atomic_load(&f->layer) != atomic_load(&in->layer) && in->keep_fd < 0 &&
	    ov_path(&ov->tab, in, NULL, &path) >= 0) {
		fd = ov_openat(ov->upper_fd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
		if (fd >= 0) {
			dup3(fd, f->fd, O_CLOEXEC); /* swap in place: no window for reuse */
			close(fd);
			atomic_store(&f->layer, OV_UPPER);
		}
	}
	cb_mutex_unlock(&in->lock);
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	return f->fd;
}

/* Closes and frees an open file (release, or unmount for the ones never released). */
void ov_file_free(struct ov_handle *h)
{
	struct ov_file *f = (struct ov_file *)h;

	ov_handle_del(f->overlay, h);
	close(f->fd);
	free(f);
}

/* Whether an open with these flags (ov_open_flags) can use the O_RDWR|O_CLOEXEC fd a
 * copy-up made: read-write, and none of the flags that change how its fd behaves. */
static int ov_open_flags_plain(int flags)
{
	return (flags & O_ACCMODE) == O_RDWR &&
	       !(flags & (O_SYNC | O_DSYNC | O_NOATIME | O_NONBLOCK | O_ASYNC | O_APPEND));
}

/* OPEN: an open file; opened for writing or truncating, the inode is copied up and marked
 * first (the copy-up's fd then serves the open). Chooses passthrough or the page cache. */
void ov_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	int writing = ov_open_changes(fi);
	int flags = ov_open_flags(fi->flags), fd = -1, r = 0, layer;
	long long freed = 0;
	char *path = NULL;
	struct ov_file *f;
	struct stat st;

	cb_rwlock_read(&ov->tab.ns);
	if (writing) {
		r = ov_copy_up_open(ov, in, !(fi->flags & O_TRUNC), &fd);
		if (r == 0)
			r = ov_mark_inode(ov, req, in, CB_CHANGE_WRITE);
	}
	layer = atomic_load(&in->layer);
	if (r < 0)
		goto out;
	/* the copy-up's own fd serves a plain open (a truncation has nothing to cut); O_SYNC,
	 * O_NOATIME... open one of their own */
	if (fd >= 0 && !ov_open_flags_plain(flags)) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0) {
		r = 0;
	} else if (in->keep_fd >= 0) {
		char proc[64];

		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", in->keep_fd);
		fd = open(proc, flags & ~O_NOFOLLOW);
	} else if ((r = ov_path(&ov->tab, in, NULL, &path)) >= 0) {
		r = 0;
		/* a truncating open frees what the file held */
		if ((flags & O_TRUNC) && layer == OV_UPPER && atomic_load(&ov->quota_on) &&
		    ov_lstat(ov->upper_fd, path, &st) == 0 && S_ISREG(st.st_mode))
			freed = (long long)ov_quota_cost(S_IFREG, st.st_size);
		fd = ov_openat(ov_layer_fd(ov, layer), path, flags, 0);
	}
	if (r == 0 && fd < 0)
		r = -errno;
	else if (r == 0)
		ov_quota_give(ov, freed, 0);
out:
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (r < 0) {
		if (fd >= 0)
			close(fd); /* copied up, but the mark failed */
		fuse_reply_err(req, -r);
		return;
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		close(fd);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	f->fd = fd;
	atomic_init(&f->layer, layer);
	f->flags = flags;
	f->inode = in;
	f->overlay = ov;
	if (writing && OV_KILL_SUIDGID(fi))
		ov_kill_suidgid(fd);
	ov_file_choose_mode(req, f, fi);
	ov_handle_add(ov, &f->h, ov_file_free);
	fi->fh = (uint64_t)(uintptr_t)f;
	/* Nearly full: a cached file's writes come to us at once and fail with ENOSPC at
	 * write(2) (a passthrough file's writes reach the upper file and fail there anyway). */
	if (writing && f->mode == OV_OPEN_CACHED && ov_space_low(ov))
		fi->direct_io = 1;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		ov_file_drop_mode(req, f);
		ov_file_free(&f->h);
	}
}

/* READ: spliced from the file's fd, not copied through us. */
void ov_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);

	(void)ino;
	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = ov_file_fd(ov_of(req), f);
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

/* Journals the first content change of f's inode in this turn (cheap when already done). */
static int ov_file_dirty(fuse_req_t req, struct ov_file *f)
{
	struct cb_overlay *ov = ov_of(req);
	int r;

	if (atomic_load(&f->inode->write_gen) == atomic_load(&ov->gen)) {
		ov_fence_stall(ov);
		return 0;
	}
	cb_rwlock_read(&ov->tab.ns);
	r = ov_mark_inode(ov, req, f->inode, CB_CHANGE_WRITE);
	cb_rwlock_unlock(&ov->tab.ns);
	return r;
}

/* WRITE: marks the file, then writes (spliced when the kernel sends pages by pipe) within
 * the quota. */
void ov_op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf, off_t off,
		     struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in_buf));
	struct ov_quota_resize q;
	ssize_t n;
	int r;

	(void)ino;
	r = ov_file_dirty(req, f);
	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	if (OV_KILL_SUIDGID(fi))
		ov_kill_suidgid(f->fd);
	r = ov_quota_resize_begin(ov_of(req), f->inode, f->fd, off + (off_t)fuse_buf_size(in_buf),
				  &q);
	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = f->fd;
	out.buf[0].pos = off;
	n = fuse_buf_copy(&out, in_buf, 0);
	ov_quota_resize_end(ov_of(req), &q);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/* RELEASE: the last close of an open file: its mode is given back and it is freed. */
void ov_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;

	(void)ino;
	ov_file_drop_mode(req, f);
	ov_file_free(&f->h);
	fuse_reply_err(req, 0);
}

/* FSYNC: the file and then the journal reach the disk (the program asked for durability). */
void ov_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	int r;

	(void)ino;
	r = datasync ? fdatasync(f->fd) : fsync(f->fd);
	r = r < 0 ? errno : 0;
	ov_journal_sync(ov_of(req));
	fuse_reply_err(req, r);
}

/* FALLOCATE: marks the file, then allocates or punches within the quota. */
void ov_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
		     struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	struct ov_quota_resize q;
	int r = ov_file_dirty(req, f), keep = (mode & FALLOC_FL_KEEP_SIZE) != 0;

	(void)ino;
	if (r == 0)
		r = ov_quota_resize_begin(ov_of(req), f->inode, f->fd, keep ? 0 : off + len, &q);
	if (r < 0)
		goto out;
	/* blocks past the end that the size does not show would escape the quota's count */
	if (q.in && keep && !(mode & FALLOC_FL_PUNCH_HOLE) &&
	    ov_quota_cost(S_IFREG, off + len) > q.before)
		r = -EOPNOTSUPP;
	else if (fallocate(f->fd, mode, off, len) < 0)
		r = -errno;
	ov_quota_resize_end(ov_of(req), &q);
out:
	fuse_reply_err(req, -r);
}

/* COPY_FILE_RANGE: marks the destination, then copies between the two files in the kernel. */
void ov_op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			   struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			   struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct ov_file *fin = (struct ov_file *)(uintptr_t)fi_in->fh;
	struct ov_file *fout = (struct ov_file *)(uintptr_t)fi_out->fh;
	struct ov_quota_resize q;
	ssize_t n;
	int r = ov_file_dirty(req, fout);

	(void)ino_in;
	(void)ino_out;
	if (r == 0)
		r = ov_quota_resize_begin(ov_of(req), fout->inode, fout->fd, off_out + (off_t)len,
					  &q);
	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	n = copy_file_range(ov_file_fd(ov_of(req), fin), &off_in, fout->fd, &off_out, len,
			    (unsigned)flags);
	if (n < 0)
		n = -errno;
	ov_quota_resize_end(ov_of(req), &q);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/* LSEEK: SEEK_DATA and SEEK_HOLE answered by the file's own layer. */
void ov_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	off_t r;

	(void)ino;
	r = lseek(ov_file_fd(ov_of(req), f), off, whence);
	if (r < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_lseek(req, r);
}
