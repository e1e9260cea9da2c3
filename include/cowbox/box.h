/* libcowbox's high-level API: a workspace as a sandbox (create, open, run, read/write, turns),
 * on top of the daemon's control protocol (client.h); what the CLI and embedders call. */
#ifndef COWBOX_BOX_H
#define COWBOX_BOX_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Errors. Every function returns 0 (or a count / turn number) on success and -errno on
 * failure, with a message in cb_error_message() (include/cowbox/error.h) that names what
 * failed and why, e.g. "read src/x.c: not_found: ...". cb_box_last_code() gives the
 * protocol's stable error code of the calling thread's last failure:
 *
 *   code              errno       when
 *   not_found         ENOENT      no such workspace, file, binary or running command
 *   invalid_path      EINVAL      a path leaving the workspace root (absolute, .., symlink out)
 *   in_use            EBUSY       a workspace mounted elsewhere, configure twice
 *                     EEXIST      create: the name is taken
 *   unavailable       EAGAIN      the daemon or backend cannot start or went away
 *   timeout           ETIMEDOUT   a strict run timed out; a hook or setup script did
 *   output_limit      EFBIG       a strict run passed its output cap
 *   access_denied     EACCES      an op above the box's access level (cowbox/access.h)
 *   conflict          EEXIST      apply: the folder changed since (cowbox/apply.h)
 *   invalid_request   EPROTO      bad options or arguments (also local checks: EINVAL
 *                                 before anything was sent reports invalid_request, and
 *                                 ENOTDIR for a base that is not a directory)
 *
 * Failures that are not the daemon's (fork, connect, out of memory) report the code
 * "unavailable" (connect/start) or "" (anything else).
 *
 * Threads: a struct cb_box serves one thread at a time; a struct cb_box_proc is independent
 * of its box (a connection of its own) and may be driven from another thread.
 */

struct cb_box;
struct cb_box_proc;

/* A limit field of cb_box_options set to this turns the limit off (0 takes the default). */
#define CB_BOX_NO_LIMIT (~0UL)

/* How cb_box_create shapes a new workspace; zeroed fields take the defaults, which include
 * limits (docs/security.md#limits): 600 s per command, 4096 MiB, 1024 pids, a 10240 MiB and
 * 1,000,000-inode upper-layer quota. */
struct cb_box_options {
	const char *base;	       /* directory the workspace starts from; NULL: empty */
	const char *name;	       /* optional unique name (see cb_ws_name_check) */
	const char *backend;	       /* "ns" (default), "local" or "docker" */
	const char *const *env;	       /* "KEY=VALUE" strings, NULL-terminated; nothing else
					* of the host's environment reaches ns or docker */
	const char *working_dir;       /* relative to the workspace root */
	const char *network;	       /* "none" (default for ns/docker), "all", "host", "public"
					* or "allow" (docs/network.md) */
	const char *const *allow;      /* network allow: its entries, NULL-terminated */
	double cpus;		       /* > 0: CPU limit */
	unsigned long memory_mb;       /* memory cap; 0: 4096; CB_BOX_NO_LIMIT: none */
	unsigned long pids;	       /* process+thread cap; 0: 1024; CB_BOX_NO_LIMIT: none */
	unsigned long disk_mb;	       /* upper-layer quota; 0: 10240; CB_BOX_NO_LIMIT: none */
	unsigned long disk_inodes;     /* its inodes; 0: 1000000; CB_BOX_NO_LIMIT: none */
	const char *image;	       /* ns: dir, oci:PATH[:TAG], podman image; docker: name */
	double timeout;		       /* default seconds per command; 0: 600; < 0: none */
	const char *const *on_create;  /* shell commands run when the backend boots */
	const char *const *on_destroy; /* shell commands run by cb_box_destroy */
	const char *setup_script;      /* shell, once after on_create */
	double setup_timeout;	       /* > 0: its seconds (default 600) */
	const char *shell;	       /* command strings and hooks: "sh" (default) or "bash" */
	const char *user;	       /* ns, docker: commands run as NAME|UID[:GROUP|GID] */
	const char *background;	       /* "keep" (default): jobs a command leaves run until the
					* workspace closes; "kill": they end with it */
	const char *const *volumes;    /* ns, docker: "HOST_DIR:PATH[:ro|rw]", NULL-terminated;
					* read-only unless :rw, none under $COWBOX_HOME */
	const char *access;	       /* the widest level it serves: "none", "files" or
					* NULL/"full" (cowbox/access.h) */
	double idle_timeout;	       /* seconds without a client before its daemon stops
					* (keeping the disk); 0: 600; < 0: never */
	bool in_place;		       /* the agent's edits land in base itself, which is
					* recorded as turn 0 first (cb_ws_create_in_place) */
	unsigned long proxy_conns;     /* network public or allow: the egress proxy's
					* connections open at once; 0: 256 */
};

/* Per command; a NULL options pointer means all defaults. */
struct cb_box_run_options {
	const char *const *env; /* extra "KEY=VALUE" strings, NULL-terminated */
	const char *cwd;	/* relative to the workspace root (or working_dir) */
	double timeout;		/* > 0: seconds, then the tree is killed and exit_code is 124 */
	long long output_limit; /* > 0: bytes of stdout+stderr that stop it (default 10 MiB) */
	const void *stdin_data; /* fed to the command, then end of file (run only) */
	size_t stdin_len;
	bool strict;		/* run: a timeout or the output cap fails (-ETIMEDOUT, -EFBIG) with
				 * the partial result still filled in */
	const char *user;	/* this command's user (NAME|UID[:GROUP|GID]); NULL: the option's */
	const char *background; /* "keep" or "kill"; NULL: the option's */
};

/* What a finished command did. out and err are NUL-terminated for convenience (their
 * lengths exclude the NUL); cb_box_exec leaves them empty, the callback saw the bytes. */
struct cb_box_result {
	int exit_code; /* the command's; 124 timed out; 127 not found; 128+n signal n */
	int signal;
	bool timed_out, output_limited, killed, oom_killed;
	double duration;
	char *out, *err;
	size_t out_len, err_len;
};

/* The protocol error code of the calling thread's last failed cb_box_* call ("" if it
 * succeeded or the failure was not the daemon's and not a refusal). */
const char *cb_box_last_code(void);

struct cb_fsck_report;
/* The JSON form of an fsck report (cowbox/fsck.h): {"ref", "problems", "blobs_checked",
 * "base_files_checked", "base_cache_rows"} as cb_box_fsck describes; *left gets the number
 * of problems not repaired. What the fsck op and `cowbox fsck --json` print. */
json_t *cb_fsck_report_json(const struct cb_fsck_report *r, long long *left);

/* Create a workspace with these options, start its daemon and attach to it. The workspace's
 * ref is made (and printed on nothing) before any work, and a workspace whose options the
 * daemon refuses is removed again, so a failure leaves nothing behind. */
int cb_box_create(const struct cb_box_options *opts, struct cb_box **out);

/* Attach to the workspace ref_or_name names, starting its daemon when none runs. Refs cowbox
 * did not make, paths and unknown names are refused (-EINVAL / -ENOENT, not_found). */
int cb_box_open(const char *ref_or_name, struct cb_box **out);

/* The workspace's ref ("cb-" + 32 hex), valid while box lives. */
const char *cb_box_ref(const struct cb_box *box);

/* Where commands start: /workspace[/working_dir] for ns and docker, the host mount point
 * [/working_dir] for local. Valid while box lives. */
const char *cb_box_workdir(const struct cb_box *box);

/* The mount point on the host (what the daemon mounted). Valid while box lives. */
const char *cb_box_mountpoint(const struct cb_box *box);

/* Run a command to completion: argv (NULL-terminated) or shell (for /bin/sh -c), exactly
 * one of them. res is filled on success, and on a strict timeout / output cap; free it
 * with cb_box_result_free. A non-zero exit code is not a failure. */
int cb_box_run(struct cb_box *box, const char *const *argv, const char *shell,
	       const struct cb_box_run_options *opts, struct cb_box_result *res);

/* Free what a result holds (the struct itself is the caller's); a zeroed result is fine. */
void cb_box_result_free(struct cb_box_result *res);

/* Start a command that streams (argv or shell as for cb_box_run; opts->stdin_data and
 * strict are not used): its stdin stays open for cb_box_proc_write until
 * cb_box_proc_close_stdin. The process has a connection of its own; free it with
 * cb_box_proc_free (which kills it if it still runs). */
int cb_box_exec(struct cb_box *box, const char *const *argv, const char *shell,
		const struct cb_box_run_options *opts, struct cb_box_proc **out);

/* Called with each chunk of output, stream 1 (stdout) or 2 (stderr), in order. */
typedef void (*cb_box_output_fn)(int stream, const void *data, size_t len, void *arg);

/* Feed the command's stdin (frames of at most 1 MiB). While the daemon cannot take more,
 * the output that arrives is kept for the next cb_box_proc_poll, so a command that writes
 * as much as it is fed cannot stall the write. */
int cb_box_proc_write(struct cb_box_proc *p, const void *data, size_t len);

/* End of file on the command's stdin. */
int cb_box_proc_close_stdin(struct cb_box_proc *p);

/* Send signal sig to the command's whole tree; its result then says killed. */
int cb_box_proc_kill(struct cb_box_proc *p, int sig);

/* Hand the output that arrives within timeout_ms (< 0: until the command ends) to
 * on_output (may be NULL). Returns 1 once the command has ended (res filled, if not NULL),
 * 0 if it still runs when the time is up, or -errno. */
int cb_box_proc_poll(struct cb_box_proc *p, int timeout_ms, cb_box_output_fn on_output, void *arg,
		     struct cb_box_result *res);

/* Hang up the process's connection (the daemon kills the command if it still runs). */
void cb_box_proc_free(struct cb_box_proc *p);

/* The bytes of path (relative to the workspace root), read in 1 MiB chunks into a malloc'd
 * buffer (NUL-terminated past *len). A missing file is -ENOENT (not_found), a path leaving
 * the root -EINVAL (invalid_path); both messages name path. */
int cb_box_read(struct cb_box *box, const char *path, void **data, size_t *len);

/* Replace path's content with len bytes (parents made, new files 0644), in chunks. */
int cb_box_write(struct cb_box *box, const char *path, const void *data, size_t len);

/* The absolute path of binary on the sandbox's PATH, malloc'd into *path; -ENOENT if none. */
int cb_box_which(struct cb_box *box, const char *binary, char **path);

/* A URL (malloc'd) that code in the sandbox uses to reach this port of the host, and only
 * it, even under network none. */
int cb_box_host_url(struct cb_box *box, int port, char **url);

/* Record a turn labelled label (may be NULL) and return its number (>= 1). files (may be
 * NULL) gets a JSON object: every regular file's relative path -> SHA-256 (lowercase hex);
 * the caller json_decref()s it. Nothing changed since the latest turn and no label: no turn
 * is recorded, and the latest turn's number and map are the answer (docs/turns.md). */
long long cb_box_snapshot(struct cb_box *box, const char *label, json_t **files);

/* Record a turn like cb_box_snapshot and return its number, with only what changed since
 * this box's previous snapshot: *changed {path: SHA-256} of the regular files added or
 * changed, *deleted [path] of those gone (the caller json_decref()s both); the first call
 * reports every file as changed. Both forms ask the daemon only for the changes once the box
 * holds a map (docs/protocol.md, snapshot `since`), so a call costs what changed, not the size
 * of the tree; when the daemon sends the whole map instead (that turn pruned, another
 * database under the ref) the changes are found by comparing the two maps. */
long long cb_box_snapshot_changes(struct cb_box *box, const char *label, json_t **changed,
				  json_t **deleted);

/* The changes from turn `from` to turn `to` (< 0: the live tree) as a JSON array of events
 * ({"event":"created"|"modified"|"deleted"|..., "path", "old", "new"}: docs/protocol.md),
 * which the caller json_decref()s. Returns the number of events. */
int cb_box_diff(struct cb_box *box, long long from, long long to, json_t **events);

/* Make the live workspace what it was at turn; returns the new turn that records this. */
long long cb_box_rollback(struct cb_box *box, long long turn);

/* A new workspace starting at turn (named name, may be NULL), attached as *out. */
int cb_box_fork(struct cb_box *box, long long turn, const char *name, struct cb_box **out);

/* Check the workspace's stored state through its daemon (docs/reliability.md, `cowbox
 * fsck`): every blob and base file a recorded turn needs is read and hashed, every base-cache
 * row and meta.db checked; nothing is read through the mount and turn operations go on
 * meanwhile. repair: drop unusable base-cache rows (a damaged meta.db is rebuilt only by
 * `cowbox fsck --repair` on the unmounted workspace). *report (owned; json_decref it) is
 * {"ref", "clean", "problems": [{"kind", "path", "object", "first_turn", "last_turn" (-1:
 * and every later turn), "repaired", "detail"}], "blobs_checked", "base_files_checked",
 * "base_cache_rows"}. Returns the number of problems left unrepaired (0: clean), or -errno. */
int cb_box_fsck(struct cb_box *box, bool repair, json_t **report);

/* Stop the workspace's daemon (its commands killed, its container removed) and free box;
 * the disk stays for cb_box_open. NULL is accepted. */
int cb_box_close(struct cb_box *box);

/* Free box and hang up, leaving the daemon running for others. NULL is accepted. */
void cb_box_detach(struct cb_box *box);

/* Run the on_destroy hooks, remove the backend's resources and delete the workspace. A
 * well-formed ref (or a name) that no longer exists returns 0 quietly. */
int cb_box_destroy(const char *ref_or_name);

#ifdef __cplusplus
}
#endif

#endif
