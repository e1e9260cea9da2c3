/* Private to the runner (run.c, run_io.c): the handle and the helpers that move bytes
 * between the caller and the command (pipes, the pty, stdin, the output buffers). */
#ifndef COWBOX_EXEC_RUN_H
#define COWBOX_EXEC_RUN_H

#include <pthread.h>
#include <sys/types.h>

#include "cowbox/exec.h"

struct stream {
	int fd;
	char *buf;
	size_t len, cap;
};

struct cb_exec {
	pid_t shim;
	int ctl; /* -1 once closed; guarded by ctl_lock */
	pthread_mutex_t ctl_lock;
	int in_w; /* stdin pipe (or pty master) for writing; guarded by in_lock */
	pthread_mutex_t in_lock;
	int tty_master;
	int stdin_src; /* tty + CB_EXEC_STDIN_FD: copied to the master by the loop */
	const char *in_data;
	size_t in_len, in_off;
	int in_bytes; /* the loop writes in_data */
	struct stream out, err;
	struct cb_exec_callbacks cb;
	double timeout, grace;
	size_t limit, keep, total;
	struct cb_cgroup *cg;
	struct cb_exec_keep *keep_set; /* spec->keep: where leftover background jobs go */
	struct cb_ns_plan *ns;
	char *shell_argv[4];
	char **argv_copy; /* sandboxed: the command's argv, off the caller's command line */
	char *cwd;	  /* the sandbox path of spec->cwd */
	char setup_error[600];
	int killed, waited;
	int sigkill_sent; /* a SIGKILL went to the tree before the command's status came */
	double t0;
};

/* Take over a command's supervisor (its pid, control socket and cgroup, all then the set's)
 * once its caller let go of the background jobs it left; 0 or -errno (nothing taken). */
int cb_exec_keep_add(struct cb_exec_keep *k, pid_t shim, int ctl, struct cb_cgroup *cg);

/* Monotonic seconds. */
double cb_exec_now(void);

/* fd moved above 2 (closing the old one), so the child's dup2 onto 0-2 never clobbers one of
 * its other fds; -1 stays -1. */
int cb_exec_fd_above_2(int fd);

/* pipe2(O_CLOEXEC) with both ends above 2; 0 or -errno. */
int cb_exec_pipe(int fds[2]);

/* close() an fd if open and mark it closed (-1). */
void cb_exec_close_fd(int *fd);

/* Ask the shim to send sig to the whole tree; thread-safe, 0 or -errno. */
int cb_exec_send_kill(struct cb_exec *h, int sig);

/* A host pty for spec (sized as asked): master and slave, both above 2 and close-on-exec. */
int cb_exec_pty_open(const struct cb_exec_spec *spec, int *master, int *slave);

/* Wait for the sandbox's pty master from the shim and make it the handle's stdin/stdout. */
int cb_exec_pty_receive(struct cb_exec *h);

/* Read what is there; 0 at end of file (or EIO on a pty whose slave is gone), else 1. */
int cb_exec_pump_output(struct cb_exec *h, struct stream *s, int stream);

/* Write as much of the stdin bytes as the pipe takes; close it when all are written. */
void cb_exec_pump_stdin_bytes(struct cb_exec *h);

/* Copy what the stdin source fd has to the pty (tty mode with an fd as stdin). */
void cb_exec_pump_stdin_src(struct cb_exec *h);

#endif
