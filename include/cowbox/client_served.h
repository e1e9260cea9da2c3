/* Internal (not installed): the client side's fast route to a workspace found served
 * (cowbox/workspace_fast.h), for the CLI's `cowbox exec REF`. */
#ifndef COWBOX_CLIENT_SERVED_H
#define COWBOX_CLIENT_SERVED_H

#include "cowbox/client.h"

/* cb_daemon_connect for a ref (never a name) without looking at its database: a served
 * workspace's daemon answers even while its meta.db is unreadable. */
int cb_daemon_connect_ref(const char *ref, struct cb_client **out);

#endif
