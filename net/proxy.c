/* The egress proxy of a workspace: HTTP CONNECT, plain HTTP and SOCKS5 on one listener served by
 * several event loops, names resolved here (libevent's evdns), every destination checked by the
 * policy on its address (and never the host's own), then connected; net/relay.c takes each
 * connection from there. Its connections are capped, the longest idle closed first. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "net/proxy_conn.h"

#define HEAD_MAX	   16384 /* an HTTP request head or a SOCKS5 request, in bytes */
#define HEAD_TIMEOUT	   30	 /* seconds for the client to send it */
#define FINISH_TLS_TIMEOUT 5	 /* seconds for an intercepted client to close after an answer */

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
	struct cb_net_loop *l = c->l;

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
		l->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	__atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
	if (!__atomic_sub_fetch(&l->open, 1, __ATOMIC_RELAXED)) {
		cb_net_pipes_trim(&l->pipes, 2); /* one connection's */
		/* the netlink socket is kept for a burst, not while idle */
		if (l->nl >= 0) {
			close(l->nl);
			l->nl = -1;
		}
	}
	free(c);
}

/* Close now, or once a pending lookup has called back (it must not meet a freed conn). */
void cb_net_conn_close(struct pconn *c)
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

void cb_net_conn_close_when_flushed(struct bufferevent *bev, void *arg)
{
	struct pconn *c = arg;

	if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		cb_net_conn_close(c);
}

void cb_net_conn_close_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	/* an intercepted client's handshake can be reported after its first request was read
	 * (and refused): that is no end */
	if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT)))
		return;
	cb_net_conn_close(arg);
}

static void discard(struct bufferevent *bev, void *arg)
{
	(void)arg;
	evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
}

/* The client's last words are out once its buffer drains; nothing more is read. */
static void finish(struct pconn *c)
{
	c->st = ST_CLOSING;
	if (c->up) {
		bufferevent_free(c->up);
		c->up = NULL;
	}
	if (c->cli_tls) {
		/* the TLS layer takes the answer at once, and what its socket has still to send
		 * would go with a close now: the client, told "Connection: close", closes once
		 * it has read it (what it sends meanwhile is dropped), or the timeout does */
		struct timeval tv = {FINISH_TLS_TIMEOUT, 0};

		bufferevent_setcb(c->cli, discard, NULL, cb_net_conn_close_event, c);
		bufferevent_set_timeouts(c->cli, &tv, &tv);
		bufferevent_enable(c->cli, EV_READ);
		return;
	}
	bufferevent_disable(c->cli, EV_READ);
	bufferevent_setcb(c->cli, NULL, cb_net_conn_close_when_flushed, cb_net_conn_close_event, c);
	bufferevent_set_timeouts(c->cli, NULL, NULL);
	if (evbuffer_get_length(bufferevent_get_output(c->cli)) == 0)
		cb_net_conn_close(c);
}

/* An HTTP answer with a one-line body, then the close. */
void cb_net_conn_http_answer(struct pconn *c, int code, const char *reason, const char *line)
{
	evbuffer_add_printf(bufferevent_get_output(c->cli),
			    "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			    "Connection: close\r\n\r\n%s\n",
			    code, reason, strlen(line) + 1, line);
	finish(c);
}

void cb_net_conn_socks_answer(struct pconn *c, unsigned char rep, int then_close)
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
		cb_net_conn_socks_answer(c, rep, 1);
		return;
	}
	snprintf(line, sizeof line, "cowbox: %s %s:%d: %s", code == 403 ? "refused" : "failed",
		 *c->name ? c->name : "?", c->port, c->v.rule);
	cb_net_conn_http_answer(c, code, reason, line);
}

static void refuse(struct pconn *c)
{
	answer_error(c, 403, "Forbidden", 0x02);
}

/* allowed: the policy let it through and something else failed (resolution, connect). */
void cb_net_conn_fail(struct pconn *c, int allowed, int code, unsigned char rep, const char *fmt,
		      const char *a)
{
	c->v.allowed = allowed;
	snprintf(c->v.rule, sizeof c->v.rule, fmt, a);
	answer_error(c, code, code == 400 ? "Bad Request" : "Bad Gateway", rep);
}

/* Under every mode, an address of the host's own (any interface's, asked now) is refused
 * unless an address or CIDR entry names it: the daemon's services listen there. */
static void host_own_refused(struct pconn *c, const struct sockaddr *sa)
{
	char txt[64];
	int own;

	if (cb_net_entry_names_addr(c->p->policy, sa, c->port))
		return;
	own = cb_net_host_own(&c->l->nl, sa);
	if (!own)
		return;
	cb_net_proxy_addr_text(sa, txt, sizeof txt);
	c->v.allowed = 0;
	if (own > 0)
		snprintf(c->v.rule, sizeof c->v.rule,
			 "address %s is the host's own (refused unless an entry names it)", txt);
	else
		snprintf(c->v.rule, sizeof c->v.rule,
			 "address %s: cannot tell whether it is the host's own (%s)", txt,
			 cb_error_message());
}

/* The first of the addresses the policy allows is connected to; the check is on it. */
static void connect_addrs(struct pconn *c, struct sockaddr **sas, size_t n)
{
	struct timeval tv = {CB_NET_CONNECT_TIMEOUT, 0};
	struct cb_net_verdict first = {0};
	struct sockaddr *use = NULL;

	for (size_t i = 0; i < n && !use; i++) {
		cb_net_proxy_set_port(sas[i], c->port);
		cb_net_check_addr(c->p->policy, c->name, sas[i], c->port, &c->v);
		if (c->v.allowed)
			host_own_refused(c, sas[i]);
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
	c->up = bufferevent_socket_new(c->l->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!c->up) {
		cb_net_conn_fail(c, 0, 502, 0x01, "%s", "out of memory");
		return;
	}
	bufferevent_setcb(c->up, NULL, NULL, cb_net_conn_connected, c);
	bufferevent_set_timeouts(c->up, &tv, &tv);
	if (bufferevent_socket_connect(c->up, use,
				       use->sa_family == AF_INET
					   ? sizeof(struct sockaddr_in)
					   : sizeof(struct sockaddr_in6)) < 0) {
		bufferevent_free(c->up);
		c->up = NULL;
		cb_net_conn_fail(c, 1, 502, 0x05, "connect: %s", strerror(errno));
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
		cb_net_conn_fail(c, 1, 502, 0x04, "cannot resolve: %s",
				 evutil_gai_strerror(result));
		return;
	}
	for (struct evutil_addrinfo *ai = res; ai && n < 16; ai = ai->ai_next)
		if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6)
			sas[n++] = ai->ai_addr;
	if (n)
		connect_addrs(c, sas, n);
	else
		cb_net_conn_fail(c, 1, 502, 0x04, "%s", "cannot resolve: no address");
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
	req = evdns_getaddrinfo(c->l->dns, c->name, NULL, &hints, dns_done, c);
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
		cb_net_conn_fail(c, 0, 400, r.rep, "%s", r.error);
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
			cb_net_conn_fail(c, 0, 400, 0, "%s", "request head too long");
		return;
	}
	if ((size_t)end.pos + 4 > HEAD_MAX) {
		cb_net_conn_fail(c, 0, 400, 0, "%s", "request head too long");
		return;
	}
	head = malloc((size_t)end.pos + 5);
	if (!head) {
		cb_net_conn_fail(c, 0, 502, 0, "%s", "out of memory");
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
		cb_net_conn_fail(c, 0, 400, 0, "%s", r.error);
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

/* Past the cap (c, just opened, made it so): the connection of loop l idle longest (no byte
 * either way for CB_NET_IDLE_MIN at least, its bytes compared with what the last look saw)
 * is closed for c; with none idle c is, a busy proxy's transfers going first. A loop looks
 * at its own connections only: they are its thread's; the loops are kept even. 0, or -1
 * when c was closed. */
static int make_room(struct cb_net_loop *l, struct pconn *c)
{
	double now = now_mono();
	struct pconn *oldest = NULL;
	size_t max = l->p->max_conns;

	for (struct pconn *o = l->conns; o; o = o->next) {
		unsigned long long up = 0, down = 0;

		if (o == c || o->closing || o->st == ST_CLOSING)
			continue;
		if (o->tun)
			cb_net_tunnel_bytes(o->tun, &up, &down);
		up += down + o->bytes_up + o->bytes_down;
		if (up != o->seen) {
			o->seen = up;
			o->seen_at = now;
		}
		if (now - o->seen_at >= CB_NET_IDLE_MIN &&
		    (!oldest || o->seen_at < oldest->seen_at))
			oldest = o;
	}
	if (oldest) {
		char was[160]; /* its verdict's rule, and why it went */

		snprintf(was, sizeof was, "%.159s", oldest->v.rule);
		snprintf(oldest->v.rule, sizeof oldest->v.rule,
			 "%s; closed idle %.0f s at the cap of %zu connections", was,
			 now - oldest->seen_at, max);
		cb_net_conn_close(oldest);
		return 0;
	}
	c->proto = "tcp"; /* not read yet: what it would have asked for is unknown */
	c->v.allowed = 0;
	snprintf(c->v.rule, sizeof c->v.rule,
		 "refused: %zu connections open (the cap) and none idle for %.0f s", max,
		 CB_NET_IDLE_MIN);
	conn_free(c);
	return -1;
}

/* A connection given to loop l (its open count already raised): its head is read with a
 * timeout. */
static void conn_new(struct cb_net_loop *l, int fd)
{
	struct pconn *c = calloc(1, sizeof(*c));
	struct timeval tv = {HEAD_TIMEOUT, 0};

	if (!c || !(c->cli = bufferevent_socket_new(l->base, fd, BEV_OPT_CLOSE_ON_FREE))) {
		free(c);
		close(fd);
		__atomic_sub_fetch(&l->open, 1, __ATOMIC_RELAXED);
		return;
	}
	c->p = l->p;
	c->l = l;
	c->t0 = c->seen_at = now_mono();
	c->t0_wall = now_wall();
	c->next = l->conns;
	if (l->conns)
		l->conns->prev = c;
	l->conns = c;
	if (__atomic_add_fetch(&l->p->open, 1, __ATOMIC_RELAXED) > l->p->max_conns &&
	    make_room(l, c) < 0)
		return;
	bufferevent_setcb(c->cli, read_head, NULL, cb_net_conn_close_event, c);
	bufferevent_set_timeouts(c->cli, &tv, NULL);
	bufferevent_enable(c->cli, EV_READ);
}

/* On loop l's thread: the sockets handed to it become its connections (or are closed when it
 * is stopping). */
static void on_hand(evutil_socket_t unused, short what, void *arg)
{
	struct cb_net_loop *l = arg;
	int fds[CB_NET_HAND_MAX];
	size_t n;

	(void)unused;
	(void)what;
	pthread_mutex_lock(&l->hand_lock);
	n = l->hand_n;
	memcpy(fds, l->hand, n * sizeof *fds);
	l->hand_n = 0;
	pthread_mutex_unlock(&l->hand_lock);
	for (size_t i = 0; i < n; i++)
		if (l->stopping) {
			close(fds[i]);
			__atomic_sub_fetch(&l->open, 1, __ATOMIC_RELAXED);
		} else {
			conn_new(l, fds[i]);
		}
}

/* Which loop takes a new connection: one with at least two fewer open than loop 0 (the
 * acceptor's own, no hand-off) and the fewest, else loop 0. The margin keeps one client at a
 * time on loop 0, whose next connection often comes while the last is still closing there. */
static struct cb_net_loop *pick_loop(struct cb_net_proxy *p)
{
	struct cb_net_loop *best = &p->loops[0];
	size_t least = __atomic_load_n(&best->open, __ATOMIC_RELAXED);

	for (int i = 1; i < p->n_loops && least; i++) {
		size_t n = __atomic_load_n(&p->loops[i].open, __ATOMIC_RELAXED);

		if (n + 1 < least) {
			least = n;
			best = &p->loops[i];
		}
	}
	return best;
}

/* fd to loop l's queue, which is woken when it was empty: 0, or -1 when the queue is full. */
static int hand_to(struct cb_net_loop *l, int fd)
{
	int wake;

	pthread_mutex_lock(&l->hand_lock);
	if (l->hand_n == CB_NET_HAND_MAX) {
		pthread_mutex_unlock(&l->hand_lock);
		return -1;
	}
	wake = l->hand_n == 0;
	l->hand[l->hand_n++] = fd;
	pthread_mutex_unlock(&l->hand_lock);
	if (wake)
		event_active(l->hand_ev, EV_READ, 0);
	return 0;
}

static void accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct cb_net_loop *l = arg;

	(void)fd;
	(void)what;
	if (!l->stopping)
		event_add(l->accept_ev, NULL);
}

/* On loop 0: the listener is readable. One connection per wake-up (the listener stays
 * readable while more wait), which saves the accept4 that would fail with EAGAIN after a lone
 * one. The socket comes non-blocking, and with the listener's TCP_NODELAY (Linux copies it),
 * so it costs no further system call. Only loop 0 polls the listener: with every loop polling
 * it (libevent cannot ask epoll for EPOLLEXCLUSIVE) each connection woke them all and all but
 * one accept4 failed. */
static void on_acceptable(evutil_socket_t lfd, short what, void *arg)
{
	struct cb_net_loop *l = arg, *to;
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	(void)what;
	if (fd >= 0) {
		to = pick_loop(l->p);
		__atomic_add_fetch(&to->open, 1, __ATOMIC_RELAXED);
		if (to != l && hand_to(to, fd) == 0)
			return;
		if (to != l) { /* its queue is full: this one serves it */
			__atomic_sub_fetch(&to->open, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&l->open, 1, __ATOMIC_RELAXED);
		}
		conn_new(l, fd);
		return;
	}
	if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
		/* the listener would stay readable and the loop spin: pause it a moment */
		struct timeval tv = {0, 100 * 1000};

		event_del(l->accept_ev);
		event_base_once(l->base, -1, EV_TIMEOUT, accept_resume, l, &tv);
	}
}

static void *loop_main(void *arg)
{
	struct cb_net_loop *l = arg;

	event_base_dispatch(l->base);
	return NULL;
}

/* On loop l's thread: it takes no more and every connection of it goes (a pending lookup's
 * conn at its callback). */
static void on_stop(evutil_socket_t fd, short what, void *arg)
{
	struct cb_net_loop *l = arg;

	(void)fd;
	(void)what;
	l->stopping = 1;
	if (l->accept_ev)
		event_del(l->accept_ev);
	on_hand(-1, 0, l); /* what was handed to it is closed */
	while (l->conns) {
		struct pconn *c = l->conns;

		for (; c && c->closing; c = c->next)
			;
		if (!c)
			break;
		cb_net_conn_close(c);
	}
	event_base_loopexit(l->base, NULL);
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

/* Loop l's base, resolver and events (its thread not started): 0 or -errno. */
static int loop_init(struct cb_net_proxy *p, struct cb_net_loop *l, int index, double dns_timeout)
{
	char tmo[32];

	l->p = p;
	l->index = index;
	l->nl = -1;
	snprintf(tmo, sizeof tmo, "%g", dns_timeout > 0 ? dns_timeout : 5.0);
	/* a resolver per loop: its requests and callbacks stay on the loop of their conn */
	pthread_mutex_init(&l->hand_lock, NULL);
	if (!(l->base = new_base()) ||
	    !(l->dns = evdns_base_new(l->base, EVDNS_BASE_INITIALIZE_NAMESERVERS)) ||
	    !(l->stop_ev = event_new(l->base, -1, 0, on_stop, l)) ||
	    !(l->hand_ev = event_new(l->base, -1, 0, on_hand, l)) ||
	    (index == 0 && (!(l->accept_ev = event_new(l->base, p->lfd, EV_READ | EV_PERSIST,
						       on_acceptable, l)) ||
			    event_add(l->accept_ev, NULL) < 0)))
		return cb_error_set(ENOMEM, "proxy: cannot set up its event loop and resolver");
	evdns_base_set_option(l->dns, "timeout:", tmo);
	evdns_base_set_option(l->dns, "attempts:", "2");
	return 0;
}

static void loop_free(struct cb_net_loop *l)
{
	if (l->accept_ev)
		event_free(l->accept_ev);
	for (size_t i = 0; i < l->hand_n; i++)
		close(l->hand[i]); /* handed after it stopped */
	if (l->dns)
		evdns_base_free(l->dns, 1); /* a pending lookup fails, its conn goes */
	while (l->conns)
		conn_free(l->conns);
	cb_net_pipes_trim(&l->pipes, 0);
	if (l->p && l->nl >= 0)
		close(l->nl);
	if (l->stop_ev)
		event_free(l->stop_ev);
	if (l->hand_ev)
		event_free(l->hand_ev);
	if (l->base)
		event_base_free(l->base);
	if (l->p) /* its mutex was made */
		pthread_mutex_destroy(&l->hand_lock);
}

static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static int threads_rc;

static void threads_init(void)
{
	threads_rc = evthread_use_pthreads();
}

/* Every running loop stopped and joined, then everything freed. */
static void proxy_free(struct cb_net_proxy *p)
{
	for (int i = 0; i < p->n_loops; i++)
		if (p->loops[i].running)
			event_active(p->loops[i].stop_ev, EV_READ, 0);
	for (int i = 0; i < p->n_loops; i++)
		if (p->loops[i].running)
			pthread_join(p->loops[i].thread, NULL);
	for (int i = 0; i < p->n_loops; i++)
		loop_free(&p->loops[i]);
	if (p->lfd >= 0)
		close(p->lfd);
	cb_net_hosts_free(&p->hosts);
	cb_net_policy_free(p->policy);
	cb_net_icpt_free(p->icpt);
	free(p);
}

/* How many loops: asked, else $COWBOX_PROXY_LOOPS (tests), else one per online CPU; 1 to
 * CB_NET_LOOPS_MAX. */
static int loops_wanted(int asked)
{
	const char *env = getenv("COWBOX_PROXY_LOOPS");
	long n = asked;

	if (n <= 0 && env && *env)
		n = strtol(env, NULL, 10);
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > CB_NET_LOOPS_MAX ? CB_NET_LOOPS_MAX : (int)n;
}

/* The cap on connections: asked (0: CB_NET_MAX_CONNS), lowered so that they, the loops' pipe
 * pools and CB_NET_FD_RESERVE fit the open-file limit (at least 4 connections). */
static size_t conns_cap(size_t asked, int n_loops)
{
	size_t cap = asked ? asked : CB_NET_MAX_CONNS, budget;
	size_t fixed = CB_NET_FD_RESERVE + (size_t)n_loops * CB_NET_PIPES_MAX * 2;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return cap;
	budget = rl.rlim_cur > fixed ? (size_t)(rl.rlim_cur - fixed) / CB_NET_FDS_PER_CONN : 0;
	if (budget < 4)
		budget = 4;
	return cap < budget ? cap : budget;
}

int cb_net_proxy_start(const struct cb_net_proxy_config *cfg, struct cb_net_proxy **out)
{
	struct cb_net_proxy *p = calloc(1, sizeof(*p));
	const char *hosts = getenv("COWBOX_PROXY_HOSTS");
	int rc = 0, one = 1;

	*out = NULL;
	pthread_once(&threads_once, threads_init);
	if (!p) {
		close(cfg->listen_fd);
		rc = cb_error_set(ENOMEM, "proxy: out of memory");
		goto out;
	}
	p->lfd = cfg->listen_fd;
	if (threads_rc < 0) {
		rc = cb_error_set(ENOSYS, "proxy: libevent has no pthreads support");
		goto out;
	}
	/* accepted sockets inherit both (Linux), which saves two system calls a connection; a
	 * unix listener (the vm backend serves its guest's proxy on one) has no Nagle to turn
	 * off and says EOPNOTSUPP */
	if (evutil_make_socket_nonblocking(p->lfd) < 0 ||
	    (setsockopt(p->lfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0 &&
	     errno != EOPNOTSUPP)) {
		rc = cb_error_set(errno, "proxy: its listener: %s", strerror(errno));
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
	for (int i = 0, n = loops_wanted(cfg->loops); i < n; i++) {
		p->n_loops = i + 1; /* freed, even half made */
		if ((rc = loop_init(p, &p->loops[i], i, cfg->dns_timeout)) < 0)
			goto out;
	}
	p->max_conns = conns_cap(cfg->max_conns, p->n_loops);
	for (int i = 0; i < p->n_loops; i++) {
		struct cb_net_loop *l = &p->loops[i];
		char name[16];

		if ((rc = pthread_create(&l->thread, NULL, loop_main, l))) {
			rc = cb_error_set(rc, "proxy: thread: %s", strerror(rc));
			goto out;
		}
		l->running = 1;
		snprintf(name, sizeof name, "cb-proxy%d", i % 10);
		pthread_setname_np(l->thread, name);
	}
	*out = p;
	p = NULL;
out:
	if (p)
		proxy_free(p);
	return rc;
}

void cb_net_proxy_stop(struct cb_net_proxy *p)
{
	if (p)
		proxy_free(p);
}

size_t cb_net_proxy_open_count(struct cb_net_proxy *p)
{
	return __atomic_load_n(&p->open, __ATOMIC_RELAXED);
}

size_t cb_net_proxy_max_conns(struct cb_net_proxy *p)
{
	return p->max_conns;
}

size_t cb_net_proxy_loop_open(struct cb_net_proxy *p, int i)
{
	return i < p->n_loops ? __atomic_load_n(&p->loops[i].open, __ATOMIC_RELAXED) : 0;
}

int cb_net_proxy_loops(struct cb_net_proxy *p)
{
	return p->n_loops;
}
