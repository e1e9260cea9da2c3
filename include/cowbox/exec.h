/* The process runner (exec/): runs one command, on the host or in a namespace sandbox, and
 * supervises it: timeout, output cap, whole-tree kill, reaping, collected or streamed output. */
#ifndef COWBOX_EXEC_H
#define COWBOX_EXEC_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cb_sandbox;

#define CB_EXEC_MAX_GROUPS 32

/* Ids a command on the host switches to before its chdir and exec (the caller must hold
 * CAP_SETUID/CAP_SETGID: the vm backend's agent, root of its guest). */
struct cb_exec_ids {
	uid_t uid;
	gid_t gid;
	const gid_t *groups; /* the supplementary groups, exactly these (none: n_groups 0) */
	size_t n_groups;
};

/* Where the command's stdin comes from. */
enum cb_exec_stdin {
	CB_EXEC_STDIN_CLOSED = 0, /* an empty pipe: reads see end of file at once */
	CB_EXEC_STDIN_BYTES,	  /* stdin_data/stdin_len, then end of file */
	CB_EXEC_STDIN_FD,	  /* stdin_fd is given to the command (with tty: copied to it) */
	CB_EXEC_STDIN_STREAM,	  /* written later with cb_exec_stdin_write, ended by _close */
};

#define CB_EXEC_DEFAULT_GRACE	     5.0
#define CB_EXEC_DEFAULT_OUTPUT_LIMIT (10u * 1024 * 1024)
#define CB_EXEC_DEFAULT_KEEP	     65536u
#define CB_EXEC_EXIT_DRAIN	     2.0 /* seconds we wait for output after the command exits */

/* What to run. Only argv (or shell) is required; zero means the default everywhere. */
struct cb_exec_spec {
	char *const *argv; /* program and arguments; the program is looked up in env's PATH */
	const char *shell; /* instead of argv: run "/bin/sh -c shell" */
	const char *shell_program; /* the shell for shell: NULL: /bin/sh; a bare name ("bash")
				      is looked up in env's PATH */
	char *const *env; /* exactly the command's environment ("K=V", NULL-terminated); NULL:
			     empty. Nothing of the caller's environment is passed implicitly. */
	const char *cwd;  /* host: a directory; sandbox: relative to /workspace (or absolute
			     inside the sandbox). NULL: the workspace root (sandbox) or ".". */
	enum cb_exec_stdin stdin_kind;
	const void *stdin_data;
	size_t stdin_len;
	int stdin_fd;
	double timeout;	     /* seconds, <= 0: none */
	double grace;	     /* SIGTERM -> SIGKILL delay after a timeout; 0: 5 s. Once the
				timed-out command itself has ended, the rest of its tree gets
				SIGKILL at once. */
	size_t output_limit; /* stdout+stderr bytes that stop the command; 0: 10 MiB */
	size_t keep_bytes;   /* per stream kept when the limit is hit; 0: 64 KiB */
	int tty;	     /* run on a new pseudo-terminal (stdout carries both streams) */
	unsigned short tty_rows, tty_cols;
	const struct cb_sandbox *sandbox; /* NULL: on the host (the local backend) */
	const struct cb_exec_ids *ids;	  /* host only: run as these ids; NULL: as the caller */
	struct cb_exec_keep *keep; /* background jobs (&, nohup, setsid) that outlive a command
				      which ended by itself are kept running in this set until it
				      is freed, instead of killed when the call returns (not with
				      tty); their later output is read and dropped. NULL: killed */
};

/* How it ended. Buffers are NUL-terminated for convenience and owned by the result. */
struct cb_exec_result {
	int exit_code;	    /* 0-255; 124 timed out, 127 not found, 128+n killed by signal n */
	int term_signal;    /* the signal that ended the command, 0 if it exited */
	int timed_out;	    /* the timeout fired */
	int output_limited; /* the output cap stopped it; streams cut to keep_bytes */
	int oom_killed;	    /* the sandbox's memory cap killed something (exit code 137) */
	int killed;	    /* cb_exec_kill was called */
	char *out, *err;
	size_t out_len, err_len;
	double duration; /* seconds from start until the command ended */
};

/* Streaming: called on the cb_exec_wait thread for each chunk as it arrives (stream 1 or 2).
 * A non-zero return stops the command (as cb_exec_kill(SIGKILL)). */
struct cb_exec_callbacks {
	int (*on_output)(void *arg, int stream, const void *buf, size_t len);
	void *arg;
};

struct cb_exec;

/* Resolve user (NAME|UID[:GROUP|GID]) in root's etc/passwd and etc/group (root NULL: "/"),
 * read beneath root, as the ns sandbox does: *ids gets the uid, the gid (the passwd entry's,
 * or 0 for a bare uid) and the groups that list the user, stored in groups. -ENOENT for a
 * name that is in neither file, -EINVAL for a malformed one, with a message. */
int cb_exec_ids_resolve(const char *root, const char *user, struct cb_exec_ids *ids,
			gid_t groups[CB_EXEC_MAX_GROUPS]);

/* Start the command; it runs in its own session and process group under a supervisor that
 * reaps every process it leaves behind. Only fds 0-2 reach the command. The supervisor is a
 * child of the calling process, reaped by cb_exec_wait: the caller must not ignore SIGCHLD
 * nor reap it with waitpid(-1) meanwhile. cb may be NULL (output is only collected). On
 * failure *out is NULL and the message says what failed. */
int cb_exec_start(const struct cb_exec_spec *spec, const struct cb_exec_callbacks *cb,
		  struct cb_exec **out);

/* Supervise until the command and everything it started is gone, at most 2 s after the
 * command itself exits. Without spec.keep, whatever the command left running (background
 * jobs, daemons, setsid'd or not) is killed as soon as the command's exit is known, so
 * nothing a command started outlives it; output is then read until every writer closes it
 * or those 2 s pass. With spec.keep and a command that ended by itself (no timeout, kill or
 * output cap), its jobs are handed to that set still running after that drain; else they
 * are killed then. Fill res (free with
 * cb_exec_result_free, also after an error). Returns 0, or -errno when the sandbox could not be set
 * up (the message says which step and why). Call once. */
int cb_exec_wait(struct cb_exec *h, struct cb_exec_result *res);

/* Thread-safe: send sig to the whole tree of the command (SIGKILL also ends the supervisor).
 * Works until cb_exec_wait returns; later calls do nothing. */
void cb_exec_kill(struct cb_exec *h, int sig);

/* Thread-safe, for CB_EXEC_STDIN_STREAM (and tty): write all of buf to the command's stdin,
 * blocking while the pipe is full. Returns 0 or -errno (-EPIPE once stdin is closed). */
int cb_exec_stdin_write(struct cb_exec *h, const void *buf, size_t len);

/* Thread-safe: end the command's stdin (with tty: send end-of-file, ^D). */
int cb_exec_stdin_close(struct cb_exec *h);

/* Thread-safe, tty only: set the terminal's size (the command gets SIGWINCH). */
int cb_exec_resize(struct cb_exec *h, unsigned short rows, unsigned short cols);

/* The supervisor's pid (for logging); the command itself may live in another pid namespace. */
pid_t cb_exec_pid(const struct cb_exec *h);

/* Free the handle; if the command still runs it is killed and reaped first. NULL is fine. */
void cb_exec_free(struct cb_exec *h);

/* Start, wait and free in one call: collected output in res (free it, also after an error). */
int cb_exec_run(const struct cb_exec_spec *spec, struct cb_exec_result *res);

/* Free the buffers of a result; safe on a zeroed result. */
void cb_exec_result_free(struct cb_exec_result *res);

/* A copy of environ without credentials, for the local backend (and the docker CLI): provider
 * prefixes (ANTHROPIC_*, OPENAI_*, LITELLM_*, AZURE_*, AWS_*, GEMINI_*, CODEX_*, CURSOR_*,
 * VAULT_*), names that say TOKEN, SECRET, PASSWORD, PASSWD, API_KEY, APIKEY, ACCESS_KEY,
 * PRIVATE_KEY, CREDENTIAL, SESSION_KEY or AUTH (not AUTHOR), agent sockets and credential
 * files (SSH_AUTH_SOCK, GPG_AGENT_INFO, GOOGLE_APPLICATION_CREDENTIALS, KUBECONFIG, ...),
 * DATABASE_URL, REDIS_URL and any value with a URL's user:password@. The table is in
 * exec/env.c. Free with cb_exec_env_free. */
int cb_exec_env_host_stripped(char ***out);

/* Is "NAME=value" (or NAME) a credential that the local backend strips? */
int cb_exec_env_is_credential(const char *entry);

struct cb_exec_keep;

/* A set of kept background trees (cb_exec_spec.keep); free it with cb_exec_keep_free. */
int cb_exec_keep_new(struct cb_exec_keep **out);

/* Thread-safe: how many kept trees still run (those that ended are reaped first). */
size_t cb_exec_keep_running(struct cb_exec_keep *k);

/* SIGKILL every kept tree, wait until each is gone (at most 10 s in all), free the set.
 * NULL is fine. */
void cb_exec_keep_free(struct cb_exec_keep *k);

/* Free a NULL-terminated array of strings made by this module. */
void cb_exec_env_free(char **env);

#ifdef __cplusplus
}
#endif

#endif
