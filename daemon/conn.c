/* Control connections: a reader thread per client splits JSON lines, dispatches them through
 * the op tables and answers malformed input with invalid_request; replies are whole lines. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "daemon.h"

struct cb_daemon_conn {
	struct cb_daemon *d;
	int fd;
	int refs;  /* guarded by d->conns_lock */
	int level; /* its own access level (cowbox/access.h); __atomic */
	pthread_mutex_t write_lock;
	struct cb_daemon_conn *next;
};

struct cb_daemon *cb_daemon_conn_daemon(struct cb_daemon_conn *conn)
{
	return conn->d;
}

int cb_daemon_conn_level(struct cb_daemon_conn *conn)
{
	return __atomic_load_n(&conn->level, __ATOMIC_ACQUIRE);
}

void cb_daemon_conn_set_level(struct cb_daemon_conn *conn, int level)
{
	__atomic_store_n(&conn->level, level, __ATOMIC_RELEASE);
}

struct cb_daemon_conn *cb_daemon_conn_ref(struct cb_daemon_conn *conn)
{
	pthread_mutex_lock(&conn->d->conns_lock);
	conn->refs++;
	pthread_mutex_unlock(&conn->d->conns_lock);
	return conn;
}

/* The fd lives until the last reference, so a late reply never lands on a reused fd. */
void cb_daemon_conn_unref(struct cb_daemon_conn *conn)
{
	struct cb_daemon *d = conn->d;
	int last;

	pthread_mutex_lock(&d->conns_lock);
	last = --conn->refs == 0;
	if (last) {
		for (struct cb_daemon_conn **p = &d->conns; *p; p = &(*p)->next)
			if (*p == conn) {
				*p = conn->next;
				break;
			}
		d->nconns--;
		pthread_cond_broadcast(&d->conns_cond);
	}
	pthread_mutex_unlock(&d->conns_lock);
	if (!last)
		return;
	close(conn->fd);
	pthread_mutex_destroy(&conn->write_lock);
	free(conn);
}

int cb_daemon_send_parts(struct cb_daemon_conn *conn, const struct iovec *part, int n)
{
	int rc = 0;

	pthread_mutex_lock(&conn->write_lock);
	for (int i = 0; i < n && !rc; i++) {
		const char *p = part[i].iov_base;
		size_t off = 0;

		while (off < part[i].iov_len) {
			ssize_t k = send(conn->fd, p + off, part[i].iov_len - off, MSG_NOSIGNAL);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				rc = cb_error_set(EPIPE, "control client went away");
				break;
			}
			off += (size_t)k;
		}
	}
	pthread_mutex_unlock(&conn->write_lock);
	return rc;
}

int cb_daemon_send_text(struct cb_daemon_conn *conn, const char *text, size_t len)
{
	struct iovec part = {(void *)text, len};

	return cb_daemon_send_parts(conn, &part, 1);
}

/* Serializes the object, appends the newline and writes it in one locked stretch. */
static int conn_send(struct cb_daemon_conn *conn, json_t *msg)
{
	char *text = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII);
	size_t len;
	int rc;

	json_decref(msg);
	if (!text)
		return cb_error_set(ENOMEM, "encode reply: out of memory");
	len = strlen(text);
	text[len] = '\n'; /* replaces the terminator; the length is known */
	rc = cb_daemon_send_text(conn, text, len + 1);
	free(text);
	return rc;
}

static json_t *conn_envelope(json_t *id)
{
	json_t *msg = json_object();

	if (msg)
		json_object_set_new(msg, "id", id ? json_incref(id) : json_null());
	return msg;
}

int cb_daemon_reply(struct cb_daemon_conn *conn, json_t *id, json_t *result)
{
	json_t *msg = conn_envelope(id);

	if (!msg) {
		json_decref(result);
		return cb_error_set(ENOMEM, "reply: out of memory");
	}
	json_object_set_new(msg, "ok", json_true());
	if (result && json_is_object(result))
		json_object_update(msg, result);
	json_decref(result);
	return conn_send(conn, msg);
}

int cb_daemon_reply_error(struct cb_daemon_conn *conn, json_t *id, const char *code,
			  const char *fmt, ...)
{
	json_t *msg = conn_envelope(id);
	char text[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (!msg)
		return cb_error_set(ENOMEM, "reply: out of memory");
	json_object_set_new(msg, "error", json_pack("{s:s, s:s}", "code", code, "message", text));
	return conn_send(conn, msg);
}

int cb_daemon_send_frame(struct cb_daemon_conn *conn, json_t *id, json_t *frame)
{
	json_t *msg = conn_envelope(id);

	if (!msg) {
		json_decref(frame);
		return cb_error_set(ENOMEM, "frame: out of memory");
	}
	if (frame && json_is_object(frame))
		json_object_update(msg, frame);
	json_decref(frame);
	return conn_send(conn, msg);
}

/* One request line: anything malformed is answered and the connection goes on. */
static void conn_dispatch(struct cb_daemon_conn *conn, const char *line, size_t len)
{
	json_error_t jerr;
	json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	json_t *id = NULL, *op;
	const struct cb_daemon_op *handler;
	int rc;

	if (!req) {
		cb_daemon_reply_error(conn, NULL, "invalid_request", "bad JSON at column %d: %s",
				      jerr.column, jerr.text);
		return;
	}
	if (!json_is_object(req)) {
		cb_daemon_reply_error(conn, NULL, "invalid_request",
				      "a request must be a JSON object with \"id\" and \"op\"");
		goto out;
	}
	id = json_object_get(req, "id");
	if (!id || !(json_is_integer(id) || json_is_string(id))) {
		cb_daemon_reply_error(conn, NULL, "invalid_request",
				      "a request needs an \"id\" that is an integer or a string");
		goto out;
	}
	op = json_object_get(req, "op");
	if (!json_is_string(op)) {
		cb_daemon_reply_error(conn, id, "invalid_request",
				      "a request needs an \"op\" that is a string");
		goto out;
	}
	handler = cb_daemon_op_find(json_string_value(op));
	if (!handler) {
		cb_daemon_reply_error(conn, id, "invalid_request", "unknown op '%s'",
				      json_string_value(op));
		goto out;
	}
	cb_error_clear();
	if (cb_daemon_access_check(conn, json_string_value(op), req) < 0) {
		cb_daemon_reply_error(conn, id, "access_denied", "%s", cb_error_message());
		goto out;
	}
	rc = handler->handle(conn->d, conn, req);
	if (rc < 0)
		cb_daemon_reply_error(conn, id, cb_daemon_error_code(rc), "%s",
				      *cb_error_message() ? cb_error_message() : strerror(-rc));
out:
	json_decref(req);
}

static int conn_hello(struct cb_daemon_conn *conn)
{
	json_t *hello =
	    json_pack("{s:s, s:i, s:s, s:I}", "hello", "cowbox", "protocol", CB_PROTOCOL_VERSION,
		      "ref", conn->d->ref, "pid", (json_int_t)getpid());

	return hello ? conn_send(conn, hello) : cb_error_set(ENOMEM, "hello: out of memory");
}

/* Reads until the client hangs up; a line past the limit is answered once and skipped. */
static void *conn_reader(void *arg)
{
	struct cb_daemon_conn *conn = arg;
	size_t cap = 65536, len = 0, scanned = 0;
	char *buf = malloc(cap);
	int discarding = 0;

	if (!buf || conn_hello(conn))
		goto out;
	for (;;) {
		char *nl;

		if (len == cap) {
			size_t ncap = cap * 2;
			char *grown =
			    ncap <= CB_PROTOCOL_MAX_LINE + 65536 ? realloc(buf, ncap) : NULL;

			if (!grown)
				break;
			buf = grown;
			cap = ncap;
		}
		ssize_t n = recv(conn->fd, buf + len, cap - len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		while ((nl = memchr(buf + scanned, '\n', len - scanned))) {
			size_t line_len = (size_t)(nl - buf);

			if (discarding)
				discarding = 0;
			else if (line_len && !(line_len == 1 && buf[0] == '\r'))
				conn_dispatch(conn, buf, line_len);
			memmove(buf, nl + 1, len - line_len - 1);
			len -= line_len + 1;
			scanned = 0;
		}
		scanned = len;
		if (len >= CB_PROTOCOL_MAX_LINE) {
			if (!discarding)
				cb_daemon_reply_error(conn, NULL, "invalid_request",
						      "request line longer than %u bytes",
						      CB_PROTOCOL_MAX_LINE);
			discarding = 1;
			len = scanned = 0;
		}
	}
out:
	free(buf);
	/* The commands this client started end with it (the reader started them, so none is
	 * started after this). */
	cb_daemon_api_hangup(conn->d, conn);
	cb_daemon_conn_unref(conn);
	return NULL;
}

int cb_daemon_conn_start(struct cb_daemon *d, int fd)
{
	struct cb_daemon_conn *conn = calloc(1, sizeof(*conn));
	pthread_attr_t attr;
	pthread_t thread;
	int err;

	if (!conn) {
		close(fd);
		return cb_error_set(ENOMEM, "connection: out of memory");
	}
	conn->d = d;
	conn->fd = fd;
	conn->refs = 1;
	conn->level = 2; /* full: what the workspace serves (d->access) bounds it */
	pthread_mutex_init(&conn->write_lock, NULL);
	pthread_mutex_lock(&d->conns_lock);
	conn->next = d->conns;
	d->conns = conn;
	d->nconns++;
	pthread_mutex_unlock(&d->conns_lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&thread, &attr, conn_reader, conn);
	pthread_attr_destroy(&attr);
	if (err) {
		cb_daemon_conn_unref(conn);
		return cb_error_set(err, "connection thread: %s", strerror(err));
	}
	return 0;
}

void cb_daemon_conns_shutdown(struct cb_daemon *d, int timeout_ms)
{
	struct timespec deadline;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += timeout_ms / 1000;
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&d->conns_lock);
	for (struct cb_daemon_conn *c = d->conns; c; c = c->next) {
		shutdown(c->fd, SHUT_RDWR);
	}
	while (d->nconns > 0)
		if (pthread_cond_timedwait(&d->conns_cond, &d->conns_lock, &deadline) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&d->conns_lock);
}
