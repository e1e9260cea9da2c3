/* libcowbox's high-level API, streamed commands (exec): a connection of their own whose stdin
 * writes keep reading the daemon's output, so a command echoing a large input cannot stall. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "box_private.h"
#include "cowbox/access.h"
#include "cowbox/error.h"
#include "daemon.h"

#define PROC_CHUNK (1u << 20) /* stdin bytes per frame */

struct cb_box_proc {
	int fd;
	long long id;
	/* What the daemon sent and poll has not handed out yet: buf[off, len); lines are
	 * searched from scan on, so a long line is not rescanned for every read. */
	char *buf;
	size_t off, len, cap, scan;
	json_t *final; /* the exec's final reply, once it came */
};

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read what the daemon has sent, waiting up to timeout_ms (< 0: forever) for something. */
static int proc_fill(struct cb_box_proc *p, int timeout_ms)
{
	struct pollfd pfd = {p->fd, POLLIN, 0};
	ssize_t n;
	int r;

	if (p->off && p->off == p->len)
		p->off = p->len = p->scan = 0;
	if (p->len == p->cap) {
		size_t keep = p->len - p->off;

		if (p->off > p->cap / 2) {
			memmove(p->buf, p->buf + p->off, keep);
			p->scan -= p->off;
			p->off = 0;
			p->len = keep;
		} else {
			size_t ncap = p->cap ? p->cap * 2 : 65536;
			char *grown = realloc(p->buf, ncap);

			if (!grown)
				return cb_error_set(ENOMEM, "exec: out of memory");
			p->buf = grown;
			p->cap = ncap;
		}
	}
	do
		r = poll(&pfd, 1, timeout_ms);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return cb_error_set(errno, "exec: poll: %s", strerror(errno));
	if (r == 0)
		return -ETIMEDOUT;
	do
		n = recv(p->fd, p->buf + p->len, p->cap - p->len, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return 0;
	if (n <= 0)
		return cb_error_set(ECONNRESET, "exec: the daemon closed the connection");
	p->len += (size_t)n;
	return 0;
}

/* The next whole line as JSON into *msg: 1, or 0 if no whole line has arrived yet. */
static int proc_line(struct cb_box_proc *p, json_t **msg)
{
	char *nl = p->len > p->scan ? memchr(p->buf + p->scan, '\n', p->len - p->scan) : NULL;
	json_error_t jerr;
	size_t start = p->off;

	if (!nl) {
		p->scan = p->len;
		return 0;
	}
	p->off = p->scan = (size_t)(nl - p->buf) + 1;
	*msg = json_loadb(p->buf + start, (size_t)(nl - p->buf) - start, 0, &jerr);
	if (!*msg)
		return cb_error_set(EPROTO, "exec: the daemon sent bad JSON: %s", jerr.text);
	return 1;
}

/* Send msg (consumed) without ever blocking on a full socket while the daemon waits for us
 * to read: whatever arrives meanwhile is kept for poll. */
static int proc_send(struct cb_box_proc *p, json_t *msg)
{
	char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
	size_t len, sent = 0;
	int rc = 0;

	json_decref(msg);
	if (!text)
		return cb_error_set(ENOMEM, "exec: out of memory");
	len = strlen(text);
	text[len] = '\n';
	while (!rc && sent < len + 1) {
		struct pollfd pfd = {p->fd, POLLIN | POLLOUT, 0};

		if (poll(&pfd, 1, -1) < 0) {
			if (errno != EINTR)
				rc = cb_error_set(errno, "exec: poll: %s", strerror(errno));
			continue;
		}
		if (pfd.revents & POLLIN && (rc = proc_fill(p, 0)) == -ETIMEDOUT)
			rc = 0;
		if (rc || !(pfd.revents & (POLLOUT | POLLERR | POLLHUP)))
			continue;
		ssize_t n = send(p->fd, text + sent, len + 1 - sent, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0)
			rc = cb_error_set(errno, "exec: send to the daemon: %s", strerror(errno));
		else
			sent += (size_t)n;
	}
	free(text);
	return rc;
}

/* Connect to the daemon of ref and check its hello. */
static int proc_connect(struct cb_box_proc *p, const char *ref)
{
	struct sockaddr_un sa;
	socklen_t salen;
	char *path = NULL;
	json_t *hello = NULL;
	int dirfd = -1, rc, got = 0;
	long long deadline = mono_ms() + 10000;

	if ((rc = cb_ws_path(ref, "control.sock", &path)) ||
	    (rc = cb_daemon_sockaddr(path, &sa, &salen, &dirfd)))
		goto out;
	p->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->fd < 0 || connect(p->fd, (struct sockaddr *)&sa, salen) < 0) {
		rc = cb_error_set(errno, "exec: workspace %s: no daemon answers on %s (%s)", ref,
				  path, strerror(errno));
		goto out;
	}
	while (!rc && !(got = proc_line(p, &hello)) && mono_ms() < deadline) {
		long long left = deadline - mono_ms();

		rc = proc_fill(p, left > 0 ? (int)left : 0);
	}
	if (rc == -ETIMEDOUT)
		rc = 0; /* reported below as no hello */
	if (!rc && got < 0)
		rc = got;
	if (!rc &&
	    (!got || strcmp(json_string_value(json_object_get(hello, "hello")) ?: "", "cowbox") ||
	     json_integer_value(json_object_get(hello, "protocol")) != CB_PROTOCOL_VERSION))
		rc =
		    cb_error_set(EPROTO, "exec: workspace %s: %s does not speak cowbox protocol %d",
				 ref, path, CB_PROTOCOL_VERSION);
out:
	json_decref(hello);
	if (dirfd >= 0)
		close(dirfd);
	free(path);
	return rc;
}

void cb_box_proc_free(struct cb_box_proc *p)
{
	if (!p)
		return;
	if (p->fd >= 0)
		close(p->fd);
	free(p->buf);
	json_decref(p->final);
	free(p);
}

int cb_box_exec(struct cb_box *box, const char *const *argv, const char *shell,
		const struct cb_box_run_options *opts, struct cb_box_proc **out)
{
	struct cb_box_proc *p = NULL;
	json_t *req = NULL;
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if ((rc = cb_box_command_json("exec", argv, shell, opts, &req)))
		goto out;
	json_object_set_new(req, "stdin", json_true());
	/* A ping boots the daemon if it is not running, like any other first use; the exec's
	 * own connection would start at the workspace's level, not the box's. */
	if ((rc = cb_box_request(box, "exec", json_pack("{s:s}", "op", "ping"), NULL, NULL)) ||
	    (rc = cb_box_access_need(box, CB_ACCESS_FULL, "exec")))
		goto out;
	if (!(p = calloc(1, sizeof(*p)))) {
		rc = cb_error_set(ENOMEM, "exec: out of memory");
		goto out;
	}
	p->fd = -1;
	p->id = 1;
	if ((rc = proc_connect(p, box->ref))) {
		cb_box_set_code("unavailable");
		goto out;
	}
	json_object_set_new(req, "id", json_integer(p->id));
	rc = proc_send(p, req);
	req = NULL;
	if (!rc) {
		*out = p;
		p = NULL;
	}
out:
	json_decref(req);
	cb_box_proc_free(p);
	return cb_box_finish(rc);
}

int cb_box_proc_write(struct cb_box_proc *p, const void *data, size_t len)
{
	int rc = 0;

	cb_box_set_code("");
	for (size_t off = 0; !rc && off < len; off += PROC_CHUNK) {
		size_t n = len - off < PROC_CHUNK ? len - off : PROC_CHUNK;

		rc = proc_send(p, json_pack("{s:I,s:s,s:o}", "id", (json_int_t)p->id, "op", "stdin",
					    "data", cb_api_b64_json((const char *)data + off, n)));
	}
	return cb_box_finish(rc);
}

int cb_box_proc_close_stdin(struct cb_box_proc *p)
{
	cb_box_set_code("");
	return cb_box_finish(proc_send(
	    p, json_pack("{s:I,s:s,s:b}", "id", (json_int_t)p->id, "op", "stdin", "eof", 1)));
}

int cb_box_proc_kill(struct cb_box_proc *p, int sig)
{
	cb_box_set_code("");
	if (p->final)
		return 0; /* it has ended: nothing left to signal */
	return cb_box_finish(proc_send(
	    p, json_pack("{s:I,s:s,s:i}", "id", (json_int_t)p->id, "op", "kill", "signal", sig)));
}

/* One frame of the exec: output to on_output, the final reply kept in p->final. */
static int proc_frame(struct cb_box_proc *p, json_t *msg, cb_box_output_fn on_output, void *arg)
{
	const char *stream = json_string_value(json_object_get(msg, "stream"));
	void *data = NULL;
	size_t n = 0;
	int rc;

	if (json_integer_value(json_object_get(msg, "id")) != p->id)
		return 0;
	if (stream) {
		rc = cb_api_b64_decode(
		    "data", json_string_value(json_object_get(msg, "data")) ?: "", &data, &n);
		if (!rc && on_output && n)
			on_output(strcmp(stream, "stderr") ? 1 : 2, data, n, arg);
		free(data);
		return rc;
	}
	/* stdin and kill lines are answered only when no exec runs under the id, i.e. after
	 * its final reply: an error before that is the exec's own. */
	p->final = json_incref(msg);
	return 0;
}

int cb_box_proc_poll(struct cb_box_proc *p, int timeout_ms, cb_box_output_fn on_output, void *arg,
		     struct cb_box_result *res)
{
	long long deadline = timeout_ms < 0 ? -1 : mono_ms() + timeout_ms;
	int rc = 0, expired = 0;

	cb_box_set_code("");
	if (res)
		memset(res, 0, sizeof(*res));
	while (!p->final) {
		json_t *msg = NULL;
		long long left = deadline < 0 ? -1 : deadline - mono_ms();

		if ((rc = proc_line(p, &msg)) < 0)
			return cb_box_finish(rc);
		if (rc == 1) {
			rc = proc_frame(p, msg, on_output, arg);
			json_decref(msg);
			if (rc)
				return cb_box_finish(rc);
			continue;
		}
		/* Past the deadline, what has already arrived is taken once, no more. */
		if (deadline >= 0 && left <= 0 && expired++)
			return cb_box_finish(0);
		rc = proc_fill(p, deadline >= 0 && left < 0 ? 0 : (int)left);
		if (rc == -ETIMEDOUT)
			return cb_box_finish(0);
		if (rc) {
			cb_box_set_code("unavailable");
			return cb_box_finish(rc);
		}
	}
	if (json_object_get(p->final, "error"))
		return cb_box_finish(cb_box_reply_error("exec", p->final, NULL));
	if (res && (rc = cb_box_result_fill(p->final, res)))
		return cb_box_finish(rc);
	return cb_box_finish(1);
}
