/* The daemon's CPU share on a busy host: its session's autogroup gets a higher weight, so the
 * FUSE threads a user's shell waits on are not starved by other sessions' builds. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"

/* Why an autogroup and not the threads' nice: with autogroups on (Debian's default), the
 * kernel first shares CPU between sessions, then within one, so a daemon in its own session
 * gets one session's share however many threads it has, against a loaded host's dozens. Its
 * sandboxed commands start their own sessions (exec/shim.c, qemu and docker under the runner
 * too), so they cannot borrow the weight: only work the daemon does itself runs at it. */
#define SCHED_DEFAULT_NICE (-5)
#define SCHED_MOST_NICE	   (-10)

/* The autogroup nice to ask for: COWBOX_DAEMON_NICE (SCHED_MOST_NICE..19) or the default.
 * Values out of range are clamped to the range's ends, so a typo cannot ask for more. */
static int sched_wanted_nice(void)
{
	const char *s = getenv("COWBOX_DAEMON_NICE");
	char *end;
	long v;

	if (!s || !*s)
		return SCHED_DEFAULT_NICE;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end)
		return SCHED_DEFAULT_NICE;
	if (v < SCHED_MOST_NICE)
		return SCHED_MOST_NICE;
	return v > 19 ? 19 : (int)v;
}

int cb_daemon_sched_raise(void)
{
	char buf[16];
	int nice = sched_wanted_nice(), fd, rc = 0;
	int len = snprintf(buf, sizeof(buf), "%d", nice);

	fd = open("/proc/self/autogroup", O_WRONLY | O_CLOEXEC);
	if (fd < 0) /* a kernel without CONFIG_SCHED_AUTOGROUP: sessions share nothing to fix */
		return errno == ENOENT ? 0 : -errno;
	if (write(fd, buf, (size_t)len) != len)
		rc = -errno;
	close(fd);
	if (rc == 0)
		cb_daemon_log("autogroup nice %d", nice);
	else
		cb_daemon_log("autogroup nice %d: %s (serving at the default share)", nice,
			      strerror(-rc));
	return rc;
}
