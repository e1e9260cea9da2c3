/* Private to net/: a plain tunnel between two connected TCP sockets that moves bytes with
 * splice(2) through a pipe per direction, in the kernel, on the proxy's event loop. */
#ifndef COWBOX_NET_TUNNEL_H
#define COWBOX_NET_TUNNEL_H

#include <event2/bufferevent.h>
#include <stddef.h>

struct cb_net_tunnel;

/* A tunnel between the sockets of two connected socket bufferevents, which it takes over:
 * on 0 they are freed (*cli and *up set to NULL) and what their buffers held goes first (the
 * answer queued for the sandbox, a request head queued for the destination, bytes either had
 * read ahead). An end's EOF is passed on as a shutdown of the other's writing side once what
 * came before it is written; done(arg) is called from the loop (never from here) once both
 * directions ended or either failed, and frees the tunnel (closing the sockets). -errno when
 * no pipe or memory could be had: the bufferevents are kept and still relay correctly (bytes
 * read ahead then queued on the other's output). */
int cb_net_tunnel_new(struct bufferevent **cli, struct bufferevent **up, void (*done)(void *arg),
		      void *arg, struct cb_net_tunnel **out);

/* Bytes from the sandbox to the destination, and back, read ahead ones included (not what
 * the proxy itself had queued). */
void cb_net_tunnel_bytes(const struct cb_net_tunnel *t, unsigned long long *up,
			 unsigned long long *down);

/* Closes both sockets and the pipes; NULL is ignored. Never calls done. */
void cb_net_tunnel_free(struct cb_net_tunnel *t);

#endif
