/* The vm backend's host_url: the guest agent listens on 127.0.0.1:PORT in the VM, and each
 * connection there comes over the agent's port as a stream that the relay thread connects to
 * the host's 127.0.0.1:PORT, only for a port host_url opened (the guest's word is not taken). */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/net.h"
#include "vm.h"
#include "vm_frame.h"

#define VM_LISTEN_SECS 30 /* the guest's answer to a listen frame (TCG on a loaded host) */

static int forward_send(void *arg, uint32_t id, uint8_t type, const void *buf, size_t len)
{
	return vm_relay_send(arg, id, type, buf, len);
}

/* See vm.h. */
void vm_forward_init(struct vm_state *s)
{
	pthread_cond_init(&s->port_cond, NULL);
	vm_streams_init(&s->streams, forward_send, s);
}

/* See vm.h. */
void vm_forward_free(struct vm_state *s)
{
	vm_streams_close_all(&s->streams);
	pthread_cond_destroy(&s->port_cond);
	if (s->proxy_sock[0])
		unlink(s->proxy_sock);
}

static struct vm_port *forward_port(struct vm_state *s, int port)
{
	for (size_t i = 0; i < VM_MAX_PORTS; i++)
		if (s->ports[i].port == port)
			return &s->ports[i];
	return NULL;
}

/* Have the guest listen on 127.0.0.1:port for host_url (proxy: for the egress proxy). */
static int forward_listen(struct vm_state *s, int port, int proxy)
{
	struct vm_port *p;
	struct timespec end;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &end);
	end.tv_sec += VM_LISTEN_SECS;
	pthread_mutex_lock(&s->lock);
	if (!(p = forward_port(s, port))) {
		if (!(p = forward_port(s, 0))) {
			rc = cb_error_set(ENOSPC,
					  "host_url: %d ports are open already (the vm "
					  "backend's most)",
					  VM_MAX_PORTS);
			goto out;
		}
		p->port = port;
		p->proxy = proxy;
		p->state = VM_PORT_PENDING;
		p->err[0] = 0;
		if (s->dead || vm_relay_send(s, (uint32_t)port, CB_VM_LISTEN, NULL, 0) < 0)
			p->state = -ENXIO;
	}
	/* a second caller for the same port waits for the first one's answer */
	while (p->state == VM_PORT_PENDING && !s->dead)
		if (pthread_cond_timedwait(&s->port_cond, &s->lock, &end) == ETIMEDOUT)
			break;
	if (p->state == VM_PORT_OPEN && p->proxy != proxy) {
		rc = cb_error_set(EADDRINUSE,
				  "host_url: listen on 127.0.0.1:%d in the VM: the "
				  "egress proxy listens there",
				  port);
		goto out;
	}
	if (p->state == VM_PORT_OPEN)
		goto out;
	if (p->state == VM_PORT_PENDING)
		p->state = s->dead ? -ENXIO : -ETIMEDOUT;
	rc = cb_error_set(-p->state, "host_url: listen on 127.0.0.1:%d in the VM: %s", port,
			  p->err[0] ? p->err : strerror(-p->state));
	memset(p, 0, sizeof(*p));
out:
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* See vm.h. */
int vm_forward_listen(struct vm_state *s, int port)
{
	if (port < 1 || port > 65535)
		return cb_error_set(EINVAL, "host_url: port %d is not in 1-65535", port);
	return forward_listen(s, port, 0);
}

/* See vm.h. */
int vm_forward_proxy(struct cb_backend *b, struct vm_state *s)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, rc;

	snprintf(s->proxy_sock, sizeof(s->proxy_sock), "%s/proxy.sock", s->sockdir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->proxy_sock);
	unlink(sa.sun_path);
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
		rc = cb_error_set(errno, "network %s: the egress proxy's socket %s: %s",
				  cb_backend_net_name(b->opt.net), sa.sun_path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	if ((rc = cb_backend_proxy_serve(b, fd)) < 0)
		return rc;
	return forward_listen(s, CB_NET_PROXY_PORT, 1);
}

/* A socket connecting (non-blocking) to where the guest's connection to p goes: the host's
 * 127.0.0.1 and the same port, or the egress proxy's socket. -1 when it fails at once. */
static int forward_connect(struct vm_state *s, const struct vm_port *p)
{
	struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	struct sockaddr *sa = (struct sockaddr *)&in;
	socklen_t len = sizeof(in);
	int fd;

	in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (p->proxy) {
		snprintf(un.sun_path, sizeof(un.sun_path), "%s", s->proxy_sock);
		sa = (struct sockaddr *)&un;
		len = sizeof(un);
	}
	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd >= 0 && connect(fd, sa, len) < 0 && errno != EINPROGRESS) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* The guest connected to 127.0.0.1:port in the VM: the host's same port, if it is open. */
static void forward_open(struct vm_state *s, uint32_t id, uint32_t port)
{
	struct vm_port *p = port && port <= 65535 ? forward_port(s, (int)port) : NULL;
	int fd = -1;

	/* the port is checked here, not taken from the guest: a guest that sends an open for a
	 * port host_url did not open is refused like a connection nothing listens for */
	if (!p || p->state != VM_PORT_OPEN || (fd = forward_connect(s, p)) < 0) {
		if (fd >= 0)
			close(fd);
		vm_relay_send(s, id, CB_VM_CLOSE, NULL, 0);
		return;
	}
	/* a connection not yet made says so as the socket's error, which drops the stream */
	if (!vm_stream_add(&s->streams, id, fd))
		vm_relay_send(s, id, CB_VM_CLOSE, NULL, 0);
}

/* See vm.h. */
int vm_forward_frame(struct vm_state *s, uint32_t id, uint8_t type, const char *buf, size_t len)
{
	struct vm_port *p;

	switch (type) {
	case CB_VM_LISTENING:
		if (id <= 65535 && (p = forward_port(s, (int)id)) && p->state == VM_PORT_PENDING) {
			char *end;
			long err = len ? strtol(buf, &end, 10) : 0;

			if (len && (err <= 0 || err > 4095))
				err = EIO;
			else if (len)
				snprintf(p->err, sizeof(p->err), "%s", *end == ' ' ? end + 1 : end);
			p->state = len ? -(int)err : VM_PORT_OPEN;
			pthread_cond_broadcast(&s->port_cond);
		}
		return 1;
	case CB_VM_OPEN:
		forward_open(s, id, cb_vm_u32(buf, len));
		return 1;
	case CB_VM_DATA:
	case CB_VM_ACK:
	case CB_VM_SHUT:
	case CB_VM_CLOSE:
		vm_stream_frame(&s->streams, id, type, buf, len);
		return 1;
	default:
		return 0;
	}
}
