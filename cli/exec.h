/* What `cowbox exec` and `cowbox shell` share between their files (cli/cmd_exec.c, the
 * command line and the in-process run; cli/exec_daemon.c, the run through the daemon). */
#ifndef COWBOX_CLI_EXEC_H
#define COWBOX_CLI_EXEC_H

#include <signal.h>

#include "cowbox/exec.h"

#define CLI_EXEC_MAX_ENV 256

enum { CLI_SET_TIMEOUT = 1, CLI_SET_MEMORY = 2, CLI_SET_PIDS = 4 };

/* The command line of exec and shell, as given (nothing resolved). */
struct cli_exec_opts {
	const char *ref, *dir, *cwd, *image, *shell, *user, *backend;
	const char *net; /* --network: NULL (the workspace's), "none", "all" or "host" */
	double timeout, cpus;
	unsigned long memory, pids;
	int set; /* CLI_SET_*: the limits given (0 there means none) */
	int privileged, json, shell_mode;
	const char *env[CLI_EXEC_MAX_ENV + 1]; /* --env, NULL-terminated */
	int n_env;
	char **cmd;
	int n_cmd;
};

/* Signals for the command, received by sigwait on a thread of their own. */
void cli_exec_signals(sigset_t *set);

/* Run o's command in the workspace o->ref through its daemon (the docker backend: the
 * daemon owns its container), stdin from fd 0; output to fds 1 and 2, or collected into
 * res when o->json. 0 with res filled, or -errno with a message (exit 125). */
int cli_exec_daemon(const struct cli_exec_opts *o, struct cb_exec_result *res);

#endif
