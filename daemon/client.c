/* Talking to a workspace daemon: connect and read the hello, send requests and wait for their
 * replies, start `cowbox serve` on first use and wait until its mount is ready. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/client.h"
#include "cowbox/client_served.h"
#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "daemon.h"

struct cb_client {
	int fd;
	pid_t daemon_pid;
	long long next_id;
	char *buf;
	size_t len, cap;
	size_t taken; /* the head of buf that the last line handed out occupies */
};

int cb_daemon_sockaddr(const char *path, struct sockaddr_un *sa, socklen_t *len, int *dirfd)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	*dirfd = -1;
	if (strlen(path) < sizeof(sa->sun_path)) {
		strcpy(sa->sun_path, path);
	} else {
		char *copy = strdup(path), *base = strdup(path);

		if (!copy || !base) {
			free(copy);
			free(base);
			return cb_error_set(ENOMEM, "out of memory");
		}
		*dirfd = open(dirname(copy), O_PATH | O_DIRECTORY | O_CLOEXEC);
		snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", *dirfd,
			 basename(base));
		free(copy);
		free(base);
		if (*dirfd < 0)
			return cb_error_set(errno, "open the directory of %s: %s", path,
					    strerror(errno));
	}
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(sa->sun_path) + 1);
	return 0;
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cb_client_recv_line(struct cb_client *c, int timeout_ms, char **line, size_t *len)
{
	long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;

	*line = NULL;
	*len = 0;
	/* The line handed out last time was valid until now. */
	if (c->taken) {
		memmove(c->buf, c->buf + c->taken, c->len - c->taken);
		c->len -= c->taken;
		c->taken = 0;
	}
	for (size_t scanned = 0;;) {
		char *nl =
		    c->len > scanned ? memchr(c->buf + scanned, '\n', c->len - scanned) : NULL;

		if (nl) {
			*nl = '\0';
			*line = c->buf;
			*len = (size_t)(nl - c->buf);
			c->taken = *len + 1;
			return 0;
		}
		scanned = c->len; /* no newline up to here: look only at what comes next */
		int rc = cb_grow(&c->buf, &c->cap, c->len, 1, 65536, "daemon reply");

		if (rc)
			return rc;
		int wait = deadline < 0 ? -1 : (int)(deadline - now_ms());
		struct pollfd pfd = {c->fd, POLLIN, 0};

		if (deadline >= 0 && wait <= 0)
			return cb_error_set(ETIMEDOUT, "no answer from the daemon in %d ms",
					    timeout_ms);
		int r = poll(&pfd, 1, wait);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return cb_error_set(errno, "poll: %s", strerror(errno));
		if (r == 0)
			continue;
		ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return cb_error_set(ECONNRESET, "the daemon closed the connection");
		c->len += (size_t)n;
	}
}

int cb_client_recv(struct cb_client *c, int timeout_ms, json_t **msg)
{
	json_error_t jerr;
	size_t len;
	char *line;
	int rc = cb_client_recv_line(c, timeout_ms, &line, &len);

	*msg = NULL;
	if (rc)
		return rc;
	*msg = json_loadb(line, len, 0, &jerr);
	if (!*msg)
		return cb_error_set(EPROTO, "daemon sent bad JSON: %s", jerr.text);
	return 0;
}

int cb_client_send(struct cb_client *c, json_t *msg, long long *id)
{
	char *text;
	size_t len, off = 0;
	int rc = 0;

	if (!msg)
		return cb_error_set(ENOMEM, "out of memory");
	if (!json_object_get(msg, "id"))
		json_object_set_new(msg, "id", json_integer(++c->next_id));
	if (id)
		*id = json_integer_value(json_object_get(msg, "id"));
	text = json_dumps(msg, JSON_COMPACT);
	json_decref(msg);
	if (!text)
		return cb_error_set(ENOMEM, "out of memory");
	len = strlen(text);
	text[len] = '\n';
	while (off < len + 1) {
		ssize_t n = send(c->fd, text + off, len + 1 - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = cb_error_set(errno ? errno : EPIPE, "send to the daemon: %s",
					  strerror(errno ? errno : EPIPE));
			break;
		}
		off += (size_t)n;
	}
	free(text);
	return rc;
}

int cb_client_request(struct cb_client *c, json_t *req, int timeout_ms, json_t **reply)
{
	const char *op = req ? json_string_value(json_object_get(req, "op")) : NULL;
	char opname[64];
	long long id;
	int rc;

	snprintf(opname, sizeof(opname), "%s", op ? op : "request");
	if (reply)
		*reply = NULL;
	if ((rc = cb_client_send(c, req, &id)))
		return rc;
	for (;;) {
		json_t *msg, *err;

		if ((rc = cb_client_recv(c, timeout_ms, &msg)))
			return rc;
		if (json_integer_value(json_object_get(msg, "id")) != id ||
		    json_object_get(msg, "stream")) {
			json_decref(msg);
			continue;
		}
		err = json_object_get(msg, "error");
		if (err) {
			const char *code = json_string_value(json_object_get(err, "code"));
			const char *text = json_string_value(json_object_get(err, "message"));

			rc = cb_error_set(cb_client_code_errno(code), "%s: %s: %s", opname,
					  code ? code : "error", text ? text : "");
			json_decref(msg);
			return rc;
		}
		if (reply)
			*reply = msg;
		else
			json_decref(msg);
		return 0;
	}
}

pid_t cb_client_daemon_pid(const struct cb_client *c)
{
	return c->daemon_pid;
}

void cb_client_close(struct cb_client *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c->buf);
	free(c);
}

static int client_connect_path(const char *ref, const char *path, struct cb_client **out)
{
	struct cb_client *c = calloc(1, sizeof(*c));
	struct sockaddr_un sa;
	socklen_t salen;
	int dirfd = -1, rc;
	json_t *hello = NULL;

	*out = NULL;
	if (!c)
		return cb_error_set(ENOMEM, "out of memory");
	c->fd = -1;
	if ((rc = cb_daemon_sockaddr(path, &sa, &salen, &dirfd)))
		goto fail;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, salen) < 0) {
		rc = cb_error_set(errno, "workspace %s: no daemon answers on %s (%s)", ref, path,
				  strerror(errno));
		goto fail;
	}
	if ((rc = cb_client_recv(c, 10000, &hello)))
		goto fail;
	if (strcmp(json_string_value(json_object_get(hello, "hello")) ?: "", "cowbox") ||
	    json_integer_value(json_object_get(hello, "protocol")) != CB_PROTOCOL_VERSION) {
		rc = cb_error_set(EPROTO, "workspace %s: %s does not speak cowbox protocol %d", ref,
				  path, CB_PROTOCOL_VERSION);
		goto fail;
	}
	c->daemon_pid = (pid_t)json_integer_value(json_object_get(hello, "pid"));
	json_decref(hello);
	if (dirfd >= 0)
		close(dirfd);
	*out = c;
	return 0;
fail:
	json_decref(hello);
	if (dirfd >= 0)
		close(dirfd);
	cb_client_close(c);
	return rc;
}

int cb_daemon_connect(const char *arg, struct cb_client **out)
{
	char ref[CB_WS_REF_LEN + 1], *path = NULL;
	int rc;

	*out = NULL;
	if ((rc = cb_ws_resolve(arg, ref)) || (rc = cb_ws_path(ref, "control.sock", &path)))
		return rc;
	rc = client_connect_path(ref, path, out);
	free(path);
	return rc;
}

int cb_daemon_connect_ref(const char *ref, struct cb_client **out)
{
	char *path = NULL;
	int rc;

	*out = NULL;
	if ((rc = cb_ws_path(ref, "control.sock", &path)))
		return rc;
	rc = client_connect_path(ref, path, out);
	free(path);
	return rc;
}

/* The last line of daemon.log, so a failed start says why without another command. */
static void log_tail(const char *log, char *out, size_t size)
{
	char buf[4096];
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	off_t end;
	ssize_t n;

	out[0] = '\0';
	if (fd < 0)
		return;
	end = lseek(fd, 0, SEEK_END);
	n = pread(fd, buf, sizeof(buf) - 1, end > (off_t)sizeof(buf) - 1 ? end - 4095 : 0);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	while (n > 0 && buf[n - 1] == '\n')
		buf[--n] = '\0';
	char *last = strrchr(buf, '\n');

	snprintf(out, size, "%.1000s", last ? last + 1 : buf);
}

/* The program to run as `cowbox serve`: $COWBOX_BIN, this very binary if it is cowbox, else
 * cowbox from PATH. */
static void exec_serve(const char *ref, const char *mountpoint)
{
	const char *bin = getenv("COWBOX_BIN");
	char self[4096];
	ssize_t n;

	if (!bin || !*bin) {
		n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		if (n > 0) {
			self[n] = '\0';
			if (strstr(basename(self), "cowbox"))
				bin = self;
		}
	}
	if (!bin || !*bin)
		bin = "cowbox";
	if (mountpoint)
		execlp(bin, "cowbox", "serve", ref, "--mountpoint", mountpoint, (char *)NULL);
	else
		execlp(bin, "cowbox", "serve", ref, (char *)NULL);
	fprintf(stderr, "cowbox: exec %s: %s%s\n", bin, strerror(errno),
		errno == ENOENT ? " (set COWBOX_BIN to the cowbox binary, or put it on PATH)" : "");
	_exit(127);
}

/* The first line of a small /proc file, without its newline ("" when unreadable). */
static void proc_line(const char *path, char *out, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, out, cap - 1) : -1;

	out[n > 0 ? n : 0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	if (fd >= 0)
		close(fd);
}

/* One line per thread of pid: its name, state and what the kernel says it waits in, so a
 * report of a stuck daemon shows where it was stuck. */
static void stuck_threads(pid_t pid)
{
	char path[320], comm[64], state[512], wchan[128];
	struct dirent *e;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(dir = opendir(path)))
		return;
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
		proc_line(path, comm, sizeof(comm));
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
		proc_line(path, state, sizeof(state));
		snprintf(path, sizeof(path), "/proc/%d/task/%s/wchan", (int)pid, e->d_name);
		proc_line(path, wchan, sizeof(wchan));
		/* the state letter follows the name's closing parenthesis */
		char *st = strrchr(state, ')');

		fprintf(stderr, "cowbox:   thread %s (%s) %c in %s\n", e->d_name, comm,
			st && st[1] && st[2] ? st[2] : '?', wchan[0] ? wchan : "-");
	}
	closedir(dir);
}

/* A daemon that was killed but cannot finish dying (threads of an old version waiting on its
 * own mount), or one that never answers, keeps its lock, socket and /dev/fuse: aborting its
 * FUSE connection fails whatever it waits for, so it can exit. Said on stderr. */
static void stuck_abort(const char *ref, pid_t pid, const char *mnt, const char *why)
{
	if (!mnt || !*mnt)
		return;
	fprintf(stderr,
		"cowbox: the daemon of %s (pid %d) %s; aborting its FUSE connection and "
		"detaching %s\n",
		ref, (int)pid, why, mnt);
	stuck_threads(pid);
	if (cb_ws_fuse_abort(mnt))
		fprintf(stderr, "cowbox: %s\n", cb_error_message());
	cb_error_clear();
}

/* Watch the daemon holding ref's lock: 0 when none does any more; its pid otherwise, after
 * aborting its connection once it has been dying for a second (*dying_since, *aborted keep
 * the watch's state between calls). */
static pid_t watch_predecessor(const char *ref, long long *dying_since, int *aborted)
{
	char *mnt = NULL;
	pid_t other = 0;

	if (cb_ws_daemon(ref, &other, &mnt)) {
		cb_error_clear();
		return -1;
	}
	if (other > 0 && !cb_ws_pid_dying(other) && *dying_since > 0)
		*dying_since = 0;
	if (other > 0 && cb_ws_pid_dying(other)) {
		if (!*dying_since)
			*dying_since = now_ms();
		else if (!*aborted && now_ms() - *dying_since > 1000) {
			stuck_abort(ref, other, mnt, "was killed but cannot finish exiting");
			*aborted = 1;
		}
	}
	free(mnt);
	return other;
}

/* Wait for ref's daemon to serve: the one we started (child), or with child 0 the one that
 * holds the lock; -EAGAIN when that one went away instead (start another). */
static int wait_ready(const char *ref, const char *log, pid_t child, long long deadline, pid_t *pid)
{
	long long dying_since = 0;
	int aborted = 0;
	char tail[1024];
	int rc, status;

	for (;;) {
		struct cb_client *c = NULL;
		struct cb_ws_info info;

		if (child == 0 && watch_predecessor(ref, &dying_since, &aborted) == 0)
			return -EAGAIN;

		if (child > 0 && waitpid(child, &status, WNOHANG) == child) {
			pid_t other = 0;
			char *mnt = NULL;

			/* Lost a race with another `mount`: its daemon serves, ours did not. */
			cb_ws_daemon(ref, &other, &mnt);
			free(mnt);
			if (other != 0) {
				child = 0;
				continue;
			}
			log_tail(log, tail, sizeof(tail));
			return cb_error_set(EIO,
					    "workspace %s: cowbox serve exited (%s %d) before "
					    "the mount was ready: %s (see %s)",
					    ref, WIFEXITED(status) ? "status" : "signal",
					    WIFEXITED(status) ? WEXITSTATUS(status)
							      : WTERMSIG(status),
					    tail[0] ? tail : "no log", log);
		}
		/* A dying daemon's socket still accepts, but nothing answers: do not ask. */
		if (!(child == 0 && dying_since) && cb_daemon_connect(ref, &c) == 0) {
			rc = cb_ws_info(ref, &info);
			int ready = !rc && cb_ws_is_fuse_mount(info.mountpoint);

			if (pid)
				*pid = cb_client_daemon_pid(c);
			cb_ws_info_free(&info);
			cb_client_close(c);
			if (ready)
				return 0;
		}
		if (now_ms() > deadline && child == 0 && !aborted) {
			char *mnt = NULL;
			pid_t other = 0;

			/* Alive, holding the lock, never ready: stuck. */
			if (!cb_ws_daemon(ref, &other, &mnt) && other > 0)
				stuck_abort(ref, other, mnt, "does not answer");
			cb_error_clear();
			free(mnt);
			aborted = 1;
			deadline = now_ms() + 5000;
		}
		if (now_ms() > deadline) {
			log_tail(log, tail, sizeof(tail));
			return cb_error_set(
			    ETIMEDOUT,
			    "workspace %s: the daemon did not get ready in time: %s "
			    "(see %s)",
			    ref, tail[0] ? tail : "no log", log);
		}
		usleep(20000);
	}
}

int cb_daemon_ensure(const char *arg, const char *mountpoint, int timeout_ms, pid_t *pid)
{
	char ref[CB_WS_REF_LEN + 1], *log = NULL, *running_mnt = NULL, *want = NULL;
	long long deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 30000);
	pid_t running, child;
	int rc;

	if ((rc = cb_ws_resolve(arg, ref)) || (rc = cb_ws_path(ref, "daemon.log", &log)))
		return rc;
	if ((rc = cb_ws_daemon(ref, &running, &running_mnt)))
		goto out;
	if (running) {
		if (mountpoint) {
			want = realpath(mountpoint, NULL);
			if (running_mnt && (!want || strcmp(want, running_mnt))) {
				rc = cb_error_set(EBUSY,
						  "workspace %s is already mounted at %s by pid %d",
						  ref, running_mnt, (int)running);
				goto out;
			}
		}
		rc = wait_ready(ref, log, 0, deadline, pid);
		if (rc != -EAGAIN)
			goto out;
		/* It was stopping (or dying) and is gone now: start ours. */
	}
	child = fork();
	if (child < 0) {
		rc = cb_error_set(errno, "fork: %s", strerror(errno));
		goto out;
	}
	if (child == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		int null = open("/dev/null", O_RDONLY | O_CLOEXEC);

		/* Even the errors before serve opens its log land in the log. */
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (null >= 0)
			dup2(null, 0);
		/* The daemon outlives us: an inherited pipe would keep our caller's reader
		 * waiting for an EOF that never comes. */
		close_range(3, ~0U, 0);
		setsid();
		exec_serve(ref, mountpoint);
	}
	rc = wait_ready(ref, log, child, deadline, pid);
out:
	free(want);
	free(running_mnt);
	free(log);
	return rc;
}

int cb_daemon_stop(const char *arg, int timeout_ms)
{
	char ref[CB_WS_REF_LEN + 1], *mnt = NULL;
	long long deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 30000);
	struct cb_client *c = NULL;
	pid_t pid;
	int rc;

	if ((rc = cb_ws_resolve(arg, ref)))
		return rc;
	if ((rc = cb_ws_daemon(ref, &pid, &mnt)) || !pid)
		goto out;
	/* A daemon that does not answer (or is still starting) gets SIGTERM instead. */
	int asked = cb_daemon_connect(ref, &c) == 0 &&
		    cb_client_request(c, json_pack("{s:s}", "op", "close"), 10000, NULL) == 0;

	cb_client_close(c);
	rc = 0;
	long long dying_since = 0;
	int aborted = 0;

	for (;;) {
		if (!asked && pid > 0)
			asked = kill(pid, SIGTERM) == 0 || errno == ESRCH;
		free(mnt);
		mnt = NULL;
		if ((rc = cb_ws_daemon(ref, &pid, &mnt)) || !pid)
			break;
		watch_predecessor(ref, &dying_since, &aborted);
		if (now_ms() > deadline && !aborted && pid > 0) {
			/* Asked to stop and still there: stuck; free it rather than give up. */
			stuck_abort(ref, pid, mnt, "does not stop");
			aborted = 1;
			deadline = now_ms() + 5000;
		}
		if (now_ms() > deadline) {
			rc = cb_error_set(ETIMEDOUT, "workspace %s: daemon pid %d did not stop",
					  ref, (int)pid);
			break;
		}
		usleep(20000);
	}
out:
	free(mnt);
	return rc;
}
