/* Prune: keep the newest turns, fold the older ones into the oldest kept (so its map stays
 * whole) and delete every blob that no remaining turn references. */
#include "config.h"

#include <errno.h>

#include "cowbox/error.h"
#include "turns_int.h"

static int prune_needed(const unsigned char *xxh3, void *arg)
{
	struct cb_turns *t = arg;
	int ret = cb_db_turns_blob_needed(t->db, xxh3);

	/* In place, turn 0's bytes live only in blobs (the folder is live): they stay. */
	if (ret == 0 && t->in_place)
		ret = cb_db_turns_base_blob_needed(t->db, xxh3);
	return ret;
}

int cb_ws_prune(struct cb_turns *t, long long keep, long long *dropped, long long *freed)
{
	long long latest = cb_db_turns_latest(t->db), oldest = cb_db_turns_oldest(t->db);
	long long keep_from = latest - keep + 1, removed = 0;
	int ret;

	*dropped = *freed = 0;
	if (keep < 1)
		return cb_error_set(EINVAL, "prune: --keep must be at least 1 (got %lld)", keep);
	if (latest == 0 || keep_from <= oldest)
		goto gc;
	ret = cb_db_turns_begin(t->db);
	if (!ret)
		ret = cb_db_turns_prune(t->db, keep_from);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret) {
		cb_db_turns_rollback(t->db);
		return cb_error_wrap(ret, "prune");
	}
	*dropped = keep_from - oldest;
gc:
	/* Also after a prune that dropped nothing: blobs a crash left behind go too. */
	ret = cb_ws_blob_gc(t->blob_fd, prune_needed, t, &removed, freed);
	return ret ? cb_error_wrap(ret, "prune: blob store") : 0;
}
