/* cowbox fsck: check every blob and base file a turn needs and every base-cache row, say which
 * turns a bad one breaks, and repair what can be repaired without touching the agent's files. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/fsck.h"
#include "cowbox/grow.h"
#include "cowbox/journal.h"
#include "cowbox/turn_store.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "turns_int.h"
#include "util/beneath.h"
#include "ws.h"

static int fsck_add(struct cb_fsck_report *r, const char *kind, const char *path,
		    const char *object, long long from, long long until, int repaired,
		    const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static int fsck_add(struct cb_fsck_report *r, const char *kind, const char *path,
		    const char *object, long long from, long long until, int repaired,
		    const char *fmt, ...)
{
	struct cb_fsck_problem *p;
	va_list ap;
	int rc = cb_grow(&r->p, &r->cap, r->n, sizeof(*r->p), 16, "fsck");

	if (rc)
		return rc;
	p = &r->p[r->n];
	memset(p, 0, sizeof(*p));
	p->kind = kind;
	p->path = path ? strdup(path) : NULL;
	p->object = object ? strdup(object) : NULL;
	p->first_turn = from;
	p->last_turn = until < 0 ? -1 : until - 1;
	p->repaired = repaired;
	va_start(ap, fmt);
	if (vasprintf(&p->detail, fmt, ap) < 0)
		p->detail = NULL;
	va_end(ap);
	if ((path && !p->path) || (object && !p->object) || !p->detail) {
		free(p->path);
		free(p->object);
		free(p->detail);
		return cb_error_set(ENOMEM, "fsck: out of memory");
	}
	r->n++;
	return 0;
}

void cb_ws_fsck_free(struct cb_fsck_report *r)
{
	for (size_t i = 0; i < r->n; i++) {
		free(r->p[i].path);
		free(r->p[i].object);
		free(r->p[i].detail);
	}
	free(r->p);
	memset(r, 0, sizeof(*r));
}

struct fsck_ctx {
	struct cb_turns *t;
	struct cb_fsck_report *r;
	/* the blob verdict of the last content seen (deltas come ordered by content) */
	unsigned char last_xxh3[CB_XXH128_LEN];
	int have_last, last_ok;
	char last_why[256];
};

/* 1 if the base file at path holds exactly e's bytes now. */
static int base_file_holds(struct cb_turns *t, const struct cb_entry *e)
{
	int fd, ok;

	if (t->base_fd < 0)
		return 0;
	fd = cb_beneath_open(t->base_fd, e->path, O_RDONLY | O_NONBLOCK, 0);
	if (fd < 0)
		return 0;
	ok = cb_ws_copy_checked(fd, -1, e, "base file") == 0;
	close(fd);
	cb_error_clear();
	return ok;
}

/* base_file_holds for a recorded content: never in place, where the folder is live and a
 * blob is the only good copy. */
static int fsck_base_holds(struct cb_turns *t, const struct cb_entry *e)
{
	return !t->in_place && base_file_holds(t, e);
}

/* Is e's blob there and good? Sets ok and a reason; one read per distinct content. */
static void fsck_blob(struct fsck_ctx *c, const struct cb_entry *e)
{
	char hex[2 * CB_XXH128_LEN + 1];
	int fd;

	if (c->have_last && !memcmp(c->last_xxh3, e->xxh3, CB_XXH128_LEN))
		return;
	memcpy(c->last_xxh3, e->xxh3, CB_XXH128_LEN);
	c->have_last = 1;
	c->r->blobs_checked++;
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (!cb_ws_blob_has(c->t->blob_fd, e->xxh3)) {
		c->last_ok = 0;
		snprintf(c->last_why, sizeof(c->last_why), "missing");
		return;
	}
	fd = cb_ws_blob_open(c->t->blob_fd, e->xxh3);
	c->last_ok = fd >= 0 && cb_ws_copy_checked(fd, -1, e, "blob") == 0;
	if (!c->last_ok)
		snprintf(c->last_why, sizeof(c->last_why), "damaged: %s", cb_error_message());
	if (fd >= 0)
		close(fd);
	cb_error_clear();
}

/* A file content a delta recorded: its blob, or (content equal to the base's at the same
 * path is not kept as a blob) the base file. */
static int fsck_delta(const struct cb_entry *e, long long from, long long until, void *arg)
{
	struct fsck_ctx *c = arg;
	char hex[2 * CB_XXH128_LEN + 1];

	fsck_blob(c, e);
	if (c->last_ok || fsck_base_holds(c->t, e))
		return 0;
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	return fsck_add(c->r, "blob", e->path, hex, from, until, 0,
			"blob %s (%lld bytes of %s) is %s, and the base does not hold it", hex,
			e->size, e->path, c->last_why);
}

/* A file of turn 0: the base file, or a blob of the same content. */
static int fsck_base_file(const struct cb_entry *e, long long from, long long until, void *arg)
{
	struct fsck_ctx *c = arg;
	char hex[2 * CB_XXH128_LEN + 1];

	c->r->base_checked++;
	if (until == 0 || fsck_base_holds(c->t, e) || cb_ws_blob_has(c->t->blob_fd, e->xxh3))
		return 0;
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	return fsck_add(c->r, "base", e->path, hex, from, until, 0,
			"base file %s is missing or no longer holds what turn 0 recorded (%lld "
			"bytes, content %s), and no blob keeps it",
			e->path, e->size, hex);
}

/* A cache row is usable only while the base file has exactly its key and its hashes. */
static int fsck_cache_row(const struct cb_db_cache_row *row, void *arg)
{
	struct fsck_ctx *c = arg;
	struct cb_entry e = {.path = (char *)row->path, .type = CB_ENTRY_FILE, .size = row->size};
	const char *why = NULL;
	struct stat st;
	int stale = 1;

	c->r->cache_rows++;
	memcpy(e.sha256, row->sha256, CB_SHA256_LEN);
	memcpy(e.xxh3, row->xxh3, CB_XXH128_LEN);
	if (c->t->base_fd < 0 || cb_beneath_stat(c->t->base_fd, row->path, &st) < 0)
		why = "the base file is gone";
	else if (!S_ISREG(st.st_mode) || st.st_size != row->size ||
		 (long long)st.st_ino != row->ino ||
		 (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec !=
		     row->mtime_ns ||
		 (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec != row->ctime_ns)
		why = "the base file changed since (the row is never used again)";
	else if (!(stale = 0) && !base_file_holds(c->t, &e))
		why = "the base file has the row's key but other content";
	/* In place the agent rewrites the folder: a row its key no longer matches is never
	 * used again, not a problem. */
	if (!why || (c->t->in_place && stale))
		return 0;
	return fsck_add(c->r, "base_cache", row->path, NULL, 0, -1, 0, "base cache row for %s: %s",
			row->path, why);
}

/* Drop the unusable base-cache rows found (each is only a hint; a miss means a rehash). */
static int fsck_repair_cache(struct cb_turns *t, struct cb_fsck_report *r)
{
	int ret = cb_db_turns_begin(t->db);

	for (size_t i = 0; i < r->n && !ret; i++)
		if (!strcmp(r->p[i].kind, "base_cache"))
			ret = cb_db_turns_base_cache_del(t->db, r->p[i].path);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret) {
		cb_db_turns_rollback(t->db);
		return ret;
	}
	for (size_t i = 0; i < r->n; i++)
		if (!strcmp(r->p[i].kind, "base_cache"))
			r->p[i].repaired = 1;
	return 0;
}

/* ---- the turn store and the journal against each other and against upper/ ---- */

/* A turn that holds fewer rows than it recorded lost some: a rollback or fork to it (and to a
 * later turn that did not record those paths again) gives a wrong tree. */
static int fsck_short_turn(long long turn, long long recorded, long long held, void *arg)
{
	return fsck_add(arg, "turn_rows", NULL, NULL, turn, -1, 0,
			"turn %lld recorded %lld changed paths but turn_delta holds %lld of them "
			"(rows deleted behind cowbox's back): rollback and fork to turn %lld or "
			"later may give a wrong tree",
			turn, recorded, held, turn);
}

struct fsck_upper {
	struct cb_turns *t;
	struct cb_fsck_report *r;
	char **odd; /* paths whose live entry differs from the last turn's map */
	int *gone;  /* ... and whether the path is gone (deleted) */
	size_t n, cap, gcap;
	struct fsck_jrow {
		char *path;
		int subtree;
	} * rows; /* the open turn's journal, sorted by path */
	size_t nrows, rcap;
};

static int fsck_odd_add(struct fsck_upper *u, const char *path, int gone)
{
	int rc = cb_grow(&u->odd, &u->cap, u->n, sizeof(*u->odd), 64, "fsck");

	if (!rc)
		rc = cb_grow(&u->gone, &u->gcap, u->n, sizeof(*u->gone), 64, "fsck");
	if (rc)
		return rc;
	if (!(u->odd[u->n] = strdup(path)))
		return cb_error_set(ENOMEM, "fsck: out of memory");
	u->gone[u->n++] = gone;
	return 0;
}

/* Each entry of upper/ against the map: what the next snapshot would compare it with. */
static int fsck_upper_visit(int dirfd, const char *name, const char *path, const struct stat *st,
			    void *arg)
{
	struct fsck_upper *u = arg;
	struct cb_entry old = {0}, now = {0};
	int ret, same;

	(void)dirfd;
	(void)name;
	if (ws_is_tmp_name(path))
		return 0;
	if ((ret = cb_db_turns_map_get(u->t->db, path, &old)) < 0)
		return ret;
	if (S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0)) {
		same = ret == 0 || old.type == CB_ENTRY_ABSENT;
		cb_entry_clear(&old);
		return same ? 0 : fsck_odd_add(u, path, 1);
	}
	ret = ws_live_entry(u->t, path, 0, &now);
	if (ret) {
		/* changed meanwhile (mounted): its mark, if any, is read after the walk */
		cb_entry_clear(&old);
		cb_error_clear();
		return fsck_odd_add(u, path, 0);
	}
	same = cb_entry_same(&old, &now);
	cb_entry_clear(&old);
	cb_entry_clear(&now);
	return same ? 0 : fsck_odd_add(u, path, 0);
}

/* A path of the last turn that neither layer holds was deleted. */
static int fsck_map_visit(const struct cb_entry *e, void *arg)
{
	struct fsck_upper *u = arg;
	struct stat st;

	if (e->type == CB_ENTRY_ABSENT || !e->path[0] || ws_is_tmp_name(e->path) ||
	    cb_beneath_stat(u->t->root_fd, e->path, &st) == 0 ||
	    (!u->t->in_place && u->t->base_fd >= 0 &&
	     cb_beneath_stat(u->t->base_fd, e->path, &st) == 0))
		return 0;
	return fsck_odd_add(u, e->path, 1);
}

static int fsck_jrow(const struct cb_journal_row *row, void *arg)
{
	struct fsck_upper *u = arg;
	int rc = cb_grow(&u->rows, &u->rcap, u->nrows, sizeof(*u->rows), 64, "fsck");

	if (rc)
		return rc;
	if (!(u->rows[u->nrows].path = strdup(row->path)))
		return cb_error_set(ENOMEM, "fsck: out of memory");
	u->rows[u->nrows++].subtree = row->subtree;
	return 0;
}

static int fsck_jrow_cmp(const void *a, const void *b)
{
	return strcmp(((const struct fsck_jrow *)a)->path, ((const struct fsck_jrow *)b)->path);
}

/* 1 if the next snapshot examines path: the journal names it, or names a directory above it
 * with its subtree, or one the map has as no directory (a new one: walked whole). */
static int fsck_covered(struct fsck_upper *u, const char *path)
{
	char *p = strdup(path), *slash;
	int covered = 0;

	if (!p)
		return 1; /* no false alarm for want of memory */
	for (int self = 1; !covered; self = 0) {
		struct fsck_jrow key = {.path = p}, *hit;

		/* the rows are unique per (path, kind): any of a path's rows with subtree */
		hit = bsearch(&key, u->rows, u->nrows, sizeof(*u->rows), fsck_jrow_cmp);
		if (hit) {
			while (hit > u->rows && !strcmp(hit[-1].path, p))
				hit--;
			for (; hit < u->rows + u->nrows && !strcmp(hit->path, p); hit++) {
				struct cb_entry e = {0};

				if (self || hit->subtree ||
				    cb_db_turns_map_get(u->t->db, p, &e) != 1 ||
				    e.type != CB_ENTRY_DIR)
					covered = 1;
				cb_entry_clear(&e);
			}
		}
		if (covered || !(slash = strrchr(p, '/')))
			break;
		*slash = '\0';
	}
	cb_error_clear();
	free(p);
	return covered;
}

/* upper/ against the last turn plus the open turn's journal: every difference must have a
 * mark, or the next snapshot leaves it out (rows deleted from `journal`, marks lost). The
 * walk comes first and the journal is read after it: a change made meanwhile was marked
 * before it was made, so it is never a false alarm. repair: mark what has none. */
static int fsck_upper(struct cb_turns *t, struct cb_db *db, int repair, struct cb_fsck_report *r)
{
	struct fsck_upper u = {.t = t, .r = r};
	long long latest = cb_db_turns_latest(t->db), open_turn;
	int ret = 0;

	/* A map not built for the latest turn (deferred) says nothing about it; in place the
	 * folder is changed behind the mount by design (the mount walks it). */
	if (t->root_fd < 0 || t->in_place || cb_db_turns_map_turn(t->db) != latest)
		return 0;
	if ((ret = cb_beneath_walk(t->root_fd, fsck_upper_visit, &u)) ||
	    (ret = cb_db_turns_map_list(t->db, NULL, fsck_map_visit, &u)))
		goto out;
	if (!u.n)
		goto out;
	open_turn = cb_journal_turn(db);
	if ((ret = cb_journal_list(db, open_turn, fsck_jrow, &u)))
		goto out;
	qsort(u.rows, u.nrows, sizeof(*u.rows), fsck_jrow_cmp);
	for (size_t i = 0; i < u.n && !ret; i++) {
		struct cb_change ch = {.kind = u.gone[i] ? CB_CHANGE_DELETE : CB_CHANGE_WRITE,
				       .path = u.odd[i],
				       .subtree = u.gone[i]};
		int fixed = 0;

		if (fsck_covered(&u, u.odd[i]))
			continue;
		if (repair) {
			if ((ret = cb_journal_mark(db, &ch, 1)))
				break;
			fixed = 1;
		}
		ret = fsck_add(r, "journal", u.odd[i], NULL, open_turn, -1, fixed,
			       "%s %s since turn %lld but the journal of the open turn %lld has no "
			       "mark for it (rows deleted or marks lost): the next snapshot would "
			       "leave it out%s",
			       u.odd[i], u.gone[i] ? "is gone" : "changed", latest, open_turn,
			       fixed ? "; journaled now" : "");
	}
out:
	for (size_t i = 0; i < u.n; i++)
		free(u.odd[i]);
	for (size_t i = 0; i < u.nrows; i++)
		free(u.rows[i].path);
	free(u.odd);
	free(u.gone);
	free(u.rows);
	return ret;
}

static int fsck_turns(const char *dir, const char *db_path, const char *base, struct cb_db *db,
		      int repair, struct cb_fsck_report *r)
{
	char *blobs = NULL, *upper = NULL;
	struct cb_turns *t = NULL;
	struct fsck_ctx c = {.r = r};
	int ret;

	if ((ret = ws_pathf(&blobs, "%s/blobs", dir)) || (ret = ws_pathf(&upper, "%s/upper", dir)))
		goto out;
	/* The live tree is upper/ (never our own mount): fsck reads no path through FUSE. */
	struct cb_turns_config cfg = {
	    .db_path = db_path, .blob_dir = blobs, .base_dir = base, .root = upper};

	if ((ret = cb_turns_open(&cfg, &t)))
		goto out;
	c.t = t;
	ret = cb_db_turns_file_deltas(t->db, fsck_delta, &c);
	if (!ret)
		ret = cb_db_turns_base_files(t->db, fsck_base_file, &c);
	if (!ret)
		ret = cb_db_turns_base_cache_list(t->db, fsck_cache_row, &c);
	if (!ret)
		ret = cb_db_turns_short_turns(t->db, fsck_short_turn, r);
	if (!ret)
		ret = fsck_upper(t, db, repair, r);
	if (!ret && repair)
		ret = fsck_repair_cache(t, r);
out:
	cb_turns_close(t);
	free(blobs);
	free(upper);
	return ret;
}

/* Journal path, an entry of upper/ met by a walk, as changed (kind): a whiteout as a deleted
 * subtree, a directory with all below it. */
static int mark_upper_entry(struct cb_db *db, enum cb_change_kind kind, const char *path,
			    const struct stat *st)
{
	struct cb_change ch = {.kind = kind, .path = path};

	if (S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0))
		ch.kind = CB_CHANGE_DELETE, ch.subtree = 1;
	else if (S_ISDIR(st->st_mode))
		ch.subtree = 1;
	return cb_journal_mark(db, &ch, 1);
}

/* ---- a mark log that lost bytes: journal what they may have held ---- */

struct rescan {
	struct cb_db *db;
	int upper_fd, base_fd;
	long long marked;
	char **gone; /* map paths neither layer holds, marked after the map is read */
	size_t n, cap;
};

/* Every entry of upper/ may have changed since the last turn: a directory with all below it
 * (an opaque one hides base entries the map still has), a whiteout as a deleted subtree. */
static int rescan_upper(int dirfd, const char *name, const char *path, const struct stat *st,
			void *arg)
{
	struct rescan *rs = arg;

	(void)dirfd;
	(void)name;
	rs->marked++;
	return mark_upper_entry(rs->db, CB_CHANGE_WRITE, path, st);
}

/* A path of the last turn that is in neither layer was deleted with no whiteout (it was only
 * ever in upper/): nothing in upper/ names it, so it is marked by name. */
static int rescan_map(const struct cb_entry *e, void *arg)
{
	struct rescan *rs = arg;
	struct stat st;
	int rc;

	if (!e->path[0] || !strcmp(e->path, ".") ||
	    cb_beneath_stat(rs->upper_fd, e->path, &st) == 0 ||
	    (rs->base_fd >= 0 && cb_beneath_stat(rs->base_fd, e->path, &st) == 0))
		return 0;
	if ((rc = cb_grow(&rs->gone, &rs->cap, rs->n, sizeof(*rs->gone), 64, "marks rescan")))
		return rc;
	if (!(rs->gone[rs->n] = strdup(e->path)))
		return cb_error_set(ENOMEM, "marks rescan: out of memory");
	rs->n++;
	return 0;
}

int cb_ws_marks_rescan(struct cb_db *db, const char *db_path, const char *upper, const char *base,
		       long long *marked)
{
	struct rescan rs = {.db = db, .upper_fd = -1, .base_fd = -1};
	struct cb_db_turns *t = NULL;
	char *pending = NULL;
	int ret = cb_db_meta_get(db, CB_MARKS_RESCAN_KEY, &pending);

	if (marked)
		*marked = 0;
	if (ret == -ENOENT) {
		cb_error_clear();
		return 0;
	}
	if (ret)
		return ret;
	rs.upper_fd = open(upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rs.upper_fd < 0) {
		ret = cb_error_set(errno, "journal the lost marks: upper layer %s: %s", upper,
				   strerror(errno));
		goto out;
	}
	/* A base that is gone holds nothing: its paths are marked too (harmless: a mark only
	 * makes the snapshot look). */
	if (base)
		rs.base_fd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if ((ret = cb_db_turns_open(db_path, &t)) ||
	    (ret = cb_db_turns_map_list(t, NULL, rescan_map, &rs)))
		goto out;
	cb_db_turns_close(t);
	t = NULL;
	for (size_t i = 0; i < rs.n && !ret; i++) {
		struct cb_change ch = {.kind = CB_CHANGE_DELETE, .path = rs.gone[i], .subtree = 1};

		rs.marked++;
		ret = cb_journal_mark(db, &ch, 1);
	}
	if (!ret)
		ret = cb_beneath_walk(rs.upper_fd, rescan_upper, &rs);
	/* The marks are in the log or the table (either survives a kill -9) before the request
	 * to make them goes. */
	if (!ret)
		ret = cb_db_meta_del(db, CB_MARKS_RESCAN_KEY);
	if (ret)
		ret = cb_error_wrap(ret, "journal the paths of %s the lost marks may have held",
				    upper);
out:
	cb_db_turns_close(t);
	for (size_t i = 0; i < rs.n; i++)
		free(rs.gone[i]);
	free(rs.gone);
	if (rs.upper_fd >= 0)
		close(rs.upper_fd);
	if (rs.base_fd >= 0)
		close(rs.base_fd);
	free(pending);
	if (!ret && marked)
		*marked = rs.marked;
	return ret ? ret : 1;
}

/* ---- rebuilding a meta.db that cannot be used ---- */

struct rebuild {
	struct cb_db *db;
	long long marked;
};

/* Mark every path of upper/ changed in the new database's open turn, so that the first
 * snapshot hashes all of them (a whiteout marks a base path deleted, subtree included). */
static int rebuild_visit(int dirfd, const char *name, const char *path, const struct stat *st,
			 void *arg)
{
	struct rebuild *rb = arg;

	(void)dirfd;
	(void)name;
	rb->marked++;
	return mark_upper_entry(rb->db, CB_CHANGE_CREATE, path, st);
}

/* Who holds ref's name: the name whose link under names/ points at it, or NULL. */
static char *rebuild_name(const char *ref)
{
	char *home = NULL, *names = NULL, *found = NULL;
	struct dirent *de;
	DIR *d;

	if (cb_ws_home(&home) || ws_pathf(&names, "%s/names", home)) {
		free(home);
		return NULL;
	}
	d = opendir(names);
	while (d && !found && (de = readdir(d))) {
		char target[64];
		ssize_t n = readlinkat(dirfd(d), de->d_name, target, sizeof(target) - 1);

		if (n > 0) {
			target[n] = '\0';
			if (!strcmp(target, ref))
				found = strdup(de->d_name);
		}
	}
	if (d)
		closedir(d);
	free(names);
	free(home);
	cb_error_clear();
	return found;
}

/* Move meta.db (and its -wal, -shm) aside as meta.db.damaged-<time>: never deleted. */
static int rebuild_move_aside(const char *db_path, char **kept)
{
	/* The mark log goes too: its records belong to the damaged file's turns. */
	static const char *const sfx[] = {"", "-wal", "-shm", "-marks", "-marks.fold"};
	char *from = NULL, *to = NULL;
	long long now = (long long)time(NULL);
	int ret = 0;

	*kept = NULL;
	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]) && !ret; i++) {
		if ((ret = ws_pathf(&from, "%s%s", db_path, sfx[i])) ||
		    (ret = ws_pathf(&to, "%s.damaged-%lld%s", db_path, now, sfx[i])))
			break;
		if (rename(from, to) == 0) {
			if (i == 0)
				*kept = strdup(to);
		} else if (errno != ENOENT) {
			ret = cb_error_set(errno, "move %s aside: %s", from, strerror(errno));
		}
		free(from);
		free(to);
		from = to = NULL;
	}
	free(from);
	free(to);
	return ret;
}

static int fsck_rebuild(const char *ref, const char *dir, const char *db_path, const char *base_opt,
			const char *why, struct cb_fsck_report *r)
{
	char *base = NULL, *name = NULL, *upper = NULL, *kept = NULL, *base_file = NULL;
	char *mnt = NULL;
	struct cb_db *db = NULL;
	struct rebuild rb = {0};
	struct cb_db_salvage sv = {0};
	pid_t pid = 0;
	int ret, upper_fd, salvaged = 0;

	ret = cb_ws_daemon(ref, &pid, &mnt);
	free(mnt);
	if (ret)
		return ret;
	if (pid != 0)
		return cb_error_set(EBUSY,
				    "workspace %s is mounted (daemon %d): unmount it ('cowbox "
				    "umount %s') before fsck --repair rebuilds its database",
				    ref, (int)pid, ref);
	/* The base: what the old file still says, else the copy kept beside it at create,
	 * else --base. */
	if (cb_db_meta_peek(db_path, "base", &base) < 0 &&
	    !ws_pathf(&base_file, "%s/base.path", dir)) {
		FILE *f = fopen(base_file, "re");
		char line[4096];

		if (f && fgets(line, sizeof(line), f)) {
			line[strcspn(line, "\n")] = '\0';
			base = line[0] ? strdup(line) : NULL;
		}
		if (f)
			fclose(f);
	}
	if (base_opt) {
		free(base);
		base = strdup(base_opt);
	}
	cb_error_clear();
	if (cb_db_meta_peek(db_path, "name", &name) < 0)
		name = rebuild_name(ref);
	if ((ret = rebuild_move_aside(db_path, &kept)) || (ret = cb_db_open(db_path, &db)))
		goto out;
	if (base && (ret = cb_db_meta_set(db, "base", base)))
		goto out;
	if (name && (ret = cb_db_meta_set(db, "name", name)))
		goto out;
	/* In place, the folder is the upper layer: it becomes turn 0 again, as it is now. */
	if (ws_in_place_marked(dir) && base) {
		if (!(ret = cb_db_meta_set(db, "in_place", "1")) &&
		    !(ret = ws_in_place_record(dir, base)) &&
		    !(ret = cb_db_meta_set(db, "created", "1")))
			ret = fsck_add(r, "meta.db", db_path, kept, 0, -1, 1,
				       "%s; rebuilt as an in-place workspace whose turn 0 is %s as "
				       "it is now%s%s",
				       why, base, kept ? "; the old file is kept as " : "",
				       kept ? kept : "");
		goto out;
	}
	if ((ret = ws_pathf(&upper, "%s/upper", dir)))
		goto out;
	/* Every row SQLite can still read of the old file, and the turns that are whole. */
	if (kept && (ret = cb_db_salvage(db, kept, &sv)))
		goto out;
	if (kept && !sv.unreadable) {
		/* the journal's open turn is read at the open: the salvage moved it */
		cb_db_close(db);
		db = NULL;
		if ((ret = cb_db_open(db_path, &db)) ||
		    (base && (ret = cb_db_meta_set(db, "base", base))) ||
		    (name && (ret = cb_db_meta_set(db, "name", name))))
			goto out;
		salvaged = 1;
	}
	rb.db = db;
	upper_fd = open(upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (upper_fd < 0)
		ret = cb_error_set(errno, "walk %s: %s", upper, strerror(errno));
	else
		ret = cb_beneath_walk(upper_fd, rebuild_visit, &rb);
	if (upper_fd >= 0)
		close(upper_fd);
	if (!ret)
		ret = cb_db_meta_set(db, "created", "1");
	if (!ret && salvaged) {
		char lost[128] = "";

		if (sv.kept + 1 == sv.latest)
			snprintf(lost, sizeof(lost), "; turn %lld could not be recovered",
				 sv.latest);
		else if (sv.kept < sv.latest)
			snprintf(lost, sizeof(lost), "; turns %lld-%lld could not be recovered",
				 sv.kept + 1, sv.latest);
		ret = fsck_add(r, "meta.db", db_path, kept, sv.kept + 1, -1, sv.kept >= sv.latest,
			       "%s; rebuilt from its %lld readable rows (%d table%s cut short by "
			       "damaged pages): turns %s%lld kept as they were%s%s; the %lld paths "
			       "of upper/ journaled, so the next snapshot records the tree as it "
			       "is; the old file is kept as %s",
			       why, sv.rows, sv.damaged_tables, sv.damaged_tables == 1 ? "" : "s",
			       sv.kept ? "1-" : "", sv.kept, lost,
			       sv.lost_base_map ? "; the base map was damaged: built from the base "
						  "again when needed"
						: "",
			       rb.marked, kept);
	} else if (!ret)
		ret = fsck_add(r, "meta.db", db_path, kept, 0, -1, 1,
			       "%s; rebuilt as a workspace with no turns over the %lld paths of "
			       "upper/ (base %s)%s%s",
			       why, rb.marked, base ? base : "none (empty)",
			       kept ? "; the old file is kept as " : "", kept ? kept : "");
out:
	cb_db_close(db);
	free(base);
	free(name);
	free(upper);
	free(kept);
	free(base_file);
	return ret;
}

/* A mark log that lost bytes is a problem until --repair has journaled what they may have
 * held (if the next mount has not yet) and has been told: never a silent clean. */
static int fsck_marks(struct cb_db *db, const char *db_path, const char *dir, const char *base,
		      int repair, struct cb_fsck_report *r)
{
	char *lost = NULL, *in_place = NULL, *upper = NULL, *pending = NULL;
	long long marked = 0;
	int ret = cb_db_meta_get(db, CB_MARKS_LOST_KEY, &lost), walked;

	if (ret == -ENOENT) {
		cb_error_clear();
		return 0;
	}
	if (ret)
		return ret;
	if (cb_db_meta_get(db, "in_place", &in_place) == 0 && !strcmp(in_place, "1") && base)
		upper = strdup(base);
	else if ((ret = ws_pathf(&upper, "%s/upper", dir)))
		goto out;
	cb_error_clear();
	if (!upper) {
		ret = cb_error_set(ENOMEM, "fsck: out of memory");
		goto out;
	}
	if (!repair) {
		int waiting = cb_db_meta_get(db, CB_MARKS_RESCAN_KEY, &pending) == 0;

		cb_error_clear();
		ret = fsck_add(r, "marks", NULL, NULL, 0, -1, 0,
			       "%s; %s; 'cowbox fsck --repair %s' journals them and clears this",
			       lost,
			       waiting ? "the paths they may have held are not journaled yet (the "
					 "next mount journals every path of upper/ that differs "
					 "from the last turn)"
				       : "every path of upper/ that differs from the last turn has "
					 "been journaled since, so the next snapshot records them",
			       r->ref);
		goto out;
	}
	if ((walked = cb_ws_marks_rescan(db, db_path, upper, base, &marked)) < 0) {
		ret = walked;
		goto out;
	}
	if ((ret = cb_db_meta_del(db, CB_MARKS_LOST_KEY)))
		goto out;
	if (walked)
		ret = fsck_add(r, "marks", NULL, NULL, 0, -1, 1,
			       "%s; %lld paths of upper/ and of the last turn journaled as "
			       "changed, so the next snapshot records the tree as it is",
			       lost, marked);
	else
		ret = fsck_add(r, "marks", NULL, NULL, 0, -1, 1,
			       "%s; the paths they may have held were journaled at a mount "
			       "since",
			       lost);
out:
	free(lost);
	free(in_place);
	free(upper);
	free(pending);
	return ret;
}

/* A temporary file of an apply that was killed is cowbox's own litter in the user's folder:
 * removed (with or without --repair) and reported. */
static int fsck_apply_temp(const char *path, void *arg)
{
	return fsck_add(arg, "apply_temp", path, NULL, 0, -1, 1,
			"%s: a temporary file of an apply that was killed midway; removed", path);
}

/* A staging directory of a fork whose builder died (never a workspace): removed, reported. */
static int fsck_unpublished(const char *path, void *arg)
{
	return fsck_add(arg, "staging", path, NULL, 0, -1, 1,
			"%s: a fork's staging directory whose daemon died before publishing it; "
			"removed",
			path);
}

int cb_ws_fsck(const char *arg, int repair, const char *base_opt, struct cb_fsck_report *out)
{
	char ref[CB_WS_REF_LEN + 1];
	char *dir = NULL, *db_path = NULL, *base = NULL;
	struct cb_db *db = NULL;
	int ret, attached = 0;

	memset(out, 0, sizeof(*out));
	/* before cb_ws_find, which would sweep them unreported */
	cb_ws_sweep_unpublished(fsck_unpublished, out);
	if ((ret = cb_ws_find(arg, ref)) || (ret = cb_ws_path(ref, NULL, &dir)) ||
	    (ret = cb_ws_path(ref, "meta.db", &db_path)))
		goto out;
	memcpy(out->ref, ref, sizeof(out->ref));
	/* upper/ as its own filesystem that no daemon serves now: mounted while we read it */
	if ((ret = cb_ws_upper_attach(dir, &attached)) < 0)
		goto out;
	if ((ret = cb_ws_apply_sweep(dir, fsck_apply_temp, out)) < 0)
		goto out;
	ret = ws_open_complete(db_path, &db);
	/* A file that opens may still have damaged pages further in. */
	if (!ret && (ret = cb_db_quick_check(db)) == -EILSEQ) {
		cb_db_close(db);
		db = NULL;
	}
	if (ret == -EUCLEAN || ret == -EILSEQ) {
		char why[1024];

		snprintf(why, sizeof(why), "%s", cb_error_message());
		cb_error_clear();
		if (!repair) {
			ret = fsck_add(out, "meta.db", db_path, NULL, 0, -1, 0, "%s", why);
			goto out;
		}
		ret = fsck_rebuild(ref, dir, db_path, base_opt, why, out);
		if (ret)
			goto out;
		ret = ws_open_complete(db_path, &db);
	}
	if (ret)
		goto out;
	cb_db_meta_get(db, "base", &base);
	cb_error_clear();
	if ((ret = fsck_marks(db, db_path, dir, base, repair, out)))
		goto out;
	ret = fsck_turns(dir, db_path, base, db, repair, out);
out:
	cb_db_close(db);
	if (attached)
		cb_ws_upper_release(dir);
	free(base);
	free(db_path);
	free(dir);
	if (ret) /* the caller frees only a report it got */
		cb_ws_fsck_free(out);
	return ret;
}
