/* Idle stop: a daemon no `cowbox mount` pinned unmounts and exits (its container and commands
 * with it) once no client has held a connection for idle_timeout seconds; the disk stays and
 * the next use boots it again. The timeout is kept in the workspace's file "idle_timeout". */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/overlay.h"
#include "daemon.h"
#include "util/smallfile.h"

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* See daemon.h. */
int cb_daemon_idle_load(const char *dir, double *timeout)
{
	char buf[64], *end;
	int n;

	*timeout = CB_DAEMON_IDLE_DEFAULT;
	n = cb_smallfile_read(dir, "idle_timeout", buf, sizeof(buf));
	if (n < 0)
		return n == -ENOENT ? 0 : n;
	*timeout = strtod(buf, &end);
	if (end == buf || !isfinite(*timeout) || *timeout < 0)
		return cb_error_set(EINVAL, "%s/idle_timeout: '%s' is no number of seconds >= 0",
				    dir, buf);
	return 0;
}

/* See daemon.h. */
int cb_daemon_idle_save(const char *dir, double timeout)
{
	char text[64];

	if (!isfinite(timeout) || timeout < 0)
		return cb_error_set(EINVAL,
				    "idle_timeout: needs a number of seconds >= 0 (0: never)");
	snprintf(text, sizeof(text), "%.17g\n", timeout);
	return cb_smallfile_write(dir, "idle_timeout", text, 0600);
}

static double idle_timeout(struct cb_daemon *d)
{
	return (double)__atomic_load_n(&d->idle_timeout_ms, __ATOMIC_ACQUIRE) / 1000;
}

/* Seconds without a connection (0 while one is open); d->idle_since is kept under conns_lock. */
static double idle_seconds(struct cb_daemon *d)
{
	double now = mono_now(), idle;

	pthread_mutex_lock(&d->conns_lock);
	if (d->nconns > 0 || d->idle_since == 0)
		d->idle_since = now;
	idle = d->nconns > 0 ? 0 : now - d->idle_since;
	pthread_mutex_unlock(&d->conns_lock);
	return idle;
}

/* Unmount only when nothing holds the mount (a shell of `cowbox exec` in it: EBUSY), so an
 * idle stop never pulls the tree from under a process; then stop as `close` does. */
static void idle_stop(struct cb_daemon *d, double idle)
{
	int rc = d->ov ? cb_overlay_unmount(d->ov) : 0;

	if (rc == -EBUSY) { /* in use by a process on the host: not idle */
		cb_error_clear();
		pthread_mutex_lock(&d->conns_lock);
		d->idle_since = mono_now();
		pthread_mutex_unlock(&d->conns_lock);
		return;
	}
	if (rc) {
		cb_daemon_log("idle stop: %s", cb_error_message());
		cb_error_clear();
	}
	cb_daemon_log("idle for %.0f s (idle_timeout %g s) with no client: stopping; the "
		      "workspace stays on disk and its next use starts it again",
		      idle, idle_timeout(d));
	cb_daemon_request_stop(d);
}

static void *idle_main(void *arg)
{
	struct cb_daemon *d = arg;

	pthread_mutex_lock(&d->idle_lock);
	while (!__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) {
		double timeout = idle_timeout(d);
		double tick = timeout > 0 && timeout < 4 ? timeout / 4 : 1.0, idle;
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += (time_t)tick;
		until.tv_nsec += (long)((tick - (double)(time_t)tick) * 1e9);
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&d->idle_cond, &d->idle_lock, &until);
		if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
			break;
		idle = idle_seconds(d);
		if (timeout > 0 && idle >= timeout &&
		    !__atomic_load_n(&d->pinned, __ATOMIC_ACQUIRE)) {
			pthread_mutex_unlock(&d->idle_lock);
			idle_stop(d, idle);
			pthread_mutex_lock(&d->idle_lock);
		}
	}
	pthread_mutex_unlock(&d->idle_lock);
	return NULL;
}

int cb_daemon_idle_start(struct cb_daemon *d)
{
	int err = pthread_create(&d->idle_thread, NULL, idle_main, d);

	if (err)
		return cb_error_set(err, "idle thread: %s", strerror(err));
	d->have_idle = 1;
	return 0;
}

void cb_daemon_idle_stop(struct cb_daemon *d)
{
	if (!d->have_idle)
		return;
	pthread_mutex_lock(&d->idle_lock);
	pthread_cond_broadcast(&d->idle_cond);
	pthread_mutex_unlock(&d->idle_lock);
	pthread_join(d->idle_thread, NULL);
	d->have_idle = 0;
}

void cb_daemon_idle_info(struct cb_daemon *d, json_t *r)
{
	json_object_set_new(r, "idle_timeout", json_real(idle_timeout(d)));
	json_object_set_new(r, "pinned",
			    json_boolean(__atomic_load_n(&d->pinned, __ATOMIC_ACQUIRE)));
}

/* {"timeout": seconds (0: never), "pin": true}: set the idle timeout (kept for later daemons)
 * or pin this daemon until it is unmounted (what `cowbox mount` does); replies the state. */
static int op_idle(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *t = json_object_get(req, "timeout"), *pin = json_object_get(req, "pin"), *r;
	int rc;

	if (pin && !json_is_boolean(pin))
		return cb_error_set(EINVAL, "idle: \"pin\" needs true or false");
	if (t && !json_is_null(t)) {
		if (!json_is_number(t) || json_number_value(t) < 0)
			return cb_error_set(EINVAL, "idle: \"timeout\" needs a number of seconds "
						    ">= 0 (0: never)");
		if ((rc = cb_daemon_idle_save(d->dir, json_number_value(t))) < 0)
			return rc;
		__atomic_store_n(&d->idle_timeout_ms, (long long)(json_number_value(t) * 1000),
				 __ATOMIC_RELEASE);
	}
	if (json_is_true(pin))
		__atomic_store_n(&d->pinned, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&d->idle_lock);
	pthread_cond_broadcast(&d->idle_cond); /* a new timeout counts from now on */
	pthread_mutex_unlock(&d->idle_lock);
	if (!(r = json_object()))
		return cb_error_set(ENOMEM, "idle: out of memory");
	cb_daemon_idle_info(d, r);
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

const struct cb_daemon_op cb_daemon_ops_idle[] = {
    {"idle", op_idle},
    {NULL, NULL},
};
