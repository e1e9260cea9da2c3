/* Snapshot: record the open turn as a delta against the latest one, rehashing only the paths
 * the journal names (directories that moved are walked), and keep new contents as blobs. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cowbox/journal.h"
#include "turns_int.h"

static double wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int diff_push(struct cb_diff *d, enum cb_diff_kind kind, const struct cb_entry *old,
		     const struct cb_entry *new)
{
	struct cb_diff_event *ev;
	int ret;

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

int ws_diff_add_meta(struct cb_diff *d, const struct cb_entry *old, const struct cb_entry *new)
{
	if (cb_entry_same(old, new))
		return cb_entry_meta_moved(new, old) ? diff_push(d, CB_DIFF_MODE_CHANGED, old, new)
						     : 0;
	return ws_diff_add(d, old, new);
}

int ws_diff_add(struct cb_diff *d, const struct cb_entry *old, const struct cb_entry *new)
{
	enum cb_diff_kind kind;

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
	return diff_push(d, kind, old, new);
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

/* Paths are examined a page at a time (in path order): the journal may name millions, and
 * only a page of them, with their entries, is ever held in memory; the rest wait in the
 * scratch tables (cb_db_scratch_*, SQLite's temporary file). */
#define SNAP_PAGE 1024

struct snap_item {
	struct cb_entry old, new;
};

static int item_cmp(const void *a, const void *b)
{
	return strcmp(((const struct snap_item *)a)->old.path,
		      ((const struct snap_item *)b)->old.path);
}

/* One page of paths being examined, sorted by path. */
struct snap_page {
	struct snap_item *it;
	size_t n;
	struct cb_db_scratch *s;
	pid_t pid; /* attribution of the entries snap_gone records */
	const char *comm;
};

static void page_clear(struct snap_page *pg)
{
	for (size_t i = 0; i < pg->n; i++) {
		cb_entry_clear(&pg->it[i].old);
		cb_entry_clear(&pg->it[i].new);
	}
	pg->n = 0;
}

/* Hash phase, outside any transaction: the writers of the journal never wait for it. */
static int snap_collect(struct cb_turns *t, const struct cb_scratch_row *rows, size_t n,
			struct snap_page *pg)
{
	int ret = 0;

	for (size_t i = 0; i < n && !ret; i++) {
		const struct cb_scratch_row *p = &rows[i];
		struct snap_item *it = &pg->it[i];

		pg->n = i + 1;
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

/* A map entry below a path that stops being a directory, not examined itself: deleted. */
static int snap_gone(const struct cb_entry *e, void *arg)
{
	struct snap_page *pg = arg;
	struct cb_entry now = {.path = e->path, .pid = pg->pid, .comm = (char *)pg->comm};
	int ret = cb_db_scratch_path_has(pg->s, e->path);

	if (ret)
		return ret < 0 ? ret : 0;
	return cb_db_scratch_res_put(pg->s, e, &now, 1);
}

/* The type path has in this turn: its entry's if it was examined (in this page or an earlier
 * one), else the map's. */
static int snap_type_of(struct cb_turns *t, struct snap_page *pg, const char *path, int *type)
{
	struct snap_item key = {.old.path = (char *)path};
	struct snap_item *it = bsearch(&key, pg->it, pg->n, sizeof(*pg->it), item_cmp);
	struct cb_entry e = {0};
	int ret;

	if (it) {
		*type = it->new.type;
		return 0;
	}
	ret = cb_db_scratch_res_type(pg->s, path, type);
	if (ret)
		return ret < 0 ? ret : 0;
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
 * with it. Parents sort before their children (in an earlier page or earlier in this one),
 * so a dropped directory drops its subtree. */
static int snap_tree(struct cb_turns *t, struct snap_page *pg)
{
	int ret = 0;

	for (size_t i = 0; i < pg->n && !ret; i++) {
		struct snap_item *it = &pg->it[i];
		const char *path = it->old.path, *slash = strrchr(path, '/');
		int parent = CB_ENTRY_DIR;

		if (slash) {
			char *dir = strndup(path, (size_t)(slash - path));

			if (!dir)
				return cb_error_set(ENOMEM, "snapshot: out of memory");
			ret = snap_type_of(t, pg, dir, &parent);
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
			pg->pid = it->new.pid;
			pg->comm = it->new.comm;
			ret = cb_db_scratch_begin(pg->s);
			if (!ret)
				ret = cb_db_turns_map_list(t->db, path, snap_gone, pg);
			if (!ret)
				ret = cb_db_scratch_commit(pg->s);
		}
	}
	return ret;
}

/* Keep the page's entries in the scratch tables, in one transaction (they lock nothing). */
static int snap_keep(struct snap_page *pg)
{
	int ret = cb_db_scratch_begin(pg->s);

	/* 2: the same content with other metadata, recorded so a restore gives it back */
	for (size_t i = 0; i < pg->n && !ret; i++)
		ret = cb_db_scratch_res_put(pg->s, &pg->it[i].old, &pg->it[i].new,
					    !cb_entry_same(&pg->it[i].old, &pg->it[i].new) ? 1
					    : cb_entry_meta_moved(&pg->it[i].old, &pg->it[i].new)
						? 2
						: 0);
	if (!ret)
		ret = cb_db_scratch_commit(pg->s);
	return ret;
}

static int sink_scratch(void *arg, const char *path, pid_t pid, const char *comm)
{
	return cb_db_scratch_path_add(arg, path, pid, comm);
}

/* Turn the dirty set into the paths to examine (walking what moved), a page at a time. */
static int snap_expand(struct cb_turns *t, struct cb_db_scratch *s, struct cb_scratch_row *rows)
{
	struct ws_sink sink = {sink_scratch, s};
	char *after = NULL;
	int n = 0, ret = 0;

	/* Two passes: every dirty row's own path first, then what lies below the rows; the
	 * scratch keeps a path's first credit, so each path is its own change's (30.9). */
	for (int pass = 0; pass < 2 && !ret; pass++) {
		free(after);
		after = NULL;
		while (!ret && (n = cb_db_scratch_dirty_page(s, after, rows, SNAP_PAGE)) > 0) {
			ret = cb_db_scratch_begin(s);
			for (int i = 0; i < n && !ret; i++) {
				struct cb_dirty d = {rows[i].path, rows[i].subtree, rows[i].pid,
						     rows[i].comm, rows[i].same_names};

				ret = pass ? ws_dirty_expand_below(t, &d, &sink)
					   : ws_dirty_add_own(&d, &sink);
			}
			if (!ret)
				ret = cb_db_scratch_commit(s);
			free(after);
			after = ret ? NULL : strdup(rows[n - 1].path);
			if (!ret && !after)
				ret = cb_error_set(ENOMEM, "snapshot: out of memory");
			cb_db_scratch_rows_free(rows, (size_t)n);
		}
		if (n < 0)
			ret = n;
	}
	cb_db_turns_rollback(t->db);
	free(after);
	return ret;
}

/* Examine every path to examine, a page at a time, keeping each entry in the scratch. */
static int snap_examine(struct cb_turns *t, struct cb_db_scratch *s, struct cb_scratch_row *rows)
{
	struct snap_page pg = {.s = s};
	char *after = NULL;
	int n = 0, ret = 0;

	pg.it = calloc(SNAP_PAGE, sizeof(*pg.it));
	if (!pg.it)
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	while (!ret && (n = cb_db_scratch_path_page(s, after, rows, SNAP_PAGE)) > 0) {
		ret = snap_collect(t, rows, (size_t)n, &pg);
		if (!ret)
			ret = snap_tree(t, &pg);
		if (!ret)
			ret = snap_keep(&pg);
		free(after);
		after = ret ? NULL : strdup(rows[n - 1].path);
		if (!ret && !after)
			ret = cb_error_set(ENOMEM, "snapshot: out of memory");
		page_clear(&pg);
		cb_db_scratch_rows_free(rows, (size_t)n);
	}
	if (n < 0)
		ret = n;
	cb_db_turns_rollback(t->db);
	free(pg.it);
	free(after);
	return ret;
}

static int changes_add(const struct cb_entry *old, const struct cb_entry *now, void *arg)
{
	return ws_diff_add(arg, old, now);
}

/* One write transaction records the turn: its delta rows and map rows come straight from the
 * scratch table, so a crash at any point leaves the previous turn as it was. */
static int snap_record(struct cb_turns *t, struct cb_db_scratch *s, long long turn,
		       const char *label, struct cb_diff *changes, int map_current)
{
	long long nchanged = 0;
	int ret;

	/* cb_ws_snapshot_skip_empty: no turn for an open turn whose rows changed nothing */
	if (t->skip_empty) {
		ret = cb_db_scratch_changed_count(s, &nchanged);
		if (ret || nchanged)
			goto record;
		t->skipped = 1;
		return 0;
	}
record:
	ret = cb_db_turns_begin(t->db);
	if (ret)
		return ret;
	ret = cb_db_scratch_record(s, turn, &nchanged);
	if (!ret)
		ret = cb_db_turns_add(t->db, turn, wall_now(), label, nchanged);
	/* A deferred map stays unbuilt (its turn behind the latest): it is built from the
	 * base when first needed. */
	if (!ret && map_current)
		ret = cb_db_turns_map_set_turn(t->db, turn);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret)
		cb_db_turns_rollback(t->db);
	if (!ret && changes)
		ret = cb_db_scratch_changes(s, changes_add, changes);
	return ret;
}

/* Record turn from the dirty set that fill (given arg) puts in the scratch tables. */
static int snap_run(struct cb_turns *t, long long turn, const char *label, struct cb_diff *changes,
		    int (*fill)(struct cb_db_scratch *, const void *), const void *arg)
{
	long long latest = cb_db_turns_latest(t->db);
	struct cb_scratch_row *rows = NULL;
	struct cb_db_scratch *s = NULL;
	int ret, defer = 0;

	if (turn <= latest) {
		ret = cb_error_set(EINVAL, "snapshot: turn %lld is already recorded (latest %lld)",
				   turn, latest);
		goto out;
	}
	ret = cb_db_scratch_open(t->db, &s);
	if (!ret)
		ret = fill(s, arg);
	if (ret)
		goto out;
	rows = calloc(SNAP_PAGE, sizeof(*rows));
	if (!rows) {
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
		goto out;
	}
	/* Nothing to examine and a map that needs a walk: the caller answers it from the walk
	 * and writes it after (cb_ws_map_first); the turn is recorded without touching it. */
	if (t->defer_map && ws_map_would_walk(t)) {
		int n = cb_db_scratch_dirty_page(s, NULL, rows, 1);

		if (n < 0)
			ret = n;
		else
			defer = n == 0;
		if (n > 0)
			cb_db_scratch_rows_free(rows, (size_t)n);
	}
	if (!ret && !defer)
		ret = ws_map_ensure(t);
	if (ret)
		goto out;
	ret = snap_expand(t, s, rows);
	t->read_left = t->read_max;
	t->read_done = 0;
	if (!ret)
		ret = snap_examine(t, s, rows);
	t->read_left = -1;
	if (!ret)
		ret = ws_snap_links(t, s, turn);
	if (!ret)
		ret = snap_record(t, s, turn, label, changes, !defer);
out:
	free(rows);
	cb_db_scratch_close(s);
	ws_known_clear(t);
	return ret ? cb_error_wrap(ret, "snapshot turn %lld", turn) : 0;
}

void cb_ws_snapshot_defer_map(struct cb_turns *t)
{
	t->defer_map = 1;
}

void cb_ws_snapshot_skip_empty(struct cb_turns *t)
{
	t->skip_empty = 1;
}

int cb_ws_snapshot_skipped(struct cb_turns *t)
{
	return t->skipped;
}

struct dirty_array {
	const struct cb_dirty *d;
	size_t n;
};

static int fill_array(struct cb_db_scratch *s, const void *arg)
{
	const struct dirty_array *a = arg;
	int ret = cb_db_scratch_begin(s);

	for (size_t i = 0; i < a->n && !ret; i++) {
		struct cb_scratch_row r = {(char *)a->d[i].path, a->d[i].subtree, a->d[i].pid,
					   (char *)a->d[i].comm, a->d[i].same_names};

		ret = cb_db_scratch_dirty_add(s, &r);
	}
	return ret ? ret : cb_db_scratch_commit(s);
}

int cb_ws_snapshot(struct cb_turns *t, long long turn, const struct cb_dirty *dirty, size_t n,
		   const char *label, struct cb_diff *changes)
{
	struct dirty_array a = {dirty, n};
	int ret = snap_run(t, turn, label, changes, fill_array, &a);

	cb_db_turns_rollback(t->db);
	return ret;
}

static int fill_journal(struct cb_db_scratch *s, const void *arg)
{
	const struct cb_journal_span *span = arg;
	int ret = 0;

	/* Names first: the rows of the turns proper have the last word on attribution. */
	if (span->names_turn > 0)
		ret = cb_db_scratch_dirty_journal(s, span->names_turn, span->names_turn,
						  CB_CHANGE_WRITE);
	if (!ret && span->from <= span->to)
		ret = cb_db_scratch_dirty_journal(s, span->from, span->to, -1);
	return ret;
}

int cb_ws_snapshot_journal(struct cb_turns *t, long long turn, const struct cb_journal_span *span,
			   const char *label, struct cb_diff *changes)
{
	return snap_run(t, turn, label, changes, fill_journal, span);
}

int cb_ws_journal_dirty(struct cb_turns *t, const struct cb_journal_span *span,
			struct cb_dirty **out, size_t *n)
{
	struct cb_scratch_row *rows = NULL;
	struct cb_db_scratch *s = NULL;
	size_t cap = 0;
	char *after = NULL;
	int got = 0, ret;

	*out = NULL;
	*n = 0;
	ret = cb_db_scratch_open(t->db, &s);
	if (!ret)
		ret = fill_journal(s, span);
	if (!ret && !(rows = calloc(SNAP_PAGE, sizeof(*rows))))
		ret = cb_error_set(ENOMEM, "journal rows: out of memory");
	while (!ret && (got = cb_db_scratch_dirty_page(s, after, rows, SNAP_PAGE)) > 0) {
		for (int i = 0; !ret && i < got; i++) {
			ret = cb_grow(out, &cap, *n, sizeof(**out), 64, "journal rows");
			if (ret)
				break;
			(*out)[(*n)++] =
			    (struct cb_dirty){rows[i].path, rows[i].subtree, rows[i].pid,
					      rows[i].comm, rows[i].same_names};
			rows[i].path = rows[i].comm = NULL;
		}
		free(after);
		after = ret ? NULL : strdup((*out)[*n - 1].path);
		if (!ret && !after)
			ret = cb_error_set(ENOMEM, "journal rows: out of memory");
		cb_db_scratch_rows_free(rows, (size_t)got);
	}
	if (got < 0)
		ret = got;
	free(after);
	free(rows);
	cb_db_scratch_close(s);
	if (ret) {
		cb_ws_dirty_free(*out, *n);
		*out = NULL;
		*n = 0;
	}
	return ret;
}

void cb_ws_dirty_free(struct cb_dirty *d, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free((char *)d[i].path);
		free((char *)d[i].comm);
	}
	free(d);
}
