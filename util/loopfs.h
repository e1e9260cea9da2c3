/* A filesystem of its own in an image file: a sparse file made ext4, attached to a loop
 * device that frees itself with its last mount, so that the kernel caps what is written. */
#ifndef CB_UTIL_LOOPFS_H
#define CB_UTIL_LOOPFS_H

/* 1 when images can be mounted here (root, /dev/loop-control), else 0. */
int cb_loopfs_available(void);

/* Create img (it must not exist) as a sparse file of size bytes and make it ext4 with room
 * for inodes inodes; a failed one is removed. what names the caller in messages. */
int cb_loopfs_make(const char *what, const char *img, unsigned long long bytes,
		   unsigned long long inodes);

/* Attach img to a free loop device (auto-clear: detached again when its last mount goes)
 * and mount it at dir, nosuid and nodev. */
int cb_loopfs_mount(const char *what, const char *img, const char *dir);

/* 1 when dir is the root of an ext4 mounted on it (its parent's device differs), else 0. */
int cb_loopfs_mounted(const char *dir);

/* Detach dir's mount when cb_loopfs_mounted says it is one (lazily: its loop device goes
 * with its last user). */
void cb_loopfs_release(const char *dir);

/* Copy the tree src (its root's attributes included) into dst, as cp -a does: owners,
 * modes, times, xattrs, hard links, device nodes. Run only where no sandbox writes. */
int cb_loopfs_fill(const char *what, const char *src, const char *dst);

#endif
