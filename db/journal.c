/* The change journal: group-committed dirty marks (one transaction for the marks that pile up
 * while the previous one commits), a set that makes repeated marks free, and the readers. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int cb_journal_init(struct cb_db *db)
{
	char *turn = NULL;
	int rc;

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
	db->reserve_held = reserve_take(db);
	return 0;
}

void cb_journal_fini(struct cb_db *db)
{
	sqlite3_finalize(db->st_insert);
	sqlite3_finalize(db->st_list_turn);
	sqlite3_finalize(db->st_list_all);
	db->st_insert = db->st_list_turn = db->st_list_all = NULL;
	mark_clear(&db->marked);
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One transaction for every waiter in the batch; the leader runs it without queue_lock so
 * that new marks keep queuing up for the next batch meanwhile. */
static int journal_commit_batch(struct cb_db *db, struct cb_mark_waiter *batch, long long turn,
				unsigned long long *rows)
{
	double t = now_seconds();
	int rc;

	pthread_mutex_lock(&db->sql_lock);
	rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "begin journal transaction");
		goto out;
	}
	for (struct cb_mark_waiter *w = batch; w; w = w->next) {
		for (size_t i = 0; i < w->n; i++) {
			const struct cb_change *c = &w->changes[i];
			sqlite3_stmt *st = db->st_insert;

			sqlite3_bind_int64(st, 1, turn);
			sqlite3_bind_text(st, 2, c->path, -1, SQLITE_STATIC);
			sqlite3_bind_int(st, 3, c->kind);
			sqlite3_bind_int(st, 4, c->subtree != 0);
			sqlite3_bind_double(st, 5, t);
			sqlite3_bind_int64(st, 6, c->pid);
			if (c->comm)
				sqlite3_bind_text(st, 7, c->comm, -1, SQLITE_STATIC);
			else
				sqlite3_bind_null(st, 7);
			rc = sqlite3_step(st);
			sqlite3_reset(st);
			sqlite3_clear_bindings(st);
			if (rc != SQLITE_DONE) {
				rc = cb_db_error(db, rc, "record change");
				sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
				goto out;
			}
			*rows += (unsigned long long)sqlite3_changes(db->sql);
		}
	}
	rc = sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "commit journal");
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	}
out:
	pthread_mutex_unlock(&db->sql_lock);
	return rc;
}

static int journal_validate(struct cb_db *db, const struct cb_change *changes, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *p = changes[i].path;

		if (!p || !*p || p[0] == '/' || !strcmp(p, ".") || !strcmp(p, ".."))
			return cb_error_set(EINVAL, "database %s: bad journal path '%s'", db->path,
					    p ? p : "(null)");
		if (changes[i].kind < CB_CHANGE_CREATE || changes[i].kind > CB_CHANGE_RENAME_TO)
			return cb_error_set(EINVAL, "database %s: bad change kind %d for '%s'",
					    db->path, (int)changes[i].kind, p);
	}
	return 0;
}

/* 1 if a batch records a delete (unlink, rmdir, or a rename's source). */
static int batch_deletes(const struct cb_mark_waiter *batch)
{
	for (const struct cb_mark_waiter *w = batch; w; w = w->next)
		for (size_t i = 0; i < w->n; i++)
			if (w->changes[i].kind == CB_CHANGE_DELETE ||
			    w->changes[i].kind == CB_CHANGE_RENAME_FROM)
				return 1;
	return 0;
}

/* Leader/follower: whoever finds no leader commits everything queued (its own rows and any
 * others'), then wakes the batch. A caller returns only once its own rows are committed. */
int cb_journal_mark(struct cb_db *db, const struct cb_change *changes, size_t n)
{
	struct cb_mark_waiter w = {changes, n, 0, 0, NULL, PTHREAD_COND_INITIALIZER};
	int rc = journal_validate(db, changes, n);
	size_t fresh = 0;

	if (rc || n == 0)
		return rc;
	pthread_mutex_lock(&db->queue_lock);
	db->stat_marks += n;
	for (size_t i = 0; i < n && !fresh; i++)
		fresh += !mark_contains(&db->marked, changes[i].kind, changes[i].path);
	if (!fresh)
		goto out;
	*db->queue_tail = &w;
	db->queue_tail = &w.next;
	while (!w.done) {
		if (db->leader_active) {
			/* Each waiter sleeps on its own condition: only its leader (done) or the
			 * previous leader (you lead next) wakes it, no herd. */
			pthread_cond_wait(&w.cond, &db->queue_lock);
			continue;
		}
		struct cb_mark_waiter *batch = db->queue_head;
		long long turn = db->turn;
		unsigned long long rows = 0;

		db->leader_active = 1;
		db->queue_head = NULL;
		db->queue_tail = &db->queue_head;
		pthread_mutex_unlock(&db->queue_lock);
		int brc = journal_commit_batch(db, batch, turn, &rows);

		/* Disk full: spend the reserve on a commit that records a delete (the agent
		 * freeing space must be able to); anything else stays ENOSPC, so the reserve is
		 * not eaten by the writes that filled the disk. Later, with room again, take it
		 * back (at most once a second). */
		if (brc == -ENOSPC && db->reserve_held && batch_deletes(batch)) {
			reserve_release(db);
			db->reserve_held = 0;
			db->reserve_tried = time(NULL);
			rows = 0;
			brc = journal_commit_batch(db, batch, turn, &rows);
		} else if (!brc && !db->reserve_held && time(NULL) != db->reserve_tried) {
			db->reserve_tried = time(NULL);
			db->reserve_held = reserve_take(db);
		}
		const char *msg = brc ? cb_error_message() : NULL;

		pthread_mutex_lock(&db->queue_lock);
		db->stat_transactions += !brc;
		db->stat_rows += rows;
		/* Each waiter's stack frame stays valid until it sees done under the lock. */
		for (struct cb_mark_waiter *b = batch, *next; b; b = next) {
			next = b->next;
			if (!brc && turn == db->turn)
				for (size_t i = 0; i < b->n; i++)
					mark_add(&db->marked, b->changes[i].kind,
						 b->changes[i].path);
			b->rc = brc;
			b->done = 1;
			pthread_cond_signal(&b->cond);
		}
		if (brc)
			snprintf(db->batch_error, sizeof(db->batch_error), "%s", msg);
		db->leader_active = 0;
		/* Marks that queued meanwhile are the next batch; its first waiter leads it. */
		if (db->queue_head)
			pthread_cond_signal(&db->queue_head->cond);
	}
	rc = w.rc;
	if (rc)
		cb_error_set(rc, "%s", db->batch_error);
out:
	pthread_mutex_unlock(&db->queue_lock);
	pthread_cond_destroy(&w.cond);
	return rc;
}

/* With synchronous=NORMAL a commit is in the WAL but not fsynced; fsyncing the WAL file
 * makes every commit so far survive power loss without checkpointing. The directory is
 * synced once per handle too, so that the WAL's own name survives. */
int cb_journal_sync(struct cb_db *db)
{
	char wal[4096], dir[4096];
	int fd, rc = 0;

	snprintf(wal, sizeof(wal), "%s-wal", db->path);
	fd = open(wal, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0
				       : cb_error_set(errno, "open %s: %s", wal, strerror(errno));
	if (fsync(fd) < 0)
		rc = cb_error_set(errno, "fsync %s: %s", wal, strerror(errno));
	close(fd);
	if (rc || __atomic_load_n(&db->dir_synced, __ATOMIC_ACQUIRE))
		return rc;
	snprintf(dir, sizeof(dir), "%s", db->path);
	char *slash = strrchr(dir, '/');

	if (slash == dir)
		slash[1] = '\0';
	else if (slash)
		*slash = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0)
		rc = cb_error_set(errno, "fsync %s: %s", dir, strerror(errno));
	else
		__atomic_store_n(&db->dir_synced, 1, __ATOMIC_RELEASE);
	if (fd >= 0)
		close(fd);
	return rc;
}

long long cb_journal_turn(struct cb_db *db)
{
	long long turn;

	pthread_mutex_lock(&db->queue_lock);
	turn = db->turn;
	pthread_mutex_unlock(&db->queue_lock);
	return turn;
}

void cb_journal_set_turn(struct cb_db *db, long long turn)
{
	pthread_mutex_lock(&db->queue_lock);
	db->turn = turn;
	mark_clear(&db->marked);
	pthread_mutex_unlock(&db->queue_lock);
}

void cb_journal_stats(struct cb_db *db, unsigned long long *marks, unsigned long long *rows,
		      unsigned long long *transactions)
{
	pthread_mutex_lock(&db->queue_lock);
	*marks = db->stat_marks;
	*rows = db->stat_rows;
	*transactions = db->stat_transactions;
	pthread_mutex_unlock(&db->queue_lock);
}

/* The statement stays locked for the whole walk, so fn must not call back into this db. */
int cb_journal_list(struct cb_db *db, long long turn,
		    int (*fn)(const struct cb_journal_row *row, void *arg), void *arg)
{
	sqlite3_stmt *st = turn > 0 ? db->st_list_turn : db->st_list_all;
	int rc;

	pthread_mutex_lock(&db->sql_lock);
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
	pthread_mutex_unlock(&db->sql_lock);
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
