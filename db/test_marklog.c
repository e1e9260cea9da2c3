/* Unit tests of the journal's mark log: the record format and its torn or corrupt tails, the
 * replay of a killed owner's log at the next open, and readers beside a live owner. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "db.h"

static char dir[64];
static char path[128];
static char logpath[160];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/cb-marklog-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/meta.db", dir);
	snprintf(logpath, sizeof(logpath), "%s-marks", path);
}

static void teardown(void)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(marklog, .init = setup, .fini = teardown);

struct rows {
	int n;
	char paths[64][64];
	int kinds[64];
	long long turns[64];
	pid_t pids[64];
	char comms[64][16];
	int subtree[64];
	double times[64];
};

static int collect(const struct cb_journal_row *r, void *arg)
{
	struct rows *c = arg;

	if (c->n < 64) {
		snprintf(c->paths[c->n], sizeof(c->paths[0]), "%s", r->path);
		c->kinds[c->n] = r->kind;
		c->turns[c->n] = r->turn;
		c->pids[c->n] = r->pid;
		c->subtree[c->n] = r->subtree;
		c->times[c->n] = r->time;
		snprintf(c->comms[c->n], sizeof(c->comms[0]), "%s", r->comm ? r->comm : "");
	}
	c->n++;
	return 0;
}

static const struct cb_change sample[] = {
    {"a.txt", CB_CHANGE_CREATE, 0, 10, "tar"},
    {"dir/b", CB_CHANGE_WRITE, 0, 11, NULL},
    {"moved", CB_CHANGE_RENAME_TO, 1, 12, "mv"},
    {"x/y/z", CB_CHANGE_DELETE, 0, 0, "rm"},
};
#define NSAMPLE (sizeof(sample) / sizeof(sample[0]))

/* The sample as records; ends[i] is where record i ends. */
static size_t encode_sample(char *buf, size_t size, size_t *ends)
{
	size_t len = 0;

	for (size_t i = 0; i < NSAMPLE; i++) {
		size_t n = cb_marklog_encode(&sample[i], 3 + (long long)i, 1000.5 + (double)i,
					     buf + len, size - len);

		cr_assert_gt(n, 0);
		len += n;
		ends[i] = len;
	}
	return len;
}

Test(marklog, records_round_trip)
{
	char buf[4096];
	size_t ends[NSAMPLE], valid;
	size_t len = encode_sample(buf, sizeof(buf), ends);
	struct rows *c = calloc(1, sizeof(*c));

	cr_assert_eq(cb_marklog_parse(buf, len, &valid, collect, c), 0);
	cr_assert_eq(valid, len);
	cr_assert_eq(c->n, (int)NSAMPLE);
	for (size_t i = 0; i < NSAMPLE; i++) {
		cr_assert_str_eq(c->paths[i], sample[i].path);
		cr_assert_eq(c->kinds[i], (int)sample[i].kind);
		cr_assert_eq(c->turns[i], 3 + (long long)i);
		cr_assert_eq(c->pids[i], sample[i].pid);
		cr_assert_eq(c->subtree[i], sample[i].subtree);
		cr_assert_float_eq(c->times[i], 1000.5 + (double)i, 1e-9);
		cr_assert_str_eq(c->comms[i], sample[i].comm ? sample[i].comm : "");
	}
	/* Too small a buffer, an empty path: nothing encoded. */
	cr_assert_eq(cb_marklog_encode(&sample[0], 1, 0, buf, 20), 0);
	free(c);
}

Test(marklog, a_torn_tail_ends_the_valid_part_at_every_cut)
{
	char buf[4096];
	size_t ends[NSAMPLE], valid;
	size_t len = encode_sample(buf, sizeof(buf), ends);

	/* Cut anywhere inside the last record: the three before are the valid part. */
	for (size_t cut = ends[NSAMPLE - 2]; cut < len; cut++) {
		struct rows c = {0};

		cr_assert_eq(cb_marklog_parse(buf, cut, &valid, collect, &c), 0);
		cr_assert_eq(valid, ends[NSAMPLE - 2], "cut at %zu", cut);
		cr_assert_eq(c.n, (int)NSAMPLE - 1, "cut at %zu", cut);
	}
}

Test(marklog, a_damaged_record_is_never_applied_nor_anything_after_it)
{
	char buf[4096], copy[4096];
	size_t ends[NSAMPLE], valid;
	size_t len = encode_sample(buf, sizeof(buf), ends);

	/* Flip each byte of the second record in turn: only the first record survives. */
	for (size_t at = ends[0]; at < ends[1]; at++) {
		struct rows c = {0};

		memcpy(copy, buf, len);
		copy[at] ^= 0x5a;
		cr_assert_eq(cb_marklog_parse(copy, len, &valid, collect, &c), 0);
		cr_assert_eq(valid, ends[0], "byte %zu", at);
		cr_assert_eq(c.n, 1, "byte %zu", at);
		cr_assert_str_eq(c.paths[0], "a.txt");
	}
	/* Zeros (a tail a power loss left unwritten) are no record either. */
	memset(copy, 0, sizeof(copy));
	cr_assert_eq(cb_marklog_parse(copy, 200, &valid, NULL, NULL), 0);
	cr_assert_eq(valid, 0);
}

/* A child records marks through the log and is killed: nothing was folded. */
static void marks_then_kill(int nmarks)
{
	pid_t pid = fork();
	int status;

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct cb_db *db;
		char p[64];

		if (cb_db_open(path, &db))
			_exit(3);
		for (int i = 0; i < nmarks; i++) {
			struct cb_change c = {p, CB_CHANGE_CREATE, 0, 7, "killed"};

			snprintf(p, sizeof(p), "f%d", i);
			if (cb_journal_mark(db, &c, 1))
				_exit(3);
		}
		raise(SIGKILL);
		_exit(4);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);
}

static long long file_size(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

Test(marklog, a_killed_owners_log_is_replayed_at_the_next_open)
{
	struct cb_db *db;
	struct rows *c = calloc(1, sizeof(*c));

	marks_then_kill(50);
	cr_assert_gt(file_size(logpath), 0, "the marks are in the log");
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(file_size(logpath), 0, "replayed and emptied at open");
	cr_assert_eq(cb_journal_list(db, 0, collect, c), 0);
	cr_assert_eq(c->n, 50);
	cr_assert_str_eq(c->paths[0], "f0");
	cr_assert_str_eq(c->paths[49], "f49");
	cr_assert_str_eq(c->comms[49], "killed");
	cb_db_close(db);
	free(c);
}

Test(marklog, a_garbage_tail_is_dropped_and_the_marks_before_it_kept)
{
	struct cb_db *db;
	struct rows *c = calloc(1, sizeof(*c));
	char rec[512];
	struct cb_change extra = {"never", CB_CHANGE_CREATE, 0, 1, NULL};
	size_t n = cb_marklog_encode(&extra, 1, 1, rec, sizeof(rec));
	int fd;

	marks_then_kill(5);
	fd = open(logpath, O_WRONLY | O_APPEND);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, rec, n - 3), (ssize_t)(n - 3)); /* a torn record */
	cr_assert_eq(write(fd, rec, n), (ssize_t)n);	       /* whole, but after the tear */
	close(fd);
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_list(db, 0, collect, c), 0);
	cr_assert_eq(c->n, 5, "the five marks, nothing after the tear");
	for (int i = 0; i < c->n; i++)
		cr_assert_str_neq(c->paths[i], "never");
	cr_assert_eq(file_size(logpath), 0);
	cb_db_close(db);
	free(c);
}

Test(marklog, a_reader_beside_a_live_owner_sees_its_marks_once)
{
	struct cb_db *owner, *reader;
	struct rows *c = calloc(1, sizeof(*c));
	struct cb_change a = {"owned", CB_CHANGE_WRITE, 0, 1, "o"};
	struct cb_change b = {"direct", CB_CHANGE_CREATE, 0, 2, "r"};

	cr_assert_eq(cb_db_open(path, &owner), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_mark(owner, &a, 1), 0, "%s", cb_error_message());
	cr_assert_gt(file_size(logpath), 0);
	/* A second handle cannot take the log (the flock is per open file): it commits its
	 * marks itself, and reads the owner's from the log. */
	cr_assert_eq(cb_db_open(path, &reader), 0, "%s", cb_error_message());
	cr_assert_gt(file_size(logpath), 0, "a reader never empties a live owner's log");
	cr_assert_eq(cb_journal_mark(reader, &b, 1), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_list(reader, 0, collect, c), 0);
	cr_assert_eq(c->n, 2);
	cr_assert_str_eq(c->paths[0], "direct");
	cr_assert_str_eq(c->paths[1], "owned");
	/* Folded by the owner: the reader sees it once, from the table. */
	cr_assert_eq(cb_journal_fold(owner), 0, "%s", cb_error_message());
	cr_assert_eq(file_size(logpath), 0);
	memset(c, 0, sizeof(*c));
	cr_assert_eq(cb_journal_list(reader, 0, collect, c), 0);
	cr_assert_eq(c->n, 2);
	cr_assert_eq(cb_journal_sync(owner), 0, "%s", cb_error_message());
	cb_db_close(reader);
	cb_db_close(owner);
	free(c);
}

/* Marks "<prefix><i>" for i in [from, to) through db, one call each. */
static void mark_range(struct cb_db *db, const char *prefix, int from, int to)
{
	char p[400];

	for (int i = from; i < to; i++) {
		struct cb_change c = {p, CB_CHANGE_CREATE, 0, 7, "storm"};

		snprintf(p, sizeof(p), "%s%d", prefix, i);
		cr_assert_eq(cb_journal_mark(db, &c, 1), 0, "%s", cb_error_message());
	}
}

static int fold_state(struct cb_db *db)
{
	int s;

	cb_mutex_lock(&db->queue_lock);
	s = db->fold_state;
	cb_mutex_unlock(&db->queue_lock);
	return s;
}

/* A thread that holds a handle's sql_lock (the fold's commit needs it) until let go. */
static struct blocker {
	struct cb_db *db;
	pthread_t t;
	int held, go; /* guarded by lock */
	int ms;	      /* if not 0: let go once a marker folds inline (or after ms) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
} blk = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *blocker_main(void *arg)
{
	(void)arg;
	cb_mutex_lock(&blk.db->sql_lock);
	pthread_mutex_lock(&blk.lock);
	blk.held = 1;
	pthread_cond_broadcast(&blk.cond);
	if (blk.ms) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += blk.ms / 1000;
		ts.tv_nsec += (long)(blk.ms % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000)
			ts.tv_sec++, ts.tv_nsec -= 1000000000;
		/* read without queue_lock: this thread holds sql_lock, which comes after it */
		while (!blk.go && !__atomic_load_n(&blk.db->stat_folds_inline, __ATOMIC_RELAXED)) {
			struct timespec now, tick;

			clock_gettime(CLOCK_REALTIME, &now);
			if (now.tv_sec > ts.tv_sec ||
			    (now.tv_sec == ts.tv_sec && now.tv_nsec >= ts.tv_nsec))
				break;
			tick = now;
			tick.tv_nsec += 10000000;
			if (tick.tv_nsec >= 1000000000)
				tick.tv_sec++, tick.tv_nsec -= 1000000000;
			pthread_cond_timedwait(&blk.cond, &blk.lock, &tick);
		}
	}
	while (!blk.go && !blk.ms)
		pthread_cond_wait(&blk.cond, &blk.lock);
	pthread_mutex_unlock(&blk.lock);
	cb_mutex_unlock(&blk.db->sql_lock);
	return NULL;
}

static void block_sql_for(struct cb_db *db, int ms)
{
	blk.db = db;
	blk.held = blk.go = 0;
	blk.ms = ms;
	cr_assert_eq(pthread_create(&blk.t, NULL, blocker_main, NULL), 0);
	pthread_mutex_lock(&blk.lock);
	while (!blk.held)
		pthread_cond_wait(&blk.cond, &blk.lock);
	pthread_mutex_unlock(&blk.lock);
}

static void block_sql(struct cb_db *db)
{
	block_sql_for(db, 0);
}

static void unblock_sql(void)
{
	pthread_mutex_lock(&blk.lock);
	blk.go = 1;
	pthread_cond_broadcast(&blk.cond);
	pthread_mutex_unlock(&blk.lock);
	pthread_join(blk.t, NULL);
}

/* Marks until the folder has rotated the log and is stuck before its commit (sql_lock held by
 * the blocker, which the caller lets go). Returns how many marks it made. */
static int mark_until_fold_waits(struct cb_db *db, const char *prefix)
{
	int n = 0;

	block_sql(db);
	while (fold_state(db) != CB_FOLD_BUSY) {
		cr_assert_lt(n, 200000, "no fold started");
		mark_range(db, prefix, n, n + 1000);
		n += 1000;
		if (n >= 20000)
			usleep(1000); /* the log is past 1 MiB: the folder rotates it */
	}
	return n;
}

/* Counts rows per path prefix, checks each (turn, path) once and the rows in id order. */
struct census {
	long long last_id;
	int n, dup, turn2, first_of[2]; /* first_of: id order of "old" before "new" */
	char *seen;			/* one byte per "<p><i>", i < 400000 */
	int order_ok;
};

static int census_row(const struct cb_journal_row *r, void *arg)
{
	struct census *c = arg;
	int i = atoi(r->path + 1), which = r->path[0] == 'n';

	if (r->id <= c->last_id)
		c->order_ok = 0;
	c->last_id = r->id;
	if (which == 0 && c->first_of[1])
		c->order_ok = 0; /* an older mark after a newer one */
	c->first_of[which] = 1;
	if (i >= 0 && i < 200000 && c->seen[which * 200000 + i]++)
		c->dup++;
	if (r->turn == 2)
		c->turn2++;
	c->n++;
	return 0;
}

static void census_of(struct cb_db *db, long long turn, struct census *c)
{
	memset(c, 0, sizeof(*c));
	c->seen = calloc(400000, 1);
	c->order_ok = 1;
	cr_assert_eq(cb_journal_list(db, turn, census_row, c), 0, "%s", cb_error_message());
}

static int census_has(const struct census *c, char which, int from, int to)
{
	for (int i = from; i < to; i++)
		if (!c->seen[(which == 'n') * 200000 + i])
			return 0;
	return 1;
}

Test(marklog, marks_go_on_while_a_fold_is_in_flight_and_land_in_their_turn)
{
	struct cb_db *db;
	struct census c;
	struct stat st;
	int old;

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	old = mark_until_fold_waits(db, "o");
	/* The fold waits for SQLite; marks do not wait for the fold. A snapshot moves the turn
	 * meanwhile: the marks after it belong to turn 2, whichever log holds them. */
	cr_assert_eq(stat(logpath, &st), 0);
	cb_journal_set_turn(db, 2);
	mark_range(db, "n", 0, 500);
	cr_assert_eq(fold_state(db), CB_FOLD_BUSY);
	{
		char fold[200];

		snprintf(fold, sizeof(fold), "%s.fold", logpath);
		cr_assert_gt(file_size(fold), 1 << 20, "the rotated log is being folded");
	}
	cr_assert_lt(file_size(logpath), 1 << 20, "new marks go to the new log");
	/* A sync now reaches the rotated log too, and makes its fold fsync the WAL first. */
	cr_assert_eq(cb_journal_sync(db), 0, "%s", cb_error_message());
	cb_mutex_lock(&db->queue_lock);
	cr_assert_eq(db->fold_synced, 1);
	cr_assert_eq(db->stat_folds_inline, 0, "no marker folded");
	cb_mutex_unlock(&db->queue_lock);
	unblock_sql();
	/* Readers (cb_journal_fold first) wait for the fold in flight and get everything. */
	census_of(db, 0, &c);
	cr_assert_eq(c.n, old + 500);
	cr_assert_eq(c.dup, 0);
	cr_assert(c.order_ok, "older marks first");
	cr_assert_eq(c.turn2, 500);
	cr_assert(census_has(&c, 'o', 0, old) && census_has(&c, 'n', 0, 500));
	free(c.seen);
	cb_mutex_lock(&db->queue_lock);
	cr_assert_eq(db->fold_state, CB_FOLD_IDLE);
	cr_assert_geq(db->stat_folds_behind, 1);
	cb_mutex_unlock(&db->queue_lock);
	cb_db_close(db);
}

Test(marklog, a_kill_during_a_fold_loses_no_answered_mark_and_repeats_none)
{
	int *answered =
	    mmap(NULL, 2 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct cb_db *db;
	struct census c;
	char fold[200];
	int status;
	pid_t pid;

	cr_assert_neq(answered, MAP_FAILED);
	snprintf(fold, sizeof(fold), "%s.fold", logpath);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) { /* rotated, its fold stuck before the commit, more marks, killed */
		if (cb_db_open(path, &db))
			_exit(3);
		answered[0] = mark_until_fold_waits(db, "o");
		mark_range(db, "n", 0, 700);
		answered[1] = 700;
		raise(SIGKILL);
		_exit(4);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);
	cr_assert_gt(file_size(fold), 0, "killed with a rotated log unfolded");
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(file_size(fold), -1, "folded at open, then unlinked");
	cr_assert_eq(file_size(logpath), 0);
	census_of(db, 0, &c);
	cr_assert_eq(c.n, answered[0] + answered[1]);
	cr_assert_eq(c.dup, 0);
	cr_assert(c.order_ok, "the rotated log's marks before the log's");
	cr_assert(census_has(&c, 'o', 0, answered[0]) && census_has(&c, 'n', 0, 700));
	free(c.seen);
	cb_db_close(db);
	munmap(answered, 2 * sizeof(int));
}

/* Writes the records of "<prefix><i>", i in [from, to), turn 1, to file (appended). */
static void append_records(const char *file, const char *prefix, int from, int to)
{
	char p[64], rec[256];
	int fd = open(file, O_WRONLY | O_APPEND | O_CREAT, 0600);

	cr_assert_geq(fd, 0);
	for (int i = from; i < to; i++) {
		struct cb_change c = {p, CB_CHANGE_CREATE, 0, 7, "staged"};
		size_t n;

		snprintf(p, sizeof(p), "%s%d", prefix, i);
		n = cb_marklog_encode(&c, 1, 1, rec, sizeof(rec));
		cr_assert_eq(write(fd, rec, n), (ssize_t)n);
	}
	close(fd);
}

static void remove_db(void)
{
	static const char *const sfx[] = {"",		"-wal",	   "-shm", "-marks", "-marks.fold",
					  "-marks.new", "-reserve"};
	char p[200];

	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		snprintf(p, sizeof(p), "%s%s", path, sfx[i]);
		unlink(p);
	}
}

/* What a kill -9 leaves at each step of a rotation and its fold (the page cache keeps every
 * write): 0 the new log made, not in place; 1 the old one linked to ".fold" too; 2 the new
 * one renamed over the log and marks appended to it; 3 the rotated log's rows committed, not
 * yet unlinked. Each is folded at the next open, older marks first, each mark once. */
Test(marklog, every_crash_point_of_a_rotation_folds_each_mark_once_in_order)
{
	char fold[200], fresh[200];
	struct cb_db *db;
	struct census c;

	snprintf(fold, sizeof(fold), "%s.fold", logpath);
	snprintf(fresh, sizeof(fresh), "%s.new", logpath);
	for (int step = 0; step < 4; step++) {
		int want = step >= 2 ? 70 : 40;

		remove_db();
		cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
		if (step == 3) { /* the commit: the rows are in the table */
			mark_range(db, "o", 0, 40);
			cr_assert_eq(cb_journal_fold(db), 0, "%s", cb_error_message());
		}
		cb_db_close(db);
		cr_assert_eq(file_size(logpath), step == 3 ? 0 : -1);
		unlink(logpath);
		append_records(logpath, "o", 0, 40);
		append_records(fresh, "o", 0, 0);
		if (step >= 1)
			cr_assert_eq(link(logpath, fold), 0);
		if (step >= 2) {
			cr_assert_eq(rename(fresh, logpath), 0);
			append_records(logpath, "n", 0, 30);
		}
		for (int open_ = 0; open_ < 2; open_++) { /* and again: nothing changes */
			cr_assert_eq(cb_db_open(path, &db), 0, "step %d: %s", step,
				     cb_error_message());
			cr_assert_eq(file_size(fold), -1, "step %d", step);
			census_of(db, 0, &c);
			cr_assert_eq(c.dup, 0, "step %d", step);
			cr_assert(c.order_ok, "step %d", step);
			cr_assert(census_has(&c, 'o', 0, 40), "step %d", step);
			cr_assert_eq(c.n, want, "step %d: %d rows", step, c.n);
			free(c.seen);
			cb_db_close(db);
		}
	}
}

/* A reader beside a live owner whose rotated log is not folded yet: both logs are read, the
 * rotated one's marks first, each once. */
Test(marklog, a_reader_beside_a_pending_fold_sees_both_logs_once)
{
	struct cb_db *owner, *reader;
	struct census c;

	cr_assert_eq(cb_db_open(path, &owner), 0, "%s", cb_error_message());
	mark_until_fold_waits(owner, "o");
	mark_range(owner, "n", 0, 100);
	cr_assert_eq(cb_db_open(path, &reader), 0, "%s", cb_error_message());
	census_of(reader, 0, &c);
	cr_assert_eq(c.dup, 0);
	cr_assert(c.order_ok);
	cr_assert(census_has(&c, 'n', 0, 100));
	cr_assert_gt(c.n, 100);
	free(c.seen);
	unblock_sql();
	cb_db_close(reader);
	cb_db_close(owner);
}

static int count_row(const struct cb_journal_row *r, void *arg)
{
	(void)r;
	++*(int *)arg;
	return 0;
}

/* The folder cannot keep up (its commit waits for SQLite until a marker folds inline): the
 * marker that finds the log at its bound waits for the fold in flight and folds inline, so
 * the log stays bounded. */
Test(marklog, the_log_stays_bounded_when_the_folder_falls_behind, .timeout = 120)
{
	char prefix[300];
	struct cb_db *db;
	long long most = 0;
	int n = 0, rows = 0;

	memset(prefix, 'p', 250);
	prefix[250] = '\0';
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	block_sql_for(db, 60000);
	for (; n < 60000; n += 100) { /* about 16 MiB of marks */
		long long size;

		mark_range(db, prefix, n, n + 100);
		size = file_size(logpath);
		if (size > most)
			most = size;
	}
	pthread_join(blk.t, NULL);
	cr_assert_leq(most, (8 << 20) + 100 * 300, "the log grew to %lld bytes", most);
	cb_mutex_lock(&db->queue_lock);
	cr_assert_geq(db->stat_folds_inline, 1, "a marker folded (backpressure)");
	cr_assert_geq(db->stat_folds_behind, 1);
	cb_mutex_unlock(&db->queue_lock);
	cr_assert_eq(cb_journal_list(db, 0, count_row, &rows), 0, "%s", cb_error_message());
	cr_assert_eq(rows, n);
	cb_db_close(db);
}
