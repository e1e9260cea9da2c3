/* Diff: events between two turns, or between a turn and the live tree, computed over the
 * paths changed in between (and the journal's dirty paths), never over the whole tree. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "turns_int.h"

static int diff_collect(const char *path, void *arg)
{
	return ws_pathset_add(arg, path, 0, NULL);
}

static const struct ws_path *diff_find(const struct ws_pathset *s, const char *path)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(s->p[mid].path, path);

		if (c == 0)
			return &s->p[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* The live entry of a path: rehashed if the journal names it, else the latest turn's. */
static int diff_live(struct cb_turns *t, const struct ws_pathset *live, long long latest,
		     const char *path, struct cb_entry *out)
{
	const struct ws_path *p = diff_find(live, path);
	int ret;

	if (!p)
		return ws_entry_at(t, path, latest, out);
	ret = ws_live_entry(t, path, 0, out);
	if (!ret && !out->path && !(out->path = strdup(path)))
		ret = cb_error_set(ENOMEM, "diff: out of memory");
	if (!ret) {
		out->pid = p->pid;
		free(out->comm);
		out->comm = p->comm ? strdup(p->comm) : NULL;
	}
	return ret;
}

/* The paths that may differ between turn a and b (b < 0: the live tree, whose journal-named
 * paths also land in live), sorted. */
static int ws_diff_paths(struct cb_turns *t, long long a, long long b, const struct cb_dirty *dirty,
			 size_t n, struct ws_pathset *all, struct ws_pathset *live)
{
	long long latest = cb_db_turns_latest(t->db), to = b < 0 ? latest : b;
	int ret;

	ret = cb_db_turns_delta_paths(t->db, a < to ? a : to, a < to ? to : a, diff_collect, all);
	if (!ret && b < 0) {
		ret = ws_map_ensure(t);
		if (!ret)
			ret = ws_dirty_expand(t, dirty, n, live);
		ws_pathset_sort(live);
		for (size_t i = 0; i < live->n && !ret; i++)
			ret = ws_pathset_add(all, live->p[i].path, 0, NULL);
	}
	ws_pathset_sort(all);
	return ret;
}

int ws_diff_run(struct cb_turns *t, long long a, long long b, const struct cb_dirty *dirty,
		size_t n, int with_meta, struct cb_diff *out)
{
	long long latest = cb_db_turns_latest(t->db);
	struct ws_pathset all = {0}, live = {0};
	struct cb_entry old = {0}, new = {0};
	int ret;

	memset(out, 0, sizeof(*out));
	ret = ws_turn_check(t, a);
	if (!ret && b >= 0)
		ret = ws_turn_check(t, b);
	if (!ret)
		ret = ws_diff_paths(t, a, b, dirty, n, &all, &live);
	for (size_t i = 0; i < all.n && !ret; i++) {
		const char *path = all.p[i].path;

		ret = ws_entry_at(t, path, a, &old);
		if (!ret)
			ret = b < 0 ? diff_live(t, &live, latest, path, &new)
				    : ws_entry_at(t, path, b, &new);
		if (!ret)
			ret = with_meta ? ws_diff_add_meta(out, &old, &new)
					: ws_diff_add(out, &old, &new);
	}
	cb_entry_clear(&old);
	cb_entry_clear(&new);
	ws_pathset_free(&all);
	ws_pathset_free(&live);
	if (ret)
		cb_ws_diff_free(out);
	return ret ? cb_error_wrap(ret, "diff") : 0;
}

int cb_ws_diff(struct cb_turns *t, long long a, long long b, const struct cb_dirty *dirty, size_t n,
	       struct cb_diff *out)
{
	return ws_diff_run(t, a, b, dirty, n, 0, out);
}
