/* Private to net/: a plain tunnel between two connected TCP sockets that moves bytes with
 * splice(2) through a pipe per direction, in the kernel, on the proxy's event loop. */
#ifndef COWBOX_NET_TUNNEL_H
#define COWBOX_NET_TUNNEL_H

#include <event2/bufferevent.h>
#include <stddef.h>

struct cb_net_tunnel;

/* Empty pipes kept between tunnels, to spare each connection two pipe2 calls, their fcntl and
 * four closes; used on the loop's thread only. Zeroed is empty. */
#define CB_NET_PIPES_MAX 32
struct cb_net_pipes {
	size_t n;
	struct {
		int fd[2];
		size_t size;
	} p[CB_NET_PIPES_MAX];
};
/* Closes all but keep of the pipes kept (the proxy keeps one connection's two while idle, so that a
 * burst's pipes do not stay open after it). */
void cb_net_pipes_trim(struct cb_net_pipes *pool, size_t keep);

/* A tunnel between the sockets of two connected socket bufferevents, which it takes over:
 * on 0 they are freed (*cli and *up set to NULL) and what their buffers held goes first (the
 * answer queued for the sandbox, a request head queued for the destination, bytes either had
 * read ahead). An end's EOF is passed on as a shutdown of the other's writing side once what
 * came before it is written; done(arg) is called from the loop (never from here) once both
 * directions ended or either failed, and frees the tunnel (closing the sockets; its pipes go
 * back to pool, which may be NULL, when empty). -errno when
 * no pipe or memory could be had: the bufferevents are kept and still relay correctly (bytes
 * read ahead then queued on the other's output). */
int cb_net_tunnel_new(struct bufferevent **cli, struct bufferevent **up, struct cb_net_pipes *pool,
		      void (*done)(void *arg), void *arg, struct cb_net_tunnel **out);

/* Bytes from the sandbox to the destination, and back, read ahead ones included (not what
 * the proxy itself had queued). */
void cb_net_tunnel_bytes(const struct cb_net_tunnel *t, unsigned long long *up,
			 unsigned long long *down);

/* Closes both sockets and the pipes; NULL is ignored. Never calls done. */
void cb_net_tunnel_free(struct cb_net_tunnel *t);

#endif
