/* The vm backend's streams (host_url's connections over the agent's port), shared by the
 * daemon's relay thread and the guest agent: one thread owns a table and polls its sockets. */
#ifndef COWBOX_VM_STREAM_H
#define COWBOX_VM_STREAM_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define VM_STREAM_MAX 64 /* connections at once, per VM; more are refused */

/* Send one frame to the other side (blocking; the other side's reader never blocks). */
typedef int (*vm_stream_send_fn)(void *arg, uint32_t id, uint8_t type, const void *buf, size_t len);

struct vm_stream {
	uint32_t id; /* 0: a free slot */
	int fd;	     /* the connection, non-blocking */
	char *buf;   /* the other side's bytes not yet written to fd */
	size_t off, len;
	size_t unacked; /* our bytes the other side has not acknowledged (<= CB_VM_WINDOW) */
	size_t to_ack;	/* bytes written to fd and not yet acknowledged */
	int rd_eof;	/* fd gave end of file: the shut frame went */
	int wr_eof;	/* the other side's shut frame came: shut fd down once buf drains */
	int wr_shut;
};

struct vm_streams {
	struct vm_stream s[VM_STREAM_MAX];
	vm_stream_send_fn send;
	void *arg;
};

/* An empty table whose frames go through send(arg, ...). */
void vm_streams_init(struct vm_streams *t, vm_stream_send_fn send, void *arg);
/* A stream id over fd (made non-blocking; the table owns it from now on); NULL when the
 * table is full or id is taken (fd is then closed). */
struct vm_stream *vm_stream_add(struct vm_streams *t, uint32_t id, int fd);
/* Forget a stream and close its connection; tell: send a close frame for it first. */
void vm_stream_drop(struct vm_streams *t, struct vm_stream *st, int tell);
/* Close every stream, telling the other side nothing (the port is gone or going). */
void vm_streams_close_all(struct vm_streams *t);
/* Fill p/who (room for VM_STREAM_MAX) with the sockets that have something to do; returns
 * how many. A socket out of credit and with nothing to write is left out. */
size_t vm_streams_poll(struct vm_streams *t, struct pollfd *p, struct vm_stream **who);
/* Act on what poll said of st's socket: read within the credit (data frames), write what the
 * other side sent (acknowledged), end of file both ways; a stream both sides ended goes. */
void vm_stream_io(struct vm_streams *t, struct vm_stream *st, short revents);
/* A data, ack, shut or close frame of the other side's; a frame that breaks the credit (more
 * data than acknowledged room) drops the stream. Frames for an unknown id are ignored. */
void vm_stream_frame(struct vm_streams *t, uint32_t id, uint8_t type, const char *buf, size_t len);

#endif
