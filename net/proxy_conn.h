/* Private to net/: one connection of the egress proxy and the proxy itself, shared by its front
 * (net/proxy.c: heads, resolution, policy, connect) and its relays (net/relay.c). */
#ifndef COWBOX_NET_PROXY_CONN_H
#define COWBOX_NET_PROXY_CONN_H

#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <pthread.h>
#include <stddef.h>

#include "cowbox/net.h"
#include "net/intercept.h"
#include "net/proxy_util.h"
#include "net/tunnel.h"

#define CB_NET_CONNECT_TIMEOUT 10 /* seconds for the destination to answer (and its TLS) */

enum pconn_state { ST_HEAD, ST_SOCKS_REQ, ST_RESOLVE, ST_CONNECT, ST_RELAY, ST_CLOSING };

struct pconn {
	struct cb_net_proxy *p;
	struct cb_net_loop *l; /* the loop it was accepted on, which runs it to its end */
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
	struct cb_net_icpt_host *bound; /* header secrets: intercepted */
	int up_tls, cli_tls;		/* their TLS layers are on */
	int cli_tls_ok;			/* the sandbox's handshake succeeded */
	struct cb_net_rewriter rw;
	struct cb_net_tunnel *tun; /* a plain tunnel relays in the kernel (net/tunnel.c) */
	unsigned long long seen;   /* its bytes either way when last looked at (the cap) */
	double seen_at;		   /* when they last changed (its start before) */
};

#define CB_NET_LOOPS_MAX 4
#define CB_NET_HAND_MAX	 64 /* accepted sockets waiting for their loop */

/* One event loop of the proxy, on a thread of its own: the connections it was given, their
 * resolver and their pipes are its alone. Loop 0 also accepts, and hands a connection to the
 * loop with the fewest open (docs/network.md#event-loops). */
struct cb_net_loop {
	struct cb_net_proxy *p;
	int index;
	struct event_base *base;
	struct evdns_base *dns;
	struct event *accept_ev; /* loop 0's */
	struct event *stop_ev, *hand_ev;
	pthread_t thread;
	int running;  /* its thread was started */
	int stopping; /* on its thread: it takes no more */
	struct pconn *conns;
	size_t open; /* atomic: its connections, counted from the hand-off (the pipe pool is
			trimmed when none are) */
	struct cb_net_pipes pipes;
	int nl; /* its netlink socket, for the host's own addresses (-1: none; closed when the
		   loop has no connection left) */
	pthread_mutex_t hand_lock; /* guards hand[] */
	int hand[CB_NET_HAND_MAX];
	size_t hand_n;
};

/* What the loops share is read-only once they run (policy, hosts, the intercept contexts,
 * whose session slots have their own lock) or safe from any thread (record, open). */
struct cb_net_proxy {
	int lfd; /* the listener, in the sandbox's namespace, accepted from by every loop */
	struct cb_net_policy *policy;
	struct cb_net_hosts hosts;
	void (*record)(void *arg, const struct cb_net_record *r);
	void *record_arg;
	size_t open;		  /* atomic: connections of all loops */
	size_t max_conns;	  /* the cap on open; past it a loop closes its longest idle */
	struct cb_net_icpt *icpt; /* NULL: no header secrets */
	int n_loops;
	struct cb_net_loop loops[CB_NET_LOOPS_MAX];
};

/* Connections open on loop i of p now, and how many loops p runs (tests). */
size_t cb_net_proxy_loop_open(struct cb_net_proxy *p, int i);
int cb_net_proxy_loops(struct cb_net_proxy *p);

/* Close c now, or once a pending lookup has called back. */
void cb_net_conn_close(struct pconn *c);
/* An HTTP answer with a one-line body to the sandbox, then the close. */
void cb_net_conn_http_answer(struct pconn *c, int code, const char *reason, const char *line);
/* A SOCKS5 reply (rep), then the close if then_close. */
void cb_net_conn_socks_answer(struct pconn *c, unsigned char rep, int then_close);
/* A failure in the client's protocol (code for HTTP, rep for SOCKS5), the rule fmt with a;
 * allowed: the policy let it through and something else failed. */
void cb_net_conn_fail(struct pconn *c, int allowed, int code, unsigned char rep, const char *fmt,
		      const char *a);
/* bufferevent callbacks that close c once bev's output is written, or at its event. */
void cb_net_conn_close_when_flushed(struct bufferevent *bev, void *arg);
void cb_net_conn_close_event(struct bufferevent *bev, short what, void *arg);

/* net/relay.c: the destination's socket (bev) connected or failed: TLS to it for a bound host,
 * then the answer to the sandbox and the relay (a spliced tunnel, or bufferevents that
 * rewrite for a bound host); a failure answered in the client's protocol. */
void cb_net_conn_connected(struct bufferevent *bev, short what, void *arg);

#endif
