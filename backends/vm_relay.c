/* The vm backend's relay: one thread multiplexes the commands of a workspace's VM over the
 * agent's one port, between the guest and each command's host client process. */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "vm.h"
#include "vm_frame.h"

int vm_relay_send(struct vm_state *s, uint32_t id, uint8_t type, const void *buf, size_t len)
{
	int rc;

	pthread_mutex_lock(&s->wlock);
	rc = cb_vm_frame_write(s->agent_fd, id, type, buf, len);
	pthread_mutex_unlock(&s->wlock);
	return rc;
}

void vm_relay_wake(struct vm_state *s)
{
	char c = 1;

	if (write(s->wake[1], &c, 1) < 0) {
		/* full: the relay wakes anyway */
	}
}

static struct vm_cmd *relay_by_id(struct vm_state *s, uint32_t id)
{
	for (size_t i = 0; id && i < VM_MAX_RUNNING; i++)
		if (s->cmds[i].id == id)
			return &s->cmds[i];
	return NULL;
}

static struct vm_cmd *relay_by_handle(struct vm_state *s, struct cb_exec *h)
{
	for (size_t i = 0; h && i < VM_MAX_RUNNING; i++)
		if (s->cmds[i].id && s->cmds[i].h == h)
			return &s->cmds[i];
	return NULL;
}

/* A slot both sides are done with is free again. */
static void relay_release(struct vm_cmd *c)
{
	if (c->closed && c->waited) {
		free(c->run);
		memset(c, 0, sizeof(*c));
		c->fd = -1;
	}
}

/* The relay lets go of a client: a command the guest still runs (the client was killed: a
 * kill, the host's output cap or timeout) is killed in the guest too. Under s->lock. */
static void relay_close(struct vm_state *s, struct vm_cmd *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	if (c->connected && !c->exited && !c->failed && !s->dead) {
		char sig = SIGKILL;

		vm_relay_send(s, c->id, CB_VM_KILL, &sig, 1);
	}
	c->closed = 1;
	relay_release(c);
}

int vm_relay_reserve(struct vm_state *s, char *run, uint32_t *id)
{
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	if (s->dead || s->stopping) {
		rc = cb_error_set(ENXIO, "vm backend: the VM has stopped; the daemon stops, the "
					 "next use boots a new one");
		goto out;
	}
	for (size_t i = 0; i < VM_MAX_RUNNING; i++)
		if (!s->cmds[i].id) {
			struct vm_cmd *c = &s->cmds[i];

			memset(c, 0, sizeof(*c));
			c->fd = -1;
			if (!++s->next_id)
				++s->next_id;
			c->id = *id = s->next_id;
			c->run = run;
			run = NULL;
			goto out;
		}
	rc = cb_error_set(EBUSY, "vm backend: %d commands already run", VM_MAX_RUNNING);
out:
	pthread_mutex_unlock(&s->lock);
	free(run);
	return rc;
}

void vm_relay_started(struct vm_state *s, uint32_t id, struct cb_exec *h)
{
	struct vm_cmd *c;

	pthread_mutex_lock(&s->lock);
	if ((c = relay_by_id(s, id))) {
		c->h = h;
		if (!h) { /* no client will come */
			c->waited = 1;
			relay_close(s, c);
		}
	}
	pthread_mutex_unlock(&s->lock);
}

void vm_relay_kill(struct vm_state *s, struct cb_exec *h, int sig)
{
	struct vm_cmd *c;
	char b = (char)sig;

	pthread_mutex_lock(&s->lock);
	if ((c = relay_by_handle(s, h))) {
		c->killed = 1;
		if (!c->connected)
			c->pending_kill = sig;
		else if (!c->exited && !c->failed && !s->dead)
			vm_relay_send(s, c->id, CB_VM_KILL, &b, 1);
	}
	pthread_mutex_unlock(&s->lock);
	/* no client yet, or the VM is gone: the client itself goes (it then exits with no
	 * frame of the guest's) */
	if (c && (!c->connected || s->dead))
		cb_exec_kill(h, sig);
}

int vm_relay_finish(struct vm_state *s, struct cb_exec *h, struct vm_cmd *out)
{
	struct vm_cmd *c;
	int rc = -ENOENT;

	pthread_mutex_lock(&s->lock);
	if ((c = relay_by_handle(s, h))) {
		*out = *c;
		out->run = NULL;
		c->waited = 1;
		c->h = NULL;
		relay_release(c);
		rc = 0;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* The guest's exit frame, as the slot keeps it. */
static void relay_exit(struct vm_cmd *c, const char *payload)
{
	json_t *o = json_loads(payload, 0, NULL);

	c->exited = 1;
	c->exit_code = (int)json_integer_value(json_object_get(o, "exit_code"));
	c->term_signal = (int)json_integer_value(json_object_get(o, "term_signal"));
	c->timed_out = json_is_true(json_object_get(o, "timed_out"));
	c->output_limited = json_is_true(json_object_get(o, "output_limited"));
	c->oom_killed = json_is_true(json_object_get(o, "oom_killed"));
	json_decref(o);
}

/* One frame from the guest: to the command's client. -errno: the port broke. */
static int relay_from_guest(struct vm_state *s)
{
	uint32_t id;
	uint8_t type;
	char *buf = NULL;
	size_t len;
	struct vm_cmd *c;
	int rc = cb_vm_frame_read(s->agent_fd, &id, &type, &buf, &len);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	if (vm_forward_frame(s, id, type, buf, len)) {
		/* host_url's: a stream's or a listen's answer */
	} else if (type == CB_VM_STDIN_ACK) {
		uint32_t n = cb_vm_u32(buf, len);

		if ((c = relay_by_id(s, id)))
			c->stdin_unacked = n > c->stdin_unacked ? 0 : c->stdin_unacked - n;
	} else if ((c = relay_by_id(s, id)) && !c->closed) {
		if (type == CB_VM_EXIT)
			relay_exit(c, buf);
		else if (type == CB_VM_FAILED) {
			c->failed = 1;
			snprintf(c->msg, sizeof(c->msg), "%s", buf);
		}
		/* the guest drops the stdin of a command that ended: no ack will come for it */
		if (c->exited || c->failed)
			c->stdin_unacked = 0;
		/* a client that cannot take it is gone: it was killed */
		if (c->fd >= 0 && cb_vm_frame_write(c->fd, id, type, buf, len) < 0)
			relay_close(s, c);
	}
	pthread_mutex_unlock(&s->lock);
	free(buf);
	return 0;
}

/* A client connects: its id (4 bytes) names a reserved slot, whose run frame goes now. */
static void relay_accept(struct vm_state *s)
{
	int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	uint32_t id = 0;
	struct vm_cmd *c;
	struct timeval tv = {5, 0};

	if (fd < 0)
		return;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (recv(fd, &id, sizeof(id), MSG_WAITALL) != sizeof(id)) {
		close(fd);
		return;
	}
	tv.tv_sec = 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	pthread_mutex_lock(&s->lock);
	c = relay_by_id(s, id);
	if (!c || c->connected || c->closed || !c->run) {
		pthread_mutex_unlock(&s->lock);
		close(fd);
		return;
	}
	c->fd = fd;
	c->connected = 1;
	if (vm_relay_send(s, id, CB_VM_RUN, c->run, strlen(c->run)) < 0)
		s->dead = 1;
	free(c->run);
	c->run = NULL;
	if (c->pending_kill) {
		char sig = (char)c->pending_kill;

		vm_relay_send(s, id, CB_VM_KILL, &sig, 1);
	}
	pthread_mutex_unlock(&s->lock);
}

/* A frame from a client (its stdin, its end) goes to the guest under the command's id;
 * end of file closes the client. */
static void relay_from_client(struct vm_state *s, struct vm_cmd *c)
{
	uint32_t id;
	uint8_t type;
	char *buf = NULL;
	size_t len;

	if (cb_vm_frame_read(c->fd, &id, &type, &buf, &len) < 0 ||
	    (type != CB_VM_STDIN && type != CB_VM_STDIN_END))
		relay_close(s, c);
	else if (!s->dead) {
		/* within the guest's credit: relay_main reads no more of this client's stdin
		 * until the guest acknowledges some (its reader never blocks on a full pipe) */
		if (type == CB_VM_STDIN)
			c->stdin_unacked += len;
		vm_relay_send(s, c->id, type, buf, len);
	}
	free(buf);
}

static void *relay_main(void *arg)
{
	struct vm_state *s = arg;
	struct pollfd p[3 + VM_MAX_RUNNING + VM_STREAM_MAX];
	struct vm_cmd *who[3 + VM_MAX_RUNNING];
	struct vm_stream *swho[VM_STREAM_MAX];

	for (;;) {
		size_t n = 0, n_cmds;
		int stop;

		pthread_mutex_lock(&s->lock);
		stop = s->stopping;
		p[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
		p[n++] = (struct pollfd){.fd = s->dead ? -1 : s->agent_fd, .events = POLLIN};
		p[n++] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
		for (size_t i = 0; i < VM_MAX_RUNNING; i++)
			if (s->cmds[i].id && s->cmds[i].fd >= 0) {
				short ev = s->cmds[i].stdin_unacked < CB_VM_WINDOW ? POLLIN : 0;

				who[n] = &s->cmds[i];
				p[n++] = (struct pollfd){.fd = s->cmds[i].fd, .events = ev};
			}
		n_cmds = n;
		/* the VM is gone: every client ends (with no exit frame: -ENXIO to its caller),
		 * every stream and host_url's wait for a listen too */
		if (s->dead || stop) {
			for (size_t i = 3; i < n; i++)
				relay_close(s, who[i]);
			vm_streams_close_all(&s->streams);
			pthread_cond_broadcast(&s->port_cond);
		}
		n += vm_streams_poll(&s->streams, p + n, swho);
		pthread_mutex_unlock(&s->lock);
		if (stop)
			break;
		if (poll(p, s->dead ? 3 : n, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents) {
			char buf[64];

			if (read(s->wake[0], buf, sizeof(buf)) < 0) {
				/* nothing to drain */
			}
		}
		if (p[1].revents && relay_from_guest(s) < 0) {
			pthread_mutex_lock(&s->lock);
			s->dead = 1;
			pthread_mutex_unlock(&s->lock);
		}
		if (p[2].revents)
			relay_accept(s);
		pthread_mutex_lock(&s->lock);
		for (size_t i = 3; i < n_cmds && !s->dead; i++)
			if (p[i].revents && who[i]->fd == p[i].fd)
				relay_from_client(s, who[i]);
		pthread_mutex_unlock(&s->lock);
		/* streams are the relay thread's alone; one a guest frame dropped is skipped */
		for (size_t i = n_cmds; i < n && !s->dead; i++) {
			struct vm_stream *st = swho[i - n_cmds];

			if (p[i].revents && st->id && st->fd == p[i].fd)
				vm_stream_io(&s->streams, st, p[i].revents);
		}
	}
	return NULL;
}

int vm_relay_start(struct vm_state *s)
{
	if (pthread_create(&s->relay_thread, NULL, relay_main, s) != 0)
		return cb_error_set(EAGAIN, "vm backend: cannot start the relay thread");
	s->relay_started = 1;
	return 0;
}

void vm_relay_stop(struct vm_state *s)
{
	if (!s->relay_started)
		return;
	pthread_mutex_lock(&s->lock);
	s->stopping = 1;
	pthread_mutex_unlock(&s->lock);
	vm_relay_wake(s);
	pthread_join(s->relay_thread, NULL);
	s->relay_started = 0;
}
