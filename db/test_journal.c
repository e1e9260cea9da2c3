/* Unit tests of db/: migration, marks and their deduplication, marks from many threads,
 * durability across a kill -9, the errors for bad files, the network log's batches and ranges,
 * the link names of hard-linked files. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/netlog.h"
#include "db.h"

static char dir[64];
static char path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/cb-dbtest-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/meta.db", dir);
}

static void teardown(void)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(journal, .init = setup, .fini = teardown);

struct collect {
	int n;
	char paths[64][64];
	int kinds[64];
	long long turns[64];
	pid_t pids[64];
	char comms[64][16];
};

static int collect_row(const struct cb_journal_row *row, void *arg)
{
	struct collect *c = arg;

	if (c->n < 64) {
		snprintf(c->paths[c->n], sizeof(c->paths[0]), "%s", row->path);
		c->kinds[c->n] = row->kind;
		c->turns[c->n] = row->turn;
		c->pids[c->n] = row->pid;
		snprintf(c->comms[c->n], sizeof(c->comms[0]), "%s", row->comm ? row->comm : "");
	}
	c->n++;
	return 0;
}

static int count_rows(struct cb_db *db)
{
	struct collect *c = calloc(1, sizeof(*c));
	int n;

	cr_assert_eq(cb_journal_list(db, 0, collect_row, c), 0, "%s", cb_error_message());
	n = c->n;
	free(c);
	return n;
}

Test(journal, migrate_from_empty_and_reopen)
{
	struct cb_db *db;
	char *v = NULL;

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_turn(db), 1);
	cr_assert_eq(cb_db_meta_set(db, "base", "/src/x"), 0);
	cb_db_close(db);
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_db_meta_get(db, "base", &v), 0);
	cr_assert_str_eq(v, "/src/x");
	free(v);
	cr_assert_eq(cb_db_meta_get(db, "nope", &v), -ENOENT);
	cr_assert_null(v);
	cr_assert(strstr(cb_error_message(), "nope"));
	cb_db_close(db);

	/* user_version says every migration ran. */
	sqlite3 *raw;
	sqlite3_stmt *st;

	cr_assert_eq(sqlite3_open(path, &raw), SQLITE_OK);
	cr_assert_eq(sqlite3_prepare_v2(raw, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_eq(sqlite3_column_int64(st, 0), (long long)cb_db_migration_count);
	sqlite3_finalize(st);
	cr_assert_eq(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
	sqlite3_finalize(st);
	sqlite3_close(raw);
}

Test(journal, mark_list_and_duplicates)
{
	struct cb_db *db;
	struct collect *c = calloc(1, sizeof(*c));
	struct cb_change ch[] = {
	    {"src/a.c", CB_CHANGE_WRITE, 0, 42, "cc1"},
	    {"src/b.c", CB_CHANGE_CREATE, 0, 43, NULL},
	    {"src/a.c", CB_CHANGE_META, 0, 42, "chmod"},
	};
	unsigned long long marks, rows, txs;

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_mark(db, ch, 3), 0, "%s", cb_error_message());
	/* The same marks again cost nothing: no rows, no transaction. */
	cr_assert_eq(cb_journal_mark(db, ch, 3), 0);
	cr_assert_eq(cb_journal_mark(db, ch, 1), 0);
	cb_journal_stats(db, &marks, &rows, &txs);
	cr_assert_eq(marks, 7);
	cr_assert_eq(rows, 3);
	cr_assert_eq(txs, 0, "the marks are in the log, no SQLite transaction yet");
	cr_assert_eq(cb_journal_list(db, 1, collect_row, c), 0);
	cb_journal_stats(db, &marks, &rows, &txs);
	cr_assert_eq(txs, 1, "listing folded the log in one transaction");
	cr_assert_eq(c->n, 3);
	cr_assert_str_eq(c->paths[0], "src/a.c");
	cr_assert_eq(c->kinds[0], CB_CHANGE_WRITE);
	cr_assert_eq(c->pids[0], 42);
	cr_assert_str_eq(c->comms[0], "cc1");
	cr_assert_str_eq(c->comms[1], "");
	cr_assert_eq(c->kinds[2], CB_CHANGE_META);
	cb_db_close(db);

	/* After a reopen the set is empty, but the unique key still stops a second row; a new
	 * turn records the path again. */
	cr_assert_eq(cb_db_open(path, &db), 0);
	cr_assert_eq(cb_journal_mark(db, ch, 1), 0);
	cr_assert_eq(count_rows(db), 3);
	cb_journal_set_turn(db, 2);
	cr_assert_eq(cb_journal_mark(db, ch, 1), 0);
	memset(c, 0, sizeof(*c));
	cr_assert_eq(cb_journal_list(db, 2, collect_row, c), 0);
	cr_assert_eq(c->n, 1);
	cr_assert_eq(c->turns[0], 2);
	cr_assert_eq(count_rows(db), 4);
	cr_assert_str_eq(cb_change_kind_name(CB_CHANGE_RENAME_TO), "rename-to");
	cr_assert_str_eq(cb_change_kind_name(99), "unknown");
	free(c);
	cb_db_close(db);
}

Test(journal, marked_knows_the_turns_marks_of_any_kind)
{
	struct cb_db *db;
	struct cb_change ch[] = {
	    {"w.txt", CB_CHANGE_CREATE, 0, 42, "sh"},
	    {"m.txt", CB_CHANGE_META, 0, 42, "chmod"},
	};

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_marked(db, "w.txt"), 0);
	cr_assert_eq(cb_journal_mark(db, ch, 2), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_marked(db, "w.txt"), 1);
	cr_assert_eq(cb_journal_marked(db, "m.txt"), 1);
	cr_assert_eq(cb_journal_marked(db, "other.txt"), 0);
	/* a new turn starts with nothing marked */
	cb_journal_set_turn(db, cb_journal_turn(db) + 1);
	cr_assert_eq(cb_journal_marked(db, "w.txt"), 0);
	cb_db_close(db);
}

Test(journal, bad_marks_refused)
{
	struct cb_db *db;
	struct cb_change abs = {"/etc/passwd", CB_CHANGE_WRITE, 0, 0, NULL};
	struct cb_change dots = {"..", CB_CHANGE_WRITE, 0, 0, NULL};
	struct cb_change kind = {"a", 77, 0, 0, NULL};

	cr_assert_eq(cb_db_open(path, &db), 0);
	cr_assert_eq(cb_journal_mark(db, &abs, 1), -EINVAL);
	cr_assert(strstr(cb_error_message(), "/etc/passwd"));
	cr_assert_eq(cb_journal_mark(db, &dots, 1), -EINVAL);
	cr_assert_eq(cb_journal_mark(db, &kind, 1), -EINVAL);
	cr_assert_eq(count_rows(db), 0);
	cb_db_close(db);
}

#define THREADS	   16
#define PER_THREAD 200

struct worker {
	struct cb_db *db;
	int index;
	int rc;
};

static void *mark_worker(void *arg)
{
	struct worker *w = arg;
	char p[64];

	for (int i = 0; i < PER_THREAD && !w->rc; i++) {
		struct cb_change c = {p, CB_CHANGE_WRITE, 0, getpid(), "worker"};

		snprintf(p, sizeof(p), "t%d/f%d", w->index, i);
		w->rc = cb_journal_mark(w->db, &c, 1);
	}
	return NULL;
}

Test(journal, group_commit_from_many_threads)
{
	struct cb_db *db;
	pthread_t t[THREADS];
	struct worker w[THREADS];
	unsigned long long marks, rows, txs;

	cr_assert_eq(cb_db_open(path, &db), 0);
	for (int i = 0; i < THREADS; i++) {
		w[i] = (struct worker){db, i, 0};
		cr_assert_eq(pthread_create(&t[i], NULL, mark_worker, &w[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(w[i].rc, 0);
	}
	cb_journal_stats(db, &marks, &rows, &txs);
	cr_assert_eq(marks, THREADS * PER_THREAD);
	cr_assert_eq(rows, THREADS * PER_THREAD);
	cr_assert_eq(count_rows(db), THREADS * PER_THREAD);
	/* Batching happened: fewer transactions than marks. */
	cr_assert_lt(txs, marks, "transactions %llu, marks %llu", txs, marks);
	cr_log_info("group commit: %llu marks in %llu transactions\n", marks, txs);
	cb_db_close(db);
}

Test(journal, durable_across_kill9)
{
	pid_t pid = fork();
	int status;

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct cb_db *db;
		struct cb_change c = {"kept.txt", CB_CHANGE_CREATE, 0, 1, "x"};

		if (cb_db_open(path, &db) || cb_journal_mark(db, &c, 1))
			_exit(3);
		c.path = "dir";
		c.kind = CB_CHANGE_RENAME_TO;
		c.subtree = 1;
		if (cb_journal_mark(db, &c, 1))
			_exit(3);
		raise(SIGKILL); /* no close, no checkpoint */
		_exit(4);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);

	struct cb_db *db;
	struct collect *c = calloc(1, sizeof(*c));

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_journal_list(db, 0, collect_row, c), 0);
	cr_assert_eq(c->n, 2);
	cr_assert_str_eq(c->paths[0], "kept.txt");
	cr_assert_str_eq(c->paths[1], "dir");
	cr_assert_eq(cb_journal_sync(db), 0, "%s", cb_error_message());
	free(c);
	cb_db_close(db);
}

Test(journal, corrupt_file_is_a_clear_error)
{
	struct cb_db *db = (void *)1;
	int fd = open(path, O_WRONLY | O_CREAT, 0600);
	char junk[4096];

	memset(junk, 'z', sizeof(junk));
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
	close(fd);
	cr_assert_lt(cb_db_open(path, &db), 0);
	cr_assert_null(db);
	cr_assert(strstr(cb_error_message(), path), "%s", cb_error_message());
	cr_assert(strstr(cb_error_message(), "not a database"), "%s", cb_error_message());
}

Test(journal, unopenable_file_is_a_clear_error)
{
	struct cb_db *db = (void *)1;
	char missing[192];

	snprintf(missing, sizeof(missing), "%s/no/such/dir/meta.db", dir);
	cr_assert_lt(cb_db_open(missing, &db), 0);
	cr_assert_null(db);
	cr_assert(strstr(cb_error_message(), missing), "%s", cb_error_message());
	cr_assert(strstr(cb_error_message(), "open"), "%s", cb_error_message());

	/* A directory where the file should be. */
	cr_assert_eq(mkdir(path, 0700), 0);
	cr_assert_lt(cb_db_open(path, &db), 0);
	cr_assert(strstr(cb_error_message(), path), "%s", cb_error_message());
}

Test(journal, newer_schema_is_refused)
{
	sqlite3 *raw;
	struct cb_db *db;

	cr_assert_eq(sqlite3_open(path, &raw), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(raw, "PRAGMA user_version = 999", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(raw);
	cr_assert_lt(cb_db_open(path, &db), 0);
	cr_assert(strstr(cb_error_message(), "newer"), "%s", cb_error_message());
}

/* Sets or clears the immutable flag; 0 when the filesystem or our privileges do not allow it. */
static int set_immutable(const char *file, int on)
{
	int fd = open(file, O_RDONLY | O_CLOEXEC), flags, ok = 0;

	if (fd < 0)
		return 0;
	if (ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0) {
		flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
		ok = ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
	}
	close(fd);
	return ok;
}

Test(journal, unwritable_file_is_a_clear_error)
{
	struct cb_db *db = NULL;
	int rc;

	cr_assert_eq(cb_db_open(path, &db), 0);
	cb_db_close(db);
	/* Root ignores modes; an immutable file is unwritable even for root. */
	if (geteuid() == 0 ? !set_immutable(path, 1) : chmod(path, 0400) != 0)
		cr_skip_test("cannot make %s unwritable here", path);
	rc = cb_db_open(path, &db);
	if (geteuid() == 0)
		set_immutable(path, 0);
	cr_assert_eq(rc, -EACCES, "rc %d: %s", rc, cb_error_message());
	cr_assert_null(db);
	cr_assert(strstr(cb_error_message(), path), "%s", cb_error_message());
	cr_assert(strstr(cb_error_message(), "not writable"), "%s", cb_error_message());
}

static int netlog_turns(const struct cb_netlog_row *row, void *arg)
{
	char *out = arg;
	size_t len = strlen(out);

	snprintf(out + len, 256 - len, "%s%lld:%s", len ? "," : "", row->turn, row->name);
	return 0;
}

/* The network log: rows added one at a time and in a batch, read per turn and by range. */
Test(journal, netlog_batches_and_ranges)
{
	struct cb_netlog_row rows[4] = {
	    {.turn = 1, .proto = "http", .name = "a", .rule = "r"},
	    {.turn = 2, .proto = "connect", .name = "b", .rule = "r", .allowed = 1},
	    {.turn = 2, .proto = "socks5", .name = "c", .rule = "r"},
	    {.turn = 3, .proto = "http", .name = "d", .rule = "r"},
	};
	struct cb_db *db;
	char out[256];

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_eq(cb_db_netlog_add(db, &rows[0]), 0, "%s", cb_error_message());
	cr_assert_eq(cb_db_netlog_add_many(db, rows + 1, 3), 0, "%s", cb_error_message());
	out[0] = 0;
	cr_assert_eq(cb_db_netlog_list(db, -1, netlog_turns, out), 0);
	cr_assert_str_eq(out, "1:a,2:b,2:c,3:d");
	out[0] = 0;
	cr_assert_eq(cb_db_netlog_list(db, 2, netlog_turns, out), 0);
	cr_assert_str_eq(out, "2:b,2:c");
	out[0] = 0;
	cr_assert_eq(cb_db_netlog_range(db, 1, 3, netlog_turns, out), 0);
	cr_assert_str_eq(out, "2:b,2:c,3:d");
	out[0] = 0;
	cr_assert_eq(cb_db_netlog_range(db, 2, -1, netlog_turns, out), 0);
	cr_assert_str_eq(out, "3:d");
	out[0] = 0;
	cr_assert_eq(cb_db_netlog_range(db, 3, 3, netlog_turns, out), 0);
	cr_assert_str_eq(out, "");
	cb_db_close(db);
}

/* The link names of an inode, joined with '|' in path order. */
struct link_list {
	char buf[512];
};

static int link_collect(unsigned long long ino, const char *p, void *arg)
{
	struct link_list *l = arg;

	(void)ino;
	if (l->buf[0])
		strcat(l->buf, "|");
	strcat(l->buf, p);
	return 0;
}

static const char *links_of(struct cb_db *db, unsigned long long ino, struct link_list *l)
{
	l->buf[0] = '\0';
	cr_assert_eq(cb_links_names(db, ino, link_collect, l), 0, "%s", cb_error_message());
	return l->buf;
}

Test(journal, link_names_follow_renames_of_their_directories)
{
	struct link_list l;
	struct cb_db *db;

	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	/* no rows: a rename or a drop asks nothing and fails nothing */
	cr_assert_eq(cb_links_rename(db, "a", "b"), 0);
	cr_assert_str_eq(links_of(db, 7, &l), "");
	cr_assert_eq(cb_links_add(db, 7, "d/x"), 0);
	cr_assert_eq(cb_links_add(db, 7, "d/sub/y"), 0);
	cr_assert_eq(cb_links_add(db, 7, "d/x"), 0);  /* again: one row */
	cr_assert_eq(cb_links_add(db, 7, "dd/z"), 0); /* "d" is not its directory */
	cr_assert_eq(cb_links_add(db, 7, "d.old/w"), 0);
	cr_assert_eq(cb_links_add(db, 9, "d/\xc3\xa9t\xc3\xa9"), 0);
	cr_assert_str_eq(links_of(db, 7, &l), "d.old/w|d/sub/y|d/x|dd/z");
	/* a directory's rename copies the rows below it (and only those), the drop after it
	 * removes the old ones */
	cr_assert_eq(cb_links_rename(db, "d", "\xc3\xa9/n"), 1);
	cr_assert_eq(cb_links_rename(db, "d/none", "e"), 0); /* nothing below: nothing written */
	cr_assert_eq(cb_links_drop(db, "d"), 0);
	cr_assert_str_eq(links_of(db, 7, &l), "d.old/w|dd/z|\xc3\xa9/n/sub/y|\xc3\xa9/n/x");
	cr_assert_str_eq(links_of(db, 9, &l), "\xc3\xa9/n/\xc3\xa9t\xc3\xa9");
	/* a file's own rename */
	cr_assert_eq(cb_links_rename(db, "dd/z", "z2"), 1);
	cr_assert_eq(cb_links_forget(db, 7, "dd/z"), 0);
	cr_assert_str_eq(links_of(db, 7, &l), "d.old/w|z2|\xc3\xa9/n/sub/y|\xc3\xa9/n/x");
	cb_db_close(db);
	/* kept across a reopen (a remount) */
	cr_assert_eq(cb_db_open(path, &db), 0, "%s", cb_error_message());
	cr_assert_str_eq(links_of(db, 7, &l), "d.old/w|z2|\xc3\xa9/n/sub/y|\xc3\xa9/n/x");
	cb_db_close(db);
}
