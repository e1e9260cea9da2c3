/* The workspace filesystem (fs/): a FUSE low-level copy-on-write overlay of a read-only base
 * directory and an upper directory (overlayfs format) that journals every change. */
#ifndef COWBOX_OVERLAY_H
#define COWBOX_OVERLAY_H

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
};

/* Mount the overlay: when this returns 0 the kernel mount exists and requests queue up
 * until cb_overlay_run serves them. */
int cb_overlay_mount(const struct cb_overlay_config *cfg, struct cb_overlay **out);

/* Serve requests on worker threads until the mount goes away (umount) or cb_overlay_stop is
 * called. Returns 0 on a clean end. */
int cb_overlay_run(struct cb_overlay *ov);

/* Ask cb_overlay_run to return; safe from another thread and from a signal handler. */
void cb_overlay_stop(struct cb_overlay *ov);

/* Unmount if still mounted, make the journal durable, free everything; NULL is accepted. */
void cb_overlay_destroy(struct cb_overlay *ov);

/* A snapshot was taken: every path is clean again, so the next change to any path is
 * journaled anew (in cb_journal_turn's new turn). */
void cb_overlay_turn_advance(struct cb_overlay *ov);

#endif
