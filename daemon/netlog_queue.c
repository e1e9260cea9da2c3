/* The network log's writer: the egress proxy's thread hands each row over and goes on, and one
 * thread of the daemon writes them in batches (one transaction each), so that a slow commit (a
 * WAL checkpoint's fsync) never stalls the proxy's event loop. Readers flush it first. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "cowbox/error.h"
#include "cowbox/net.h"
#include "cowbox/netlog.h"
#include "daemon.h"

#define BATCH_MAX 256 /* rows per transaction */
/* How long the writer waits for more rows after the first of a batch: a commit per connection
 * costs about ten system calls (the WAL's locks and writes), a batch's are shared. A kill -9
 * loses the rows of at most this long (docs/network.md#network-log). */
#define LINGER_NS (5 * 1000 * 1000)

struct qrow {
	struct cb_netlog_row r; /* its strings point into text */
	struct qrow *next;
	char text[];
};

/* One daemon per process: the queue is the process's. */
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_more = PTHREAD_COND_INITIALIZER, q_idle = PTHREAD_COND_INITIALIZER;
static struct qrow *q_head, **q_tail = &q_head;
static size_t q_len;
static int q_busy;    /* the writer holds rows taken off the queue */
static int q_waiting; /* the writer sleeps for a first row: the only time it needs waking */
static int q_linger;  /* the writer waits for a batch to fill: woken when it is full */
static int q_flush;   /* a reader waits: no lingering */
static int q_state;   /* 0 no writer yet, 1 running, 2 stopped: rows are written at once */
static pthread_t q_thread;
static struct cb_db *q_db;

static void write_rows(struct cb_db *db, struct qrow *list)
{
	struct cb_netlog_row batch[BATCH_MAX];

	while (list) {
		size_t n = 0;

		for (; list && n < BATCH_MAX; list = list->next)
			batch[n++] = list->r;
		/* The proxy cannot fail the connection over its log: say it in the log file. */
		if (cb_db_netlog_add_many(db, batch, n) < 0) {
			fprintf(stderr, "cowbox: network log: %s\n", cb_error_message());
			cb_error_clear();
		}
	}
}

static void free_rows(struct qrow *list)
{
	for (struct qrow *next; list; list = next) {
		next = list->next;
		free(list);
	}
}

static void *writer_main(void *arg)
{
	struct qrow *list;

	(void)arg;
	pthread_mutex_lock(&q_lock);
	for (;;) {
		q_waiting = 1;
		while (!q_head && q_state == 1)
			pthread_cond_wait(&q_more, &q_lock);
		q_waiting = 0;
		if (!q_head)
			break; /* stopped, and nothing left */
		if (q_len < BATCH_MAX && q_state == 1 && !q_flush) {
			struct timespec until;

			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_nsec += LINGER_NS;
			if (until.tv_nsec >= 1000000000) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000;
			}
			q_linger = 1;
			while (q_len < BATCH_MAX && q_state == 1 && !q_flush &&
			       pthread_cond_clockwait(&q_more, &q_lock, CLOCK_MONOTONIC, &until) ==
				   0)
				;
			q_linger = 0;
		}
		list = q_head;
		q_head = NULL;
		q_tail = &q_head;
		q_len = 0;
		q_busy = 1;
		pthread_mutex_unlock(&q_lock);
		write_rows(q_db, list);
		free_rows(list);
		pthread_mutex_lock(&q_lock);
		q_busy = 0;
		pthread_cond_broadcast(&q_idle);
	}
	pthread_mutex_unlock(&q_lock);
	return NULL;
}

/* A copy of the record as a row of the turn open now, its strings in one allocation. */
static struct qrow *row_of(struct cb_daemon *d, const struct cb_net_record *r)
{
	const char *s[4] = {r->proto ?: "", r->name ?: "", r->address ?: "", r->rule ?: ""};
	size_t len[4], total = 0;
	struct qrow *q;
	char *p;

	for (int i = 0; i < 4; i++)
		total += (len[i] = strlen(s[i])) + 1;
	if (!(q = calloc(1, sizeof(*q) + total)))
		return NULL;
	p = q->text;
	for (int i = 0; i < 4; i++) {
		memcpy(p, s[i], len[i] + 1);
		s[i] = p;
		p += len[i] + 1;
	}
	q->r = (struct cb_netlog_row){
	    .turn = cb_journal_turn(d->db),
	    .time = r->time,
	    .proto = s[0],
	    .name = s[1],
	    .address = s[2],
	    .port = r->port,
	    .allowed = r->allowed,
	    .rule = s[3],
	    .bytes_up = (long long)r->bytes_up,
	    .bytes_down = (long long)r->bytes_down,
	    .duration = r->duration,
	    .secret = r->secret,
	};
	return q;
}

void cb_daemon_net_record(void *arg, const struct cb_net_record *r)
{
	struct cb_daemon *d = arg;
	struct qrow *q = row_of(d, r);

	if (!q) {
		fprintf(stderr, "cowbox: network log: out of memory\n");
		return;
	}
	pthread_mutex_lock(&q_lock);
	if (q_state == 0) {
		q_db = d->db;
		q_state = pthread_create(&q_thread, NULL, writer_main, NULL) == 0 ? 1 : 2;
	}
	if (q_state == 1) {
		*q_tail = q;
		q_tail = &q->next;
		q->next = NULL;
		/* a wake (a futex call) only where the writer waits for this row */
		if ((q_waiting && !q_len) || (q_linger && q_len + 1 == BATCH_MAX))
			pthread_cond_signal(&q_more);
		q_len++;
		q = NULL;
	}
	pthread_mutex_unlock(&q_lock);
	if (q) { /* no writer (stopped, or none could start): write it here */
		write_rows(d->db, q);
		free(q);
	}
}

void cb_daemon_net_flush(void)
{
	pthread_mutex_lock(&q_lock);
	q_flush++;
	if (q_linger)
		pthread_cond_signal(&q_more);
	while (q_head || q_busy)
		pthread_cond_wait(&q_idle, &q_lock);
	q_flush--;
	pthread_mutex_unlock(&q_lock);
}

void cb_daemon_net_stop(void)
{
	int joined;

	pthread_mutex_lock(&q_lock);
	joined = q_state == 1;
	q_state = 2;
	pthread_cond_broadcast(&q_more);
	pthread_mutex_unlock(&q_lock);
	if (joined)
		pthread_join(q_thread, NULL);
}
