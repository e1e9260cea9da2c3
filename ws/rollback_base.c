/* Which paths a rollback can give back to the base (the overlay drops what upper holds there,
 * cb_overlay_revert) instead of writing the base's bytes into upper once more, and the
 * metadata check that tells which of those still need a copy of their own afterwards. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "turns_int.h"

void cb_ws_revert_free(struct cb_ws_revert *r)
{
	for (size_t i = 0; i < r->n; i++)
		free(r->paths[i]);
	for (size_t i = 0; i < r->ncheck; i++)
		free(r->check[i]);
	free(r->paths);
	free(r->check);
	memset(r, 0, sizeof(*r));
}

static int revert_push(char ***v, size_t *n, const char *path)
{
	char **grown = realloc(*v, (*n + 1) * sizeof(**v));

	if (!grown)
		return cb_error_set(ENOMEM, "rollback: out of memory");
	*v = grown;
	if (!(grown[*n] = strdup(path)))
		return cb_error_set(ENOMEM, "rollback: out of memory");
	(*n)++;
	return 0;
}

/* 1 if want (the turn's entry) is what the base shows at its path now: any directory over a
 * directory (a mode is the rollback's to put back, through the mount), else the same type,
 * mode and content. The base's hashes come from its cache by stat, or are computed now. */
static int revert_fits(struct cb_turns *t, const struct cb_entry *want)
{
	struct cb_entry now = {0};
	int ret;

	if (want->type == CB_ENTRY_ABSENT)
		return 0;
	ret = ws_base_now(t, want->path, &now);
	if (!ret)
		ret = want->type == CB_ENTRY_DIR ? now.type == CB_ENTRY_DIR
						 : cb_entry_same(want, &now);
	cb_entry_clear(&now);
	return ret;
}

int cb_ws_revert_plan(struct cb_turns *t, long long turn, struct cb_ws_revert *out)
{
	struct cb_diff d = {0};
	long long latest = cb_db_turns_latest(t->db);
	int ret = 0;

	memset(out, 0, sizeof(*out));
	/* In place the base is the live folder itself: nothing to show through. */
	if (t->base_fd < 0 || t->in_place || turn >= latest)
		return 0;
	/* Between recorded turns: the latest one holds the open turn's changes already
	 * (the daemon records them first), and nothing is read through the mount. */
	ret = cb_ws_diff(t, turn, latest, NULL, 0, &d);
	for (size_t i = 0; i < d.n && !ret; i++) {
		const struct cb_entry *want = &d.ev[i].old;
		int fits = revert_fits(t, want);

		if (fits < 0)
			ret = fits;
		else if (fits)
			ret = revert_push(&out->paths, &out->n, want->path);
		/* A recorded time, owner or xattrs may not be what the base file shows. */
		if (!ret && fits > 0 && want->type == CB_ENTRY_FILE &&
		    (want->has_mtime || want->has_owner || want->xattrs_len))
			ret = revert_push(&out->check, &out->ncheck, want->path);
	}
	cb_ws_diff_free(&d);
	if (ret)
		cb_ws_revert_free(out);
	return ret ? cb_error_wrap(ret, "rollback to turn %lld: the base's paths", turn) : 0;
}
