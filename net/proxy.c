/* The egress proxy of a workspace: HTTP CONNECT, plain HTTP and SOCKS5 on one listener, names
 * resolved here (libevent's evdns), every destination checked by the policy on its address;
 * a host with header secrets is intercepted (net/intercept.c), every other one tunnelled. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"
#include "net/intercept.h"
#include "net/proxy_util.h"
#include "net/tunnel.h"

#define HEAD_MAX	 16384	   /* an HTTP request head or a SOCKS5 request, in bytes */
#define HEAD_TIMEOUT	 30	   /* seconds for the client to send it */
#define CONNECT_TIMEOUT	 10	   /* seconds for the destination to answer */
#define RELAY_HIGH_WATER (1 << 20) /* bytes queued to one side before the other pauses */

enum pconn_state { ST_HEAD, ST_SOCKS_REQ, ST_RESOLVE, ST_CONNECT, ST_RELAY, ST_CLOSING };

struct pconn {
	struct cb_net_proxy *p;
	struct pconn *prev, *next;
	struct bufferevent *cli, *up;
	enum pconn_state st;
	const char *proto;
	char name[256];
	char address[64];
	int port;
	struct evbuffer *head; /* plain HTTP: the request head rewritten for the destination */
	struct evdns_getaddrinfo_request *dns;
	int dns_pending, closing;
	struct cb_net_verdict v;
	double t0_wall, t0;
	unsigned long long bytes_up, bytes_down;
	const struct cb_net_icpt_host *bound; /* header secrets: intercepted */
	int up_tls, cli_tls;		      /* their TLS layers are on */
	int cli_tls_ok;			      /* the sandbox's handshake succeeded */
	struct cb_net_rewriter rw;
	struct cb_net_tunnel *tun; /* a plain tunnel relays in the kernel (net/tunnel.c) */
};

struct cb_net_proxy {
	struct event_base *base;
	struct evdns_base *dns;
	struct evconnlistener *lis;
	struct event *stop_ev;
	pthread_t thread;
	struct cb_net_policy *policy;
	struct cb_net_hosts hosts;
	void (*record)(void *arg, const struct cb_net_record *r);
	void *record_arg;
	struct pconn *conns;
	size_t open;
	struct cb_net_icpt *icpt; /* NULL: no header secrets */
	struct cb_net_pipes pipes;
};

static double now_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now_wall(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void conn_free(struct pconn *c)
{
	struct cb_net_proxy *p = c->p;

	if (c->tun) {
		unsigned long long up, down;

		cb_net_tunnel_bytes(c->tun, &up, &down);
		c->bytes_up += up;
		c->bytes_down += down;
	}
	if (p->record && c->proto) {
		struct cb_net_record r = {
		    .time = c->t0_wall,
		    .proto = c->proto,
		    .name = c->name,
		    .address = c->address,
		    .port = c->port,
		    .allowed = c->v.allowed,
		    .rule = c->v.rule,
		    .bytes_up = c->bytes_up,
		    .bytes_down = c->bytes_down,
		    .duration = now_mono() - c->t0,
		    .secret = c->rw.injected,
		};
		p->record(p->record_arg, &r);
	}
	cb_net_tunnel_free(c->tun);
	if (c->cli)
		bufferevent_free(c->cli);
	if (c->up)
		bufferevent_free(c->up);
	if (c->head)
		evbuffer_free(c->head);
	if (c->prev)
		c->prev->next = c->next;
	else
		p->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (!__atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED))
		cb_net_pipes_trim(&p->pipes, 2); /* one connection's */
	free(c);
}

/* Close now, or once a pending lookup has called back (it must not meet a freed conn). */
static void conn_close(struct pconn *c)
{
	if (c->dns_pending) {
		struct evdns_getaddrinfo_request *req = c->dns;

		c->closing = 1;
		c->dns = NULL;
		if (req)
			evdns_getaddrinfo_cancel(req);
		return;
	}
	conn_free(c);
}

static void close_when_flushed(struct bufferevent *bev, void *arg)
{
	struct pconn *c = arg;

	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		conn_close(c);
}

static void close_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	(void)what;
	conn_close(arg);
}

/* The client's last words are out once its buffer drains; nothing more is read. */
static void finish(struct pconn *c)
{
	c->st = ST_CLOSING;
	if (c->up) {
		bufferevent_free(c->up);
		c->up = NULL;
	}
	bufferevent_disable(c->cli, EV_READ);
	bufferevent_setcb(c->cli, NULL, close_when_flushed, close_event, c);
	bufferevent_set_timeouts(c->cli, NULL, NULL);
	if (evbuffer_get_length(bufferevent_get_output(c->cli)) == 0)
		conn_close(c);
}

/* An HTTP answer with a one-line body, then the close. */
static void http_answer(struct pconn *c, int code, const char *reason, const char *line)
{
	evbuffer_add_printf(bufferevent_get_output(c->cli),
			    "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			    "Connection: close\r\n\r\n%s\n",
			    code, reason, strlen(line) + 1, line);
	finish(c);
}

static void socks_answer(struct pconn *c, unsigned char rep, int then_close)
{
	unsigned char r[10] = {5, rep, 0, 1};

	bufferevent_write(c->cli, r, sizeof r);
	if (then_close)
		finish(c);
}

/* Both sides of every connection: TLS writes its flights as records of their own and a
 * tunnel passes on each short message as it comes; Nagle would hold the last one back for the
 * peer's delayed ACK (~40 ms a handshake). */
static void no_delay(evutil_socket_t fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A refusal or failure, in the client's protocol; rep is the SOCKS5 reply code. */
static void answer_error(struct pconn *c, int code, const char *reason, unsigned char rep)
{
	char line[1024];

	if (!strcmp(c->proto, "socks5")) {
		socks_answer(c, rep, 1);
		return;
	}
	snprintf(line, sizeof line, "cowbox: %s %s:%d: %s", code == 403 ? "refused" : "failed",
		 *c->name ? c->name : "?", c->port, c->v.rule);
	http_answer(c, code, reason, line);
}

static void refuse(struct pconn *c)
{
	answer_error(c, 403, "Forbidden", 0x02);
}

/* allowed: the policy let it through and something else failed (resolution, connect). */
static void fail(struct pconn *c, int allowed, int code, unsigned char rep, const char *fmt,
		 const char *a)
{
	c->v.allowed = allowed;
	snprintf(c->v.rule, sizeof c->v.rule, fmt, a);
	answer_error(c, code, code == 400 ? "Bad Request" : "Bad Gateway", rep);
}

/* Bytes per read or write call while relaying: libevent's default, 16 KiB, costs a loop
 * iteration each 16 KiB of a bulk transfer. */
#define RELAY_CHUNK (256 << 10)

static void relay_read(struct bufferevent *bev, void *arg);
static void relay_event(struct bufferevent *bev, short what, void *arg);

static void drained(struct bufferevent *bev, void *arg)
{
	struct pconn *c = arg;
	struct bufferevent *other = bev == c->cli ? c->up : c->cli;

	bufferevent_setcb(bev, relay_read, NULL, relay_event, c);
	bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
	if (other)
		bufferevent_enable(other, EV_READ);
}

static void relay_read(struct bufferevent *bev, void *arg)
{
	struct pconn *c = arg;
	struct bufferevent *other = bev == c->cli ? c->up : c->cli;
	struct evbuffer *in = bufferevent_get_input(bev), *out;
	size_t n = evbuffer_get_length(in);

	if (!other) {
		evbuffer_drain(in, n);
		return;
	}
	if (bev == c->cli)
		c->bytes_up += n;
	else
		c->bytes_down += n;
	out = bufferevent_get_output(other);
	if (bev == c->cli && c->bound) {
		if (cb_net_rewrite(&c->rw, in, out) < 0) {
			c->v.allowed = 1;
			snprintf(c->v.rule, sizeof c->v.rule, "intercepted request refused: %s",
				 c->rw.error);
			http_answer(c, 400, "Bad Request", c->v.rule);
			return;
		}
	} else {
		evbuffer_add_buffer(out, in);
	}
	if (evbuffer_get_length(out) >= RELAY_HIGH_WATER) {
		bufferevent_setcb(other, relay_read, drained, relay_event, c);
		bufferevent_setwatermark(other, EV_WRITE, RELAY_HIGH_WATER / 2, RELAY_HIGH_WATER);
		bufferevent_disable(bev, EV_READ);
	}
}

/* One side ended: what it sent goes to the other, which closes once that is written. */
static void relay_event(struct bufferevent *bev, short what, void *arg)
{
	struct pconn *c = arg;
	struct bufferevent *other = bev == c->cli ? c->up : c->cli;

	if (bev == c->cli && c->cli_tls && (what & BEV_EVENT_CONNECTED))
		c->cli_tls_ok = 1;
	if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)))
		return;
	if (bev == c->cli && c->cli_tls && !c->cli_tls_ok) {
		char why[200];

		cb_net_icpt_tls_error(NULL, bufferevent_get_openssl_error(bev), why, sizeof why);
		snprintf(c->v.rule, sizeof c->v.rule, "TLS from the sandbox failed: %s", why);
	}
	if (other && !(bev == c->cli && c->bound))
		relay_read(bev, c); /* (an intercepted request is whole when it is read) */
	if (bev == c->cli)
		c->cli = NULL;
	else
		c->up = NULL;
	bufferevent_free(bev);
	if (!other || !evbuffer_get_length(bufferevent_get_output(other))) {
		conn_close(c);
		return;
	}
	c->st = ST_CLOSING;
	bufferevent_disable(other, EV_READ);
	bufferevent_setwatermark(other, EV_WRITE, 0, 0);
	bufferevent_setcb(other, NULL, close_when_flushed, close_event, c);
}

/* The sandbox's side of an intercepted connection: TLS with the bound host's leaf, over the
 * answer (200, or the SOCKS5 reply) already queued in the clear. */
static int intercept_client(struct pconn *c)
{
	SSL *ssl = cb_net_icpt_downstream(c->p->icpt, c->bound);
	struct bufferevent *tls =
	    ssl ? bufferevent_openssl_filter_new(c->p->base, c->cli, ssl, BUFFEREVENT_SSL_ACCEPTING,
						 BEV_OPT_CLOSE_ON_FREE)
		: NULL;

	if (!tls) {
		SSL_free(ssl);
		fail(c, 1, 502, 0x01, "%s", "out of memory");
		return -1;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
	c->cli = tls;
	c->cli_tls = 1;
	c->rw.host = c->bound;
	return 0;
}

static void tunnel_done(void *arg)
{
	conn_close(arg);
}

static void start_relay(struct pconn *c)
{
	c->st = ST_RELAY;
	bufferevent_set_timeouts(c->cli, NULL, NULL);
	bufferevent_set_timeouts(c->up, NULL, NULL);
	bufferevent_setwatermark(c->cli, EV_READ, 0, 0);
	if (!strcmp(c->proto, "connect"))
		evbuffer_add_printf(bufferevent_get_output(c->cli),
				    "HTTP/1.1 200 Connection established\r\n\r\n");
	else if (!strcmp(c->proto, "socks5"))
		socks_answer(c, 0, 0);
	else {
		c->bytes_up += evbuffer_get_length(c->head);
		evbuffer_add_buffer(bufferevent_get_output(c->up), c->head);
	}
	if (c->bound && intercept_client(c) < 0)
		return;
	/* else the bufferevents relay: when no tunnel could be had, or to rewrite */
	if (!c->bound &&
	    cb_net_tunnel_new(&c->cli, &c->up, &c->p->pipes, tunnel_done, c, &c->tun) == 0)
		return;
	bufferevent_setcb(c->cli, relay_read, NULL, relay_event, c);
	bufferevent_setcb(c->up, relay_read, NULL, relay_event, c);
	for (int i = 0; i < 2; i++) {
		bufferevent_set_max_single_read(i ? c->up : c->cli, RELAY_CHUNK);
		bufferevent_set_max_single_write(i ? c->up : c->cli, RELAY_CHUNK);
	}
	bufferevent_enable(c->cli, EV_READ);
	bufferevent_enable(c->up, EV_READ);
	if (evbuffer_get_length(bufferevent_get_input(c->cli)))
		relay_read(c->cli, c);
}

static void up_connected(struct bufferevent *bev, short what, void *arg);

/* The destination's side of an intercepted connection: TLS, its certificate verified, before
 * the sandbox is answered, so that a failure is a clear 502 rather than a broken handshake. */
static void intercept_upstream(struct pconn *c)
{
	struct timeval tv = {CONNECT_TIMEOUT, 0};
	SSL *ssl = cb_net_icpt_upstream(c->p->icpt, c->name);
	struct bufferevent *tls =
	    ssl ? bufferevent_openssl_filter_new(c->p->base, c->up, ssl, BUFFEREVENT_SSL_CONNECTING,
						 BEV_OPT_CLOSE_ON_FREE)
		: NULL;

	bufferevent_set_timeouts(c->up, NULL, NULL); /* the TLS layer's own from now */
	if (!tls) {
		SSL_free(ssl);
		fail(c, 1, 502, 0x01, "%s", "upstream TLS: out of memory");
		return;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
	c->up = tls;
	c->up_tls = 1;
	bufferevent_setcb(tls, NULL, NULL, up_connected, c);
	bufferevent_set_timeouts(tls, &tv, &tv);
	bufferevent_enable(tls, EV_READ | EV_WRITE);
}

static void up_connected(struct bufferevent *bev, short what, void *arg)
{
	struct pconn *c = arg;

	(void)bev;
	if ((what & BEV_EVENT_CONNECTED) && c->bound && !c->up_tls) {
		intercept_upstream(c);
		return;
	}
	if (what & BEV_EVENT_CONNECTED) {
		start_relay(c);
		return;
	}
	if (c->up_tls) {
		char why[200];

		if (what & BEV_EVENT_TIMEOUT)
			snprintf(why, sizeof why, "handshake timed out");
		else
			cb_net_icpt_tls_error(bufferevent_openssl_get_ssl(c->up),
					      bufferevent_get_openssl_error(c->up), why,
					      sizeof why);
		fail(c, 1, 502, 0x05, "upstream TLS: %s", why);
		return;
	}
	fail(c, 1, 502, 0x05, "%s",
	     what & BEV_EVENT_TIMEOUT ? "connect: timed out"
				      : evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
}

/* The first of the addresses the policy allows is connected to; the check is on it. */
static void connect_addrs(struct pconn *c, struct sockaddr **sas, size_t n)
{
	struct timeval tv = {CONNECT_TIMEOUT, 0};
	struct cb_net_verdict first = {0};
	struct sockaddr *use = NULL;

	for (size_t i = 0; i < n && !use; i++) {
		cb_net_proxy_set_port(sas[i], c->port);
		cb_net_check_addr(c->p->policy, c->name, sas[i], c->port, &c->v);
		if (i == 0) {
			first = c->v;
			cb_net_proxy_addr_text(sas[i], c->address, sizeof c->address);
		}
		if (c->v.allowed)
			use = sas[i];
	}
	if (!use) {
		c->v = first;
		refuse(c);
		return;
	}
	cb_net_proxy_addr_text(use, c->address, sizeof c->address);
	c->st = ST_CONNECT;
	c->up = bufferevent_socket_new(c->p->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!c->up) {
		fail(c, 0, 502, 0x01, "%s", "out of memory");
		return;
	}
	bufferevent_setcb(c->up, NULL, NULL, up_connected, c);
	bufferevent_set_timeouts(c->up, &tv, &tv);
	if (bufferevent_socket_connect(c->up, use,
				       use->sa_family == AF_INET
					   ? sizeof(struct sockaddr_in)
					   : sizeof(struct sockaddr_in6)) < 0) {
		bufferevent_free(c->up);
		c->up = NULL;
		fail(c, 1, 502, 0x05, "connect: %s", strerror(errno));
		return;
	}
	no_delay(bufferevent_getfd(c->up));
}

static void dns_done(int result, struct evutil_addrinfo *res, void *arg)
{
	struct pconn *c = arg;
	struct sockaddr *sas[16];
	size_t n = 0;

	c->dns = NULL;
	c->dns_pending = 0;
	if (c->closing) {
		if (res)
			evutil_freeaddrinfo(res);
		conn_free(c);
		return;
	}
	if (result) {
		fail(c, 1, 502, 0x04, "cannot resolve: %s", evutil_gai_strerror(result));
		return;
	}
	for (struct evutil_addrinfo *ai = res; ai && n < 16; ai = ai->ai_next)
		if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6)
			sas[n++] = ai->ai_addr;
	if (n)
		connect_addrs(c, sas, n);
	else
		fail(c, 1, 502, 0x04, "%s", "cannot resolve: no address");
	evutil_freeaddrinfo(res);
}

/* Name and port known: checked by name, resolved (hosts file first), checked by address. */
static void resolve(struct pconn *c)
{
	struct evutil_addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	struct sockaddr_storage lit, *found[16];
	struct sockaddr *sas[16];
	struct evdns_getaddrinfo_request *req;
	size_t n;

	c->st = ST_RESOLVE;
	bufferevent_setwatermark(c->cli, EV_READ, 0, HEAD_MAX);
	/* a bound host through CONNECT or SOCKS5 is intercepted, but on port 80, where what
	 * goes through is plain HTTP, which never gets a secret */
	if (strcmp(c->proto, "http") && c->port != 80)
		c->bound = cb_net_icpt_find(c->p->icpt, c->name);
	cb_net_check_name(c->p->policy, c->name, c->port, &c->v);
	if (!c->v.allowed) {
		refuse(c);
		return;
	}
	if (cb_net_proxy_literal(c->name, &lit) == 0) {
		sas[0] = (struct sockaddr *)&lit;
		connect_addrs(c, sas, 1);
		return;
	}
	n = cb_net_hosts_find(&c->p->hosts, c->name, found, 16);
	if (n) {
		struct sockaddr_storage copy[16];

		for (size_t i = 0; i < n; i++) {
			copy[i] = *found[i];
			sas[i] = (struct sockaddr *)&copy[i];
		}
		connect_addrs(c, sas, n);
		return;
	}
	c->dns_pending = 1;
	req = evdns_getaddrinfo(c->p->dns, c->name, NULL, &hints, dns_done, c);
	if (c->dns_pending)
		c->dns = req; /* else it answered at once */
}

static void read_head(struct bufferevent *bev, void *arg);

static void socks_request(struct pconn *c, struct evbuffer *in)
{
	unsigned char h[CB_NET_SOCKS_REQ_MAX];
	size_t have = evbuffer_get_length(in);
	ev_ssize_t got = evbuffer_copyout(in, h, have < sizeof h ? have : sizeof h);
	struct cb_net_socks_req r;
	long n = got < 0 ? 0 : cb_net_socks_parse(h, (size_t)got, &r);

	if (n == 0)
		return;
	if (n > 0) {
		evbuffer_drain(in, (size_t)n);
		snprintf(c->name, sizeof c->name, "%s", r.name);
		c->port = r.port;
	}
	if (r.error)
		fail(c, 0, 400, r.rep, "%s", r.error);
	else
		resolve(c);
}

static void socks_greeting(struct pconn *c, struct evbuffer *in)
{
	unsigned char h[2 + 255];
	size_t have = evbuffer_get_length(in);

	if (have < 2)
		return;
	evbuffer_copyout(in, h, have < sizeof h ? have : sizeof h);
	if (have < 2 + (size_t)h[1])
		return;
	evbuffer_drain(in, 2 + (size_t)h[1]);
	if (!h[1] || !memchr(h + 2, 0, h[1])) {
		static const unsigned char no[2] = {5, 0xff};

		c->v.allowed = 0;
		snprintf(c->v.rule, sizeof c->v.rule, "socks5: no acceptable method (only none)");
		bufferevent_write(c->cli, no, 2);
		finish(c);
		return;
	}
	bufferevent_write(c->cli, "\x05\x00", 2);
	c->st = ST_SOCKS_REQ;
	if (evbuffer_get_length(in))
		socks_request(c, in);
}

static void http_head(struct pconn *c, struct evbuffer *in)
{
	struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
	struct cb_net_http_req r;
	char *head;
	int rc;

	if (end.pos < 0) {
		if (evbuffer_get_length(in) > HEAD_MAX)
			fail(c, 0, 400, 0, "%s", "request head too long");
		return;
	}
	if ((size_t)end.pos + 4 > HEAD_MAX) {
		fail(c, 0, 400, 0, "%s", "request head too long");
		return;
	}
	head = malloc((size_t)end.pos + 5);
	if (!head) {
		fail(c, 0, 502, 0, "%s", "out of memory");
		return;
	}
	evbuffer_remove(in, head, (size_t)end.pos + 4);
	head[end.pos + 4] = 0;
	rc = cb_net_http_parse(head, &r);
	if (rc == 0) {
		c->proto = r.connect ? "connect" : "http";
		snprintf(c->name, sizeof c->name, "%s", r.host);
		c->port = r.port;
		if (!r.connect && !(c->head = evbuffer_new()))
			rc = -1;
		else if (!r.connect)
			evbuffer_add(c->head, r.rewritten, strlen(r.rewritten));
	}
	if (rc < 0)
		fail(c, 0, 400, 0, "%s", r.error);
	else
		resolve(c);
	cb_net_http_req_free(&r);
	free(head);
}

static void read_head(struct bufferevent *bev, void *arg)
{
	struct pconn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	unsigned char first;

	if (c->st == ST_SOCKS_REQ) {
		socks_request(c, in);
		return;
	}
	if (c->st != ST_HEAD || evbuffer_copyout(in, &first, 1) != 1)
		return; /* resolving or connecting: the rest waits in the buffer */
	if (first == 5) {
		c->proto = "socks5";
		socks_greeting(c, in);
	} else {
		c->proto = "http";
		http_head(c, in);
	}
}

static void on_accept(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa, int len,
		      void *arg)
{
	struct cb_net_proxy *p = arg;
	struct pconn *c = calloc(1, sizeof(*c));
	struct timeval tv = {HEAD_TIMEOUT, 0};

	(void)lis;
	(void)sa;
	(void)len;
	if (!c || !(c->cli = bufferevent_socket_new(p->base, fd, BEV_OPT_CLOSE_ON_FREE))) {
		free(c);
		evutil_closesocket(fd);
		return;
	}
	no_delay(fd);
	c->p = p;
	c->t0 = now_mono();
	c->t0_wall = now_wall();
	c->next = p->conns;
	if (p->conns)
		p->conns->prev = c;
	p->conns = c;
	__atomic_add_fetch(&p->open, 1, __ATOMIC_RELAXED);
	bufferevent_setcb(c->cli, read_head, NULL, close_event, c);
	bufferevent_set_timeouts(c->cli, &tv, NULL);
	bufferevent_enable(c->cli, EV_READ);
}

static void *proxy_main(void *arg)
{
	struct cb_net_proxy *p = arg;

	event_base_dispatch(p->base);
	return NULL;
}

/* On the proxy's thread: every connection goes (a pending lookup's conn at its callback). */
static void on_stop(evutil_socket_t fd, short what, void *arg)
{
	struct cb_net_proxy *p = arg;

	(void)fd;
	(void)what;
	evconnlistener_free(p->lis);
	p->lis = NULL;
	while (p->conns) {
		struct pconn *c = p->conns;

		for (; c && c->closing; c = c->next)
			;
		if (!c)
			break;
		conn_close(c);
	}
	event_base_loopexit(p->base, NULL);
}

/* An event loop whose epoll changes wait for its next poll, where they merge: a connection
 * handed from its bufferevents to a tunnel re-registers its sockets for nothing otherwise
 * (the fds are never dup'd, which that mode cannot follow). */
static struct event_base *new_base(void)
{
	struct event_config *cfg = event_config_new();
	struct event_base *base = NULL;

	if (cfg && event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST) == 0)
		base = event_base_new_with_config(cfg);
	if (cfg)
		event_config_free(cfg);
	return base;
}

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int threads_rc;

static void threads_init(void)
{
	threads_rc = evthread_use_pthreads();
}

static void proxy_free(struct cb_net_proxy *p)
{
	if (p->lis)
		evconnlistener_free(p->lis);
	if (p->dns)
		evdns_base_free(p->dns, 1); /* a pending lookup fails, its conn goes */
	while (p->conns)
		conn_free(p->conns);
	cb_net_pipes_trim(&p->pipes, 0);
	if (p->stop_ev)
		event_free(p->stop_ev);
	if (p->base)
		event_base_free(p->base);
	cb_net_hosts_free(&p->hosts);
	cb_net_policy_free(p->policy);
	cb_net_icpt_free(p->icpt);
	free(p);
}

int cb_net_proxy_start(const struct cb_net_proxy_config *cfg, struct cb_net_proxy **out)
{
	struct cb_net_proxy *p = calloc(1, sizeof(*p));
	const char *hosts = getenv("COWBOX_PROXY_HOSTS");
	char tmo[32];
	int rc = 0, fd = cfg->listen_fd;

	*out = NULL;
	pthread_once(&threads_once, threads_init);
	if (!p) {
		rc = cb_error_set(ENOMEM, "proxy: out of memory");
		goto out;
	}
	if (threads_rc < 0) {
		rc = cb_error_set(ENOSYS, "proxy: libevent has no pthreads support");
		goto out;
	}
	if ((rc = cb_net_policy_copy(cfg->policy, &p->policy)) < 0)
		goto out;
	if (hosts && *hosts && (rc = cb_net_hosts_load(hosts, &p->hosts)) < 0)
		goto out;
	if ((rc = cb_net_icpt_new(cfg, &p->icpt)) < 0)
		goto out;
	p->record = cfg->record;
	p->record_arg = cfg->record_arg;
	snprintf(tmo, sizeof tmo, "%g", cfg->dns_timeout > 0 ? cfg->dns_timeout : 5.0);
	if (!(p->base = new_base()) ||
	    !(p->dns = evdns_base_new(p->base, EVDNS_BASE_INITIALIZE_NAMESERVERS)) ||
	    !(p->stop_ev = event_new(p->base, -1, 0, on_stop, p))) {
		rc = cb_error_set(ENOMEM, "proxy: cannot set up its event loop and resolver");
		goto out;
	}
	evdns_base_set_option(p->dns, "timeout:", tmo);
	evdns_base_set_option(p->dns, "attempts:", "2");
	evutil_make_socket_nonblocking(fd);
	p->lis = evconnlistener_new(p->base, on_accept, p, LEV_OPT_CLOSE_ON_FREE, -1, fd);
	if (!p->lis) {
		rc = cb_error_set(ENOMEM, "proxy: cannot listen");
		goto out;
	}
	fd = -1;
	if ((rc = pthread_create(&p->thread, NULL, proxy_main, p))) {
		rc = cb_error_set(rc, "proxy: thread: %s", strerror(rc));
		goto out;
	}
	*out = p;
	p = NULL;
out:
	if (fd >= 0)
		close(fd);
	if (p)
		proxy_free(p);
	return rc;
}

void cb_net_proxy_stop(struct cb_net_proxy *p)
{
	if (!p)
		return;
	event_active(p->stop_ev, EV_READ, 0);
	pthread_join(p->thread, NULL);
	proxy_free(p);
}

size_t cb_net_proxy_open_count(struct cb_net_proxy *p)
{
	return __atomic_load_n(&p->open, __ATOMIC_RELAXED);
}
