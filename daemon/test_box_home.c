/* The libcowbox tests' own $COWBOX_HOME: set up before a suite, and torn down after it with
 * every daemon stopped and its log searched for sanitizer reports. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_box_home.h"

struct report {
	char *buf;
	size_t size;
};

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static int remove_ws(const struct cb_ws_info *info, void *arg)
{
	(void)arg;
	cb_ws_remove(info->ref);
	return 0;
}

static int sanitizer_report(const struct cb_ws_info *info, void *arg)
{
	static const char *markers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
					"runtime error:"};
	struct report *r = arg;
	char *path = NULL, buf[65536];
	FILE *f = NULL;
	size_t n;

	if (r->buf[0] || asprintf(&path, "%s/daemon.log", info->dir) < 0)
		return 0;
	f = fopen(path, "re");
	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = '\0';
		for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]) && !r->buf[0]; i++)
			if (strstr(buf, markers[i]))
				snprintf(r->buf, r->size, "%s: %s", path, strstr(buf, markers[i]));
		fclose(f);
	}
	free(path);
	return 0;
}

void box_home_setup(char *home)
{
	const char *bin = getenv("COWBOX");

	cr_assert(bin && *bin, "COWBOX must name the built cowbox binary (make check sets it)");
	cr_assert_not_null(mkdtemp(home));
	setenv("COWBOX_HOME", home, 1);
	setenv("COWBOX_BIN", bin, 1);
}

void box_home_teardown(const char *home)
{
	char report[4300] = "";
	struct report r = {report, sizeof(report)};

	cb_ws_list(sanitizer_report, &r);
	/* Whatever a failed test left: daemons stopped, mounts gone, then the files. */
	cb_ws_list(remove_ws, NULL);
	box_tree_remove(home);
	cr_assert_eq(report[0], '\0', "%s", report);
}

void box_tree_remove(const char *dir)
{
	nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A close that takes long: the daemon's threads as gdb sees them, taken before the client
 * aborts its FUSE connection (30 s), so a stuck stop shows where it was stuck. */
struct stop_watch {
	pthread_mutex_t lock;
	pthread_cond_t done_cond;
	int done;
	pid_t pid;
	char stacks[12000];
};

static void *stop_watch_run(void *arg)
{
	struct stop_watch *w = arg;
	struct timespec until;
	char cmd[128];
	size_t n = 0;
	FILE *p;
	int late;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 25;
	pthread_mutex_lock(&w->lock);
	while (!w->done && pthread_cond_timedwait(&w->done_cond, &w->lock, &until) != ETIMEDOUT)
		;
	late = !w->done;
	pthread_mutex_unlock(&w->lock);
	if (!late || w->pid <= 0 || kill(w->pid, 0) < 0)
		return NULL;
	snprintf(cmd, sizeof(cmd),
		 "gdb -p %d -batch -nx -ex 'thread apply all bt 15' 2>&1 | grep '^#\\|^Thread'",
		 (int)w->pid);
	if ((p = popen(cmd, "re"))) {
		n = fread(w->stacks, 1, sizeof(w->stacks) - 1, p);
		pclose(p);
	}
	w->stacks[n] = '\0';
	return NULL;
}

void box_close_checked(struct cb_box *box)
{
	char path[4200], msg[1024], tail[3001] = "";
	const char *home = getenv("COWBOX_HOME");
	struct stop_watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ""};
	pthread_t watcher;
	char *mnt = NULL;
	FILE *f;
	size_t n;
	int rc, watching;

	snprintf(path, sizeof(path), "%s/workspaces/%s/daemon.log", home ? home : "",
		 cb_box_ref(box));
	cb_ws_daemon(cb_box_ref(box), &w.pid, &mnt);
	free(mnt);
	watching = pthread_create(&watcher, NULL, stop_watch_run, &w) == 0;
	rc = cb_box_close(box);
	pthread_mutex_lock(&w.lock);
	w.done = 1;
	pthread_cond_signal(&w.done_cond);
	pthread_mutex_unlock(&w.lock);
	if (watching)
		pthread_join(watcher, NULL);
	if (rc == 0)
		return;
	snprintf(msg, sizeof(msg), "%s", cb_error_message());
	/* The daemon's own account: the home (and its log) is removed after the test. */
	if ((f = fopen(path, "re"))) {
		if (fseek(f, -(long)(sizeof(tail) - 1), SEEK_END) < 0)
			rewind(f);
		n = fread(tail, 1, sizeof(tail) - 1, f);
		tail[n] = '\0';
		fclose(f);
	}
	cr_assert_fail("close: %s\n--- the end of %s:\n%s\n--- its threads at 25 s:\n%s", msg, path,
		       tail, w.stacks);
}
