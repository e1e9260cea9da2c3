/* The client side of a workspace daemon's control socket (JSON lines): connecting, requests
 * and replies, and starting the daemon on first use. */
#ifndef COWBOX_CLIENT_H
#define COWBOX_CLIENT_H

#include <jansson.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cb_client;

/* Connect to the running daemon of ref (a ref or name) and read its hello. -ECONNREFUSED or
 * -ENOENT with a message when no daemon serves it. */
int cb_daemon_connect(const char *ref, struct cb_client **out);

/* The daemon's pid, from its hello. */
pid_t cb_client_daemon_pid(const struct cb_client *c);

/* Send one request line; msg is consumed. If it has no "id", a fresh integer id is set and
 * returned in *id (id may be NULL). */
int cb_client_send(struct cb_client *c, json_t *msg, long long *id);

/* The next line from the daemon (a reply, a stream frame or an error) into *msg, waiting at
 * most timeout_ms (< 0: forever). -ETIMEDOUT, or -ECONNRESET once the daemon hung up. */
int cb_client_recv(struct cb_client *c, int timeout_ms, json_t **msg);

/* The next line from the daemon as it came, without its newline and NUL-terminated in place,
 * for a reader that parses a large frame itself instead of building a JSON object of it
 * (the CLI's whole map). *line stays valid, and may be changed in place, until the next
 * receive on c. Errors as cb_client_recv. */
int cb_client_recv_line(struct cb_client *c, int timeout_ms, char **line, size_t *len);

/* Send req (consumed) and wait for its final reply, skipping stream frames. On an error
 * reply, returns -errno with the daemon's message and code set ("info: not_found: ..."); on
 * success *reply (if not NULL) is the reply object, which the caller frees. */
int cb_client_request(struct cb_client *c, json_t *req, int timeout_ms, json_t **reply);

/* The errno that stands for a protocol error code (not_found -> ENOENT, invalid_path -> EINVAL,
 * access_denied -> EACCES, in_use -> EBUSY, timeout -> ETIMEDOUT, output_limit -> EFBIG,
 * invalid_request -> EPROTO, conflict -> EEXIST, unavailable -> EAGAIN: daemon/errcode.c's
 * table); EIO for a code this library does not know or NULL. */
int cb_client_code_errno(const char *code);

/* Hang up; NULL is accepted. */
void cb_client_close(struct cb_client *c);

/* Make sure a daemon serves ref, starting `cowbox serve` in the background when none does,
 * and return once its socket answers and its mount point is a FUSE mount. mountpoint NULL
 * means the workspace's default (or wherever it is already mounted). Errors name daemon.log.
 * *pid (may be NULL) is the daemon's pid. */
int cb_daemon_ensure(const char *ref, const char *mountpoint, int timeout_ms, pid_t *pid);

/* Ask the daemon of ref to unmount and exit, and wait until it has; 0 if none was running. */
int cb_daemon_stop(const char *ref, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif
