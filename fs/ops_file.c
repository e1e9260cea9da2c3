/* FUSE operations on open files: open (copy-up for writing), read and write by splice
 * straight to the layer's fd, fsync, fallocate, copy_file_range, lseek, release. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ov.h"

/* The fd of f, reopened in upper first if the inode was copied up since f was opened
 * read-only in the base (rare: costs a compare on the hot path). */
static int ov_file_fd(struct cb_overlay *ov, struct ov_file *f)
{
	struct ov_inode *in = f->inode;
	char path[PATH_MAX];
	int fd;

	if (atomic_load(&f->layer) == atomic_load(&in->layer))
		return f->fd;
	pthread_rwlock_rdlock(&ov->ns_lock);
	pthread_mutex_lock(&in->lock);
	if (atomic_load(&f->layer) != atomic_load(&in->layer) && in->keep_fd < 0 &&
	    ov_path(in, NULL, path, sizeof(path)) >= 0) {
		fd = openat(ov->upper_fd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			dup3(fd, f->fd, O_CLOEXEC); /* swap in place: no window for reuse */
			close(fd);
			atomic_store(&f->layer, OV_UPPER);
		}
	}
	pthread_mutex_unlock(&in->lock);
	pthread_rwlock_unlock(&ov->ns_lock);
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

static void ov_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	int writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	int flags = ov_open_flags(fi->flags), fd = -1, r = 0, layer;
	char path[PATH_MAX];
	struct ov_file *f;

	pthread_rwlock_rdlock(&ov->ns_lock);
	if (writing) {
		r = ov_copy_up(ov, in, !(fi->flags & O_TRUNC));
		if (r == 0)
			r = ov_mark_inode(ov, req, in, CB_CHANGE_WRITE);
	}
	layer = atomic_load(&in->layer);
	if (r < 0)
		goto out;
	if (in->keep_fd >= 0) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", in->keep_fd);
		fd = open(path, flags & ~O_NOFOLLOW);
	} else if ((r = ov_path(in, NULL, path, sizeof(path))) >= 0) {
		r = 0;
		fd = openat(ov_layer_fd(ov, layer), path, flags);
	}
	if (r == 0 && fd < 0)
		r = -errno;
out:
	pthread_rwlock_unlock(&ov->ns_lock);
	if (r < 0) {
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
	ov_handle_add(ov, &f->h, ov_file_free);
	fi->fh = (uint64_t)(uintptr_t)f;
	fi->keep_cache = 1; /* we are the only writer: cached pages stay valid */
	if (fuse_reply_open(req, fi) == -ENOENT)
		ov_file_free(&f->h);
}

static void ov_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
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

	if (atomic_load(&f->inode->write_gen) == atomic_load(&ov->gen))
		return 0;
	pthread_rwlock_rdlock(&ov->ns_lock);
	r = ov_mark_inode(ov, req, f->inode, CB_CHANGE_WRITE);
	pthread_rwlock_unlock(&ov->ns_lock);
	return r;
}

static void ov_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf, off_t off,
			 struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in_buf));
	ssize_t n;
	int r;

	(void)ino;
	r = ov_file_dirty(req, f);
	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = f->fd;
	out.buf[0].pos = off;
	n = fuse_buf_copy(&out, in_buf, 0);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

static void ov_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;

	(void)ino;
	ov_file_free(&f->h);
	fuse_reply_err(req, 0);
}

static void ov_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	int r;

	(void)ino;
	r = datasync ? fdatasync(f->fd) : fsync(f->fd);
	r = r < 0 ? errno : 0;
	ov_journal_sync(ov_of(req));
	fuse_reply_err(req, r);
}

static void ov_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	struct ov_file *f = (struct ov_file *)(uintptr_t)fi->fh;
	int r = ov_file_dirty(req, f);

	(void)ino;
	if (r == 0 && fallocate(f->fd, mode, off, len) < 0)
		r = -errno;
	fuse_reply_err(req, -r);
}

static void ov_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			       struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			       struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct ov_file *fin = (struct ov_file *)(uintptr_t)fi_in->fh;
	struct ov_file *fout = (struct ov_file *)(uintptr_t)fi_out->fh;
	ssize_t n;
	int r = ov_file_dirty(req, fout);

	(void)ino_in;
	(void)ino_out;
	if (r < 0) {
		fuse_reply_err(req, -r);
		return;
	}
	n = copy_file_range(ov_file_fd(ov_of(req), fin), &off_in, fout->fd, &off_out, len,
			    (unsigned)flags);
	if (n < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_write(req, (size_t)n);
}

static void ov_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
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

/* Fills in the operations on open files. */
void ov_fill_ops_file(struct fuse_lowlevel_ops *ops)
{
	ops->open = ov_open;
	ops->read = ov_read;
	ops->write_buf = ov_write_buf;
	/* no flush: nothing to do on close(2) (the kernel keeps posix locks itself and writes
	 * dirty pages before asking), and the ENOSYS libfuse answers for a missing handler
	 * makes the kernel stop sending FLUSH, one round trip less per close */
	ops->release = ov_release;
	ops->fsync = ov_fsync;
	ops->fallocate = ov_fallocate;
	ops->copy_file_range = ov_copy_file_range;
	ops->lseek = ov_lseek;
}
