/* libcowbox's network calls on a box: whether its policy opens a destination (reaches), what
 * its egress proxy did (the network log), and published ports (a sandbox server on the host). */
#ifndef COWBOX_BOX_NET_H
#define COWBOX_BOX_NET_H

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cb_box;

/* Whether the workspace's network policy opens dest ("host[:port]", 443 when no port is
 * given, "[v6]:port"): 1 opened, 0 not, -errno on failure (-EPROTO for a malformed dest,
 * code invalid_request). *rule (if not NULL) gets the rule that decided, malloc'd ("public",
 * an allow entry as written, why nothing opened it, or "network MODE" outside public and
 * allow). Names are not resolved: the proxy still refuses an allowed name at a private
 * address. */
int cb_box_reaches(struct cb_box *box, const char *dest, char **rule);

/* The network log's rows (a new JSON array, oldest first; the fields of protocol.md
 * "net_log"): every connection the egress proxy let through or refused, of turn, or of every
 * turn when turn <= 0. Returns the number of rows or -errno. */
int cb_box_net_log(struct cb_box *box, long long turn, json_t **rows);

/* A host address, "127.0.0.1:HOSTPORT" (malloc'd), that reaches a server listening on
 * 127.0.0.1:port inside the sandbox (ns, docker; -EOPNOTSUPP under network host and the local
 * backend); the same address again for a port already published. It stays open until
 * cb_box_unpublish or the workspace's daemon stops. */
int cb_box_publish(struct cb_box *box, int port, char **address);

/* Close a published port and its connections; -ENOENT (not_found) if it was not published. */
int cb_box_unpublish(struct cb_box *box, int port);

#ifdef __cplusplus
}
#endif

#endif
