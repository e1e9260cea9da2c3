/* Private to net/: a plain tunnel between two connected TCP sockets that moves bytes with
 * splice(2) through a pipe per direction, in the kernel, on the proxy's event loop. */
#ifndef COWBOX_NET_TUNNEL_H
#define COWBOX_NET_TUNNEL_H

#include <event2/event.h>
#include <stddef.h>

struct cb_net_tunnel;

/* What each end has still to receive before the spliced stream (the proxy's own answer, bytes
 * the head's parser had read past the request). */
struct cb_net_tunnel_pre {
	const void *to_up, *to_cli;
	size_t to_up_len, to_cli_len;
};

/* A tunnel between cli and up (non-blocking sockets, taken over: closed by
 * cb_net_tunnel_free, or left open on failure). The pre bytes are copied. An end's EOF is
 * passed on as a shutdown of the other's writing side once what came before it is written;
 * done(arg) is called on the loop's thread once both directions ended or either failed (then
 * free the tunnel). 0, or -errno (no pipe could be had, ENOMEM): the caller keeps the sockets
 * and relays another way. It may have written part of pre already only if it returns 0. */
int cb_net_tunnel_new(struct event_base *base, int cli, int up, const struct cb_net_tunnel_pre *pre,
		      void (*done)(void *arg), void *arg, struct cb_net_tunnel **out);

/* Bytes moved so far from the sandbox to the destination, and back (pre bytes not counted). */
void cb_net_tunnel_bytes(const struct cb_net_tunnel *t, unsigned long long *up,
			 unsigned long long *down);

/* Closes both sockets and the pipes; NULL is ignored. Never calls done. */
void cb_net_tunnel_free(struct cb_net_tunnel *t);

#endif
