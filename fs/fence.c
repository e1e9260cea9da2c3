/* The turn fence: every operation that can change the tree runs on the shared side from its
 * journal mark to its reply (fs/ops.c puts it there, as OV_OPS says), and a turn advance takes
 * the exclusive side, so no change straddles it. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>

#include "cowbox/turn_store.h"
#include "ov.h"

/* See ov.h. */
void ov_fence_enter(struct cb_overlay *ov)
{
	cb_rwlock_read(&ov->fence);
}

/* See ov.h. An operation that a waiting advance let finish was answered, but the kernel
 * completes it (its dentries, attributes) only a moment after the answer, so the snapshot
 * that follows the advance may still see the old state through the mount: its marks are
 * journaled in the next turn too. */
void ov_fence_leave(struct cb_overlay *ov)
{
	ov_marks_leave(ov, atomic_load(&ov->advancing));
	cb_rwlock_unlock(&ov->fence);
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
	cb_rwlock_init(&ov->fence, &attr);
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
	cb_rwlock_write(&ov->fence);
	if (ov->db)
		cb_db_turns_journal_advance(ov->db, turn);
	atomic_fetch_add(&ov->gen, 1);
	atomic_store(&ov->advancing, 0);
	cb_rwlock_unlock(&ov->fence);
	ov_marks_carry(ov);
	/* Files open for writing in passthrough mode change without asking us: marked anew
	 * (this thread serves no operation, so it keeps none of those marks). */
	ov_mark_open_writers(ov);
	ov_marks_leave(ov, 0);
}
