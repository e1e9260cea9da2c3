/* Private to the API ops (daemon/ops_api.c, daemon/ops_files.c): the workspace's backend as
 * this daemon holds it, and base64 for the binary-safe fields of the protocol. */
#ifndef COWBOX_DAEMON_API_H
#define COWBOX_DAEMON_API_H

#include <stddef.h>

#include "cowbox/backend.h"
#include "daemon.h"

/* The daemon's backend, opened on first use from backend.json, with a reference for the
 * caller to drop with cb_api_backend_put (b may be NULL). When create is set its resources
 * are made too (cb_backend_ensure); on failure nothing is held. */
int cb_api_backend(struct cb_daemon *d, int create, struct cb_backend **out);

/* info's "published": the ports publish opened ([{port, host_port, address}]), when the
 * backend is open (daemon/ops_net.c). */
void cb_daemon_publish_info(struct cb_daemon *d, json_t *r);
void cb_api_backend_put(struct cb_daemon *d, struct cb_backend *b);

/* Replace the backend's options (configure op): refused with -EBUSY once it was created. */
int cb_api_configure(struct cb_daemon *d, json_t *options);

/* The egress proxy's record hook (daemon/netlog_queue.c): arg is the daemon; the row goes to
 * the network log under the turn open now, written by the log's own thread (started on the
 * first row). flush returns once every row recorded before it is in the database; stop
 * writes what is left and ends the thread (before the database closes): rows recorded later
 * are written by the caller's thread. */
struct cb_net_record;
void cb_daemon_net_record(void *arg, const struct cb_net_record *r);
void cb_daemon_net_flush(void);
void cb_daemon_net_stop(void);
/* The network log's rows of the turns after < turn <= upto (upto < 0: up to now) as a new JSON
 * array (net_log's form), for net_log and diff's "network". */
int cb_daemon_net_rows(struct cb_daemon *d, long long after, long long upto, json_t **out);

/* Close the backend (forwarders, the container) once no command of the API runs; later
 * cb_api_backend calls fail with -ESHUTDOWN. */
void cb_api_backend_release(struct cb_daemon *d);

/* Base64 (RFC 4648, padded). The encoder returns a new JSON string; the decoder a malloc'd
 * buffer, or -EINVAL naming field when s is not base64. */
json_t *cb_api_b64_json(const void *data, size_t len);
int cb_api_b64_decode(const char *field, const char *s, void **out, size_t *len);

#endif
