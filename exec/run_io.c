/* The runner's byte moving: pipes and ptys, stdin written from any thread, output taken
 * into the result under the cap, and kill requests to the shim. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "internal.h"
#include "run.h"

double cb_exec_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Move fd above 2 so the child's dup2 onto 0-2 never clobbers another of its fds. */
int cb_exec_fd_above_2(int fd)
{
	if (fd < 0 || fd > 2)
		return fd;
	int n = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	close(fd);
	return n;
}

int cb_exec_pipe(int fds[2])
{
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	fds[0] = cb_exec_fd_above_2(fds[0]);
	fds[1] = cb_exec_fd_above_2(fds[1]);
	return (fds[0] < 0 || fds[1] < 0) ? -EMFILE : 0;
}

void cb_exec_close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* write() that turns a closed reader into -EPIPE instead of killing us with SIGPIPE. */
static ssize_t write_nosigpipe(int fd, const void *buf, size_t len)
{
	sigset_t pipe_set, old, pending;
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	sigpending(&pending);
	int was_pending = sigismember(&pending, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	ssize_t n = write(fd, buf, len);
	int saved = errno;
	if (n < 0 && saved == EPIPE && !was_pending) {
		struct timespec zero = {0, 0};
		sigtimedwait(&pipe_set, NULL, &zero);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
	return n;
}

int cb_exec_send_kill(struct cb_exec *h, int sig)
{
	char msg[1 + sizeof(int)];
	int rc = 0;
	msg[0] = CB_MSG_KILL;
	memcpy(msg + 1, &sig, sizeof sig);
	pthread_mutex_lock(&h->ctl_lock);
	if (h->ctl >= 0 && send(h->ctl, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		rc = -errno;
	else if (h->ctl >= 0 && sig == SIGKILL)
		__atomic_store_n(&h->sigkill_sent, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&h->ctl_lock);
	return rc;
}

int cb_exec_pty_open(const struct cb_exec_spec *spec, int *master, int *slave)
{
	char name[128];
	*master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*master < 0)
		return cb_error_set(errno, "open a pseudo-terminal: %s", strerror(errno));
	if (grantpt(*master) < 0 || unlockpt(*master) < 0 || ptsname_r(*master, name, sizeof name))
		return cb_error_set(errno, "set up the pseudo-terminal: %s", strerror(errno));
	*slave = cb_exec_fd_above_2(open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
	*master = cb_exec_fd_above_2(*master);
	if (*slave < 0 || *master < 0)
		return cb_error_set(errno, "open %s: %s", name, strerror(errno));
	struct winsize ws = {.ws_row = spec->tty_rows ? spec->tty_rows : 24,
			     .ws_col = spec->tty_cols ? spec->tty_cols : 80};
	ioctl(*master, TIOCSWINSZ, &ws);
	return 0;
}

/* Wait for the sandbox's pty master (or the reason there is none). */
int cb_exec_pty_receive(struct cb_exec *h)
{
	char buf[600];
	union {
		char space[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
	struct msghdr msg = {.msg_iov = &iov,
			     .msg_iovlen = 1,
			     .msg_control = u.space,
			     .msg_controllen = sizeof u.space};
	ssize_t n;
	while ((n = recvmsg(h->ctl, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
	if (n > 0 && buf[0] == CB_MSG_TTY && c && c->cmsg_type == SCM_RIGHTS) {
		int fd;
		memcpy(&fd, CMSG_DATA(c), sizeof fd);
		h->tty_master = h->out.fd = h->in_w = cb_exec_fd_above_2(fd);
		return 0;
	}
	if (n > 0 && buf[0] == CB_MSG_ERROR) {
		buf[n] = 0;
		return cb_error_set(EIO, "exec: sandbox setup: %s", buf + 1);
	}
	return cb_error_set(EIO, "exec: the sandbox ended before its terminal was ready");
}

/* Take a chunk of output: hand it to the callback and keep it while under the cap. */
static void cb_exec_take_output(struct cb_exec *h, struct stream *s, int stream, const char *buf,
				size_t n)
{
	int over;

	/* Past the cap nothing more is kept or streamed: what the command writes until its
	 * SIGKILL lands (a loaded machine lets it write megabytes) goes nowhere. */
	if (h->total > h->limit)
		return;
	h->total += n;
	over = h->total > h->limit;
	if (over)
		n -= h->total - h->limit; /* up to the cap, cut below */
	if (n && h->cb.on_output && h->cb.on_output(h->cb.arg, stream, buf, n)) {
		__atomic_store_n(&h->killed, 1, __ATOMIC_RELEASE);
		cb_exec_send_kill(h, SIGKILL);
	}
	if (over)
		cb_exec_send_kill(h, SIGKILL);
	if (s->len + n + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 4096;
		while (cap < s->len + n + 1)
			cap *= 2;
		char *nb = realloc(s->buf, cap);
		if (!nb)
			return;
		s->buf = nb;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, buf, n);
	s->len += n;
}

/* Read what is there; returns 0 at end of file (or EIO on a pty whose slave is gone). */
int cb_exec_pump_output(struct cb_exec *h, struct stream *s, int stream)
{
	char buf[65536];
	ssize_t n = read(s->fd, buf, sizeof buf);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 1;
	if (n <= 0)
		return 0;
	cb_exec_take_output(h, s, stream, buf, (size_t)n);
	return 1;
}

void cb_exec_pump_stdin_bytes(struct cb_exec *h)
{
	pthread_mutex_lock(&h->in_lock);
	while (h->in_w >= 0 && h->in_off < h->in_len) {
		ssize_t n = write_nosigpipe(h->in_w, (const char *)h->in_data + h->in_off,
					    h->in_len - h->in_off);
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			h->in_off = h->in_len;
			break;
		}
		h->in_off += (size_t)n;
	}
	if (h->in_w >= 0 && h->in_off >= h->in_len) {
		if (h->in_w != h->tty_master) /* the master also carries the output */
			cb_exec_close_fd(&h->in_w);
		h->in_bytes = 0;
	}
	pthread_mutex_unlock(&h->in_lock);
}

void cb_exec_pump_stdin_src(struct cb_exec *h)
{
	char buf[4096];
	ssize_t n = read(h->stdin_src, buf, sizeof buf);
	if (n <= 0) {
		if (n == 0 || (errno != EAGAIN && errno != EINTR))
			h->stdin_src = -1;
		return;
	}
	cb_exec_stdin_write(h, buf, (size_t)n);
}

int cb_exec_stdin_write(struct cb_exec *h, const void *buf, size_t len)
{
	int rc = 0;
	pthread_mutex_lock(&h->in_lock);
	while (len > 0) {
		if (h->in_w < 0) {
			rc = -EPIPE;
			break;
		}
		ssize_t n = write_nosigpipe(h->in_w, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd pf = {.fd = h->in_w, .events = POLLOUT};
			poll(&pf, 1, 100);
			continue;
		}
		if (n <= 0) {
			rc = -(n < 0 ? errno : EPIPE);
			break;
		}
		buf = (const char *)buf + n;
		len -= (size_t)n;
	}
	pthread_mutex_unlock(&h->in_lock);
	if (rc)
		cb_error_set(-rc, "exec: write stdin: %s", strerror(-rc));
	return rc;
}

int cb_exec_stdin_close(struct cb_exec *h)
{
	if (h->tty_master >= 0) {
		char eof = 4; /* ^D: the line discipline's end of file */
		return cb_exec_stdin_write(h, &eof, 1);
	}
	pthread_mutex_lock(&h->in_lock);
	cb_exec_close_fd(&h->in_w);
	pthread_mutex_unlock(&h->in_lock);
	return 0;
}

int cb_exec_resize(struct cb_exec *h, unsigned short rows, unsigned short cols)
{
	struct winsize ws = {.ws_row = rows, .ws_col = cols};
	if (h->tty_master < 0)
		return cb_error_set(ENOTTY, "exec: resize: the command has no terminal");
	if (ioctl(h->tty_master, TIOCSWINSZ, &ws) < 0)
		return cb_error_set(errno, "exec: resize: %s", strerror(errno));
	return 0;
}
