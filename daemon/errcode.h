/* Private to daemon/: the protocol error code for an errno, from the one table of codes
 * (daemon/errcode.c); the other direction is cb_client_code_errno (cowbox/client.h). */
#ifndef COWBOX_DAEMON_ERRCODE_H
#define COWBOX_DAEMON_ERRCODE_H

/* The protocol error code for err (either sign): ENOENT -> not_found, EACCES -> access_denied,
 * EBUSY -> in_use, ...; any errno the table does not list is unavailable. */
const char *cb_daemon_error_code(int err);

#endif
