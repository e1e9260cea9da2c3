/* The guest agent's side of host_url's streams and of the commands' stdin: a thread that owns
 * the listeners and the streams, and a pump per command; the agent's reader only hands over. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/exec.h"
#include "vm.h"
#include "vm_frame.h"

/* A frame the reader handed over, in order. */
struct io_msg {
	uint32_t id;
	uint8_t type;
	char *buf;
	size_t len;
	struct io_msg *next;
};

static pthread_once_t io_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t io_lock = PTHREAD_MUTEX_INITIALIZER;
static struct io_msg *io_head, **io_tail = &io_head;
static int io_wake[2] = {-1, -1};
static int io_started;
/* the thread's own */
static struct vm_streams io_streams;
static struct {
	int port, fd;
} io_listen[VM_MAX_PORTS];
static uint32_t io_next_id;

static int io_send(void *arg, uint32_t id, uint8_t type, const void *buf, size_t len)
{
	(void)arg;
	return vm_agent_send(id, type, buf, len);
}

/* Listen on 127.0.0.1:port (once) and answer the host: empty, or "ERRNO message". */
static void io_listen_port(uint32_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	char msg[200] = "";
	int fd = -1, one = 1, slot = -1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < VM_MAX_PORTS; i++) {
		if (io_listen[i].fd >= 0 && io_listen[i].port == (int)port)
			goto out; /* listening already */
		if (io_listen[i].fd < 0 && slot < 0)
			slot = i;
	}
	if (!port || port > 65535 || slot < 0) {
		snprintf(msg, sizeof(msg), "%d %s", EINVAL, "no such port, or too many");
		goto out;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
		snprintf(msg, sizeof(msg), "%d %s", errno, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	io_listen[slot].port = (int)port;
	io_listen[slot].fd = fd;
out:
	vm_agent_send(port, CB_VM_LISTENING, msg, strlen(msg));
}

/* A connection on a listener: a new stream, announced to the host before any of its data. */
static void io_accept(int i)
{
	int fd = accept4(io_listen[i].fd, NULL, NULL, SOCK_CLOEXEC);
	unsigned char port[4];

	if (fd < 0)
		return;
	if (!++io_next_id)
		++io_next_id;
	/* a full table closes the connection: the program sees a reset, as with no listener */
	if (!vm_stream_add(&io_streams, io_next_id, fd))
		return;
	cb_vm_put_u32(port, (uint32_t)io_listen[i].port);
	vm_agent_send(io_next_id, CB_VM_OPEN, port, sizeof(port));
}

static void io_drain(void)
{
	struct io_msg *m, *next;

	pthread_mutex_lock(&io_lock);
	m = io_head;
	io_head = NULL;
	io_tail = &io_head;
	pthread_mutex_unlock(&io_lock);
	for (; m; m = next) {
		next = m->next;
		if (m->type == CB_VM_LISTEN)
			io_listen_port(m->id);
		else
			vm_stream_frame(&io_streams, m->id, m->type, m->buf, m->len);
		free(m->buf);
		free(m);
	}
}

static void *io_main(void *arg)
{
	struct pollfd p[1 + VM_MAX_PORTS + VM_STREAM_MAX];
	int lidx[1 + VM_MAX_PORTS];
	struct vm_stream *who[VM_STREAM_MAX];

	(void)arg;
	for (;;) {
		size_t n = 0, n_listen;

		io_drain();
		p[n++] = (struct pollfd){.fd = io_wake[0], .events = POLLIN};
		for (int i = 0; i < VM_MAX_PORTS; i++)
			if (io_listen[i].fd >= 0) {
				lidx[n] = i;
				p[n++] = (struct pollfd){.fd = io_listen[i].fd, .events = POLLIN};
			}
		n_listen = n;
		n += vm_streams_poll(&io_streams, p + n, who);
		if (poll(p, n, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			char b[64];

			if (read(io_wake[0], b, sizeof(b)) < 0) {
				/* nothing to drain */
			}
		}
		for (size_t i = 1; i < n_listen; i++)
			if (p[i].revents)
				io_accept(lidx[i]);
		for (size_t i = n_listen; i < n; i++)
			if (p[i].revents && who[i - n_listen]->id &&
			    who[i - n_listen]->fd == p[i].fd)
				vm_stream_io(&io_streams, who[i - n_listen], p[i].revents);
	}
	return NULL;
}

static void io_start(void)
{
	pthread_t t;

	for (int i = 0; i < VM_MAX_PORTS; i++)
		io_listen[i].fd = -1;
	vm_streams_init(&io_streams, io_send, NULL);
	if (pipe2(io_wake, O_CLOEXEC | O_NONBLOCK) < 0)
		return;
	if (pthread_create(&t, NULL, io_main, NULL) == 0) {
		pthread_detach(t);
		io_started = 1;
	}
}

/* See vm.h. */
void vm_agent_io_frame(uint32_t id, uint8_t type, char *buf, size_t len)
{
	struct io_msg *m;
	char c = 1;

	pthread_once(&io_once, io_start);
	if (!io_started || !(m = calloc(1, sizeof(*m)))) {
		if (type == CB_VM_LISTEN)
			vm_agent_send(id, CB_VM_LISTENING, "12 no stream thread", 19);
		free(buf);
		return;
	}
	*m = (struct io_msg){.id = id, .type = type, .buf = buf, .len = len};
	pthread_mutex_lock(&io_lock);
	*io_tail = m;
	io_tail = &m->next;
	pthread_mutex_unlock(&io_lock);
	if (write(io_wake[1], &c, 1) < 0) {
		/* full: the thread wakes anyway */
	}
}

/* --- stdin pumps ---------------------------------------------------------------------- */

struct vm_pump {
	pthread_mutex_t m;
	pthread_cond_t c;
	struct cb_exec *exec;
	uint32_t id;
	char *buf; /* queued stdin, at most the host's credit (CB_VM_WINDOW) and a frame */
	size_t len;
	int end, closed, quit;
	int refs; /* the job's and the thread's */
};

static void pump_unref(struct vm_pump *p, int free_exec)
{
	int last;

	pthread_mutex_lock(&p->m);
	last = --p->refs == 0;
	pthread_mutex_unlock(&p->m);
	if (!last)
		return;
	if (free_exec)
		cb_exec_free(p->exec);
	free(p->buf);
	pthread_mutex_destroy(&p->m);
	pthread_cond_destroy(&p->c);
	free(p);
}

static void *pump_main(void *arg)
{
	struct vm_pump *p = arg;

	pthread_mutex_lock(&p->m);
	for (;;) {
		while (!p->len && !(p->end && !p->closed) && !p->quit)
			pthread_cond_wait(&p->c, &p->m);
		if (p->len) {
			char *b = p->buf;
			size_t n = p->len;
			int quit = p->quit;
			unsigned char ack[4];

			p->buf = NULL;
			p->len = 0;
			pthread_mutex_unlock(&p->m);
			if (!quit)
				cb_exec_stdin_write(p->exec, b, n);
			free(b);
			/* taken (or dropped): the host may send as much again */
			cb_vm_put_u32(ack, (uint32_t)n);
			vm_agent_send(p->id, CB_VM_STDIN_ACK, ack, sizeof(ack));
			pthread_mutex_lock(&p->m);
		} else if (p->end && !p->closed) {
			p->closed = 1;
			pthread_mutex_unlock(&p->m);
			cb_exec_stdin_close(p->exec);
			pthread_mutex_lock(&p->m);
		} else {
			break; /* quit, nothing queued */
		}
	}
	pthread_mutex_unlock(&p->m);
	/* the job let go first: the exec is ours to free */
	pump_unref(p, 1);
	return NULL;
}

/* See vm.h. */
struct vm_pump *vm_pump_new(struct cb_exec *exec, uint32_t id)
{
	struct vm_pump *p = calloc(1, sizeof(*p));
	pthread_t t;

	if (!p)
		return NULL;
	pthread_mutex_init(&p->m, NULL);
	pthread_cond_init(&p->c, NULL);
	p->exec = exec;
	p->id = id;
	p->refs = 2;
	if (pthread_create(&t, NULL, pump_main, p) != 0) {
		pthread_mutex_destroy(&p->m);
		pthread_cond_destroy(&p->c);
		free(p);
		return NULL;
	}
	pthread_detach(t);
	return p;
}

/* See vm.h. */
void vm_pump_push(struct vm_pump *p, const void *buf, size_t len)
{
	char *nb;

	pthread_mutex_lock(&p->m);
	if (!p->end && !p->quit && len && (nb = realloc(p->buf, p->len + len))) {
		memcpy(nb + p->len, buf, len);
		p->buf = nb;
		p->len += len;
		pthread_cond_signal(&p->c);
	}
	pthread_mutex_unlock(&p->m);
}

/* See vm.h. */
void vm_pump_end(struct vm_pump *p)
{
	pthread_mutex_lock(&p->m);
	p->end = 1;
	pthread_cond_signal(&p->c);
	pthread_mutex_unlock(&p->m);
}

/* See vm.h. */
int vm_pump_release(struct vm_pump *p)
{
	int last;

	pthread_mutex_lock(&p->m);
	p->quit = 1;
	pthread_cond_signal(&p->c);
	last = --p->refs == 0;
	pthread_mutex_unlock(&p->m);
	/* the thread is gone: the exec is the caller's; else the thread frees it as it goes */
	if (last) {
		free(p->buf);
		pthread_mutex_destroy(&p->m);
		pthread_cond_destroy(&p->c);
		free(p);
	}
	return last;
}
