/* The journal's mark log over time: taking it (and folding what a crash left), folding it into
 * SQLite off the request path (rotation and a folder thread), and making it power-safe.
 *
 * INVARIANTS (see also db/journal.c; locks asserted in a checked build, util/lock.h):
 *   - names: "<db>-marks" is the log marks are appended to; "<db>-marks.fold" is an older log
 *     being folded (it exists only between a rotation and the end of its fold, or after a
 *     crash there); "<db>-marks.new" is a fresh log before it is renamed over "<db>-marks".
 *     "<db>-marks" always exists once made: a rotation links the old log to ".fold" first,
 *     then renames the new one over it, so another opener finds the owner's flock on it.
 *   - order: every record in ".fold" is older than every record in "<db>-marks"; a fold of
 *     both (crash recovery, cb_journal_fold) applies ".fold" first.
 *   - a rotated log is applied in one transaction and only then unlinked; a crash between the
 *     two folds it again at the next open, which the table's UNIQUE (turn, path, kind) makes
 *     harmless. When it held marks made power-safe (fold_synced), the WAL is fsynced first.
 *   - fold_state: IDLE (no ".fold"), PENDING (".fold" on fold_fd, nobody folding it) or BUSY
 *     (a thread folds it without queue_lock; nobody else touches fold_fd but
 *     cb_journal_sync, through a dup); fold_done is broadcast when BUSY ends. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "db.h"

/* The log is rotated once it holds this much (about 15,000 marks) and folded by the folder:
 * the cost of one SQLite transaction spread over as many marks, none of which waits for it. */
#define LOG_FOLD_BYTES (1 << 20)

/* A log this big is folded by the mark that finds it so, after the folder's fold in flight:
 * the log stays bounded under a storm of marks that outruns SQLite. */
#define LOG_MAX_BYTES (8 << 20)

/* See db.h. */
void cb_journal_log_name(const struct cb_db *db, const char *suffix, char *buf, size_t size)
{
	snprintf(buf, size, "%s-marks%s", db->path, suffix);
}

/* queue_lock's condition wait: the checked build's owner follows the mutex. */
static void queue_wait(struct cb_db *db, pthread_cond_t *cond, int timed)
{
	struct timespec ts;

#ifdef CB_LOCK_CHECKS
	atomic_store(&db->queue_lock.owner, 0);
#endif
	if (timed) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(cond, &db->queue_lock.m, &ts);
	} else {
		pthread_cond_wait(cond, &db->queue_lock.m);
	}
#ifdef CB_LOCK_CHECKS
	atomic_store(&db->queue_lock.owner, cb_lock_self());
#endif
}

struct fold_ctx {
	struct cb_db *db;
	unsigned long long rows;
};

static int fold_row(const struct cb_journal_row *r, void *arg)
{
	struct fold_ctx *f = arg;

	return cb_journal_insert(f->db, r, &f->rows);
}

/* fsync the WAL: every commit so far survives power loss. With synchronous=NORMAL a commit is
 * in the WAL but not fsynced; fsyncing the WAL does that without checkpointing. */
static int sync_wal(struct cb_db *db)
{
	char wal[4200];
	int fd, rc = 0;

	snprintf(wal, sizeof(wal), "%s-wal", db->path);
	fd = open(wal, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0
				       : cb_error_set(errno, "open %s: %s", wal, strerror(errno));
	if (fsync(fd) < 0)
		rc = cb_error_set(errno, "fsync %s: %s", wal, strerror(errno));
	close(fd);
	return rc;
}

/* fsync the directory of the database: the log's names survive power loss. */
static int sync_dir(struct cb_db *db)
{
	char dir[4096];
	int fd, rc = 0;

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
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Bytes of a log that are no whole record may have held marks of changes that were made: the
 * loss is recorded in the same transaction as the rest of the log's rows (meta
 * CB_MARKS_LOST_KEY says where, CB_MARKS_RESCAN_KEY asks for a walk of the upper layer that
 * journals what they may have held), so no opener, whoever folds, can forget it. sql_lock
 * held, inside the fold's transaction. */
static int note_lost(struct cb_db *db, const char *name, size_t dropped, size_t offset)
{
	static const char *const keys[] = {CB_MARKS_LOST_KEY, CB_MARKS_RESCAN_KEY};
	char what[4600];
	int rc = 0;

	CB_ASSERT_HELD(&db->sql_lock);
	snprintf(what, sizeof(what),
		 "journal log %s: %zu bytes at offset %zu are no whole record (damage, or a "
		 "write torn by a crash): the marks they held are lost",
		 name, dropped, offset);
	for (size_t i = 0; i < 2 && !rc; i++) {
		sqlite3_bind_text(db->st_meta_set, 1, keys[i], -1, SQLITE_STATIC);
		sqlite3_bind_text(db->st_meta_set, 2, i ? "1" : what, -1, SQLITE_STATIC);
		rc = sqlite3_step(db->st_meta_set);
		rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "record lost marks");
		sqlite3_reset(db->st_meta_set);
		sqlite3_clear_bindings(db->st_meta_set);
	}
	return rc;
}

/* The log on fd into the journal table in one transaction; the file is left as it is. A tail
 * that is no whole, valid record (a write torn by a crash, or damage) is reported and
 * dropped, never applied; *dropped gets its length. No lock of the caller's is needed but
 * that nothing appends to fd meanwhile. */
static int fold_file(struct cb_db *db, int fd, const char *name, size_t *dropped)
{
	struct fold_ctx f = {db, 0};
	size_t len = 0, valid = 0;
	char *buf = NULL;
	int rc;

	CB_ASSERT_NOT_HELD(&db->sql_lock);
	*dropped = 0;
	if ((rc = cb_marklog_read(fd, name, &buf, &len)) || len == 0)
		goto out;
	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "begin journal transaction");
	} else {
		rc = cb_marklog_parse(buf, len, &valid, fold_row, &f);
		if (!rc && valid < len)
			rc = note_lost(db, name, len - valid, valid);
		if (!rc && sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
			rc = cb_db_error(db, sqlite3_errcode(db->sql), "commit journal");
		if (rc)
			sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	}
	cb_mutex_unlock(&db->sql_lock);
	if (rc)
		goto out;
	if (valid < len) {
		fprintf(stderr,
			"cowbox: journal log %s: dropped %zu bytes at offset %zu that are no whole "
			"record (a write torn by a crash, or damage); the %zu bytes before are "
			"kept, and the next mount or 'cowbox fsck --repair' journals every path "
			"of the upper layer that differs from the last turn\n",
			name, len - valid, valid, valid);
		*dropped = len - valid;
	}
out:
	free(buf);
	return rc;
}

/* The active log into the table, then emptied; queue_lock held, so nothing is appended
 * meanwhile. Marks made power-safe by an fsync stay so once only the WAL holds them. */
static int fold_active(struct cb_db *db)
{
	char name[4200];
	size_t dropped;
	int rc;

	CB_ASSERT_HELD(&db->queue_lock);
	cb_journal_log_name(db, "", name, sizeof(name));
	if ((rc = fold_file(db, db->log_fd, name, &dropped)))
		return rc;
	db->stat_transactions++;
	db->stat_dropped += dropped;
	if (db->log_synced && (rc = sync_wal(db)))
		return rc;
	if (ftruncate(db->log_fd, 0) < 0)
		return cb_error_set(errno, "journal log %s: truncate: %s", name, strerror(errno));
	db->log_synced = 0;
	db->log_size = 0;
	return 0;
}

/* The rotated log into the table, without queue_lock while SQLite works (marks go on being
 * appended to the new log), then unlinked. queue_lock held on entry and on return; the state
 * is PENDING on entry, IDLE after success, PENDING again after a failure. */
static int fold_rotated(struct cb_db *db)
{
	char name[4200];
	size_t dropped = 0;
	int rc, fd = db->fold_fd;

	CB_ASSERT_HELD(&db->queue_lock);
	db->fold_state = CB_FOLD_BUSY;
	cb_journal_log_name(db, ".fold", name, sizeof(name));
	cb_mutex_unlock(&db->queue_lock);
	rc = fold_file(db, fd, name, &dropped);
	cb_mutex_lock(&db->queue_lock);
	/* fold_synced is read after the commit: a sync that sets it later fsyncs the WAL after
	 * the commit itself. */
	if (!rc && db->fold_synced) {
		cb_mutex_unlock(&db->queue_lock);
		rc = sync_wal(db);
		cb_mutex_lock(&db->queue_lock);
	}
	if (!rc && unlink(name) < 0 && errno != ENOENT)
		rc = cb_error_set(errno, "journal log %s: unlink: %s", name, strerror(errno));
	if (!rc) {
		db->stat_transactions++;
		db->stat_dropped += dropped;
		db->stat_folds_behind++;
		close(fd);
		db->fold_fd = -1;
		db->fold_state = CB_FOLD_IDLE;
		db->fold_synced = 0;
	} else {
		db->fold_state = CB_FOLD_PENDING;
	}
	pthread_cond_broadcast(&db->fold_done);
	return rc;
}

/* Start a new log: the old one becomes ".fold" (linked first, so "<db>-marks" never goes
 * missing), a fresh one, already locked, is renamed over "<db>-marks". queue_lock held, so
 * no mark is appended meanwhile; the state is IDLE on entry, PENDING after success. */
static int rotate(struct cb_db *db)
{
	char name[4200], fold[4200], fresh[4200];
	int fd, rc = 0, linked = 0;

	CB_ASSERT_HELD(&db->queue_lock);
	cb_journal_log_name(db, "", name, sizeof(name));
	cb_journal_log_name(db, ".fold", fold, sizeof(fold));
	cb_journal_log_name(db, ".new", fresh, sizeof(fresh));
	if (unlink(fresh) < 0 && errno != ENOENT) /* an earlier owner's, never written to */
		return cb_error_set(errno, "journal log %s: unlink: %s", fresh, strerror(errno));
	fd = open(fresh, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return cb_error_set(errno, "journal log %s: %s", fresh, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = cb_error_set(errno, "journal log %s: lock: %s", fresh, strerror(errno));
		goto out;
	}
	if (link(name, fold) < 0) {
		rc = cb_error_set(errno, "journal log %s: link to %s: %s", name, fold,
				  strerror(errno));
		goto out;
	}
	linked = 1;
	/* Power-safe marks keep a name that survives power loss before they lose the old one. */
	if (db->log_synced && (rc = sync_dir(db)))
		goto out;
	if (rename(fresh, name) < 0) {
		rc = cb_error_set(errno, "journal log %s: rename to %s: %s", fresh, name,
				  strerror(errno));
		goto out;
	}
	db->fold_fd = db->log_fd;
	db->fold_synced = db->log_synced;
	db->fold_state = CB_FOLD_PENDING;
	db->log_fd = fd;
	db->log_size = 0;
	db->log_synced = 0;
	db->names_gen++; /* for cb_journal_sync: new names */
	fd = -1;
out:
	if (fd >= 0) {
		close(fd);
		unlink(fresh);
		if (linked)
			unlink(fold);
	}
	return rc;
}

/* The folder: rotates a log that reached LOG_FOLD_BYTES and folds the rotated one, while
 * markers append to the new log; a failure is reported and retried a second later. */
static void *folder_main(void *arg)
{
	struct cb_db *db = arg;

	cb_mutex_lock(&db->queue_lock);
	while (!db->folder_stop) {
		int rc = 0;

		if (db->fold_state == CB_FOLD_IDLE && db->log_fd >= 0 &&
		    db->log_size >= LOG_FOLD_BYTES)
			rc = rotate(db);
		if (!rc && db->fold_state == CB_FOLD_PENDING)
			rc = fold_rotated(db);
		if (rc) {
			fprintf(stderr, "cowbox: %s (the marks stay in the log; retried)\n",
				cb_error_message());
			queue_wait(db, &db->folder_wake, 1);
		} else if (!db->folder_stop && db->fold_state != CB_FOLD_PENDING &&
			   (db->fold_state != CB_FOLD_IDLE || db->log_size < LOG_FOLD_BYTES)) {
			queue_wait(db, &db->folder_wake, 0); /* nothing to do */
		}
	}
	cb_mutex_unlock(&db->queue_lock);
	return NULL;
}

/* See db.h. */
int cb_journal_log_fold_all(struct cb_db *db)
{
	int rc = 0;

	CB_ASSERT_HELD(&db->queue_lock);
	CB_ASSERT_NOT_HELD(&db->sql_lock);
	while (db->fold_state == CB_FOLD_BUSY)
		queue_wait(db, &db->fold_done, 0);
	if (db->fold_state == CB_FOLD_PENDING && (rc = fold_rotated(db)))
		return rc;
	if (db->log_fd >= 0 && db->log_size)
		rc = fold_active(db);
	return rc;
}

/* See db.h. */
void cb_journal_log_appended(struct cb_db *db)
{
	CB_ASSERT_HELD(&db->queue_lock);
	if (db->log_size < LOG_FOLD_BYTES)
		return;
	/* The rotation is a few syscalls, made here so that the folder does not have to win
	 * queue_lock from a storm of markers to start; one after an fsync (a directory fsync
	 * too) is left to the folder. */
	if (db->folder_running && db->fold_state == CB_FOLD_IDLE) {
		if (!db->log_synced && rotate(db))
			fprintf(stderr, "cowbox: %s (the folder tries again)\n",
				cb_error_message());
		pthread_cond_signal(&db->folder_wake);
	}
	if (db->log_size >= (db->folder_running ? LOG_MAX_BYTES : LOG_FOLD_BYTES)) {
		/* The folder is behind (a storm of marks outruns SQLite), or there is none: this
		 * mark waits for the fold in flight and folds the rest itself, in one batch. */
		db->stat_folds_inline++;
		if (cb_journal_log_fold_all(db)) /* the marks stay in the log */
			fprintf(stderr, "cowbox: %s (retried at the next fold)\n",
				cb_error_message());
	}
}

/* A rotated log a crash left behind (an owner killed during its fold) into the table before
 * the log itself: it is older. queue_lock held, and "<db>-marks"'s flock, so no live owner. */
static int recover_rotated(struct cb_db *db)
{
	char fold[4200];
	size_t dropped;
	int fd, rc;

	cb_journal_log_name(db, ".fold", fold, sizeof(fold));
	fd = open(fold, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT
			   ? 0
			   : cb_error_set(errno, "journal log %s: %s", fold, strerror(errno));
	rc = fold_file(db, fd, fold, &dropped);
	close(fd);
	/* whatever its marks' history, they are power-safe before their last name goes */
	if (!rc && !(rc = sync_wal(db)) && unlink(fold) < 0)
		rc = cb_error_set(errno, "journal log %s: unlink: %s", fold, strerror(errno));
	if (!rc) {
		db->stat_transactions++;
		db->stat_dropped += dropped;
	}
	return rc;
}

/* See db.h. */
int cb_journal_log_open(struct cb_db *db, int create)
{
	char name[4200];
	struct stat st, now;
	int fd, rc;

	CB_ASSERT_HELD(&db->queue_lock);
	cb_journal_log_name(db, "", name, sizeof(name));
	fd = open(name, O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
	if (fd < 0)
		return errno == ENOENT && !create
			   ? 0
			   : cb_error_set(errno, "journal log %s: %s", name, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = errno == EWOULDBLOCK
			 ? 0
			 : cb_error_set(errno, "journal log %s: lock: %s", name, strerror(errno));
		close(fd);
		return rc;
	}
	/* A file that was rotated away between the open and the flock (its fold ended and its
	 * owner let it go) is no log any more: the name's live owner has the new one. */
	if (fstat(fd, &st) < 0 || lstat(name, &now) < 0 || st.st_ino != now.st_ino ||
	    st.st_dev != now.st_dev) {
		close(fd);
		return 0;
	}
	db->log_fd = fd;
	db->log_size = (size_t)st.st_size;
	/* a crash's marks may have been made power-safe: they stay so in the WAL */
	db->log_synced = 1;
	if ((rc = recover_rotated(db)) || (rc = cb_journal_log_fold_all(db))) {
		db->log_fd = -1;
		close(fd);
		return rc;
	}
	db->log_synced = 0;
	return 1;
}

/* See db.h. */
void cb_journal_log_start(struct cb_db *db)
{
	sigset_t all, old;

	CB_ASSERT_HELD(&db->queue_lock);
	if (db->folder_running || db->log_fd < 0)
		return;
	/* the folder takes no signal meant for the process's own threads */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	db->folder_stop = 0;
	if (pthread_create(&db->folder, NULL, folder_main, db) == 0)
		db->folder_running = 1;
	else
		fprintf(stderr, "cowbox: journal: no folder thread (marks fold inline)\n");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* See db.h. */
void cb_journal_log_close(struct cb_db *db)
{
	cb_mutex_lock(&db->queue_lock);
	if (db->folder_running) {
		db->folder_stop = 1;
		pthread_cond_signal(&db->folder_wake);
		cb_mutex_unlock(&db->queue_lock);
		pthread_join(db->folder, NULL);
		cb_mutex_lock(&db->queue_lock);
		db->folder_running = 0;
	}
	if (db->log_fd >= 0 && cb_journal_log_fold_all(db))
		fprintf(stderr, "cowbox: %s (the marks stay in the log, folded at the next open)\n",
			cb_error_message());
	if (db->fold_state != CB_FOLD_IDLE)
		close(db->fold_fd);
	db->fold_fd = -1;
	db->fold_state = CB_FOLD_IDLE;
	if (db->log_fd >= 0)
		close(db->log_fd);
	db->log_fd = -1;
	cb_mutex_unlock(&db->queue_lock);
}

/* See db.h. */
int cb_journal_log_read_unowned(struct cb_db *db, char **older, size_t *olen, char **newer,
				size_t *nlen)
{
	/* The log first, then the rotated one: a rotation in between leaves the same marks in
	 * both (read twice, listed once); a fold that unlinks ".fold" meanwhile has committed
	 * its rows before, so the table read after both has them. */
	static const char *const sfx[] = {"", ".fold"};
	char **bufs[] = {newer, older};
	size_t *lens[] = {nlen, olen};
	char name[4200];
	int rc = 0;

	*older = *newer = NULL;
	*olen = *nlen = 0;
	for (int i = 0; i < 2 && !rc; i++) {
		int fd;

		cb_journal_log_name(db, sfx[i], name, sizeof(name));
		fd = open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0) {
			if (errno != ENOENT)
				rc = cb_error_set(errno, "journal log %s: %s", name,
						  strerror(errno));
			continue;
		}
		rc = cb_marklog_read(fd, name, bufs[i], lens[i]);
		close(fd);
	}
	if (rc) {
		free(*older);
		free(*newer);
		*older = *newer = NULL;
		*olen = *nlen = 0;
	}
	return rc;
}

/* fdatasync of fd, a dup of the owner's (which may close or rotate its own meanwhile), then
 * closed; err is the dup's errno when it failed; name for errors. */
static int sync_file(int fd, int err, const char *name)
{
	int rc = 0;

	if (fd < 0)
		return cb_error_set(err, "journal log %s: dup: %s", name, strerror(err));
	if (fdatasync(fd) < 0)
		rc = cb_error_set(errno, "fdatasync %s: %s", name, strerror(errno));
	close(fd);
	return rc;
}

/* The logs' marks (the rotated one's too while it is folded) and the WAL's commits, then the
 * directory once per set of names (the handle's first, and after each rotation), so that the
 * names survive too. A fold from then on fsyncs the WAL before it lets a log go. */
int cb_journal_sync(struct cb_db *db)
{
	char name[4200];
	int log = -2, fold = -2, log_err = 0, fold_err = 0, rc = 0;
	unsigned gen;

	cb_mutex_lock(&db->queue_lock);
	if (db->log_fd >= 0) {
		db->log_synced = 1;
		log = fcntl(db->log_fd, F_DUPFD_CLOEXEC, 0);
		log_err = errno;
	}
	if (db->fold_state != CB_FOLD_IDLE) {
		db->fold_synced = 1;
		fold = fcntl(db->fold_fd, F_DUPFD_CLOEXEC, 0);
		fold_err = errno;
	}
	gen = db->names_gen;
	cb_mutex_unlock(&db->queue_lock);
	if (log != -2) {
		cb_journal_log_name(db, "", name, sizeof(name));
		rc = sync_file(log, log_err, name);
	}
	if (fold != -2) {
		cb_journal_log_name(db, ".fold", name, sizeof(name));
		if (!rc)
			rc = sync_file(fold, fold_err, name);
		else if (fold >= 0)
			close(fold);
	}
	if (rc || (rc = sync_wal(db)) || __atomic_load_n(&db->synced_gen, __ATOMIC_ACQUIRE) == gen)
		return rc;
	if (!(rc = sync_dir(db)))
		__atomic_store_n(&db->synced_gen, gen, __ATOMIC_RELEASE);
	return rc;
}
