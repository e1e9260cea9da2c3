/* The exec path's cheap look-up of a served workspace (ws/resolve_fast.c): from the directory
 * layout, the lock and the mount table alone, without opening meta.db or the socket. */
#ifndef COWBOX_WORKSPACE_FAST_H
#define COWBOX_WORKSPACE_FAST_H

#include "cowbox/workspace.h"

/* For a REF or NAME whose daemon is serving right now: 1, with ref filled, *mountpoint the
 * live FUSE mount (malloc'd) and *name the workspace's name (malloc'd; the ref when it has
 * none). 0 when that cannot be shown cheaply (bad syntax, unknown name, no workspace, no
 * daemon, daemon starting or dead): the caller then takes the full route (cb_ws_resolve,
 * cb_daemon_ensure), which also gives the proper error. -ENOMEM with a message. */
int cb_ws_find_served(const char *ref_or_name, char ref[CB_WS_REF_LEN + 1], char **mountpoint,
		      char **name);

#endif
