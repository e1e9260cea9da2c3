/* The change journal: marks appended to a log (folded into SQLite by db/journal_log.c), a set
 * that makes repeated marks free, commits without the log, and the readers.
 *
 * INVARIANTS (locks asserted in a checked build, util/lock.h):
 *   - queue_lock guards the open turn, the mark set, the logs (their fds, sizes, every write
 *     to them, the rotation) and the counters; sql_lock guards the connection and its
 *     statements. queue_lock comes first: a fold of the log being appended to holds it, so
 *     no mark is appended while the log is read and emptied; the fold of a rotated log
 *     (which nothing appends to) holds only sql_lock; nothing holding sql_lock takes
 *     queue_lock.
 *   - a mark is in the mark set only once it is durable against a kill -9: its record is in
 *     the log or its row committed. A hit in the set is such a mark; the set empties when the
 *     turn moves (cb_journal_set_turn).
 *   - the log holds whole records: a failed write is cut back to log_size, and a torn tail
 *     found by a fold is reported and dropped, never applied.
 *   - only the handle holding the log's flock appends to it or folds it; another handle
 *     commits each mark itself and reads the owner's unfolded marks from the logs.
 *   - a fold applies a log in one transaction, then empties or unlinks it; when the log was
 *     fdatasynced since (log_synced, fold_synced), the WAL is fsynced before, so a mark once
 *     power-safe stays so. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "db.h"

/* Room kept for the journal on the database's filesystem (the file "<db>-reserve"): when a
 * commit that records a delete finds the disk full, the reserve is given back and the commit
 * tried again, so that the deletes an agent makes to free space can still be recorded (and
 * so happen). It is taken again once the disk has room for it four times over. */
#define JOURNAL_RESERVE (4 << 20)

/* Take the reserve if it is not held: 1 if held afterwards. */
static int reserve_take(struct cb_db *db)
{
	char path[4200];
	struct statvfs sv;
	struct stat st;
	int fd, ok = 0;

	snprintf(path, sizeof(path), "%s-reserve", db->path);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return 0;
	if (fstat(fd, &st) == 0 && (long long)st.st_blocks * 512 >= JOURNAL_RESERVE)
		ok = 1; /* still held from before */
	else
		ok = fstatvfs(fd, &sv) == 0 &&
		     (unsigned long long)sv.f_bavail * sv.f_frsize >= 4ULL * JOURNAL_RESERVE &&
		     posix_fallocate(fd, 0, JOURNAL_RESERVE) == 0;
	close(fd);
	if (!ok)
		unlink(path);
	return ok;
}

/* Give the reserve back to the filesystem: 1 if there was one. */
static int reserve_release(struct cb_db *db)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s-reserve", db->path);
	return unlink(path) == 0;
}

static uint64_t mark_hash(int kind, const char *path)
{
	uint64_t h = 1469598103934665603ULL ^ (uint64_t)kind;

	for (const unsigned char *p = (const unsigned char *)path; *p; p++)
		h = (h ^ *p) * 1099511628211ULL;
	return h;
}

/* The key owns "<kind>\t<path>" so lookups compare one string. */
static char *mark_key(int kind, const char *path)
{
	size_t len = strlen(path);
	char *key = malloc(len + 4);

	if (key) {
		key[0] = (char)('0' + kind);
		key[1] = '\t';
		memcpy(key + 2, path, len + 1);
	}
	return key;
}

static size_t mark_slot(const struct cb_mark_set *set, int kind, const char *path)
{
	size_t i = mark_hash(kind, path) & (set->size - 1);

	while (set->keys[i]) {
		if (set->keys[i][0] == '0' + kind && !strcmp(set->keys[i] + 2, path))
			break;
		i = (i + 1) & (set->size - 1);
	}
	return i;
}

static int mark_contains(const struct cb_mark_set *set, int kind, const char *path)
{
	return set->size && set->keys[mark_slot(set, kind, path)];
}

/* Memory pressure only costs a later redundant INSERT OR IGNORE, so failures are ignored. */
static void mark_add(struct cb_mark_set *set, int kind, const char *path)
{
	if ((set->count + 1) * 2 > set->size) {
		size_t size = set->size ? set->size * 2 : 1024;
		char **keys = calloc(size, sizeof(*keys));
		struct cb_mark_set grown = {keys, size, 0};

		if (!keys)
			return;
		for (size_t i = 0; i < set->size; i++) {
			char *k = set->keys[i];

			if (k) {
				grown.keys[mark_slot(&grown, k[0] - '0', k + 2)] = k;
				grown.count++;
			}
		}
		free(set->keys);
		*set = grown;
	}
	size_t i = mark_slot(set, kind, path);

	if (set->keys[i])
		return;
	set->keys[i] = mark_key(kind, path);
	if (set->keys[i])
		set->count++;
}

static void mark_clear(struct cb_mark_set *set)
{
	for (size_t i = 0; i < set->size; i++)
		free(set->keys[i]);
	free(set->keys);
	memset(set, 0, sizeof(*set));
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* See db.h. */
int cb_journal_insert(struct cb_db *db, const struct cb_journal_row *r, unsigned long long *rows)
{
	sqlite3_stmt *st = db->st_insert;
	int rc;

	CB_ASSERT_HELD(&db->sql_lock);
	sqlite3_bind_int64(st, 1, r->turn);
	sqlite3_bind_text(st, 2, r->path, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 3, r->kind);
	sqlite3_bind_int(st, 4, r->subtree != 0);
	sqlite3_bind_double(st, 5, r->time);
	sqlite3_bind_int64(st, 6, r->pid);
	if (r->comm)
		sqlite3_bind_text(st, 7, r->comm, -1, SQLITE_STATIC);
	else
		sqlite3_bind_null(st, 7);
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	if (rc != SQLITE_DONE)
		return cb_db_error(db, rc, "record change");
	*rows += (unsigned long long)sqlite3_changes(db->sql);
	return 0;
}

/* A crash's marks reach the table when the workspace is next opened by anyone, so that every
 * reader sees them; a live owner (the daemon) keeps the log, and folds it itself. */
static int log_replay_at_open(struct cb_db *db)
{
	int rc;

	cb_mutex_lock(&db->queue_lock);
	rc = cb_journal_log_open(db, 0);
	if (db->log_fd >= 0)
		close(db->log_fd);
	db->log_fd = -1;
	cb_mutex_unlock(&db->queue_lock);
	return rc < 0 ? rc : 0;
}

int cb_journal_init(struct cb_db *db)
{
	char *turn = NULL;
	int rc;

	pthread_cond_init(&db->fold_done, NULL);
	pthread_cond_init(&db->folder_wake, NULL);
	db->conds_ready = 1;
	db->fold_fd = -1;
	db->names_gen = 1; /* the directory is fsynced at the first sync */
	rc = sqlite3_prepare_v3(
	    db->sql,
	    "INSERT OR IGNORE INTO journal (turn, path, kind, subtree, time, pid, "
	    "comm) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
	    -1, SQLITE_PREPARE_PERSISTENT, &db->st_insert, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_prepare_v3(db->sql,
					"SELECT id, turn, path, kind, subtree, time, pid, comm "
					"FROM journal WHERE turn = ?1 ORDER BY id",
					-1, SQLITE_PREPARE_PERSISTENT, &db->st_list_turn, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_prepare_v3(db->sql,
					"SELECT id, turn, path, kind, subtree, time, pid, comm "
					"FROM journal ORDER BY id",
					-1, SQLITE_PREPARE_PERSISTENT, &db->st_list_all, NULL);
	if (rc != SQLITE_OK)
		return cb_db_error(db, rc, "prepare journal statements");
	rc = cb_db_meta_get(db, "turn", &turn);
	if (rc)
		return rc;
	db->turn = strtoll(turn, NULL, 10);
	free(turn);
	if (db->turn < 1)
		return cb_error_set(EILSEQ, "database %s: bad turn in meta", db->path);
	if ((rc = log_replay_at_open(db)))
		return rc;
	db->reserve_held = reserve_take(db);
	return 0;
}

void cb_journal_fini(struct cb_db *db)
{
	if (db->conds_ready) {
		cb_journal_log_close(db);
		pthread_cond_destroy(&db->fold_done);
		pthread_cond_destroy(&db->folder_wake);
		db->conds_ready = 0;
	}
	sqlite3_finalize(db->st_insert);
	sqlite3_finalize(db->st_list_turn);
	sqlite3_finalize(db->st_list_all);
	db->st_insert = db->st_list_turn = db->st_list_all = NULL;
	mark_clear(&db->marked);
}

static int journal_validate(struct cb_db *db, const struct cb_change *changes, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *p = changes[i].path;

		/* no PATH_MAX bound: a tree can be deeper than a syscall's path (relative paths) */
		if (!p || !*p || p[0] == '/' || !strcmp(p, ".") || !strcmp(p, ".."))
			return cb_error_set(EINVAL, "database %s: bad journal path '%s'", db->path,
					    p ? p : "(null)");
		if (changes[i].kind < CB_CHANGE_CREATE || changes[i].kind > CB_CHANGE_RENAME_TO)
			return cb_error_set(EINVAL, "database %s: bad change kind %d for '%s'",
					    db->path, (int)changes[i].kind, p);
	}
	return 0;
}

/* 1 if the changes record a delete (unlink, rmdir, or a rename's source). */
static int marks_delete(const struct cb_change *c, const size_t *fresh, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (c[fresh[i]].kind == CB_CHANGE_DELETE ||
		    c[fresh[i]].kind == CB_CHANGE_RENAME_FROM)
			return 1;
	return 0;
}

/* The fresh marks as one write(2) to the log: all of them or, after a failure, none (a short
 * write is cut off again, so the log stays whole records). queue_lock held. */
static int log_append(struct cb_db *db, const struct cb_change *c, const size_t *fresh, size_t n,
		      double t)
{
	char stack[4096], *buf = stack, name[4200];
	size_t len = 0, size = 0, done = 0;
	int rc = 0;

	CB_ASSERT_HELD(&db->queue_lock);
	for (size_t i = 0; i < n; i++)
		size += cb_marklog_record_size(&c[fresh[i]]);
	if (size > sizeof(stack) && !(buf = malloc(size)))
		return cb_error_set(ENOMEM, "journal log: out of memory");
	for (size_t i = 0; i < n; i++) {
		size_t r = cb_marklog_encode(&c[fresh[i]], db->turn, t, buf + len, size - len);

		if (!r) { /* never a mark dropped in silence */
			rc = cb_error_set(ENAMETOOLONG,
					  "journal log: a path of %zu bytes is too long "
					  "to record",
					  strlen(c[fresh[i]].path));
			goto out;
		}
		len += r;
	}
	while (done < len) {
		ssize_t w = write(db->log_fd, buf + done, len - done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = w < 0 ? -errno : -EIO;
			break;
		}
		done += (size_t)w;
	}
	if (rc) {
		cb_journal_log_name(db, "", name, sizeof(name));
		if (done && ftruncate(db->log_fd, (off_t)db->log_size) < 0)
			fprintf(stderr, "cowbox: journal log %s: cut a failed write: %s\n", name,
				strerror(errno));
		rc = cb_error_set(-rc, "journal log %s: write: %s", name, strerror(-rc));
	} else {
		db->log_size += len;
		db->stat_rows += n;
	}
out:
	if (buf != stack)
		free(buf);
	return rc;
}

/* Without the log (another handle owns it): one transaction for the fresh marks. */
static int journal_commit(struct cb_db *db, const struct cb_change *c, const size_t *fresh,
			  size_t n, double t)
{
	unsigned long long rows = 0;
	int rc;

	CB_ASSERT_HELD(&db->queue_lock);
	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "begin journal transaction");
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		struct cb_journal_row r = {.turn = db->turn,
					   .path = c[fresh[i]].path,
					   .kind = c[fresh[i]].kind,
					   .subtree = c[fresh[i]].subtree,
					   .time = t,
					   .pid = c[fresh[i]].pid,
					   .comm = c[fresh[i]].comm};

		rc = cb_journal_insert(db, &r, &rows);
	}
	if (!rc && sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		rc = cb_db_error(db, sqlite3_errcode(db->sql), "commit journal");
	if (rc)
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	else
		db->stat_transactions++, db->stat_rows += rows;
out:
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

/* To the log when this handle owns it (taking it when free, retried at most once a second),
 * else straight to SQLite. queue_lock held. */
static int journal_record(struct cb_db *db, const struct cb_change *c, const size_t *fresh,
			  size_t n)
{
	double t = now_seconds();

	CB_ASSERT_HELD(&db->queue_lock);
	if (db->log_fd < 0 && db->log_tried != (long long)time(NULL)) {
		int got = cb_journal_log_open(db, 1);

		if (got < 0)
			fprintf(stderr, "cowbox: %s (marks are committed one by one)\n",
				cb_error_message());
		if (got == 1) {
			db->names_gen++; /* the log's name may be new */
			cb_journal_log_start(db);
		} else {
			db->log_tried = (long long)time(NULL);
		}
	}
	if (db->log_fd >= 0)
		return log_append(db, c, fresh, n, t);
	return journal_commit(db, c, fresh, n, t);
}

/* A mark is answered once its record is in the log (the page cache keeps it across a kill
 * -9 of this process); the table gets it at the next fold. */
int cb_journal_tmp_name(const char *path)
{
	const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;

	return !strncmp(name, CB_JOURNAL_TMP_PREFIX, strlen(CB_JOURNAL_TMP_PREFIX));
}

int cb_journal_mark(struct cb_db *db, const struct cb_change *changes, size_t n)
{
	size_t stack[16], *fresh = stack, nf = 0;
	int rc = journal_validate(db, changes, n);

	CB_ASSERT_NOT_HELD(&db->sql_lock);
	if (rc || n == 0)
		return rc;
	if (n > 16 && !(fresh = malloc(n * sizeof(*fresh))))
		return cb_error_set(ENOMEM, "journal: out of memory");
	cb_mutex_lock(&db->queue_lock);
	db->stat_marks += n;
	/* A temporary name is no change of the tree (no turn records it): not journaled, so
	 * neither `log` nor a snapshot's reading of the rows meets it. */
	for (size_t i = 0; i < n; i++)
		if (!cb_journal_tmp_name(changes[i].path) &&
		    !mark_contains(&db->marked, changes[i].kind, changes[i].path))
			fresh[nf++] = i;
	if (!nf)
		goto out;
	rc = journal_record(db, changes, fresh, nf);
	/* Disk full: spend the reserve on marks that record a delete (the agent freeing space
	 * must be able to); anything else stays ENOSPC, so the reserve is not eaten by the
	 * writes that filled the disk. Later, with room again, take it back (at most once a
	 * second). */
	if (rc == -ENOSPC && db->reserve_held && marks_delete(changes, fresh, nf)) {
		reserve_release(db);
		db->reserve_held = 0;
		db->reserve_tried = time(NULL);
		rc = journal_record(db, changes, fresh, nf);
	} else if (!rc && !db->reserve_held && time(NULL) != db->reserve_tried) {
		db->reserve_tried = time(NULL);
		db->reserve_held = reserve_take(db);
	}
	if (rc)
		goto out;
	for (size_t i = 0; i < nf; i++)
		mark_add(&db->marked, changes[fresh[i]].kind, changes[fresh[i]].path);
	if (db->log_fd >= 0)
		cb_journal_log_appended(db);
out:
	cb_mutex_unlock(&db->queue_lock);
	if (fresh != stack)
		free(fresh);
	return rc;
}

/* See journal.h. */
int cb_journal_fold(struct cb_db *db)
{
	int rc = 0;

	CB_ASSERT_NOT_HELD(&db->sql_lock);
	cb_mutex_lock(&db->queue_lock);
	if (db->log_fd >= 0)
		rc = cb_journal_log_fold_all(db);
	cb_mutex_unlock(&db->queue_lock);
	return rc;
}

long long cb_journal_turn(struct cb_db *db)
{
	long long turn;

	cb_mutex_lock(&db->queue_lock);
	turn = db->turn;
	cb_mutex_unlock(&db->queue_lock);
	return turn;
}

int cb_journal_marked(struct cb_db *db, const char *path)
{
	int found = 0;

	CB_ASSERT_NOT_HELD(&db->sql_lock);
	cb_mutex_lock(&db->queue_lock);
	for (int kind = CB_CHANGE_CREATE; kind <= CB_CHANGE_RENAME_TO && !found; kind++)
		found = mark_contains(&db->marked, kind, path);
	cb_mutex_unlock(&db->queue_lock);
	return found;
}

void cb_journal_set_turn(struct cb_db *db, long long turn)
{
	CB_ASSERT_NOT_HELD(&db->sql_lock);
	cb_mutex_lock(&db->queue_lock);
	db->turn = turn;
	mark_clear(&db->marked);
	cb_mutex_unlock(&db->queue_lock);
}

void cb_journal_stats(struct cb_db *db, unsigned long long *marks, unsigned long long *rows,
		      unsigned long long *transactions)
{
	cb_mutex_lock(&db->queue_lock);
	*marks = db->stat_marks;
	*rows = db->stat_rows;
	*transactions = db->stat_transactions;
	cb_mutex_unlock(&db->queue_lock);
}

/* The statement stays locked for the whole walk, so fn must not call back into this db. */
static int journal_list_sql(struct cb_db *db, long long turn,
			    int (*fn)(const struct cb_journal_row *row, void *arg), void *arg)
{
	sqlite3_stmt *st = turn > 0 ? db->st_list_turn : db->st_list_all;
	int rc;

	cb_mutex_lock(&db->sql_lock);
	if (turn > 0)
		sqlite3_bind_int64(st, 1, turn);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct cb_journal_row row = {
		    .id = sqlite3_column_int64(st, 0),
		    .turn = sqlite3_column_int64(st, 1),
		    .path = (const char *)sqlite3_column_text(st, 2),
		    .kind = (enum cb_change_kind)sqlite3_column_int(st, 3),
		    .subtree = sqlite3_column_int(st, 4),
		    .time = sqlite3_column_double(st, 5),
		    .pid = (pid_t)sqlite3_column_int64(st, 6),
		    .comm = (const char *)sqlite3_column_text(st, 7),
		};
		int stop = fn(&row, arg);

		if (stop) {
			rc = stop;
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "read journal");
out:
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

/* Another process owns the log (a live daemon): its marks not folded yet are read from the
 * log, after the table's rows, each once. The log is read first: a fold that empties it
 * meanwhile has put its rows in the table before. */
struct list_merge {
	long long turn, max_id;
	struct cb_mark_set seen; /* "<turn>/<path>" under kind */
	int (*fn)(const struct cb_journal_row *row, void *arg);
	void *arg;
};

/* "turn/path" on the heap (a path has no length bound), or NULL when out of memory. */
static char *merge_key(const struct cb_journal_row *r)
{
	char *key;

	return asprintf(&key, "%lld/%s", r->turn, r->path) < 0 ? NULL : key;
}

static int merge_sql_row(const struct cb_journal_row *r, void *arg)
{
	struct list_merge *m = arg;
	char *key = merge_key(r);

	if (!key)
		return cb_error_set(ENOMEM, "journal: out of memory");
	if (r->id > m->max_id)
		m->max_id = r->id;
	mark_add(&m->seen, r->kind, key);
	free(key);
	return m->fn(r, m->arg);
}

static int merge_log_row(const struct cb_journal_row *r, void *arg)
{
	struct list_merge *m = arg;
	struct cb_journal_row row = *r;
	char *key;
	int seen;

	if (m->turn > 0 && r->turn != m->turn)
		return 0;
	if (!(key = merge_key(r)))
		return cb_error_set(ENOMEM, "journal: out of memory");
	seen = mark_contains(&m->seen, r->kind, key);
	if (!seen)
		mark_add(&m->seen, r->kind, key);
	free(key);
	if (seen)
		return 0;
	row.id = ++m->max_id;
	return m->fn(&row, m->arg);
}

int cb_journal_list(struct cb_db *db, long long turn,
		    int (*fn)(const struct cb_journal_row *row, void *arg), void *arg)
{
	struct list_merge m = {.turn = turn, .fn = fn, .arg = arg};
	char *older = NULL, *newer = NULL;
	size_t olen = 0, nlen = 0, valid;
	int rc, owned;

	cb_mutex_lock(&db->queue_lock);
	owned = db->log_fd >= 0;
	cb_mutex_unlock(&db->queue_lock);
	if (owned) {
		if ((rc = cb_journal_fold(db)))
			return rc;
		return journal_list_sql(db, turn, fn, arg);
	}
	if ((rc = cb_journal_log_read_unowned(db, &older, &olen, &newer, &nlen)))
		return rc;
	rc = journal_list_sql(db, turn, merge_sql_row, &m);
	if (!rc && olen)
		rc = cb_marklog_parse(older, olen, &valid, merge_log_row, &m);
	if (!rc && nlen)
		rc = cb_marklog_parse(newer, nlen, &valid, merge_log_row, &m);
	mark_clear(&m.seen);
	free(older);
	free(newer);
	return rc;
}

const char *cb_change_kind_name(enum cb_change_kind kind)
{
	static const char *const names[] = {
	    [CB_CHANGE_CREATE] = "create",
	    [CB_CHANGE_WRITE] = "write",
	    [CB_CHANGE_META] = "meta",
	    [CB_CHANGE_DELETE] = "delete",
	    [CB_CHANGE_RENAME_FROM] = "rename-from",
	    [CB_CHANGE_RENAME_TO] = "rename-to",
	};

	if (kind < CB_CHANGE_CREATE || kind > CB_CHANGE_RENAME_TO)
		return "unknown";
	return names[kind];
}
