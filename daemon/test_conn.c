/* Unit tests of daemon/conn.c over a socketpair, with a table of test ops: a long-running
 * streaming request on one connection while the same connection keeps reading lines (ping,
 * kill by id), the hang-up reaching the requests a connection started, and framing errors. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "daemon.h"

/* The test's stand-in for the API's running table (daemon/ops_api.c): counters by
 * (connection, id), stopped by kill and by the hang-up hook. */
struct counter {
	struct cb_daemon_conn *conn;
	json_t *id;
	int stop;
	pthread_t thread;
	struct counter *next;
};

static pthread_mutex_t counters_lock = PTHREAD_MUTEX_INITIALIZER;
static struct counter *counters;

/* Streams a frame every 5 ms until killed or the client hangs up, then replies. */
static void *counter_main(void *arg)
{
	struct counter *c = arg;
	int ticks = 0;

	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		cb_daemon_send_frame(
		    c->conn, c->id,
		    json_pack("{s:s, s:s}", "stream", "stdout", "data", "dGljaw=="));
		ticks++;
		usleep(5000);
	}
	pthread_mutex_lock(&counters_lock);
	for (struct counter **p = &counters; *p; p = &(*p)->next)
		if (*p == c) {
			*p = c->next;
			break;
		}
	pthread_mutex_unlock(&counters_lock);
	cb_daemon_reply(c->conn, c->id, json_pack("{s:i, s:b}", "ticks", ticks, "killed", 1));
	cb_daemon_conn_unref(c->conn);
	json_decref(c->id);
	free(c);
	return NULL;
}

static int op_count(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct counter *c = calloc(1, sizeof(*c));

	(void)d;
	cr_assert_not_null(c);
	c->id = json_incref(json_object_get(req, "id"));
	c->conn = cb_daemon_conn_ref(conn);
	pthread_mutex_lock(&counters_lock);
	c->next = counters;
	counters = c;
	pthread_mutex_unlock(&counters_lock);
	cr_assert_eq(pthread_create(&c->thread, NULL, counter_main, c), 0);
	pthread_detach(c->thread);
	return 0;
}

static int op_kill(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *id = json_object_get(req, "id");
	int found = 0;

	(void)d;
	pthread_mutex_lock(&counters_lock);
	for (struct counter *c = counters; c; c = c->next)
		if (c->conn == conn && json_equal(c->id, id)) {
			__atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
			found = 1;
		}
	pthread_mutex_unlock(&counters_lock);
	if (!found)
		return cb_error_set(ENOENT, "no running request with this id");
	return cb_daemon_reply(conn, id, json_pack("{s:b}", "kill", 1));
}

/* The reader's hang-up hook: here it stops the counters of conn, as the API kills its
 * commands. */
void cb_daemon_api_hangup(struct cb_daemon *dd, struct cb_daemon_conn *conn)
{
	(void)dd;
	pthread_mutex_lock(&counters_lock);
	for (struct counter *c = counters; c; c = c->next)
		if (c->conn == conn)
			__atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&counters_lock);
}

static int op_ping(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	(void)d;
	return cb_daemon_reply(conn, json_object_get(req, "id"), NULL);
}

static const struct cb_daemon_op test_ops[] = {
    {"count", op_count},
    {"kill", op_kill},
    {"ping", op_ping},
    {NULL, NULL},
};

/* The real registry lives in daemon/ops.c; this test serves its own table. */
const struct cb_daemon_op *cb_daemon_op_find(const char *name)
{
	for (const struct cb_daemon_op *op = test_ops; op->name; op++)
		if (!strcmp(op->name, name))
			return op;
	return NULL;
}

/* Access levels (daemon/access.c) are not what this test is about: everything is allowed. */
int cb_daemon_access_check(struct cb_daemon_conn *conn, const char *op, json_t *req)
{
	(void)conn, (void)op, (void)req;
	return 0;
}

static struct cb_daemon d;
static int peer = -1;
static char inbuf[1 << 16];
static size_t inlen;

static void setup(void)
{
	int sv[2];

	memset(&d, 0, sizeof(d));
	strcpy(d.ref, "cb-00000000000000000000000000000000");
	pthread_mutex_init(&d.conns_lock, NULL);
	pthread_cond_init(&d.conns_cond, NULL);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert_eq(cb_daemon_conn_start(&d, sv[0]), 0);
	peer = sv[1];
	inlen = 0;
}

static void teardown(void)
{
	if (peer >= 0)
		close(peer);
	cb_daemon_conns_shutdown(&d, 5000);
	cr_assert_eq(d.nconns, 0, "connections left: %u", d.nconns);
}

TestSuite(conn, .init = setup, .fini = teardown);

static void send_line(const char *line)
{
	size_t len = strlen(line);

	cr_assert_eq(write(peer, line, len), (ssize_t)len);
	cr_assert_eq(write(peer, "\n", 1), 1);
}

/* The next line from the daemon, parsed; fails the test after 5 s. */
static json_t *recv_msg(void)
{
	for (;;) {
		char *nl = memchr(inbuf, '\n', inlen);

		if (nl) {
			json_t *msg = json_loadb(inbuf, (size_t)(nl - inbuf), 0, NULL);

			memmove(inbuf, nl + 1, inlen - (size_t)(nl - inbuf) - 1);
			inlen -= (size_t)(nl - inbuf) + 1;
			cr_assert_not_null(msg);
			return msg;
		}
		struct pollfd p = {peer, POLLIN, 0};

		cr_assert_eq(poll(&p, 1, 5000), 1, "no message from the daemon");
		ssize_t n = read(peer, inbuf + inlen, sizeof(inbuf) - inlen);

		cr_assert_gt(n, 0);
		inlen += (size_t)n;
	}
}

/* The next message that is not a stream frame. */
static json_t *recv_reply(int *frames)
{
	for (;;) {
		json_t *m = recv_msg();

		if (!json_object_get(m, "stream"))
			return m;
		(*frames)++;
		json_decref(m);
	}
}

static const char *error_code(json_t *m)
{
	return json_string_value(json_object_get(json_object_get(m, "error"), "code"));
}

Test(conn, long_request_while_reading_more_lines)
{
	json_t *m = recv_msg();
	int frames = 0, saw_kill = 0, saw_done = 0;

	cr_assert_str_eq(json_string_value(json_object_get(m, "hello")), "cowbox");
	json_decref(m);
	send_line("{\"id\":1,\"op\":\"count\"}");
	m = recv_msg();
	cr_assert_str_eq(json_string_value(json_object_get(m, "stream")), "stdout");
	cr_assert_eq(json_integer_value(json_object_get(m, "id")), 1);
	json_decref(m);
	frames = 1;
	/* The same connection answers other requests meanwhile. */
	send_line("{\"id\":2,\"op\":\"ping\"}");
	m = recv_reply(&frames);
	cr_assert_eq(json_integer_value(json_object_get(m, "id")), 2);
	cr_assert(json_is_true(json_object_get(m, "ok")));
	json_decref(m);
	send_line("{\"id\":9,\"op\":\"kill\"}");
	m = recv_reply(&frames);
	cr_assert_str_eq(error_code(m), "not_found");
	json_decref(m);
	/* kill under the running id: its ack and the request's final reply both arrive. */
	send_line("{\"id\":1,\"op\":\"kill\"}");
	while (!(saw_kill && saw_done)) {
		m = recv_reply(&frames);
		cr_assert_eq(json_integer_value(json_object_get(m, "id")), 1);
		saw_kill |= json_is_true(json_object_get(m, "kill"));
		saw_done |= json_integer_value(json_object_get(m, "ticks")) > 0;
		json_decref(m);
	}
	cr_assert_gt(frames, 0);
}

Test(conn, hang_up_stops_the_connections_requests)
{
	json_t *m = recv_msg();

	json_decref(m);
	send_line("{\"id\":\"a\",\"op\":\"count\"}");
	send_line("{\"id\":\"b\",\"op\":\"count\"}");
	m = recv_msg();
	json_decref(m);
	close(peer);
	peer = -1;
	/* The hang-up hook stops both counters; their replies fail quietly; every ref is
	 * dropped. */
	cb_daemon_conns_shutdown(&d, 5000);
	cr_assert_eq(d.nconns, 0);
}

Test(conn, framing_errors_keep_the_connection)
{
	json_t *m = recv_msg();

	json_decref(m);
	send_line("{\"id\":1,");
	m = recv_msg();
	cr_assert_str_eq(error_code(m), "invalid_request");
	cr_assert(json_is_null(json_object_get(m, "id")));
	json_decref(m);
	send_line("{\"id\":[1],\"op\":\"ping\"}");
	m = recv_msg();
	cr_assert_str_eq(error_code(m), "invalid_request");
	json_decref(m);
	send_line("{\"id\":3,\"op\":\"ping\",\"id\":4}");
	m = recv_msg();
	cr_assert_str_eq(error_code(m), "invalid_request");
	json_decref(m);
	send_line("\r");
	send_line("{\"id\":\"s\",\"op\":\"ping\"}");
	m = recv_msg();
	cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "s");
	json_decref(m);
}
