/* The journal's write path in numbers: marks per second and transactions per mark for 1..N
 * threads marking distinct paths (what concurrent FUSE writers do). Run by
 * scripts/bench/journal; not a test. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"

static struct cb_db *bench_db;
static int bench_per_thread;
/* Per thread: the longest a mark took, and how many took over 1 ms (a mark that waited for a
 * fold, or for another thread's). */
static double bench_max[256];
static int bench_slow[256];

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *bench_worker(void *arg)
{
	long index = (long)arg;
	char path[64];

	for (int i = 0; i < bench_per_thread; i++) {
		struct cb_change c = {path, CB_CHANGE_CREATE, 0, 1, "bench"};

		double t;

		snprintf(path, sizeof(path), "t%ld/d%d/file%06d", index, i % 64, i);
		t = now();
		if (cb_journal_mark(bench_db, &c, 1)) {
			fprintf(stderr, "bench_journal: %s\n", cb_error_message());
			exit(1);
		}
		t = now() - t;
		if (t > bench_max[index])
			bench_max[index] = t;
		bench_slow[index] += t > 1e-3;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t threads[256];
	unsigned long long marks, rows, txs;
	int nthreads, total;
	double t0, elapsed, marked, max = 0;
	int slow = 0;

	if (argc != 4 || (nthreads = atoi(argv[2])) < 1 || nthreads > 256 ||
	    (total = atoi(argv[3])) < nthreads) {
		fprintf(stderr, "usage: bench_journal DB THREADS MARKS\n");
		return 2;
	}
	bench_per_thread = total / nthreads;
	if (cb_db_open(argv[1], &bench_db)) {
		fprintf(stderr, "bench_journal: %s\n", cb_error_message());
		return 1;
	}
	t0 = now();
	for (long i = 0; i < nthreads; i++)
		pthread_create(&threads[i], NULL, bench_worker, (void *)i);
	for (int i = 0; i < nthreads; i++)
		pthread_join(threads[i], NULL);
	marked = now() - t0;
	for (int i = 0; i < nthreads; i++) {
		max = bench_max[i] > max ? bench_max[i] : max;
		slow += bench_slow[i];
	}
	/* The marks are in the table only once the mark log is folded: that is part of the cost. */
	if (cb_journal_fold(bench_db)) {
		fprintf(stderr, "bench_journal: %s\n", cb_error_message());
		return 1;
	}
	elapsed = now() - t0;
	cb_journal_stats(bench_db, &marks, &rows, &txs);
	printf("%3d threads  %7llu marks  %7llu transactions  %6.2f marks/tx  %6.1f us/mark  "
	       "(%.1f before the last fold; slowest mark %.2f ms, %d over 1 ms)\n",
	       nthreads, marks, txs, (double)marks / (double)(txs ? txs : 1),
	       elapsed / (double)marks * 1e6, marked / (double)marks * 1e6, max * 1e3, slow);
	cb_db_close(bench_db);
	return 0;
}
