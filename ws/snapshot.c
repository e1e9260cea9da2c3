/* Snapshot: record the open turn as a delta against the latest one, rehashing only the paths
 * the journal names (directories that moved are walked), and keep new contents as blobs. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"

struct snap_item {
	struct cb_entry old, new;
};

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int ws_diff_add(struct cb_diff *d, const struct cb_entry *old, const struct cb_entry *new)
{
	struct cb_diff_event *ev;
	enum cb_diff_kind kind;
	int ret;

	if (cb_entry_same(old, new))
		return 0;
	if (old->type == CB_ENTRY_ABSENT)
		kind = CB_DIFF_CREATED;
	else if (new->type == CB_ENTRY_ABSENT)
		kind = CB_DIFF_DELETED;
	else if (old->type != new->type)
		kind = CB_DIFF_TYPE_CHANGED;
	else if (old->type == CB_ENTRY_DIR ||
		 (old->type == CB_ENTRY_FILE && old->size == new->size &&
		  !memcmp(old->sha256, new->sha256, CB_SHA256_LEN)))
		kind = CB_DIFF_MODE_CHANGED;
	else
		kind = CB_DIFF_MODIFIED;
	if ((ret = cb_grow(&d->ev, &d->cap, d->n, sizeof(*d->ev), 16, "diff")))
		return ret;
	ev = &d->ev[d->n];
	memset(ev, 0, sizeof(*ev));
	ev->kind = kind;
	ret = cb_entry_copy(&ev->old, old);
	if (!ret)
		ret = cb_entry_copy(&ev->new, new);
	if (ret) {
		cb_entry_clear(&ev->old);
		cb_entry_clear(&ev->new);
		return ret;
	}
	d->n++;
	return 0;
}

void cb_ws_diff_free(struct cb_diff *d)
{
	for (size_t i = 0; i < d->n; i++) {
		cb_entry_clear(&d->ev[i].old);
		cb_entry_clear(&d->ev[i].new);
	}
	free(d->ev);
	memset(d, 0, sizeof(*d));
}

const char *cb_ws_diff_kind_name(enum cb_diff_kind kind)
{
	switch (kind) {
	case CB_DIFF_CREATED:
		return "created";
	case CB_DIFF_MODIFIED:
		return "modified";
	case CB_DIFF_DELETED:
		return "deleted";
	case CB_DIFF_TYPE_CHANGED:
		return "type_changed";
	case CB_DIFF_MODE_CHANGED:
		return "mode_changed";
	}
	return "unknown";
}

/* Hash phase, outside any transaction: the writers of the journal never wait for it. */
static int snap_collect(struct cb_turns *t, const struct ws_pathset *set, struct snap_item *items)
{
	int ret = 0;

	for (size_t i = 0; i < set->n && !ret; i++) {
		const struct ws_path *p = &set->p[i];
		struct snap_item *it = &items[i];

		ret = cb_db_turns_map_get(t->db, p->path, &it->old);
		if (ret < 0)
			break;
		if (!it->old.path)
			it->old.path = strdup(p->path);
		ret = ws_live_entry(t, p->path, 1, &it->new);
		if (ret)
			break;
		if (!it->new.path)
			it->new.path = strdup(p->path);
		if (!it->old.path || !it->new.path) {
			ret = cb_error_set(ENOMEM, "snapshot: out of memory");
			break;
		}
		it->new.pid = p->pid;
		if (p->comm && !(it->new.comm = strdup(p->comm)))
			ret = cb_error_set(ENOMEM, "snapshot: out of memory");
	}
	return ret;
}

static int item_cmp(const void *a, const void *b)
{
	return strcmp(((const struct snap_item *)a)->old.path,
		      ((const struct snap_item *)b)->old.path);
}

/* The items of this snapshot, sorted by path up to n_sorted, and more appended after. */
struct snap_items {
	struct snap_item *it;
	size_t n, cap, n_sorted;
	pid_t pid;
	const char *comm;
};

static struct snap_item *items_find(struct snap_items *s, const char *path)
{
	struct snap_item key = {.old.path = (char *)path};

	return bsearch(&key, s->it, s->n_sorted, sizeof(*s->it), item_cmp);
}

/* A map entry below a path that stops being a directory, not examined itself: deleted. */
static int items_add_gone(const struct cb_entry *e, void *arg)
{
	struct snap_items *s = arg;
	struct snap_item *it;
	int ret;

	if (items_find(s, e->path))
		return 0;
	ret = cb_grow(&s->it, &s->cap, s->n, sizeof(*s->it), 64, "snapshot");
	if (ret)
		return ret;
	it = &s->it[s->n];
	memset(it, 0, sizeof(*it));
	ret = cb_entry_copy(&it->old, e);
	if (!ret && !(it->new.path = strdup(e->path)))
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
	it->new.pid = s->pid;
	if (!ret && s->comm && !(it->new.comm = strdup(s->comm)))
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
	s->n++;
	return ret;
}

/* The type path has in this turn: its item's if it was examined, else the map's. */
static int snap_type_of(struct cb_turns *t, struct snap_items *s, const char *path, int *type)
{
	struct snap_item *it = items_find(s, path);
	struct cb_entry e = {0};
	int ret;

	if (it) {
		*type = it->new.type;
		return 0;
	}
	ret = cb_db_turns_map_get(t->db, path, &e);
	*type = ret == 1 ? (int)e.type : CB_ENTRY_ABSENT;
	cb_entry_clear(&e);
	return ret < 0 ? ret : 0;
}

/* A turn is a tree: nothing is recorded below a path recorded as anything but a directory.
 * Paths are read one at a time while a program may swap a directory and a symlink
 * (rename-exchange) in between, so a child read while its parent was a directory can meet
 * its parent read as a symlink a moment later. Such a child is recorded absent (the swap
 * happened after the turn advance, so it is journaled in the next turn, whose snapshot
 * walks the directory again), and map entries below a path that stops being a directory go
 * with it. Parents sort before their children, so a dropped directory drops its subtree. */
static int snap_tree(struct cb_turns *t, struct snap_items *s)
{
	int ret = 0;

	s->n_sorted = s->n;
	for (size_t i = 0; i < s->n_sorted && !ret; i++) {
		struct snap_item *it = &s->it[i];
		const char *path = it->old.path, *slash = strrchr(path, '/');
		int parent = CB_ENTRY_DIR;

		if (slash) {
			char *dir = strndup(path, (size_t)(slash - path));

			if (!dir)
				return cb_error_set(ENOMEM, "snapshot: out of memory");
			ret = snap_type_of(t, s, dir, &parent);
			free(dir);
			if (ret)
				break;
		}
		if (parent != CB_ENTRY_DIR && it->new.type != CB_ENTRY_ABSENT) {
			pid_t pid = it->new.pid;
			char *comm = it->new.comm;

			it->new.comm = NULL;
			cb_entry_clear(&it->new);
			it->new.pid = pid;
			it->new.comm = comm;
			if (!(it->new.path = strdup(path)))
				return cb_error_set(ENOMEM, "snapshot: out of memory");
		}
		/* Below a parent that is not a directory the map holds nothing (it is a tree),
		 * or the parent's own listing covered it. */
		if (parent == CB_ENTRY_DIR && it->old.type == CB_ENTRY_DIR &&
		    it->new.type != CB_ENTRY_DIR) {
			s->pid = it->new.pid;
			s->comm = it->new.comm;
			ret = cb_db_turns_map_list(t->db, path, items_add_gone, s);
		}
	}
	if (!ret && s->n > s->n_sorted)
		qsort(s->it, s->n, sizeof(*s->it), item_cmp);
	return ret;
}

static int snap_record(struct cb_turns *t, long long turn, const char *label,
		       struct snap_item *items, size_t n, struct cb_diff *changes)
{
	long long nchanged = 0;
	int ret;

	ret = cb_db_turns_begin(t->db);
	if (ret)
		return ret;
	for (size_t i = 0; i < n && !ret; i++) {
		struct snap_item *it = &items[i];

		if (cb_entry_same(&it->old, &it->new))
			continue;
		nchanged++;
		ret = cb_db_turns_delta_put(t->db, turn, &it->new);
		if (!ret)
			ret = it->new.type == CB_ENTRY_ABSENT
				  ? cb_db_turns_map_del(t->db, it->new.path)
				  : cb_db_turns_map_put(t->db, &it->new);
		if (!ret && changes)
			ret = ws_diff_add(changes, &it->old, &it->new);
	}
	if (!ret)
		ret = cb_db_turns_add(t->db, turn, wall_now(), label, nchanged);
	if (!ret)
		ret = cb_db_turns_map_set_turn(t->db, turn);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret)
		cb_db_turns_rollback(t->db);
	return ret;
}

int cb_ws_snapshot(struct cb_turns *t, long long turn, const struct cb_dirty *dirty, size_t n,
		   const char *label, struct cb_diff *changes)
{
	long long latest = cb_db_turns_latest(t->db);
	struct ws_pathset set = {0};
	struct snap_items items = {0};
	int ret;

	if (turn <= latest) {
		ret = cb_error_set(EINVAL, "snapshot: turn %lld is already recorded (latest %lld)",
				   turn, latest);
		goto out;
	}
	ret = ws_map_ensure(t);
	if (ret)
		goto out;
	ret = ws_dirty_expand(t, dirty, n, &set);
	if (ret)
		goto out;
	ws_pathset_sort(&set);
	items.cap = set.n ? set.n : 1;
	items.it = calloc(items.cap, sizeof(*items.it));
	if (!items.it) {
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
		goto out;
	}
	items.n = set.n;
	t->read_left = t->read_max;
	t->read_done = 0;
	ret = snap_collect(t, &set, items.it);
	t->read_left = -1;
	if (!ret)
		ret = snap_tree(t, &items);
	if (!ret)
		ret = snap_record(t, turn, label, items.it, items.n, changes);
out:
	for (size_t i = 0; i < items.n; i++) {
		cb_entry_clear(&items.it[i].old);
		cb_entry_clear(&items.it[i].new);
	}
	free(items.it);
	ws_pathset_free(&set);
	ws_known_clear(t);
	return ret ? cb_error_wrap(ret, "snapshot turn %lld", turn) : 0;
}
