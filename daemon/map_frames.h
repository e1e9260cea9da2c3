/* The map of a turn, or the changes since a client's turn, as the snapshot op sends them:
 * one object in the reply, or streamed frames (JSON text, columns or raw bytes). */
#ifndef COWBOX_DAEMON_MAP_FRAMES_H
#define COWBOX_DAEMON_MAP_FRAMES_H

#include <jansson.h>
#include <stddef.h>

#include "cowbox/turns.h"

struct cb_daemon_conn;

/* Where the rows of a whole map (or of the changes since a client's turn) go: one object, or
 * frames of 2048 rows each when the client streams (it applies or writes them out as
 * they come, and the daemon never holds them all). A streamed whole map is written as JSON
 * text straight into one buffer per frame (no object per row: 100k rows of jansson cost
 * more than the rest of the snapshot). */
struct cb_daemon_map_out {
	json_t *files;
	json_t *deleted;	     /* a delta: the paths that are no regular file any more */
	struct cb_daemon_conn *conn; /* streaming: frames go here */
	json_t *id;
	long long turn;
	size_t rows;
	char *text; /* the streamed whole map's frame being written */
	size_t len, cap;
	char *head;	    /* its opening: {"id":...,"stream":"files","turn":N,"files":{ */
	size_t frame_bytes; /* > 0: the client's budget per whole-map frame, not 2048 rows */
	/* map_form "columns": a frame's paths and hashes as two strings ("paths", joined by
	 * "//", which no path holds; "sha256", joined by spaces), which a client splits into a
	 * dict faster than its JSON reader builds one; the hashes gather here meanwhile. */
	int columns;
	/* map_form "raw": the same two columns as bytes after the frame's line (the paths as
	 * they are, joined by NUL; the hashes joined by spaces), which a client takes without
	 * its JSON reader scanning 8 MB of text; the paths gather in text. */
	int raw;
	char *hashes;
	size_t hlen, hcap;
};

/* The most a client may ask a whole-map frame to hold: its line buffer must take it. */
#define FRAME_BYTES_MAX (48u << 20)

/* Add a regular file's row of a whole map (a cb_ws_map_list callback; arg is the map_out):
 * into o->files, or into the frame being written, sent once it is due. */
int cb_daemon_map_file(const struct cb_entry *e, void *arg);
/* Add a change since the client's turn (now NULL: deleted; a cb_ws_map_changes callback). */
int cb_daemon_map_change(const char *path, const struct cb_entry *now, void *arg);
/* Send the frame being written, if it holds a row (nothing when not streaming). */
int cb_daemon_map_flush(struct cb_daemon_map_out *o);

#endif
