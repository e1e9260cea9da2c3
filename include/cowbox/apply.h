/* Apply: write the changes a workspace recorded between two turns onto a directory outside
 * it (its base, or any other folder), refusing when that folder changed since. */
#ifndef COWBOX_APPLY_H
#define COWBOX_APPLY_H

#ifdef __cplusplus
extern "C" {
#endif

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
