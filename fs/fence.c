/* The turn fence: every operation that can change the tree runs on the shared side from its
 * journal mark to its reply, and a turn advance takes the exclusive side, so no change straddles
 * it. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>

#include "cowbox/turn_store.h"
#include "ov.h"

/* The operations as ops_*.c wrote them; the table fuse sees calls them inside the fence. */
static struct fuse_lowlevel_ops inner;

static void fence_enter(struct cb_overlay *ov)
{
	pthread_rwlock_rdlock(&ov->fence);
}

/* An operation that a waiting advance let finish was answered, but the kernel completes it
 * (its dentries, attributes) only a moment after the answer, so the snapshot that follows
 * the advance may still see the old state through the mount: its marks are journaled in the
 * next turn too. */
static void fence_leave(struct cb_overlay *ov)
{
	ov_marks_leave(ov, atomic_load(&ov->advancing));
	pthread_rwlock_unlock(&ov->fence);
}

static void fenced_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			   struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req); /* req is freed by the reply */

	fence_enter(ov);
	inner.setattr(req, ino, attr, to_set, fi);
	fence_leave(ov);
}

static void fenced_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			 dev_t rdev)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.mknod(req, parent, name, mode, rdev);
	fence_leave(ov);
}

static void fenced_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.mkdir(req, parent, name, mode);
	fence_leave(ov);
}

static void fenced_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.unlink(req, parent, name);
	fence_leave(ov);
}

static void fenced_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.rmdir(req, parent, name);
	fence_leave(ov);
}

static void fenced_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.symlink(req, link, parent, name);
	fence_leave(ov);
}

static void fenced_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
			  const char *newname, unsigned int flags)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.rename(req, parent, name, newparent, newname, flags);
	fence_leave(ov);
}

static void fenced_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.link(req, ino, newparent, newname);
	fence_leave(ov);
}

/* Only an open for writing changes anything (copy-up, truncation); a read-only open of a
 * large base file never holds up a turn advance. */
static void fenced_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	int writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);

	if (!writing) {
		inner.open(req, ino, fi);
		return;
	}
	fence_enter(ov);
	inner.open(req, ino, fi);
	fence_leave(ov);
}

static void fenced_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			  struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.create(req, parent, name, mode, fi);
	fence_leave(ov);
}

static void fenced_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
			     struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.write_buf(req, ino, bufv, off, fi);
	fence_leave(ov);
}

static void fenced_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
			     struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.fallocate(req, ino, mode, offset, length, fi);
	fence_leave(ov);
}

static void fenced_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
				   struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
				   struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.copy_file_range(req, ino_in, off_in, fi_in, ino_out, off_out, fi_out, len, flags);
	fence_leave(ov);
}

static void fenced_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			    size_t size, int flags)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.setxattr(req, ino, name, value, size, flags);
	fence_leave(ov);
}

static void fenced_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct cb_overlay *ov = ov_of(req);

	fence_enter(ov);
	inner.removexattr(req, ino, name);
	fence_leave(ov);
}

/* Wraps every operation of ops that changes the tree or the journal in the fence. A new
 * changing operation must be added here too, or a turn advance cannot see it in flight. */
void ov_fence_wrap(struct fuse_lowlevel_ops *ops)
{
	inner = *ops;
#define OV_FENCE(op)                                                                               \
	do {                                                                                       \
		if (ops->op)                                                                       \
			ops->op = fenced_##op;                                                     \
	} while (0)
	OV_FENCE(setattr);
	OV_FENCE(mknod);
	OV_FENCE(mkdir);
	OV_FENCE(unlink);
	OV_FENCE(rmdir);
	OV_FENCE(symlink);
	OV_FENCE(rename);
	OV_FENCE(link);
	OV_FENCE(open);
	OV_FENCE(create);
	OV_FENCE(write_buf);
	OV_FENCE(fallocate);
	OV_FENCE(copy_file_range);
	OV_FENCE(setxattr);
	OV_FENCE(removexattr);
#undef OV_FENCE
}

/* Reads COWBOX_TEST_FS_STALL_US once at mount: tests set it to hold every change between its
 * journal mark and the change itself, so that a turn advance racing it is not a rare event. */
void ov_fence_setup(struct cb_overlay *ov)
{
	pthread_rwlockattr_t attr;
	const char *stall = getenv("COWBOX_TEST_FS_STALL_US");

	pthread_rwlockattr_init(&attr);
	/* A steady stream of writes must not starve the advance, which waits only for the
	 * operations already inside. */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&ov->fence, &attr);
	pthread_rwlockattr_destroy(&attr);
	ov->stall_us = stall ? strtol(stall, NULL, 10) : 0;
	if (ov->stall_us < 0 || ov->stall_us > 1000000)
		ov->stall_us = 0;
}

/* See ov.h. */
void ov_fence_stall(struct cb_overlay *ov)
{
	struct timespec ts;

	if (ov->stall_us <= 0)
		return;
	ts.tv_sec = ov->stall_us / 1000000;
	ts.tv_nsec = (ov->stall_us % 1000000) * 1000;
	nanosleep(&ts, NULL);
}

/* See overlay.h. The exclusive side waits for the changes in flight (their marks are
 * committed in the old turn and their effect is in the tree, so the snapshot that follows
 * sees both); every change that enters after it marks in the new turn, because the
 * generation every inode's "already marked" compare uses moves with it. */
void cb_overlay_turn_advance(struct cb_overlay *ov, long long turn)
{
	atomic_store(&ov->advancing, 1);
	pthread_rwlock_wrlock(&ov->fence);
	if (ov->db)
		cb_db_turns_journal_advance(ov->db, turn);
	atomic_fetch_add(&ov->gen, 1);
	atomic_store(&ov->advancing, 0);
	pthread_rwlock_unlock(&ov->fence);
	ov_marks_carry(ov);
	/* Files open for writing in passthrough mode change without asking us: marked anew
	 * (this thread serves no operation, so it keeps none of those marks). */
	ov_mark_open_writers(ov);
	ov_marks_leave(ov, 0);
}
