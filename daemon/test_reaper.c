/* Unit tests of the daemon's reaper: orphans re-parented to the subreaper are reaped, and a
 * claimed child is left for the code that waits for it. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "daemon.h"

/* 'Z' if pid is a zombie (exited, not reaped), 0 if it is gone, else its state letter. */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return p && p[1] ? p[2] : '?';
}

static int wait_gone(pid_t pid, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (proc_state(pid) == 0)
			return 1;
		usleep(10000);
	}
	return 0;
}

Test(reaper, orphans_are_reaped)
{
	int pipefd[2];
	pid_t mid, orphan;

	cr_assert_eq(cb_daemon_reaper_start(), 0, "%s", cb_error_message());
	cr_assert_eq(pipe(pipefd), 0);
	mid = fork();
	cr_assert_geq(mid, 0);
	if (mid == 0) {
		/* The grandchild outlives its parent: it is re-parented to us (the subreaper). */
		pid_t g = fork();

		if (g == 0) {
			close(pipefd[0]);
			usleep(100000);
			_exit(0);
		}
		if (write(pipefd[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		_exit(0);
	}
	close(pipefd[1]);
	cr_assert_eq(read(pipefd[0], &orphan, sizeof(orphan)), (ssize_t)sizeof(orphan));
	close(pipefd[0]);
	/* Neither the middle child nor the orphan is claimed: both must disappear. */
	cr_assert(wait_gone(mid, 5000), "middle child %d left as '%c'", (int)mid, proc_state(mid));
	cr_assert(wait_gone(orphan, 5000), "orphan %d left as '%c'", (int)orphan,
		  proc_state(orphan));
	cb_daemon_reaper_stop();
}

Test(reaper, claimed_children_are_left_to_their_owner)
{
	pid_t pid;
	int status;

	cr_assert_eq(cb_daemon_reaper_start(), 0, "%s", cb_error_message());
	cb_daemon_spawn_lock();
	pid = fork();
	if (pid == 0)
		_exit(7);
	cr_assert_eq(cb_daemon_child_claim(pid), 0);
	cb_daemon_spawn_unlock();
	/* Several reaper rounds pass; the zombie must still be there for us. */
	usleep(700000);
	cr_assert_eq(proc_state(pid), 'Z');
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 7);
	cb_daemon_child_release(pid);
	cb_daemon_reaper_stop();
}
