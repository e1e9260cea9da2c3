/* Helpers every cowbox subcommand uses: option parsing with --help and --json, errors in one
 * format, JSON on stdout. */
#ifndef COWBOX_CLI_COMMON_H
#define COWBOX_CLI_COMMON_H

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>

/* Exit statuses (man/cowbox.1, EXIT STATUS, lists them): 0 done, 1 failed otherwise, 2 bad
 * usage, 3 not found, 4 conflict or in use, 5 refused by policy or access, 6 I/O failure.
 * `exec` and `shell` exit with their command's status (125: cowbox failed). */
#define CLI_OK	      0
#define CLI_FAIL      1
#define CLI_USAGE     2
#define CLI_NOT_FOUND 3
#define CLI_CONFLICT  4
#define CLI_REFUSED   5
#define CLI_IO	      6

/* What every command accepts besides its own options. */
struct cli_common {
	int json;
	int help;
};

/* getopt_long over argv with the command's own options plus --json and --help (own may be
 * NULL); a shortopts starting with '+' stops at the first operand. own options return their val;
 * unknown ones print the usage on stderr and return -1 with *status = CLI_USAGE. Call until it
 * returns 0 (done) or -1 (stop with *status). */
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *own,
	       struct cli_common *common, const char *usage, int *status);

/* After the cli_getopt loop ended with c: 0 when exactly one operand, the workspace ref or
 * name, is left at argv[optind]; else -1 with *status the exit status (cli_getopt's own when
 * c < 0, CLI_USAGE after saying "CMD takes one workspace ref or name"). */
int cli_one_ref(int c, int argc, char **argv, const char *usage, int *status);

/* "cowbox CMD: message" on stderr (the library's message when fmt is NULL), and under --json
 * {"error": {"code", "message"}} on stdout too; returns CLI_FAIL, or the status of the
 * protocol code a library message carries ("op: not_found: ..." from the client). */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* cli_fail with the library's message for rc (a -errno): the exit status and the JSON code
 * follow the errno (or the protocol code the message carries): not_found 3, conflict and
 * in_use 4, access_denied 5, io_error 6, else 1. */
int cli_fail_rc(const char *cmd, int rc);

/* The protocol code of the failure about to be reported (a daemon's reply said it), for the
 * next cli_fail/cli_fail_rc; NULL forgets it. */
void cli_set_code(const char *code);

/* Wrong arguments: "cowbox CMD: message", the first line of the usage and "see `cowbox CMD
 * --help`" on stderr (CMD is the usage's own); returns CLI_USAGE. */
int cli_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether --json was given to this command (cli_getopt saw it): errors go to stdout as JSON. */
extern int cli_json_errors;

/* name quoted for a line a person reads, as git's core.quotePath quotes it: as it is when it
 * has no control character, backslash, double quote or leading/trailing blank; else in double
 * quotes with C escapes (\t, \n, \", \\, \ooo), so that no name can forge a line or a column.
 * The result lives until the 8th call after this one (a ring: a printf may quote several);
 * "?" when out of memory. --json output never goes through this. */
const char *cli_q(const char *name);

/* text (a sentence that may hold a name: fsck's detail, an apply conflict) with its control
 * characters escaped as cli_q escapes them, without quotes; same lifetime as cli_q's. */
const char *cli_q_text(const char *text);

/* Print value as one line of JSON on stdout (consumed); returns CLI_OK. */
int cli_print_json(json_t *value);

/* Print a daemon's reply for --json without the protocol's "id" and "ok" (consumed); returns
 * CLI_OK. */
int cli_print_reply_json(json_t *reply);

/* net_log's rows as net-log prints them (cli/cmd_net.c): a header, then one line each. */
void cli_print_net_rows(json_t *rows);

/* ---- the network of cowbox exec REF (cli/exec_net.c) ---- */

/* The workspace's network namespace as an fd of this process (its daemon started if need
 * be), for the sandbox to join: -errno with a message (-ESTALE when it went away meanwhile). */
int cli_workspace_netns(const char *ref, int *out);

/* A size in MiB from "512", "512m", "2g", "1t" or "4096k" (binary units, case ignored; k
 * rounds up to whole MiB): 0, or -EINVAL with a message naming s. */
int cli_parse_mib(const char *s, long long *mib);

/* --env's argument as "K=V" in *out (malloc'd): K=V as it is; K alone takes this process's
 * value of K (docker's --env K). -EINVAL with a message for an empty name or a K not set. */
int cli_env_arg(const char *arg, char **out);

/* A turn of workspace ref_arg as a person types it: a number (0: the base), "last" (the
 * latest recorded turn; 0 when none is), "last~N" (N recorded turns before it) or a label
 * (its latest turn). Only a name asks the workspace's daemon (started if need be) for its
 * turns. 0, or -errno with a message (-ENOENT: no such turn or label). cli/cmd_turns.c. */
int cli_turn(const char *ref_arg, const char *s, long long *out);

/* What a long command is doing now, on standard error's line, when standard error is a
 * terminal (nothing on a pipe): "cowbox CMD: TEXT..." replaced by the next phase and erased
 * by cli_phase_done. */
void cli_phase(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_phase_done(void);

/* While a request waits on the first use of ref's backend (the vm's boot), its daemon's
 * backend_phase (info) as phase lines of cmd, asked from a thread every 0.3 s; only when
 * standard error is a terminal (NULL otherwise, or when no thread could start). Stop erases
 * the line; NULL is accepted. cli/phase_watch.c. */
struct cli_phase_watch;
struct cli_phase_watch *cli_phase_watch_start(const char *cmd, const char *ref);
void cli_phase_watch_stop(struct cli_phase_watch *w);

/* A human size: "0 B", "12.3 KiB", ... into buf. */
const char *cli_size(long long bytes, char *buf, size_t size);

/* create's --secret HOST:HEADER:env:VAR|file:PATH[:PATH_PREFIX] as an entry of the backend
 * option secrets (env read now, file made absolute), with prefix and suffix if not NULL:
 * 0, or -EINVAL with a message naming spec. */
int cli_secret_json(const char *spec, const char *prefix, const char *suffix, json_t **out);

#endif
