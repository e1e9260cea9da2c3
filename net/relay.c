/* The egress proxy's relays: once the destination answers, TLS both ways for a host with header
 * secrets (its requests rewritten in user space), a spliced tunnel for every other one. */
#include "config.h"

#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <stdio.h>
#include <string.h>

#include "net/proxy_conn.h"

#define RELAY_HIGH_WATER (1 << 20) /* bytes queued to one side before the other pauses */

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
		/* the handshake is done before the first byte of a request is read */
		c->rw.sni = SSL_get_servername(bufferevent_openssl_get_ssl(c->cli),
					       TLSEXT_NAMETYPE_host_name);
		if (cb_net_rewrite(&c->rw, in, out) < 0) {
			/* a misdirected request is the policy's refusal, logged as refused */
			c->v.allowed = !c->rw.misdirected;
			snprintf(c->v.rule, sizeof c->v.rule, "intercepted request refused: %s",
				 c->rw.error);
			if (c->rw.misdirected)
				cb_net_conn_http_answer(c, 421, "Misdirected Request", c->v.rule);
			else
				cb_net_conn_http_answer(c, 400, "Bad Request", c->v.rule);
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
		cb_net_conn_close(c);
		return;
	}
	c->st = ST_CLOSING;
	bufferevent_disable(other, EV_READ);
	bufferevent_setwatermark(other, EV_WRITE, 0, 0);
	bufferevent_setcb(other, NULL, cb_net_conn_close_when_flushed, cb_net_conn_close_event, c);
}

/* The sandbox's side of an intercepted connection: TLS with the bound host's leaf, over the
 * answer (200, or the SOCKS5 reply) already queued in the clear. */
static int intercept_client(struct pconn *c)
{
	SSL *ssl = cb_net_icpt_downstream(c->bound);
	struct bufferevent *tls =
	    ssl ? bufferevent_openssl_filter_new(c->l->base, c->cli, ssl, BUFFEREVENT_SSL_ACCEPTING,
						 BEV_OPT_CLOSE_ON_FREE)
		: NULL;

	if (!tls) {
		SSL_free(ssl);
		cb_net_conn_fail(c, 1, 502, 0x01, "%s", "out of memory");
		return -1;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
	c->cli = tls;
	c->cli_tls = 1;
	c->rw.host = c->bound;
	c->rw.target = c->name;
	c->rw.port = c->port;
	return 0;
}

static void tunnel_done(void *arg)
{
	cb_net_conn_close(arg);
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
		cb_net_conn_socks_answer(c, 0, 0);
	else {
		c->bytes_up += evbuffer_get_length(c->head);
		evbuffer_add_buffer(bufferevent_get_output(c->up), c->head);
	}
	if (c->bound && intercept_client(c) < 0)
		return;
	/* else the bufferevents relay: when no tunnel could be had, or to rewrite */
	if (!c->bound &&
	    cb_net_tunnel_new(&c->cli, &c->up, &c->l->pipes, tunnel_done, c, &c->tun) == 0)
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

/* The destination's side of an intercepted connection: TLS, its certificate verified, before
 * the sandbox is answered, so that a failure is a clear 502 rather than a broken handshake. */
static void intercept_upstream(struct pconn *c)
{
	struct timeval tv = {CB_NET_CONNECT_TIMEOUT, 0};
	SSL *ssl = cb_net_icpt_upstream(c->p->icpt, c->bound, c->name, c->port);
	struct bufferevent *tls =
	    ssl ? bufferevent_openssl_filter_new(c->l->base, c->up, ssl, BUFFEREVENT_SSL_CONNECTING,
						 BEV_OPT_CLOSE_ON_FREE)
		: NULL;

	bufferevent_set_timeouts(c->up, NULL, NULL); /* the TLS layer's own from now */
	if (!tls) {
		SSL_free(ssl);
		cb_net_conn_fail(c, 1, 502, 0x01, "%s", "upstream TLS: out of memory");
		return;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(tls, 1);
	c->up = tls;
	c->up_tls = 1;
	bufferevent_setcb(tls, NULL, NULL, cb_net_conn_connected, c);
	bufferevent_set_timeouts(tls, &tv, &tv);
	bufferevent_enable(tls, EV_READ | EV_WRITE);
}

void cb_net_conn_connected(struct bufferevent *bev, short what, void *arg)
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
		cb_net_conn_fail(c, 1, 502, 0x05, "upstream TLS: %s", why);
		return;
	}
	cb_net_conn_fail(c, 1, 502, 0x05, "%s",
			 what & BEV_EVENT_TIMEOUT
			     ? "connect: timed out"
			     : evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
}
