/* Apply: write the changes a workspace recorded between two turns onto a directory outside
 * it (its base, or any other folder), refusing when that folder changed since. */
#ifndef COWBOX_APPLY_H
#define COWBOX_APPLY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cb_turns;

/* What an apply did, or why it refused: conflicts[] are "PATH: why" lines (the folder's
 * entry is neither what turn a recorded nor what turn b did). */
struct cb_ws_apply_result {
	long long written, deleted,
	    unchanged; /* paths written (or chmod'ed), removed, already so */
	char **conflicts;
	size_t nconflicts;
};

/* Write the changes from turn a to turn b (recorded turns; 0 = the base) onto the directory
 * target: every path is checked first against what turn a recorded (type, content by
 * SHA-256, symlink target); a path already as turn b has it is left alone. Any other state is
 * a conflict, and then nothing is written: -EEXIST with the list in res. Otherwise deletions
 * go first (deepest first), then directories, files (content copied from the base or its
 * blob into a temporary name beside it, checked against the turn's hashes, then renamed over)
 * and symlinks. Every path goes through util/beneath.c (no symlink, no "..", nothing outside
 * target). Free res with cb_ws_apply_result_free. */
int cb_ws_apply(struct cb_turns *t, long long a, long long b, const char *target,
		struct cb_ws_apply_result *res);
void cb_ws_apply_result_free(struct cb_ws_apply_result *res);

struct cb_box;
#include <jansson.h>

/* Through box's daemon (the apply op, docs/protocol.md): turn's changes (turn > 0: from
 * turn - 1), or with turn <= 0 everything since the base after recording a snapshot, onto
 * to (NULL: the base). *report (may be NULL; json_decref it) gets {"from_turn", "to_turn",
 * "to", "written", "deleted", "unchanged"} on success, or {"conflicts": ["PATH: why", ...]}
 * when refused with -EEXIST (code "conflict"; nothing was written). */
int cb_box_apply(struct cb_box *box, long long turn, const char *to, json_t **report);

#ifdef __cplusplus
}
#endif

#endif
