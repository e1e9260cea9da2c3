/* Unit tests of the journal's mark log: the record format and its torn or corrupt tails, the
 * replay of a killed owner's log at the next open, and readers beside a live owner. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
