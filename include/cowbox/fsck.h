/* cowbox fsck: what a check of one workspace's stored state found (bad or missing blobs,
 * base files that changed, unusable base-cache rows, an unusable meta.db) and repaired. */
#ifndef COWBOX_FSCK_H
#define COWBOX_FSCK_H

#include <stddef.h>

#include "cowbox/workspace.h"

struct cb_fsck_problem {
	/* "blob", "base" (a turn-0 file the base no longer holds), "base_cache", "meta.db" or
	 * "marks" (the mark log lost bytes: changes made then may be missing from the journal) */
	const char *kind;
	char *path;   /* the workspace path it concerns (for meta.db: the file) */
	char *object; /* the blob's name, or the kept copy of a rebuilt meta.db; may be NULL */
	/* the turns it breaks: first .. last (-1: and every turn after) */
	long long first_turn, last_turn;
	int repaired;
	char *detail; /* one sentence */
};

struct cb_fsck_report {
	char ref[CB_WS_REF_LEN + 1];
	struct cb_fsck_problem *p;
	size_t n, cap;
	long long blobs_checked, base_checked, cache_rows;
};

/* Check workspace ref_or_name (mounted or not; nothing is read through its mount): every blob
 * or base file a recorded turn needs is read and hashed, every base-cache row compared with
 * the file. repair: drop unusable cache rows, and rebuild a missing, empty, corrupt or
 * incomplete meta.db as a workspace with no turns over the intact upper/ (the old file is
 * kept beside it, nothing of upper/ is touched; the workspace must be unmounted; base
 * overrides the recorded base directory). Returns 0 with *out filled (free it with
 * cb_ws_fsck_free) also when problems were found; -errno if the check itself failed. */
int cb_ws_fsck(const char *ref_or_name, int repair, const char *base, struct cb_fsck_report *out);
void cb_ws_fsck_free(struct cb_fsck_report *r);

struct cb_db;

/* When a fold found the mark log damaged (meta CB_MARKS_RESCAN_KEY, cowbox/journal.h): journal
 * every path the lost marks may have held, so that the next snapshot records the tree as it
 * is: each entry of upper (a directory with its subtree, a whiteout as a deleted subtree), and
 * each path of the last turn's map that neither upper nor base holds any more; then clear the
 * key. upper must not change meanwhile (unmounted, or before the mount serves). db_path is
 * the database db is open on; base may be NULL. Returns 1 and *marked (may be NULL) when it
 * walked, 0 when nothing was pending, -errno with a message naming the path on failure (the
 * key stays, so the walk is tried again). */
int cb_ws_marks_rescan(struct cb_db *db, const char *db_path, const char *upper, const char *base,
		       long long *marked);

#endif
