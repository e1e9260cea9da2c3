/* The vm backend's streams (vm_stream.h): per-stream credit both ways, so one slow connection
 * holds at most CB_VM_WINDOW bytes on each side and never the agent's port itself. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "vm_frame.h"
#include "vm_stream.h"

#define VM_STREAM_CHUNK (64u * 1024)

/* See vm_stream.h. */
void vm_streams_init(struct vm_streams *t, vm_stream_send_fn send, void *arg)
{
	memset(t, 0, sizeof(*t));
	for (size_t i = 0; i < VM_STREAM_MAX; i++)
		t->s[i].fd = -1;
	t->send = send;
	t->arg = arg;
}

static struct vm_stream *stream_find(struct vm_streams *t, uint32_t id)
{
	for (size_t i = 0; id && i < VM_STREAM_MAX; i++)
		if (t->s[i].id == id)
			return &t->s[i];
	return NULL;
}

/* See vm_stream.h. */
struct vm_stream *vm_stream_add(struct vm_streams *t, uint32_t id, int fd)
{
	struct vm_stream *free_slot = NULL;

	for (size_t i = 0; i < VM_STREAM_MAX && id; i++) {
		if (t->s[i].id == id)
			break;
		if (!t->s[i].id && !free_slot)
			free_slot = &t->s[i];
	}
	if (!id || stream_find(t, id) || !free_slot || !(free_slot->buf = malloc(CB_VM_WINDOW))) {
		close(fd);
		return NULL;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	free_slot->id = id;
	free_slot->fd = fd;
	return free_slot;
}

/* See vm_stream.h. */
void vm_stream_drop(struct vm_streams *t, struct vm_stream *st, int tell)
{
	if (tell)
		t->send(t->arg, st->id, CB_VM_CLOSE, NULL, 0);
	if (st->fd >= 0)
		close(st->fd);
	free(st->buf);
	memset(st, 0, sizeof(*st));
	st->fd = -1;
}

/* See vm_stream.h. */
void vm_streams_close_all(struct vm_streams *t)
{
	for (size_t i = 0; i < VM_STREAM_MAX; i++)
		if (t->s[i].id)
			vm_stream_drop(t, &t->s[i], 0);
}

/* See vm_stream.h. */
size_t vm_streams_poll(struct vm_streams *t, struct pollfd *p, struct vm_stream **who)
{
	size_t n = 0;

	for (size_t i = 0; i < VM_STREAM_MAX; i++) {
		struct vm_stream *st = &t->s[i];
		short ev = 0;

		if (!st->id)
			continue;
		if (!st->rd_eof && st->unacked < CB_VM_WINDOW)
			ev |= POLLIN;
		if (st->off < st->len)
			ev |= POLLOUT;
		/* nothing to do: left out, or poll would say POLLHUP over and over */
		if (!ev)
			continue;
		who[n] = st;
		p[n++] = (struct pollfd){.fd = st->fd, .events = ev};
	}
	return n;
}

static void stream_ack(struct vm_streams *t, struct vm_stream *st)
{
	unsigned char b[4];

	cb_vm_put_u32(b, (uint32_t)st->to_ack);
	t->send(t->arg, st->id, CB_VM_ACK, b, sizeof(b));
	st->to_ack = 0;
}

/* Write what the other side sent; acknowledge it once a quarter of the window (or all of
 * it) is out, so the other side keeps sending while we write. -1: the stream went. */
static int stream_write(struct vm_streams *t, struct vm_stream *st)
{
	while (st->off < st->len) {
		ssize_t n = send(st->fd, st->buf + st->off, st->len - st->off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			vm_stream_drop(t, st, 1);
			return -1;
		}
		st->off += (size_t)n;
		st->to_ack += (size_t)n;
	}
	if (st->off == st->len)
		st->off = st->len = 0;
	if (st->to_ack && (st->to_ack >= CB_VM_WINDOW / 4 || !st->len))
		stream_ack(t, st);
	if (!st->len && st->wr_eof && !st->wr_shut) {
		shutdown(st->fd, SHUT_WR);
		st->wr_shut = 1;
	}
	return 0;
}

/* Both sides ended and everything is written: the stream goes (the other side, which has
 * seen both ends too, lets go of its own without a frame). */
static void stream_maybe_done(struct vm_streams *t, struct vm_stream *st)
{
	if (st->id && st->rd_eof && st->wr_shut)
		vm_stream_drop(t, st, 0);
}

/* See vm_stream.h. */
void vm_stream_io(struct vm_streams *t, struct vm_stream *st, short revents)
{
	char buf[VM_STREAM_CHUNK];

	if ((revents & POLLERR) && !(revents & POLLIN)) {
		vm_stream_drop(t, st, 1);
		return;
	}
	if ((revents & (POLLOUT | POLLHUP)) && st->off < st->len && stream_write(t, st) < 0)
		return;
	if ((revents & (POLLIN | POLLHUP)) && !st->rd_eof && st->unacked < CB_VM_WINDOW) {
		size_t room = CB_VM_WINDOW - st->unacked;
		ssize_t n = read(st->fd, buf, room < sizeof(buf) ? room : sizeof(buf));

		if (n > 0) {
			st->unacked += (size_t)n;
			t->send(t->arg, st->id, CB_VM_DATA, buf, (size_t)n);
		} else if (n == 0) {
			st->rd_eof = 1;
			t->send(t->arg, st->id, CB_VM_SHUT, NULL, 0);
		} else if (errno != EAGAIN && errno != EINTR) {
			vm_stream_drop(t, st, 1);
			return;
		}
	}
	stream_maybe_done(t, st);
}

/* See vm_stream.h. */
void vm_stream_frame(struct vm_streams *t, uint32_t id, uint8_t type, const char *buf, size_t len)
{
	struct vm_stream *st = stream_find(t, id);
	uint32_t acked;

	if (!st)
		return;
	switch (type) {
	case CB_VM_DATA:
		/* the sender's credit: what it may have sent and we not acknowledged */
		if (st->wr_eof || st->len - st->off + st->to_ack + len > CB_VM_WINDOW) {
			vm_stream_drop(t, st, 1);
			return;
		}
		if (st->off && st->len + len > CB_VM_WINDOW) {
			memmove(st->buf, st->buf + st->off, st->len - st->off);
			st->len -= st->off;
			st->off = 0;
		}
		memcpy(st->buf + st->len, buf, len);
		st->len += len;
		stream_write(t, st);
		break;
	case CB_VM_ACK:
		acked = cb_vm_u32(buf, len);
		st->unacked = acked > st->unacked ? 0 : st->unacked - acked;
		break;
	case CB_VM_SHUT:
		st->wr_eof = 1;
		if (stream_write(t, st) < 0)
			return;
		break;
	case CB_VM_CLOSE:
		vm_stream_drop(t, st, 0);
		return;
	default:
		return;
	}
	stream_maybe_done(t, st);
}
