/* `cowbox serve`: takes the workspace lock, recovers what a crashed daemon left (a dead FUSE
 * mount, a socket), mounts the overlay and serves the control socket until told to stop. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/access.h"
#include "cowbox/workspace.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/fsck.h"
#include "cowbox/grow.h"
#include "cowbox/journal.h"
#include "cowbox/overlay.h"
#include "cowbox/turns.h"
#include "api.h"
#include "daemon.h"

/* A single-line, timestamped message in daemon.log (or on stderr in the foreground). */
static void daemon_vlog(const char *fmt, va_list ap)
{
	char stamp[32], msg[2048];
	struct timespec now;
	struct tm tm;

	/* Milliseconds: a start, a first snapshot and a stop are read from these stamps. */
	clock_gettime(CLOCK_REALTIME, &now);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", gmtime_r(&now.tv_sec, &tm));
	fprintf(stderr, "%s.%03ldZ cowbox[%d]: %s\n", stamp, now.tv_nsec / 1000000, (int)getpid(),
		msg);
	fflush(stderr);
}

static void daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void daemon_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	daemon_vlog(fmt, ap);
	va_end(ap);
}

void cb_daemon_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	daemon_vlog(fmt, ap);
	va_end(ap);
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A step of stopping that took long is logged with its time: a stop that hangs shows the
 * last step that ended. *mark moves to now. */
static void stop_phase(double *mark, const char *what)
{
	double now = now_seconds();

	if (now - *mark > 0.5)
		daemon_log("stopping: %s took %.1f s", what, now - *mark);
	*mark = now;
}

static char *path_join(const char *a, const char *b)
{
	char *out = NULL;

	if (asprintf(&out, "%s/%s", a, b) < 0)
		return NULL;
	return out;
}

/* The mount point as an absolute path without resolving its last part, which may be a dead
 * FUSE mount that stat cannot enter (ENOTCONN). */
static int daemon_mountpoint(const char *dir, const char *arg, char **out)
{
	char *copy = NULL, *parent = NULL, *real = NULL;
	int rc = 0;

	*out = NULL;
	if (!arg) {
		*out = path_join(dir, "mnt");
		return *out ? 0 : cb_error_set(ENOMEM, "out of memory");
	}
	copy = strdup(arg);
	parent = strdup(arg);
	if (!copy || !parent) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	real = realpath(dirname(parent), NULL);
	if (!real) {
		rc = cb_error_set(errno, "mount point %s: %s", arg, strerror(errno));
		goto out;
	}
	const char *leaf = basename(copy);

	if (!strcmp(leaf, "/"))
		*out = strdup("/");
	else
		*out = !strcmp(real, "/") ? path_join("", leaf) : path_join(real, leaf);
	if (!*out)
		rc = cb_error_set(ENOMEM, "out of memory");
out:
	free(copy);
	free(parent);
	free(real);
	return rc;
}

/* We hold the workspace lock, so a mount of this workspace (source "cowbox:<ref>") at path is
 * a dead daemon's and ours to clear. stat cannot tell: the kernel answers it from cache even
 * after the connection died. A mount of anything else there is refused. */
static int daemon_clear_mountpoint(const struct cb_daemon *d, const char *path)
{
	char source[512], ours[64];
	struct stat st;

	if (!cb_ws_fuse_mount_source(path, source, sizeof(source))) {
		if (stat(path, &st) < 0)
			return cb_error_set(errno, "mount point %s: %s", path, strerror(errno));
		if (!S_ISDIR(st.st_mode))
			return cb_error_set(ENOTDIR, "mount point %s: not a directory", path);
		return 0;
	}
	snprintf(ours, sizeof(ours), "cowbox:%s", d->ref);
	if (strcmp(source, ours))
		return cb_error_set(EBUSY, "mount point %s: %s is mounted there", path, source);
	daemon_log("unmounting %s, left behind by a daemon that died", path);
	return cb_ws_unmount(path);
}

/* lock is the lock file's text, "PID\nMOUNTPOINT\n": abort that mount's FUSE connection. */
static void daemon_abort_predecessor(const struct cb_daemon *d, pid_t owner, const char *lock)
{
	const char *nl = strchr(lock, '\n');
	char mnt[4096];

	if (!nl || nl[1] != '/' || sscanf(nl + 1, "%4095[^\n]", mnt) != 1)
		return;
	fprintf(stderr,
		"cowbox: the previous daemon of %s (pid %d) was killed but cannot finish exiting; "
		"aborting its FUSE connection and detaching %s\n",
		d->ref, (int)owner, mnt);
	if (cb_ws_fuse_abort(mnt))
		fprintf(stderr, "cowbox: %s\n", cb_error_message());
	cb_error_clear();
}

/* Takes the lock without blocking; when another daemon holds it, name its pid. */
static int daemon_lock(struct cb_daemon *d, char **old_mountpoint)
{
	char *path = path_join(d->dir, "lock"), buf[4200];
	int rc = 0;
	ssize_t n;

	*old_mountpoint = NULL;
	if (!path)
		return cb_error_set(ENOMEM, "out of memory");
	d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->lock_fd < 0) {
		rc = cb_error_set(errno, "open %s: %s", path, strerror(errno));
		goto out;
	}
	/* A shared lock held for a moment by `cowbox ls` or `info` (probing for a daemon) is no
	 * owner: retry briefly while the pid in the file is not a live process. */
	for (int tries = 0;; tries++) {
		n = pread(d->lock_fd, buf, sizeof(buf) - 1, 0);
		buf[n > 0 ? n : 0] = '\0';
		if (flock(d->lock_fd, LOCK_EX | LOCK_NB) == 0 || errno != EWOULDBLOCK)
			break;
		pid_t owner = (pid_t)atoi(buf);
		int dying = owner > 0 && cb_ws_pid_dying(owner);

		/* A predecessor killed but unable to finish exiting holds the lock for ever: after
		 * a second, abort its FUSE connection so that it can. */
		if (dying && tries == 100)
			daemon_abort_predecessor(d, owner, buf);
		if (tries == (dying ? 1000 : 100) ||
		    (owner > 0 && !dying && (kill(owner, 0) == 0 || errno == EPERM)))
			break;
		usleep(10000);
	}
	n = pread(d->lock_fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	if (flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		int pid = atoi(buf);

		rc = errno == EWOULDBLOCK
			 ? cb_error_set(EBUSY, "workspace %s is in use by pid %d", d->ref, pid)
			 : cb_error_set(errno, "flock %s: %s", path, strerror(errno));
		close(d->lock_fd);
		d->lock_fd = -1;
		goto out;
	}
	char *nl = strchr(buf, '\n'), *end;

	if (nl && (end = strchr(nl + 1, '\n'))) {
		*end = '\0';
		if (nl[1] == '/')
			*old_mountpoint = strdup(nl + 1);
	}
out:
	free(path);
	return rc;
}

static int daemon_write_lock(struct cb_daemon *d)
{
	char buf[4200];
	int len = snprintf(buf, sizeof(buf), "%d\n%s\n", (int)getpid(), d->mountpoint);

	if (ftruncate(d->lock_fd, 0) < 0 || pwrite(d->lock_fd, buf, (size_t)len, 0) != len)
		return cb_error_set(errno, "write lock of %s: %s", d->ref, strerror(errno));
	return 0;
}

static int daemon_listen(struct cb_daemon *d)
{
	struct sockaddr_un sa;
	socklen_t salen;
	int dirfd = -1, rc;
	mode_t old;

	if ((rc = cb_daemon_sockaddr(d->sock_path, &sa, &salen, &dirfd)))
		return rc;
	/* We hold the lock, so a socket file here is a dead daemon's. */
	if (unlink(d->sock_path) == 0)
		daemon_log("removed the stale control socket of a daemon that died");
	d->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (d->listen_fd < 0) {
		rc = cb_error_set(errno, "socket: %s", strerror(errno));
		goto out;
	}
	old = umask(0177);
	rc = bind(d->listen_fd, (struct sockaddr *)&sa, salen);
	umask(old);
	if (rc < 0 || chmod(d->sock_path, 0600) < 0 || listen(d->listen_fd, 64) < 0)
		rc = cb_error_set(errno, "listen on %s: %s", d->sock_path, strerror(errno));
out:
	if (dirfd >= 0)
		close(dirfd);
	return rc;
}

static void *daemon_accept(void *arg)
{
	struct cb_daemon *d = arg;

	while (!__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) {
		int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
				daemon_log("accept: %s", strerror(errno));
				usleep(100000);
				continue;
			}
			break; /* the listener was shut down */
		}
		if (cb_daemon_conn_start(d, fd))
			daemon_log("%s", cb_error_message());
	}
	return NULL;
}

/* Signals are blocked everywhere and taken here, so stopping never runs in a handler. */
static sigset_t daemon_signals;

static void *daemon_signal_thread(void *arg)
{
	struct cb_daemon *d = arg;
	int sig;

	while (sigwait(&daemon_signals, &sig) == 0) {
		if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
			break;
		daemon_log("got signal %d (%s), unmounting", sig, strsignal(sig));
		cb_daemon_request_stop(d);
		break;
	}
	return NULL;
}

/* Flush and unmount, then end the loop ourselves: a copy of the mount in another mount
 * namespace would otherwise keep it (see cb_overlay_unmount). A refused umount (files still
 * open: EBUSY; not root: EPERM) is logged, and the loop ends all the same. */
void cb_daemon_request_stop(struct cb_daemon *d)
{
	double mark = now_seconds();

	__atomic_store_n(&d->stopping, 1, __ATOMIC_RELEASE);
	/* Commands and containers hold the mount; they go before the umount. */
	cb_daemon_api_stop(d);
	stop_phase(&mark, "ending the commands");
	pthread_mutex_lock(&d->ov_stop_lock);
	if (d->ov) {
		if (cb_overlay_unmount(d->ov)) {
			daemon_log("%s; stopping the filesystem loop instead", cb_error_message());
			cb_error_clear();
		}
		stop_phase(&mark, "the flush and the umount");
		cb_overlay_end(d->ov);
	}
	pthread_mutex_unlock(&d->ov_stop_lock);
}

/* The upper layer: <dir>/upper, or in place the folder itself (the base), read now since a
 * rollback's leftovers are cleaned from it before anything else is opened. */
static int daemon_upper(struct cb_daemon *d)
{
	struct cb_db *db = NULL;
	char *v = NULL, *base = NULL;
	int rc = cb_db_open(d->db_path, &db);

	if (!rc && cb_db_meta_get(db, "in_place", &v) == 0 && !strcmp(v, "1")) {
		rc = cb_db_meta_get(db, "base", &base);
		d->in_place = !rc;
		d->upper = base;
		base = NULL;
	}
	cb_error_clear();
	if (!rc && !d->upper && !(d->upper = path_join(d->dir, "upper")))
		rc = cb_error_set(ENOMEM, "out of memory");
	cb_db_close(db);
	free(base);
	free(v);
	return rc;
}

/* Under a byte quota, upper/ becomes an ext4 of the quota's size on a loop device; where
 * that cannot be (no root, no loop devices, COWBOX_UPPER_IMAGE=0, in place) the FUSE layer
 * counts the bytes instead and writes go through it (no passthrough). */
static int daemon_upper_image(struct cb_daemon *d)
{
	struct cb_backend_limits lim = {0};
	struct cb_backend_options bo;
	int rc;

	if (d->in_place)
		return 0;
	if ((rc = cb_backend_options_load(d->dir, &bo)))
		return rc;
	cb_backend_limits_of(&bo, &lim);
	cb_backend_options_free(&bo);
	rc = cb_ws_upper_image(d->dir, lim.disk_bytes, lim.disk_inodes);
	if (rc < 0)
		return rc;
	d->upper_capped = rc;
	d->upper_cap = rc ? lim.disk_bytes : 0;
	if (rc)
		daemon_log("upper layer: its own filesystem of %llu MiB (%s/upper.img)",
			   lim.disk_bytes >> 20, d->dir);
	else if (lim.disk_bytes)
		daemon_log("upper layer: the quota is counted by the mount, without "
			   "passthrough: %s",
			   cb_error_message()[0] ? cb_error_message() : "asked for");
	cb_error_clear();
	return 0;
}

static int daemon_load(struct cb_daemon *d, const struct cb_daemon_options *opt)
{
	char *dir = NULL;
	double idle;
	int rc;

	if ((rc = cb_ws_resolve(opt->ref, d->ref)) || (rc = cb_ws_path(d->ref, NULL, &dir)))
		return rc;
	d->dir = realpath(dir, NULL);
	free(dir);
	if (!d->dir)
		return cb_error_set(errno, "workspace %s: %s", d->ref, strerror(errno));
	d->sock_path = path_join(d->dir, "control.sock");
	d->db_path = path_join(d->dir, "meta.db");
	if (!d->sock_path || !d->db_path)
		return cb_error_set(ENOMEM, "out of memory");
	if ((rc = daemon_upper(d)))
		return rc;
	if ((d->access = cb_ws_access_load(d->dir)) < 0)
		return d->access;
	if ((rc = cb_daemon_idle_load(d->dir, &idle)) < 0)
		return rc;
	d->idle_timeout_ms = (long long)(idle * 1000);
	return daemon_mountpoint(d->dir, opt->mountpoint, &d->mountpoint);
}

static void daemon_free(struct cb_daemon *d)
{
	free(d->dir);
	free(d->base);
	free(d->name);
	free(d->upper);
	free(d->mountpoint);
	free(d->sock_path);
	free(d->db_path);
	cb_ws_drift_free(&d->drift);
	pthread_mutex_destroy(&d->turn_lock);
	pthread_mutex_destroy(&d->worker_lock);
	pthread_mutex_destroy(&d->spawner_lock);
	pthread_mutex_destroy(&d->files_lock);
	pthread_cond_destroy(&d->files_cond);
	pthread_mutex_destroy(&d->conns_lock);
	pthread_cond_destroy(&d->conns_cond);
	pthread_mutex_destroy(&d->idle_lock);
	pthread_cond_destroy(&d->idle_cond);
	pthread_mutex_destroy(&d->api_lock);
	pthread_mutex_destroy(&d->phase_lock);
	pthread_mutex_destroy(&d->running_lock);
	pthread_cond_destroy(&d->running_cond);
	pthread_mutex_destroy(&d->api_stop_lock);
	pthread_mutex_destroy(&d->ov_stop_lock);
}

struct base_seen {
	struct cb_daemon *d;
	char **paths;
	size_t n, cap;
};

/* A path the base changed under: journaled in the open turn, so the next snapshot hashes it
 * through the mount and records what is there now; kept for the kernel to forget. */
static int daemon_base_changed(void *arg, const char *path)
{
	struct base_seen *s = arg;
	struct cb_change c = {.path = path, .kind = CB_CHANGE_WRITE, .comm = "(base)"};
	int rc = cb_grow(&s->paths, &s->cap, s->n, sizeof(*s->paths), 16, "base check");

	if (rc)
		return rc;
	if (!(s->paths[s->n] = strdup(path)))
		return cb_error_set(ENOMEM, "base check: out of memory");
	s->n++;
	/* In place the watch also sees the mount's own changes (the folder is the upper layer),
	 * each marked under its writer before it was made: not marked again as the base's
	 * (which would also credit the writer's change to "(base)" when the look races it). */
	if (s->d->in_place)
		return cb_journal_marked(s->d->db, path) ? 0 : cb_journal_mark(s->d->db, &c, 1);
	daemon_log("base %s/%s changed behind cowbox's back; the next snapshot records it",
		   s->d->base, path);
	return cb_journal_mark(s->d->db, &c, 1);
}

int cb_daemon_base_watch(struct cb_daemon *d, const char *when)
{
	struct cb_ws_base_stats st = {0};
	struct base_seen seen = {.d = d};
	struct cb_turns *t = NULL;
	struct timespec a, b;
	int ret;

	/* Events reset before the walk: what moves during it is looked at next time. */
	if (!d->base || (!cb_daemon_basewatch_take(d) && strcmp(when, "start")))
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &a);
	/* the first map copies no shared row into meta.db's cache: the check looks there too */
	ret = cb_daemon_turns_open(d, d->upper, 1, &t);
	if (!ret)
		ret = cb_ws_base_check(t, daemon_base_changed, &seen, &st);
	cb_turns_close(t);
	/* Marked or not, what the kernel cached of those paths is stale (sorted: the check
	 * reports in path order). */
	cb_overlay_base_changed(d->ov, (const char *const *)seen.paths, seen.n);
	for (size_t i = 0; i < seen.n; i++)
		free(seen.paths[i]);
	free(seen.paths);
	clock_gettime(CLOCK_MONOTONIC, &b);
	if (ret)
		daemon_log("base check (%s): %s", when, cb_error_message());
	else /* only at start, or when the watch saw the base move: rare */
		daemon_log("base check (%s): %lld entries, %lld files rehashed, %lld paths changed "
			   "behind cowbox's back, %.3f s",
			   when, st.entries, st.hashed, st.changed,
			   (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
	return ret;
}

struct base_start {
	struct cb_daemon *d;
	sem_t locked;
};

/* The check at start, on its own thread (a base changed wholesale takes a while to rehash)
 * while the mount already serves, but holding the turn lock from before the first request
 * can arrive: no turn operation runs on a base not yet looked at. */
static void *daemon_base_check(void *arg)
{
	struct base_start *bs = arg;
	struct cb_daemon *d = bs->d;

	pthread_mutex_lock(&d->turn_lock);
	sem_post(&bs->locked);
	/* Watched before the look: a change made during it is seen by the next one. Before
	 * the first map, the base is read ahead for it, each directory watched before it is
	 * read (one walk for both, done before the first snapshot is likely to ask). */
	if (cb_daemon_basewatch_open(d)) {
		daemon_log("%s; every snapshot and rollback looks at the whole base",
			   cb_error_message());
		cb_error_clear();
	} else if (!cb_daemon_base_scan_ahead(d)) {
		cb_daemon_basewatch_all(d);
	}
	/* Tests only: a look that comes while the mount already serves changes. */
	if (getenv("COWBOX_TEST_START_LOOK_STALL"))
		usleep((useconds_t)(atof(getenv("COWBOX_TEST_START_LOOK_STALL")) * 1e6));
	cb_daemon_base_watch(d, "start");
	/* From here the watch counts every change: a turn 0 not frozen yet is the base while
	 * it counts nothing more (a fork then needs no look at the whole base). */
	{
		struct cb_turns *t = NULL;

		if (!cb_daemon_turns_open(d, NULL, 0, &t))
			cb_daemon_drift_note(d, t);
		cb_turns_close(t);
		cb_error_clear();
	}
	pthread_mutex_unlock(&d->turn_lock);
	return NULL;
}

static int daemon_to_log(const struct cb_daemon *d)
{
	char *log = path_join(d->dir, "daemon.log");
	int fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int rc = 0;

	if (fd < 0 || null < 0 || dup2(null, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
		rc =
		    cb_error_set(errno, "log to %s: %s", log ? log : "daemon.log", strerror(errno));
	if (fd >= 0)
		close(fd);
	if (null >= 0)
		close(null);
	free(log);
	setsid(); /* fails harmlessly when already a session leader */
	return rc;
}

int cb_daemon_ids(const char *dir, int privileged, unsigned long *base)
{
	struct cb_backend_options o;
	int rc;

	*base = 0;
	if (geteuid() != 0)
		return 0; /* the sandbox maps its root to us, and only that */
	if (privileged < 0) {
		if ((rc = cb_backend_options_load(dir, &o)) < 0)
			return rc;
		privileged = o.privileged;
		cb_backend_options_free(&o);
	}
	return privileged ? 0 : cb_ws_ids_ensure(dir, base);
}

/* The mount, the turn ops, the workers and the egress proxy share one table of open files: a
 * host's usual soft limit (1,024) is far below what it allows, and the proxy sizes its cap to
 * leave the others a reserve of it (docs/network.md#connection-cap). The soft limit goes up
 * to the hard one, before the spawner and every thread inherit it. */
static void daemon_raise_nofile(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
		return;
	was = rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		daemon_log("open files: cannot raise the soft limit %llu to %llu: %s",
			   (unsigned long long)was, (unsigned long long)rl.rlim_max,
			   strerror(errno));
	else
		daemon_log("open files: soft limit raised from %llu to %llu",
			   (unsigned long long)was, (unsigned long long)rl.rlim_max);
}

int cb_daemon_serve(const struct cb_daemon_options *opt)
{
	struct cb_daemon d = {.lock_fd = -1, .listen_fd = -1, .spawner_fd = -1};
	pthread_t accept_thread, sig_thread, base_thread;
	struct base_start base_start = {.d = &d};
	int have_accept = 0, have_sig = 0, have_base = 0, rc;
	char *old_mnt = NULL;
	sigset_t old_mask;

	pthread_mutex_init(&d.turn_lock, NULL);
	pthread_mutex_init(&d.worker_lock, NULL);
	pthread_mutex_init(&d.spawner_lock, NULL);
	pthread_mutex_init(&d.files_lock, NULL);
	pthread_cond_init(&d.files_cond, NULL);
	pthread_mutex_init(&d.conns_lock, NULL);
	pthread_cond_init(&d.conns_cond, NULL);
	pthread_mutex_init(&d.idle_lock, NULL);
	pthread_cond_init(&d.idle_cond, NULL);
	pthread_mutex_init(&d.api_lock, NULL);
	pthread_mutex_init(&d.phase_lock, NULL);
	pthread_mutex_init(&d.running_lock, NULL);
	pthread_cond_init(&d.running_cond, NULL);
	pthread_mutex_init(&d.api_stop_lock, NULL);
	pthread_mutex_init(&d.ov_stop_lock, NULL);
	d.started = now_seconds();
	d.pinned = opt->pinned;
	/* Our pid goes into the lock at once: a dead daemon's pid left there could meanwhile
	 * belong to an unrelated process that `rm` would signal. */
	if ((rc = daemon_load(&d, opt)) || (rc = daemon_lock(&d, &old_mnt)) ||
	    (rc = daemon_write_lock(&d)))
		goto out;
	/* Every path is absolute now; a cwd inside some mount would keep it busy for our life. */
	if (chdir("/") < 0) {
		rc = cb_error_set(errno, "chdir /: %s", strerror(errno));
		goto out;
	}
	/* From here on the caller's terminal only sees the log if asked to. */
	if (!opt->foreground && (rc = daemon_to_log(&d)))
		goto out;
	daemon_log("serving %s at %s", d.ref, d.mountpoint);
	/* Before anything reads upper/: under a byte quota it is its own filesystem. */
	if ((rc = daemon_upper_image(&d)))
		goto out;
	/* Only a session of our own: in the foreground the session is the caller's shell. */
	if (!opt->foreground)
		cb_daemon_sched_raise();
	daemon_raise_nofile();
	/* Forks this daemon's predecessor was building when it died are of no use to anyone. */
	cb_ws_clean_unpublished();
	/* ... and so are the temporary files of an apply it was killed during. */
	int swept = cb_ws_apply_sweep(d.dir, NULL, NULL);
	if (swept > 0)
		daemon_log("removed %d temporary file%s of an apply that was killed midway", swept,
			   swept == 1 ? "" : "s");
	else if (swept < 0)
		daemon_log("%s (the temporary files of a killed apply stay)", cb_error_message());
	cb_error_clear();
	/* Before any thread, database or /dev/fuse fd exists: the spawner inherits none. */
	if ((rc = cb_daemon_worker_start(&d)))
		goto out;
	sigemptyset(&daemon_signals);
	sigaddset(&daemon_signals, SIGTERM);
	sigaddset(&daemon_signals, SIGINT);
	sigaddset(&daemon_signals, SIGHUP);
	sigaddset(&daemon_signals, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &daemon_signals, &old_mask);
	if (old_mnt && strcmp(old_mnt, d.mountpoint) && cb_ws_is_fuse_mount(old_mnt))
		daemon_clear_mountpoint(&d, old_mnt);
	if ((rc = daemon_clear_mountpoint(&d, d.mountpoint)))
		goto out;
	cb_daemon_rollback_recover(&d);
	if ((rc = cb_daemon_reaper_start()) || (rc = cb_db_open(d.db_path, &d.db)))
		goto out;
	cb_db_meta_get(d.db, "base", &d.base);
	cb_db_meta_get(d.db, "name", &d.name);
	cb_error_clear();
	/* Marks a damaged log lost (found by the fold at the open) are made good before the
	 * mount serves anything: upper/ holds still while it is walked. */
	long long rescanned;
	if ((rc = cb_ws_marks_rescan(d.db, d.db_path, d.upper, d.in_place ? NULL : d.base,
				     &rescanned)) < 0)
		goto out;
	if (rc)
		daemon_log(
		    "the mark log lost marks (see 'cowbox fsck %s'): %lld paths of the upper "
		    "layer and of the last turn journaled as changed",
		    d.ref, rescanned);
	rc = 0;
	if ((rc = cb_daemon_worker_init(&d)))
		goto out;
	unsigned long id_base;
	if ((rc = cb_daemon_ids(d.dir, -1, &id_base)))
		goto out;
	/* the upper layer's quota, from the workspace's options */
	struct cb_backend_limits lim = {0};
	struct cb_backend_options bo;
	if ((rc = cb_backend_options_load(d.dir, &bo)))
		goto out;
	cb_backend_limits_of(&bo, &lim);
	cb_backend_options_free(&bo);
	char fsname[64];
	struct cb_overlay_config cfg = {
	    /* In place the folder is the upper layer, with nothing below it. */
	    .base_dir = d.in_place ? NULL : d.base,
	    .upper_dir = d.upper,
	    .mountpoint = d.mountpoint,
	    .fsname = fsname,
	    .db = d.db,
	    .debug = opt->debug,
	    .id_base = id_base,
	    .owner_squash = d.in_place,
	    /* a capped upper/ holds the bytes itself: only its inodes are counted here */
	    .quota_bytes = d.upper_capped ? 0 : lim.disk_bytes,
	    .quota_inodes = lim.disk_inodes,
	};

	snprintf(fsname, sizeof(fsname), "cowbox:%s", d.ref);
	if ((rc = cb_overlay_mount(&cfg, &d.ov)))
		goto out;
	if (d.base) {
		sem_init(&base_start.locked, 0, 0);
		have_base = pthread_create(&base_thread, NULL, daemon_base_check, &base_start) == 0;
		if (have_base)
			sem_wait(&base_start.locked);
		sem_destroy(&base_start.locked);
	}
	cb_daemon_merge_recover_start(&d);
	if ((rc = daemon_listen(&d)))
		goto out;
	if ((rc = pthread_create(&accept_thread, NULL, daemon_accept, &d))) {
		rc = cb_error_set(rc, "accept thread: %s", strerror(rc));
		goto out;
	}
	have_accept = 1;
	if ((rc = pthread_create(&sig_thread, NULL, daemon_signal_thread, &d))) {
		rc = cb_error_set(rc, "signal thread: %s", strerror(rc));
		goto out;
	}
	have_sig = 1;
	daemon_log("ready: %s mounted at %s, control socket %s", d.ref, d.mountpoint, d.sock_path);
	if (cb_daemon_idle_start(&d)) {
		daemon_log("%s; it stops only when told to", cb_error_message());
		cb_error_clear();
	}
	if (cb_daemon_basehash_start(&d)) {
		daemon_log("base hash: %s", cb_error_message());
		cb_error_clear();
	}
	rc = cb_overlay_run(d.ov);
	if (rc)
		daemon_log("filesystem loop ended: %s", cb_error_message());
	else
		daemon_log("stopping: the filesystem loop ended");
out:
	if (rc && d.lock_fd >= 0)
		daemon_log("error: %s", cb_error_message());
	double mark = now_seconds();

	__atomic_store_n(&d.stopping, 1, __ATOMIC_RELEASE);
	/* End the API's commands first; their threads hold connections. */
	cb_daemon_api_stop(&d);
	stop_phase(&mark, "ending the commands");
	if (d.listen_fd >= 0)
		shutdown(d.listen_fd, SHUT_RDWR);
	if (have_accept)
		pthread_join(accept_thread, NULL);
	cb_daemon_idle_stop(&d);
	cb_daemon_worker_stop(&d);
	stop_phase(&mark, "the listener, the idle watch and the worker");
	cb_daemon_conns_shutdown(&d, 30000);
	stop_phase(&mark, "the connections");
	cb_daemon_fsck_stop();
	if (have_base)
		pthread_join(base_thread, NULL);
	cb_daemon_merge_recover_join();
	cb_daemon_basewatch_stop(&d);
	cb_daemon_basehash_stop(&d);
	cb_daemon_base_scan_drop(&d);
	stop_phase(&mark, "the base's threads");
	if (have_sig) {
		pthread_kill(sig_thread, SIGTERM);
		pthread_join(sig_thread, NULL);
	}
	/* Keep the error of the start-up, not of the clean-up. */
	char saved[1024];

	snprintf(saved, sizeof(saved), "%s", cb_error_message());
	pthread_mutex_lock(&d.ov_stop_lock);
	cb_overlay_destroy(d.ov);
	d.ov = NULL;
	pthread_mutex_unlock(&d.ov_stop_lock);
	if (d.upper_capped)
		cb_ws_upper_release(d.dir); /* a killed daemon's stays: rm or the next start */
	stop_phase(&mark, "the filesystem's teardown");
	/* Only now: a worker still waiting on the mount is answered (ENOTCONN) once the FUSE
	 * session is gone, never before. */
	cb_daemon_worker_reap(&d);
	cb_daemon_net_stop(); /* the proxy is gone with the backend: its last rows */
	stop_phase(&mark, "the worker and the proxy");
	if (d.db) {
		unsigned long long marks, rows, txs;

		cb_journal_sync(d.db);
		cb_journal_stats(d.db, &marks, &rows, &txs);
		daemon_log("journal: %llu marks asked, %llu rows written in %llu transactions",
			   marks, rows, txs);
	}
	cb_db_close(d.db);
	if (d.listen_fd >= 0) {
		close(d.listen_fd);
		unlink(d.sock_path);
	}
	cb_daemon_reaper_stop();
	if (d.lock_fd >= 0) {
		if (ftruncate(d.lock_fd, 0) < 0)
			daemon_log("truncate lock: %s", strerror(errno));
		if (!rc)
			daemon_log("stopped; %s unmounted", d.ref);
		close(d.lock_fd);
	}
	if (have_sig || have_accept)
		pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
	free(old_mnt);
	daemon_free(&d);
	if (rc)
		cb_error_set(rc, "%s", saved);
	return rc;
}
