/* A race stress of the runner's handle (exec/run.c, run_io.c) for ThreadSanitizer: exec, kill,
 * stdin and close racing on one command and across commands, as the daemon drives them.
 *
 * Each "connection" thread starts host commands (cat, the local backend's path) over and
 * over. Per command, a waiter thread runs cb_exec_wait, a writer streams stdin and closes it,
 * a second closer races that close, and killers signal it: the connection's own and those of
 * every other connection, which find the command in a shared table. The table follows the
 * daemon's rule (docs/hacking.md, "Command handles and their lifetimes"): a killer takes a
 * reference under the table's lock and signals outside it; the owner takes the command off
 * the table and waits for the references before cb_exec_free. A command that was not killed
 * must echo exactly what was written (checked in the plain build). Built and run by
 * exec/test_run_tsan.sh, with ThreadSanitizer and plainly. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"

#define CONNS 4
#define SLOTS CONNS

struct cmd {
	struct cb_exec *h;
	struct cb_exec_result res;
	int rc;
	char sent[4096];
	size_t sent_len;
	_Atomic int write_failed;
	unsigned seed; /* read only: each thread draws from its own copy */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t gone;
	struct cb_exec *h[SLOTS];
	int refs[SLOTS];
} table = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, {0}};

static _Atomic int failures, stop_all;
#if defined(__SANITIZE_THREAD__)
/* Under TSan the shim's own CLONE_VM child (the command before its exec) runs instrumented
 * code TSan cannot model, and can lose a command's output: here only races are judged, and
 * the plain build of this stress checks the bytes. */
static const int verify_echo = 0;
#else
static const int verify_echo = 1;
#endif
static _Atomic long commands, kills, cross_kills, echoed;

static void sleep_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

	nanosleep(&ts, NULL);
}

static void *waiter(void *arg)
{
	struct cmd *c = arg;

	c->rc = cb_exec_wait(c->h, &c->res);
	return NULL;
}

static void *writer(void *arg)
{
	struct cmd *c = arg;
	unsigned seed = c->seed ^ 0x1111;
	size_t at = 0;

	while (at < c->sent_len) {
		size_t n = 1 + rand_r(&seed) % 512;

		if (n > c->sent_len - at)
			n = c->sent_len - at;
		if (cb_exec_stdin_write(c->h, c->sent + at, n) < 0) {
			c->write_failed = 1; /* a kill or the racing close came first */
			break;
		}
		at += n;
		if (rand_r(&seed) % 4 == 0)
			sleep_us(rand_r(&seed) % 300);
	}
	cb_exec_stdin_close(c->h);
	return NULL;
}

static void *closer(void *arg)
{
	struct cmd *c = arg;
	unsigned seed = c->seed ^ 0x2222;

	sleep_us(rand_r(&seed) % 3000);
	if (rand_r(&seed) % 3 == 0) {
		c->write_failed = 1; /* maybe before every byte was written */
		cb_exec_stdin_close(c->h);
	}
	return NULL;
}

static void *killer(void *arg)
{
	struct cmd *c = arg;
	unsigned seed = c->seed ^ 0x3333;
	int sig = rand_r(&seed) % 2 ? SIGKILL : SIGTERM;

	sleep_us(rand_r(&seed) % 4000);
	if (rand_r(&seed) % 2) {
		cb_exec_kill(c->h, sig);
		kills++;
	}
	return NULL;
}

/* Kills of other connections' commands, through the table. */
static void *cross_killer(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!stop_all) {
		int slot = (int)(rand_r(&seed) % SLOTS);
		struct cb_exec *h;

		pthread_mutex_lock(&table.lock);
		h = table.h[slot];
		if (h)
			table.refs[slot]++;
		pthread_mutex_unlock(&table.lock);
		if (h) {
			int what = (int)(rand_r(&seed) % 4);

			if (what == 0) {
				cb_exec_kill(h, SIGKILL);
				cross_kills++;
			} else if (what == 1) {
				cb_exec_stdin_close(h); /* a hang-up's close, from elsewhere */
			}
			pthread_mutex_lock(&table.lock);
			if (--table.refs[slot] == 0)
				pthread_cond_broadcast(&table.gone);
			pthread_mutex_unlock(&table.lock);
		}
		sleep_us(1000 + rand_r(&seed) % 9000);
	}
	return NULL;
}

static void one_command(int slot, unsigned *seed)
{
	static char *const argv[] = {"cat", NULL};
	static char *const env[] = {"PATH=/usr/bin:/bin", NULL};
	struct cb_exec_spec spec = {
	    .argv = argv, .env = env, .stdin_kind = CB_EXEC_STDIN_STREAM, .timeout = 20};
	struct cmd c = {.seed = rand_r(seed)};
	pthread_t w, wr, cl, k;

	c.sent_len = 1 + rand_r(seed) % sizeof(c.sent);
	for (size_t i = 0; i < c.sent_len; i++)
		c.sent[i] = (char)('a' + rand_r(seed) % 26);
	if (cb_exec_start(&spec, NULL, &c.h) < 0) {
		fprintf(stderr, "stress: start: %s\n", cb_error_message());
		failures++;
		return;
	}
	commands++;
	pthread_mutex_lock(&table.lock);
	table.h[slot] = c.h;
	pthread_mutex_unlock(&table.lock);
	pthread_create(&w, NULL, waiter, &c);
	pthread_create(&wr, NULL, writer, &c);
	pthread_create(&cl, NULL, closer, &c);
	pthread_create(&k, NULL, killer, &c);
	pthread_join(k, NULL);
	pthread_join(cl, NULL);
	pthread_join(wr, NULL);
	pthread_join(w, NULL);
	/* off the table, then no reference left: only now may the handle go */
	pthread_mutex_lock(&table.lock);
	table.h[slot] = NULL;
	while (table.refs[slot])
		pthread_cond_wait(&table.gone, &table.lock);
	pthread_mutex_unlock(&table.lock);
	if (c.rc < 0) {
		fprintf(stderr, "stress: wait: %s\n", cb_error_message());
		failures++;
	} else if (verify_echo && !c.res.killed && !c.write_failed && !c.res.term_signal &&
		   (c.res.out_len != c.sent_len || memcmp(c.res.out, c.sent, c.sent_len))) {
		fprintf(stderr, "stress: cat echoed %zu bytes of %zu (exit %d)\n", c.res.out_len,
			c.sent_len, c.res.exit_code);
		failures++;
	} else if (!c.res.killed && !c.write_failed && !c.res.term_signal) {
		echoed++;
	}
	cb_exec_result_free(&c.res);
	cb_exec_free(c.h);
}

static int iterations = 25;

static void *connection(void *arg)
{
	int slot = (int)(uintptr_t)arg;
	unsigned seed = (unsigned)(slot * 7919 + 1) ^ (unsigned)time(NULL);

	for (int i = 0; i < iterations && !failures; i++)
		one_command(slot, &seed);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t conn[CONNS], cross[2];

	if (argc > 1)
		iterations = atoi(argv[1]);
	for (int i = 0; i < 2; i++)
		pthread_create(&cross[i], NULL, cross_killer, (void *)(uintptr_t)(i + 17));
	for (int i = 0; i < CONNS; i++)
		pthread_create(&conn[i], NULL, connection, (void *)(uintptr_t)i);
	for (int i = 0; i < CONNS; i++)
		pthread_join(conn[i], NULL);
	stop_all = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(cross[i], NULL);
	printf("stress: %ld commands (%ld echoed all their stdin), %ld kills, %ld from other "
	       "connections, %d failures\n",
	       (long)commands, (long)echoed, (long)kills, (long)cross_kills, (int)failures);
	return failures ? 1 : 0;
}
