/* The workspace filesystem (fs/): a FUSE low-level copy-on-write overlay of a read-only base
 * directory and an upper directory (overlayfs format) that journals every change. */
#ifndef COWBOX_OVERLAY_H
#define COWBOX_OVERLAY_H

#include <stddef.h>

struct cb_db;
struct cb_overlay;

struct cb_overlay_config {
	const char *base_dir;	/* read-only lower layer; NULL for an empty workspace */
	const char *upper_dir;	/* the copy-on-write layer; must exist */
	const char *mountpoint; /* must exist and be an empty directory */
	const char *fsname;	/* shown in /proc/mounts, e.g. "cowbox:cb-<hex>" */
	struct cb_db *db;	/* the journal; NULL records nothing (some tests) */
	unsigned max_threads;	/* FUSE worker threads; 0 = a sensible default */
	int debug;		/* libfuse request tracing on stderr */
	unsigned long id_base;	/* 0: ids as they are. Else the first of the 65536 host ids the
				   workspace's sandbox maps its ids 0-65535 to: ids x < 65536 are
				   shown as id_base + x and stored so (creations, chown, copy-up),
				   and no setuid/setgid bit is kept on a file whose owner (group)
				   is outside [id_base, id_base + 65536). */
	int owner_squash;	/* in place (upper_dir is the user's folder): with
				   id_base, the sandbox's root is stored as upper_dir's
				   owner, and that owner is shown as its root */
	unsigned long long quota_bytes;	 /* upper-layer quota (fs/quota.c); 0: none. A byte
					    quota turns FUSE passthrough off for the mount
					    (the writeback cache instead): docs/security.md */
	unsigned long long quota_inodes; /* upper-layer inode quota; 0: none */
};

/* Mount the overlay: when this returns 0 the kernel mount exists and requests queue up
 * until cb_overlay_run serves them. */
int cb_overlay_mount(const struct cb_overlay_config *cfg, struct cb_overlay **out);

/* Serve requests on worker threads until the mount goes away (umount) or cb_overlay_stop is
 * called. Returns 0 on a clean end. */
int cb_overlay_run(struct cb_overlay *ov);

/* 0 while the upper layer the mount serves is still the directory at upper_dir; -ENOENT
 * naming it when it was deleted or replaced behind the mount (a snapshot must not record
 * files that exist only in open handles). */
int cb_overlay_upper_check(struct cb_overlay *ov, const char *upper_dir);

/* Ask cb_overlay_run to return; safe from another thread and from a signal handler.
 * cb_overlay_sync, then cb_overlay_end. */
void cb_overlay_stop(struct cb_overlay *ov);

/* Flush the kernel's dirty pages of the mount to us while the workers still serve (syncfs
 * of the mount point; nothing when the loop is not running or the mount is gone). */
void cb_overlay_sync(struct cb_overlay *ov);

/* Flush the kernel's dirty pages to us (cb_overlay_sync), then unmount: 0, or -errno with a
 * message when the umount is refused (EBUSY: a process holds the mount; EPERM). Once it
 * succeeded, later calls do nothing. The loop goes on serving: cb_overlay_end ends it, and
 * must, since ours is the last reference to the mount only if no other mount namespace was
 * made while it was mounted (unshare -m, a VM's qemu, a sandbox being set up, a container).
 * Such a namespace holds a private copy our umount does not reach, for which the kernel
 * keeps the connection; ended, the copy answers ENOTCONN. */
int cb_overlay_unmount(struct cb_overlay *ov);

/* Make cb_overlay_run return, unmounted or not: once the session's /dev/fuse is closed, every
 * copy of the mount left (another mount namespace's) answers ENOTCONN. */
void cb_overlay_end(struct cb_overlay *ov);

/* Unmount if still mounted, make the journal durable, free everything; NULL is accepted.
 * The caller makes sure no other thread is in, or will enter, cb_overlay_stop, _sync, _end
 * or _unmount on ov: those read ov, and a signal thread left running is the usual culprit. */
void cb_overlay_destroy(struct cb_overlay *ov);

/* Change cb_overlay_config.id_base of a mounted overlay (a new workspace's options chose
 * it); the kernel is told to forget the ownership it cached. */
void cb_overlay_set_id_base(struct cb_overlay *ov, unsigned long id_base);
/* The base changed behind the overlay's back at these paths (sorted by strcmp): the kernel is
 * told to forget their entries, attributes and cached pages and their directories' listings,
 * so every later lookup and read (a program's, the turn worker's) sees the base as it is now,
 * instead of a day-long cached view of what it was (the overlay otherwise trusts the base
 * to be read-only). Not from a FUSE request of this overlay. */
void cb_overlay_base_changed(struct cb_overlay *ov, const char *const *paths, size_t n);

/* A rollback gives paths (sorted by strcmp, parents first) back to the base: where the
 * caller found the recorded entry to be the base's own again, what upper holds there goes
 * (a whiteout, a copy of a file, a symlink; an opaque directory over the base's becomes a
 * merged one, with whiteouts for what it hid), instead of the rollback writing the base's
 * bytes into upper once more. A path the base lacks, an upper directory over a base file,
 * or one below a whiteout or a non-directory, is left as it is (the rollback restores it
 * through the mount). Each changed path is journaled first, as a request's would be, and
 * the kernel is told to forget its entry. *reverted: how many paths changed. 0 or -errno
 * with a message. Not from a FUSE request of this overlay. */
int cb_overlay_revert(struct cb_overlay *ov, const char *const *paths, size_t n, size_t *reverted);

/* Move the journal's open turn to turn, fenced: returns once every change in flight has
 * been made and its mark committed (in the old turn), and every change that starts later is
 * journaled anew in the new turn, also for paths already marked in the old one. A snapshot
 * that reads the old turn's rows and hashes the tree after this call misses nothing. */
void cb_overlay_turn_advance(struct cb_overlay *ov, long long turn);

/* Set the upper layer's quota (0: none) of a mounted overlay; the first limit set counts
 * what upper/ holds (a walk). Past a limit, a change that would grow upper/ fails with
 * ENOSPC; deletes always work. Passthrough, chosen at mount, stays as it was. */
int cb_overlay_set_quota(struct cb_overlay *ov, unsigned long long bytes,
			 unsigned long long inodes);

/* The quota's limits (0: none) and what upper/ holds (0 while no limit is set). */
struct cb_overlay_quota {
	unsigned long long limit_bytes, limit_inodes, used_bytes, used_inodes;
};
void cb_overlay_quota_info(struct cb_overlay *ov, struct cb_overlay_quota *out);

/* What the kernel and libfuse gave a mount. */
struct cb_overlay_fs_info {
	const char *libfuse;   /* the libfuse version it runs on, e.g. "3.18.3" */
	const char *transport; /* "io_uring" once a request came that way, else "/dev/fuse" */
	unsigned long long uring_requests; /* requests served over io_uring */
	int passthrough;     /* file I/O of upper files goes to them without asking us */
	int killpriv_v2;     /* we clear set-id bits on writes (no getxattr before each) */
	int writeback_cache; /* the kernel gathers writes (only without passthrough) */
};

/* Fills out for ov (before the kernel's INIT, every feature reads as off). */
void cb_overlay_fs_info(struct cb_overlay *ov, struct cb_overlay_fs_info *out);

/* Requests of one FUSE opcode since the mount, and the daemon's time spent on them. */
struct cb_overlay_op_stat {
	const char *op; /* the kernel's name: "LOOKUP", "CREATE", ... (static) */
	unsigned long long count;
	unsigned long long ns;
};

/* Fills out[] with up to max opcodes seen so far (requests libfuse answers itself, like
 * FLUSH without a handler, are not among them); returns how many. */
size_t cb_overlay_op_stats(struct cb_overlay *ov, struct cb_overlay_op_stat *out, size_t max);

#endif
