/* Apply: write the changes a workspace recorded between two turns onto a directory outside
 * it (its base, or any other folder), refusing when that folder changed since; merge: bring
 * a fork's changes back into a workspace. */
#ifndef COWBOX_APPLY_H
#define COWBOX_APPLY_H

#ifdef __cplusplus
extern "C" {
#endif

struct cb_box;
#include <jansson.h>
#include <stdbool.h>

/* Through box's daemon (the apply op, docs/protocol.md): turn's changes (turn > 0: from
 * turn - 1), or with turn <= 0 everything since the base after recording a snapshot, onto
 * to (NULL: the base). *report (may be NULL; json_decref it) gets {"from_turn", "to_turn",
 * "to", "written", "deleted", "unchanged"} on success, or {"conflicts": ["PATH: why", ...]}
 * when refused with -EEXIST (code "conflict"; nothing was written). */
int cb_box_apply(struct cb_box *box, long long turn, const char *to, json_t **report);

/* Through box's daemon (the merge op, docs/protocol.md; semantics in docs/turns.md, "Merge"):
 * the changes source (a ref or name: a fork of box's workspace, the workspace it forked
 * from, or a fork of the same turn) recorded since their common ancestor up to its turn
 * (< 0: its latest), merged three-way into box's live tree as one turn. strategy "merge"
 * (NULL), "ours" or "theirs"; dry_run writes nothing. *report (may be NULL; json_decref it)
 * gets the reply: {"turn" (null when nothing was written), "merged": [path], "conflicts":
 * [{"path", "kind", "resolution"}], "source", "source_turn", "ancestor_turn", "written",
 * "dry_run"}; or, refused with -EEXIST (code "conflict", nothing written), {"conflicts":
 * ["PATH: changed in TARGET since its latest turn", ...]}. */
int cb_box_merge(struct cb_box *box, const char *source, long long turn, const char *strategy,
		 bool dry_run, json_t **report);

#ifdef __cplusplus
}
#endif

#endif
