/* Private to libcowbox's high-level API (daemon/box.c, daemon/box_run.c): the box itself and
 * the request plumbing both halves share. */
#ifndef COWBOX_DAEMON_BOX_PRIVATE_H
#define COWBOX_DAEMON_BOX_PRIVATE_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

#include "cowbox/box.h"
#include "cowbox/workspace.h"

struct cb_client;

struct cb_box {
	char ref[CB_WS_REF_LEN + 1];
	char *mountpoint, *workdir, *backend;
	char *working_dir; /* the option, for the direct path of read and write (NULL: none) */
	struct cb_client *client; /* NULL until the first request, or after the daemon left */
	pid_t daemon_pid;	  /* the daemon last seen serving it (maybe our child) */
	int access;		  /* the level its connections were lowered to; -1: as served */
	int level;		  /* the level the daemon last said this box has */
	/* The map of the last snapshot (NULL: none yet), its turn and its database's id:
	 * the next snapshot asks only for what changed since. */
	json_t *map;
	long long map_turn;
	char map_id[17];
};

/* 0 when box may do what needs level (cowbox/access.h), else -EACCES (access_denied) naming
 * what; for what the client does itself (exec's own connection, read/write by the mount). */
int cb_box_access_need(struct cb_box *box, int level, const char *what);

/* Record code as the thread's last error code ("" or NULL: none). */
void cb_box_set_code(const char *code);

/* rc unchanged; on failure with no code recorded yet, the code matching rc's errno. */
int cb_box_finish(int rc);

/* The -errno of an error reply (msg has "error"), with its code recorded and a message
 * "what: code: message"; *result (if not NULL) gets the error's "result" object, if any. */
int cb_box_reply_error(const char *what, json_t *msg, json_t **result);

/* Send req (consumed) over box's connection, booting the daemon if needed and retrying
 * once on a fresh one if the old daemon had gone before the send (never after: it may have
 * acted); *reply is the final reply, and on an error reply *result its "result" (both may
 * be NULL). */
int cb_box_request(struct cb_box *box, const char *what, json_t *req, json_t **reply,
		   json_t **result);

/* The ops that take a port (host_url, publish, unpublish): send {"op": op, "port": port} and,
 * with field set, put a copy of the reply's string field in *out (the caller frees it).
 * 0 or -errno, with the box's last code set. */
int cb_box_port_op(struct cb_box *box, const char *op, int port, const char *field, char **out);

/* Wait for the final reply to one of the n ids on c (replies may come in any order), skipping
 * stream frames and others' replies; *which (may be NULL) is the index of the one answered. */
int cb_box_wait_reply(struct cb_client *c, const long long *ids, size_t n, size_t *which,
		      const char *what, json_t **reply, json_t **result);

/* Attach *out to ref, configuring a fresh workspace with options (consumed; NULL: attach
 * as it is). *pid (may be NULL) is the daemon's pid, also on failure, so that the caller
 * can reap it. */
int cb_box_attach(const char *ref, json_t *options, struct cb_box **out, pid_t *pid);

/* "KEY=VALUE" strings into a new JSON object; -EINVAL naming what for a malformed one. */
int cb_box_env_json(const char *const *env, const char *what, json_t **out);

/* The request fields run and exec share (op, cmd or shell, env, cwd, timeout, output_limit)
 * into a new *out; -EINVAL naming what is wrong with argv/shell/env. */
int cb_box_command_json(const char *op, const char *const *argv, const char *shell,
			const struct cb_box_run_options *o, json_t **out);

/* Fill res (zeroed first) from an exec/run reply or a strict error's result. */
int cb_box_result_fill(json_t *msg, struct cb_box_result *res);

/* read/write straight through the mount (daemon/box_direct.c) when this process sees the
 * daemon's live mount and COWBOX_DIRECT_IO is not 0: 0 done, -errno failed with the same
 * codes and messages as the protocol, 1 when the protocol must do it instead. */
int cb_box_direct_read(struct cb_box *box, const char *path, void **data, size_t *len);
int cb_box_direct_write(struct cb_box *box, const char *path, const void *data, size_t len);

#endif
