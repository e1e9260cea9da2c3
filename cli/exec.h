/* What `cowbox exec` and `cowbox shell` share between their files: cli/cmd_exec.c (the
 * command line, a workspace's run), exec_dir.c (--dir), exec_daemon.c (through the daemon). */
#ifndef COWBOX_CLI_EXEC_H
#define COWBOX_CLI_EXEC_H

#include <signal.h>
#include <stddef.h>

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
	int tty;    /* -t: the command on a pseudo-terminal */
	int detach; /* -d: started through the daemon as a background job, not waited for */
	const char *env[CLI_EXEC_MAX_ENV + 1]; /* --env, NULL-terminated */
	char *env_taken[CLI_EXEC_MAX_ENV];     /* the --env K entries made here, to free */
	int n_env;
	char **cmd;
	int n_cmd;
};

/* What one run needs to end cleanly, whichever path it took. */
struct cli_run {
	struct cb_exec *h;
	struct cb_backend *b; /* a workspace's backend, joined in this process; NULL: --dir */
	struct cb_exec_result res;
	double timeout; /* for the timed-out message */
	unsigned long memory_mb;
	int usage; /* the error is a usage error (exit 2) */
};

/* --network all for one command (cli/exec_net.c): a namespace of its own served by pasta,
 * whose files live in a private directory, all gone when the command is. */
struct cli_user_net {
	int netns_fd;
	struct cb_pasta *pasta;
	char dir[64];
};

int cli_user_net_start(struct cli_user_net *n);
void cli_user_net_stop(struct cli_user_net *n);

/* Output as it comes, to fds 1 and 2 (a cb_exec_callbacks on_output). */
int cli_exec_forward(void *arg, int stream, const void *buf, size_t len);

/* The terminal's size now, for a shell's pty (left as they are without a terminal). */
void cli_tty_size(unsigned short *rows, unsigned short *cols);

/* Wait for r->h (through r->b's wait when set) with the signals passed on to its tree, the
 * terminal raw while tty: r->res filled; 0 or -errno with a message. */
int cli_exec_wait(struct cli_run *r, int tty);

/* --dir (cli/exec_dir.c): its usage errors said on stderr (2; else 0), and the run. */
int cli_exec_dir_usage(const struct cli_exec_opts *o, const char *cmd);
int cli_exec_dir(const struct cli_exec_opts *o, struct cli_run *r);

/* Signals for the command, received by sigwait on a thread of their own. */
void cli_exec_signals(sigset_t *set);

/* Run o's command in the workspace o->ref through its daemon (the docker backend: the
 * daemon owns its container), stdin from fd 0; output to fds 1 and 2, or collected into
 * res when o->json. 0 with res filled, or -errno with a message (exit 125). */
int cli_exec_daemon(const struct cli_exec_opts *o, struct cb_exec_result *res);

#endif
