/* Private to backends/: helpers the ns, local and docker tables share (the working directory
 * of a command, waiting and freeing a runner handle). */
#ifndef COWBOX_BACKENDS_COMMON_H
#define COWBOX_BACKENDS_COMMON_H

#include "cowbox/backend.h"

/* The command's directory relative to the workspace root ("" for the root), from the
 * options' working_dir and the command's cwd; malloc'd. Refuses .. and, unless allow_abs,
 * absolute paths. */
int cb_backend_cwd(const struct cb_backend *b, const char *cwd, int allow_abs, char **out);

/* The program that runs command strings: NULL (/bin/sh) or "bash" (the shell option). */
const char *cb_backend_shell_program(const struct cb_backend *b);

/* The user a command runs as: its own, else the options', else NULL. */
const char *cb_backend_user(const struct cb_backend *b, const struct cb_backend_cmd *cmd);

/* The keep set for a command's background jobs (b->keep), or NULL when they end with it. */
struct cb_exec_keep *cb_backend_keep(const struct cb_backend *b, const struct cb_backend_cmd *cmd);

/* The runner's wait and kill, for backends with nothing of their own to clean. */
int cb_backend_wait_plain(struct cb_backend *b, struct cb_exec *h, struct cb_exec_result *res);
void cb_backend_kill_plain(struct cb_backend *b, struct cb_exec *h, int sig);

/* The spec's timeout from a command and the options (0 = default, < 0 = none). */
double cb_backend_timeout(const struct cb_backend *b, const struct cb_backend_cmd *cmd);

/* which's answer from CB_BACKEND_WHICH_SCRIPT's result, which it frees: 0 with *path the
 * malloc'd absolute path it printed, else -ENOENT saying it is not on where's PATH ("sandbox",
 * "container"). */
int cb_backend_which_result(struct cb_exec_result *res, const char *binary, const char *where,
			    char **path);

/* A /bin/sh script printing where $1 is on $PATH (an executable file, not a directory):
 * `command -v` would name shell builtins (true, echo) instead of the programs. */
#define CB_BACKEND_WHICH_SCRIPT                                                                    \
	"case $1 in */*) exit 1;; esac; IFS=:; for d in $PATH; do "                                \
	"if [ -f \"$d/$1\" ] && [ -x \"$d/$1\" ]; then echo \"$d/$1\"; exit 0; fi; done; exit 1"

/* ---- relays (backends/relay.c) ---- */

/* A set of relays, all shut down together (a forwarder's, a published port's). */
struct cb_relays;
int cb_relays_new(struct cb_relays **out);
/* Relay the connected sockets a and b both ways (each end of file passed on as a half close)
 * on a thread of the set's, which closes both at the end; on failure (-errno with a message,
 * -ESHUTDOWN once the set closes) nothing is started and neither is closed. */
int cb_relay_start(struct cb_relays *s, int a, int b);
/* Shut every relay of the set down, wait until their threads let go, and free it; NULL: no-op. */
void cb_relays_close(struct cb_relays *s);

#endif
