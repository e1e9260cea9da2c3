/* What a daemon's backend is doing while a command waits on its first use (the vm's boot):
 * a thread asks the daemon's info and shows its backend_phase as a phase line on a terminal. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd_common.h"
#include "cowbox/client.h"
#include "cowbox/error.h"

struct cli_phase_watch {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* CLOCK_MONOTONIC: the pause between two asks */
	int stop;
	const char *cmd;
	char *ref;
};

/* One ask: the daemon's backend_phase drawn when it changed, erased when it ends. A daemon
 * that is not there yet or hung up is asked again next time. 1 once the phase shown ended
 * (the backend is up: nothing more to show). */
static int watch_ask(struct cli_phase_watch *w, struct cb_client **c, char *shown, size_t size)
{
	json_t *reply = NULL;
	const char *phase;
	int done = 0;

	if (!*c && cb_daemon_connect(w->ref, c) < 0)
		*c = NULL;
	if (*c && cb_client_request(*c, json_pack("{s:s}", "op", "info"), 10000, &reply) < 0) {
		cb_client_close(*c);
		*c = NULL;
	}
	cb_error_clear();
	phase = json_string_value(json_object_get(reply, "backend_phase"));
	pthread_mutex_lock(&w->lock);
	if (!w->stop && phase && strcmp(phase, shown)) {
		snprintf(shown, size, "%s", phase);
		cli_phase(w->cmd, "%s", phase);
	} else if (!w->stop && !phase && reply && *shown) {
		cli_phase_done();
		done = 1;
	}
	pthread_mutex_unlock(&w->lock);
	json_decref(reply);
	return done;
}

static int watch_stopped(struct cli_phase_watch *w)
{
	int stop;

	pthread_mutex_lock(&w->lock);
	stop = w->stop;
	pthread_mutex_unlock(&w->lock);
	return stop;
}

static void *watch_loop(void *arg)
{
	struct cli_phase_watch *w = arg;
	struct cb_client *c = NULL;
	char shown[256] = "";
	struct timespec until, start;

	/* The request that may boot the backend is on its way: a phase shows within a moment,
	 * or there is no boot and nothing to ask for (a long command is not watched). */
	clock_gettime(CLOCK_MONOTONIC, &start);
	while (!watch_stopped(w) && !watch_ask(w, &c, shown, sizeof(shown))) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		if (!*shown && until.tv_sec - start.tv_sec >= 5)
			break;
		until.tv_nsec += 300 * 1000 * 1000;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&w->lock);
		while (!w->stop && pthread_cond_timedwait(&w->cond, &w->lock, &until) != ETIMEDOUT)
			;
		pthread_mutex_unlock(&w->lock);
	}
	cb_client_close(c);
	return NULL;
}

struct cli_phase_watch *cli_phase_watch_start(const char *cmd, const char *ref)
{
	struct cli_phase_watch *w;
	pthread_condattr_t attr;

	if (!isatty(STDERR_FILENO) || !(w = calloc(1, sizeof(*w))))
		return NULL;
	w->cmd = cmd;
	if (!(w->ref = strdup(ref))) {
		free(w);
		return NULL;
	}
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (pthread_create(&w->thread, NULL, watch_loop, w)) {
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w->ref);
		free(w);
		return NULL;
	}
	return w;
}

void cli_phase_watch_stop(struct cli_phase_watch *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = 1;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w->ref);
	free(w);
	cli_phase_done();
}
