/* The vm backend's wire format between the daemon and the guest agent (backends/vm_agent.c),
 * over one virtio-serial port: length-prefixed binary frames, so output bytes travel as is. */
#ifndef COWBOX_VM_FRAME_H
#define COWBOX_VM_FRAME_H

#include <stddef.h>
#include <stdint.h>

/* A frame: u32 little-endian length of what follows (id + type + payload), u32 id (the
 * command it concerns; 0 for the agent itself), u8 type, payload. */
#define CB_VM_FRAME_HEAD 9
#define CB_VM_FRAME_MAX	 (1u << 20) /* the largest payload either side sends */

/* Host to guest. */
#define CB_VM_RUN                                                                                  \
	'R'		    /* payload: JSON {argv | shell, shell_program, env, cwd, timeout,      \
			   grace, output_limit, keep_bytes, stdin: "closed"|"stream"} */
#define CB_VM_STDIN	'I' /* payload: bytes for the command's stdin */
#define CB_VM_STDIN_END 'E' /* the command's stdin ends */
#define CB_VM_KILL	'K' /* payload: the signal, one byte */
#define CB_VM_POWEROFF	'Q' /* stop the guest (after ending every command) */

/* Guest to host. */
#define CB_VM_HELLO  'H' /* payload: JSON {kernel, uptime}: the agent is ready */
#define CB_VM_STDOUT 'O' /* payload: output bytes */
#define CB_VM_STDERR 'e'
#define CB_VM_EXIT                                                                                 \
	'X'		 /* payload: JSON {exit_code, term_signal, timed_out,                      \
			output_limited, oom_killed, duration}: the command's last frame */
#define CB_VM_FAILED 'F' /* payload: the message; the command did not start (last frame) */

/* host_url: a connection to 127.0.0.1:PORT in the guest becomes a stream over the port,
 * which the host connects to its own 127.0.0.1:PORT if host_url opened PORT. A stream's id
 * is the guest's (never reused), apart from the commands' ids (the type tells them apart).
 * Each side sends at most CB_VM_WINDOW bytes of a stream's data (and the host of a command's
 * stdin) that the other has not acknowledged, so a slow reader never stalls the port. */
#define CB_VM_WINDOW	(256u * 1024)
#define CB_VM_LISTEN	'L' /* host: listen on 127.0.0.1:id in the guest */
#define CB_VM_LISTENING 'l' /* guest: id the port; payload empty: it listens, else why not */
#define CB_VM_OPEN	'o' /* guest: id a new stream; payload: the port, u32 little-endian */
#define CB_VM_DATA	'd' /* either side: the stream's bytes */
#define CB_VM_ACK	'a' /* either side: u32 LE, bytes of the stream written out (credit) */
#define CB_VM_SHUT	's' /* either side: the sender read the end of its connection */
#define CB_VM_CLOSE	'c' /* either side: the stream is gone (refused, reset) */
#define CB_VM_STDIN_ACK 'i' /* guest: id a command; u32 LE, stdin bytes it took (credit) */

/* Little-endian u32 of a 4-byte payload (0 if it is not 4 bytes); and its encoding. */
uint32_t cb_vm_u32(const char *payload, size_t len);
void cb_vm_put_u32(unsigned char *p, uint32_t v);

/* Write a frame to fd, all of it (fd is blocking). Returns 0 or -errno. */
int cb_vm_frame_write(int fd, uint32_t id, uint8_t type, const void *payload, size_t len);

/* Read one frame from fd: *payload is malloc'ed (NUL-terminated, free it), *len its length.
 * Returns 0, -EPIPE at end of file, -EPROTO on a frame too large, or -errno. */
int cb_vm_frame_read(int fd, uint32_t *id, uint8_t *type, char **payload, size_t *len);

#endif
