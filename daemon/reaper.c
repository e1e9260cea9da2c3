/* The daemon as child subreaper: commands' orphans are re-parented here and reaped by a
 * thread, while children that an op waits for itself are claimed and left to it. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "daemon.h"

#define REAPER_MAX_CLAIMS 4096

static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t claims[REAPER_MAX_CLAIMS]; /* guarded by spawn_lock */
static pthread_t reaper_thread;
static pthread_mutex_t reaper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reaper_cond = PTHREAD_COND_INITIALIZER;
static int reaper_running, reaper_quit;

void cb_daemon_spawn_lock(void)
{
	pthread_mutex_lock(&spawn_lock);
}

void cb_daemon_spawn_unlock(void)
{
	pthread_mutex_unlock(&spawn_lock);
}

/* Called with spawn_lock held, right after fork in the parent. */
int cb_daemon_child_claim(pid_t pid)
{
	for (int i = 0; i < REAPER_MAX_CLAIMS; i++)
		if (claims[i] == 0) {
			claims[i] = pid;
			return 0;
		}
	return cb_error_set(EAGAIN, "too many children waited for at once");
}

void cb_daemon_child_release(pid_t pid)
{
	pthread_mutex_lock(&spawn_lock);
	for (int i = 0; i < REAPER_MAX_CLAIMS; i++)
		if (claims[i] == pid)
			claims[i] = 0;
	pthread_mutex_unlock(&spawn_lock);
}

static int claimed(pid_t pid)
{
	for (int i = 0; i < REAPER_MAX_CLAIMS; i++)
		if (claims[i] == pid)
			return 1;
	return 0;
}

/* Children of every thread are listed in /proc/self/task/<tid>/children; an unclaimed one that
 * has exited is reaped with WNOHANG so a live child is never waited for. */
static void reap_unclaimed(void)
{
	DIR *tasks = opendir("/proc/self/task");
	struct dirent *de;

	if (!tasks)
		return;
	while ((de = readdir(tasks))) {
		char path[64];
		FILE *f;
		long pid;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%.20s/children", de->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		while (fscanf(f, "%ld", &pid) == 1) {
			pthread_mutex_lock(&spawn_lock);
			if (!claimed((pid_t)pid))
				waitpid((pid_t)pid, NULL, WNOHANG);
			pthread_mutex_unlock(&spawn_lock);
		}
		fclose(f);
	}
	closedir(tasks);
}

static void *reaper_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&reaper_lock);
	while (!reaper_quit) {
		struct timespec t;

		pthread_mutex_unlock(&reaper_lock);
		reap_unclaimed();
		pthread_mutex_lock(&reaper_lock);
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_nsec += 200000000L;
		if (t.tv_nsec >= 1000000000L) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&reaper_cond, &reaper_lock, &t);
	}
	pthread_mutex_unlock(&reaper_lock);
	return NULL;
}

int cb_daemon_reaper_start(void)
{
	int err;

	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		return cb_error_set(errno, "prctl(PR_SET_CHILD_SUBREAPER): %s", strerror(errno));
	reaper_quit = 0;
	err = pthread_create(&reaper_thread, NULL, reaper_main, NULL);
	if (err)
		return cb_error_set(err, "reaper thread: %s", strerror(err));
	reaper_running = 1;
	return 0;
}

void cb_daemon_reaper_stop(void)
{
	if (!reaper_running)
		return;
	pthread_mutex_lock(&reaper_lock);
	reaper_quit = 1;
	pthread_cond_signal(&reaper_cond);
	pthread_mutex_unlock(&reaper_lock);
	pthread_join(reaper_thread, NULL);
	reaper_running = 0;
	reap_unclaimed();
}
