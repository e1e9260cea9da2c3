/* Merge (ws/merge.c): the changes one workspace recorded between two of its turns brought
 * into another workspace's live tree, three-way per path against the common ancestor. */
#ifndef COWBOX_MERGE_H
#define COWBOX_MERGE_H

#include <stddef.h>
#include <sys/types.h>

#include "cowbox/turns.h"

enum cb_ws_merge_strategy {
	CB_WS_MERGE_MERGE = 0, /* text merged line by line; other conflicts keep TARGET's */
	CB_WS_MERGE_OURS,      /* conflicting hunks and paths keep TARGET's */
	CB_WS_MERGE_THEIRS,    /* conflicting hunks and paths take SOURCE's */
};

/* "merge", "ours", "theirs" into *out; -EINVAL (message) for anything else. */
int cb_ws_merge_strategy_parse(const char *s, enum cb_ws_merge_strategy *out);

/* A path both sides changed in ways that do not combine. */
struct cb_ws_merge_conflict {
	char *path;
	const char *kind;	/* "content", "binary", "mode", "type", "symlink",
				 * "delete/modify", "modify/delete", "directory", "parent" */
	const char *resolution; /* "markers", "target", "source" */
};

/* Who made the change of SOURCE a path the merge wrote carries: SOURCE's attribution of
 * the path's last change up to its turn `to`, for the merge's turn to keep. */
struct cb_ws_merge_audit {
	char *path;
	pid_t pid;  /* 0 if SOURCE did not know */
	char *comm; /* NULL if SOURCE did not know */
};

struct cb_ws_merge_result {
	char **merged; /* paths written (or removed) in TARGET, cleanly */
	size_t nmerged, cap_merged;
	struct cb_ws_merge_audit *audit; /* one per path written (not on a dry run) */
	size_t naudit;
	struct cb_ws_merge_conflict *conflicts;
	size_t nconflicts, cap_conflicts;
	char **blocked; /* paths TARGET changed since its latest turn that the merge would touch */
	size_t nblocked, cap_blocked;
	long long written; /* paths written or removed in the tree (0 on a dry run) */
};

void cb_ws_merge_result_free(struct cb_ws_merge_result *res);

/* Bring source's changes from turn `from` (the common ancestor: source's turn that equals
 * what target forked from, or what source forked from) to turn `to` into target's live
 * tree (target opened over its mount), three-way against source's turn `from`: a path only
 * source changed takes source's entry; text files both changed are merged with libgit2
 * (conflicts written with markers under the merge strategy); other conflicts keep
 * target's entry unless the strategy is theirs. Every write goes through target's root
 * with util/beneath (no set-id or sticky bit is ever written; no device node can be: turns
 * hold files, directories and symlinks only); contents come from source's blobs or the base
 * and are checked against their hashes while copied. Costs what source changed, never the
 * tree. Nothing is written with dry_run, nor when a path the merge would touch differs in
 * target's tree from target's latest turn: then -EBUSY and res->blocked lists them.
 * intent (NULL: none) is a file written durably before the first write, naming target's
 * latest turn and every path the merge writes: cb_ws_merge_undo puts them back after a
 * failure or a kill. The caller records the result as a turn of target, gives its rows
 * res->audit's attribution (cb_db_turns_attribute), then removes intent. */
int cb_ws_merge(struct cb_turns *target, struct cb_turns *source, long long from, long long to,
		enum cb_ws_merge_strategy strategy, const char *source_label, int dry_run,
		const char *intent, struct cb_ws_merge_result *res);

/* After a merge that failed or was killed: if intent exists and its merge was not recorded
 * as a turn (target's latest turn is still the one it names), roll the paths it names back
 * to that turn (cb_ws_rollback: nothing else is touched), then remove intent. A merge that
 * was recorded only loses intent. No intent: nothing to do. *restored: paths put back. */
int cb_ws_merge_undo(struct cb_turns *t, const char *intent, long long *restored);

/* The record a fork keeps of where it came from ("origin" in its workspace directory):
 * the ref it was forked from and the turn. Written by the daemon's fork op. */
int cb_ws_origin_write(const char *ws_dir, const char *from_ref, long long turn);
/* Read it: 0 and the values, -ENOENT (no message) when the workspace was not forked (or
 * by a cowbox that kept no record), another -errno with a message. */
int cb_ws_origin_read(const char *ws_dir, char *from_ref, size_t len, long long *turn);

#endif
