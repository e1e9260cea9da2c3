/* Helpers every cowbox subcommand uses: option parsing with --help and --json, errors in one
 * format, JSON on stdout. */
#ifndef COWBOX_CLI_COMMON_H
#define COWBOX_CLI_COMMON_H

#include <getopt.h>
#include <jansson.h>

/* Exit statuses: 0 done, 1 failed, 2 bad usage. */
#define CLI_OK	  0
#define CLI_FAIL  1
#define CLI_USAGE 2

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

/* "cowbox CMD: message" on stderr (the library's message when fmt is NULL); returns CLI_FAIL. */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Wrong arguments: the message, then the usage line, on stderr; returns CLI_USAGE. */
int cli_usage_error(const char *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

/* A human size: "0 B", "12.3 KiB", ... into buf. */
const char *cli_size(long long bytes, char *buf, size_t size);

/* create's --secret HOST:HEADER:env:VAR|file:PATH[:PATH_PREFIX] as an entry of the backend
 * option secrets (env read now, file made absolute), with prefix and suffix if not NULL:
 * 0, or -EINVAL with a message naming spec. */
int cli_secret_json(const char *spec, const char *prefix, const char *suffix, json_t **out);

#endif
