/* The workspace daemon (`cowbox serve`): its state, the control-protocol plumbing that op
 * handlers use (replies, errors, stream frames) and the op tables they register. */
#ifndef COWBOX_DAEMON_INTERNAL_H
#define COWBOX_DAEMON_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "cowbox/daemon.h"
#include "errcode.h"
#include "cowbox/workspace.h"
#include "cowbox/turns.h"

#define CB_PROTOCOL_VERSION  1
#define CB_PROTOCOL_MAX_LINE (16u << 20) /* a request line longer than this is refused */
/* The API's commands (exec, run: on threads of their own) at once on one connection; one more
 * is refused with in_use (daemon/ops_api.c). Inline ops run one at a time in order: the reader
 * takes the next line only after answering, so a client that never reads its replies is held back
 * by the socket buffers (backpressure), never cut off. */
#define CB_PROTOCOL_MAX_IN_FLIGHT 64

/* File workers (daemon/workproc.c): at most this many API reads and writes run at once. */
#define CB_DAEMON_FILE_WORKERS 4

struct cb_db;
struct cb_overlay;
struct cb_daemon_conn;
struct cb_daemon_lines;

/* A worker process as the daemon sees it: pid 0 when there is none (never started, or dead
 * and reaped); fd and r are valid while pid is set. */
struct cb_daemon_wproc {
	pid_t pid;
	int fd;
	struct cb_daemon_lines *r;
	int busy; /* file workers: taken by a call (under files_lock) */
};

/* One daemon serves one workspace. Paths are absolute; fields are set before the first op
 * runs and stay fixed, except where a lock is named. */
struct cb_daemon {
	char ref[CB_WS_REF_LEN + 1];
	char *dir;	  /* $COWBOX_HOME/workspaces/<ref> (realpath) */
	char *base;	  /* the read-only lower layer; NULL for an empty workspace */
	char *name;	  /* NULL if the workspace has none */
	char *upper;	  /* <dir>/upper; in place, the base folder itself */
	int in_place;	  /* the workspace is in place (cb_ws_create_in_place) */
	char *mountpoint; /* where the overlay is mounted */
	char *sock_path;  /* <dir>/control.sock */
	char *db_path;	  /* <dir>/meta.db */
	struct cb_db *db;
	struct cb_overlay *ov;
	/* upper/ is its own filesystem of the byte quota's size (ws/upper_image.c), made for
	 * upper_cap bytes: the kernel holds writes to it, the mount keeps passthrough */
	int upper_capped;
	unsigned long long upper_cap;
	/* Held by turn operations (snapshot, diff, rollback, fork) so they run one at a time;
	 * FUSE keeps serving on its own threads meanwhile. */
	pthread_mutex_t turn_lock;
	double started; /* seconds since the epoch */
	/* The worker processes (daemon/workproc.c), all forked by the spawner, a child forked
	 * before any thread, database or /dev/fuse fd exists. The turn worker serves the turn
	 * ops, one call at a time (worker_lock); the file workers serve the API's read and
	 * write (files_lock, files_cond: a call takes an idle one). A dead one is replaced at
	 * the next call. */
	struct cb_daemon_wproc worker;
	pthread_mutex_t worker_lock;
	pid_t spawner_pid;
	int spawner_fd;
	pthread_mutex_t spawner_lock;
	int workers_ready; /* the paths are known: a new worker can be told them */
	struct cb_daemon_wproc files[CB_DAEMON_FILE_WORKERS];
	pthread_mutex_t files_lock;
	pthread_cond_t files_cond;
	struct cb_daemon_basehash *basehash;   /* the background hash of the base (basehash.c) */
	struct cb_daemon_basewatch *basewatch; /* inotify on the base (basewatch.c) */
	/* The base read ahead at start for the first map, and the watch's count then (both
	 * under turn_lock; basehash.c). */
	struct cb_ws_base_scan *scan_ahead;
	long long scan_ahead_events;
	/* The base's drift from turn 0 (what a fork writes besides the turns' changes), known
	 * while the watch's count is still drift_events (under turn_lock; basehash.c). */
	struct cb_ws_drift drift;
	long long drift_events;
	int drift_known;
	int access; /* the widest level it serves (cowbox/access.h), only lowered; __atomic */
	/* Idle stop (daemon/idle.c): the timeout (0: never) and whether `cowbox mount` pinned
	 * it (never idle then), both __atomic; idle_since under conns_lock. */
	long long idle_timeout_ms;
	int pinned;
	double idle_since;
	pthread_mutex_t idle_lock;
	pthread_cond_t idle_cond;
	pthread_t idle_thread;
	int have_idle;

	/* Internal to daemon/: the lock, the listener and the connections. */
	int lock_fd;
	int listen_fd;
	int stopping; /* set once, by any thread; read and written with __atomic builtins */
	/* held while a stop unmounts and ends d->ov, and while main destroys it: a stop asked
	 * for by a thread main did not wait for (a connection past conns_shutdown's timeout)
	 * then finds d->ov gone instead of freed */
	pthread_mutex_t ov_stop_lock;
	pthread_mutex_t conns_lock;
	pthread_cond_t conns_cond;
	struct cb_daemon_conn *conns;
	unsigned nconns;

	/* The API (daemon/api_util.c): the workspace's backend, opened on first use, and a
	 * reference count per backend generation (configure replaces it while ops may still use
	 * the old one); released once stopping. All under api_lock. */
	pthread_mutex_t api_lock;
	struct cb_backend *api_backend;
	struct api_ref *api_refs;
	int api_released;
	/* What the backend's create is doing now (the vm's boot), "" when nothing: the info op
	 * says it, so a client waiting on a first command can show it. Under phase_lock. */
	pthread_mutex_t phase_lock;
	char phase[256];
	/* The API's running commands (daemon/ops_api.c), the one table of them: exec and run
	 * list themselves by (connection, id) there, stdin and kill find them there, a hang-up
	 * and the daemon's stop kill them from there. running_cond: a start, an end, a
	 * reference dropped. api_stop_lock: one stop at a time. */
	pthread_mutex_t running_lock;
	pthread_cond_t running_cond;
	struct api_exec *running;
	pthread_mutex_t api_stop_lock;
};

/* The host id range the workspace in dir shows its files in (cb_overlay_config.id_base): 0
 * when not root or when privileged (-1: as its backend options say), else its own slot,
 * allocated the first time (cb_ws_ids_ensure). */
int cb_daemon_ids(const char *dir, int privileged, unsigned long *base);

/* Look at the whole base now (stat only; a file whose stat moved is rehashed) and journal
 * every path where the mount shows something the latest turn did not record because the base
 * changed behind cowbox's back; logs what it found. Reads the base and upper/ directly, never
 * the mount. Called under the turn lock: at start, and before a snapshot or a rollback, where
 * it looks only when the inotify watch (basewatch.c) saw something move in the base since
 * the previous look. when: for the log. */
int cb_daemon_base_watch(struct cb_daemon *d, const char *when);

/* Record the open turn labelled label, as the snapshot op does (daemon/ops_turns.c); *turn
 * gets its number. With skip_empty, nothing changed since the latest turn records none and
 * *turn is the latest. Takes the turn lock. */
int cb_daemon_snapshot_labelled(struct cb_daemon *d, const char *label, int skip_empty,
				long long *turn);
/* The same for a caller that holds the turn lock already (merge records its writes). */
int cb_daemon_snapshot_locked(struct cb_daemon *d, const char *label, long long *turn);

/* merge (daemon/ops_merge.c): the op, a row of the turns table, and its worker side (in a
 * worker process: the merge's reads and writes of the live tree at mountpoint). */
int cb_daemon_op_merge(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req);
int cb_daemon_worker_merge(const char *mountpoint, const char *dir, const char *base,
			   const char *db_path, json_t *req, json_t **res);
/* In a worker: put back what an unrecorded merge wrote (cb_ws_merge_undo). */
int cb_daemon_worker_merge_undo(const char *mountpoint, const char *dir, const char *base,
				const char *db_path, json_t **res);
/* At start, once mounted: if a merge was interrupted, a thread holding the turn lock (taken
 * before this returns) undoes it through the worker; joined while stopping. */
void cb_daemon_merge_recover_start(struct cb_daemon *d);
void cb_daemon_merge_recover_join(void);

/* fsck (daemon/ops_fsck.c): wait for a running check to end. Called once while stopping,
 * after the connections are shut down. */
void cb_daemon_fsck_stop(void);

/* An op: handle runs on the connection's reader thread with the parsed request (which holds
 * "id" and "op"). It either replies (now, or later from a thread of its own after taking a
 * reference with cb_daemon_conn_ref) and returns 0, or returns -errno with a message set
 * (cb_error_set) and the dispatcher replies with an error for it. A handler that must not
 * block the connection (it streams, or waits for a process) starts its own thread. */
struct cb_daemon_op {
	const char *name;
	int (*handle)(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req);
};

/* The op tables (daemon/ops.c lists them); each ends with a NULL name. */
extern const struct cb_daemon_op cb_daemon_ops_core[];

/* Find an op by name in every registered table; NULL if unknown. */
const struct cb_daemon_op *cb_daemon_op_find(const char *name);

/* Send {"id":id,"ok":true, ...result's members} (result may be NULL; it is consumed either
 * way). Thread-safe; a line is never interleaved with another. -EPIPE once the client is gone. */
int cb_daemon_reply(struct cb_daemon_conn *conn, json_t *id, json_t *result);

/* Send {"id":id,"error":{"code":code,"message":...}}. code is one of the protocol's codes
 * (cowbox/client.h, cb_protocol_errors). */
int cb_daemon_reply_error(struct cb_daemon_conn *conn, json_t *id, const char *code,
			  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Send a frame of a running request: frame's members plus "id" (frame is consumed), e.g.
 * {"stream":"stdout","data":"<base64>"}. */
int cb_daemon_send_frame(struct cb_daemon_conn *conn, json_t *id, json_t *frame);

/* Send text as it is: one or more whole protocol lines (each a JSON object ending in a
 * newline) that the caller wrote itself, in one locked stretch. */
int cb_daemon_send_text(struct cb_daemon_conn *conn, const char *text, size_t len);
/* Send the n parts one after the other in one locked stretch (a frame's line and the bytes
 * it announces: no other frame can come between them). */
int cb_daemon_send_parts(struct cb_daemon_conn *conn, const struct iovec *part, int n);

/* The protocol error code for an errno: cb_daemon_error_code (errcode.h). */

/* Keep a connection alive past its reader (for ops that finish on their own thread); every
 * ref is dropped with cb_daemon_conn_unref. */
struct cb_daemon_conn *cb_daemon_conn_ref(struct cb_daemon_conn *conn);
void cb_daemon_conn_unref(struct cb_daemon_conn *conn);

/* The daemon a connection belongs to. */
struct cb_daemon *cb_daemon_conn_daemon(struct cb_daemon_conn *conn);

/* api (daemon/ops_api.c): the client of conn hung up or the daemon is stopping (called once per
 * connection, by its reader thread as it ends): every command conn started is killed (one not
 * started yet never starts). Requests that outlive their handler are the API's commands only;
 * they are kept in the daemon's running table, not by the connection. */
void cb_daemon_api_hangup(struct cb_daemon *d, struct cb_daemon_conn *conn);

/* api (daemon/ops_api.c): kill the API's running commands, wait for them, and close the
 * workspace's backend (forwarders, the docker container). Called once while stopping. */
void cb_daemon_api_stop(struct cb_daemon *d);

/* Ask the daemon to unmount and exit once the current replies are out (the `close` op). */
void cb_daemon_request_stop(struct cb_daemon *d);

/* A timestamped line in daemon.log (stderr in the foreground); any thread, and the worker. */
void cb_daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- daemon/sched.c: the daemon's CPU share on a busy host ---- */
/* Give this process's session (autogroup) the nice COWBOX_DAEMON_NICE (default -5, at most
 * -10); call once the daemon leads a session of its own. 0, or -errno when the kernel refused
 * (logged; the daemon serves on at the default share). */
int cb_daemon_sched_raise(void);

/* ---- daemon/basewatch.c: whether the base may have changed since the last look ---- */
struct cb_daemon_basewatch;
/* Watch every directory of the base (inotify); 0 or -errno with a message. */
int cb_daemon_basewatch_start(struct cb_daemon *d);
/* The watch without any directory yet (cb_daemon_basewatch_dir adds them one by one,
 * cb_daemon_basewatch_all all at once); 0 or -errno with a message. */
int cb_daemon_basewatch_open(struct cb_daemon *d);
void cb_daemon_basewatch_all(struct cb_daemon *d);
/* Watch the directory open at dirfd (d is the daemon); a watch that cannot be added leaves
 * the module blind, as cb_daemon_basewatch_all does. */
void cb_daemon_basewatch_dir(void *d, int dirfd);
/* 1 if the base may have changed since the previous call (or cannot be watched, or no watch
 * was started), and forget it; 0 when no event came: nothing in the base moved. */
int cb_daemon_basewatch_take(struct cb_daemon *d);
void cb_daemon_basewatch_stop(struct cb_daemon *d);
/* How many times the base was seen to move since the watch began (equal counts: nothing
 * moved in between); -1 when the watch cannot tell (none, blind, events not read yet). */
long long cb_daemon_basewatch_events(struct cb_daemon *d);
/* The same, after a moment (up to 0.1 s) for the watch thread to read events already queued:
 * -1 only when the watch cannot tell for good. */
long long cb_daemon_basewatch_settled(struct cb_daemon *d);

/* ---- daemon/basehash.c: the base hashed in the background ---- */
struct cb_turns;
/* Start hashing the base on a thread of idle priority (nothing for an empty base). It
 * pauses while a turn op holds the turn lock and ends once the first snapshot recorded the
 * base or the daemon stops. */
int cb_daemon_basehash_start(struct cb_daemon *d);
/* Wait for it to end (after d->stopping is set: it ends between two files). */
void cb_daemon_basehash_stop(struct cb_daemon *d);
/* 1 when the background pass finished and prepared the base map, and the base watch saw
 * nothing move in the base since the pass began walking it: the first snapshot may take
 * that map as it is. */
int cb_daemon_basehash_prepared(struct cb_daemon *d);
/* At start, under the turn lock, before the first map: read the base as the first map
 * would (cb_ws_base_scan_ahead), adding the base watch on each directory before it is read,
 * and keep the scan for the first map. 1 if every directory was watched so (else the caller
 * watches the base itself), 0 if not. */
int cb_daemon_base_scan_ahead(struct cb_daemon *d);
/* Under the turn lock: give t the scan read ahead if the watch saw nothing move in the base
 * since it began (else drop it). */
void cb_daemon_base_scan_take(struct cb_daemon *d, struct cb_turns *t);
/* Under the turn lock: drop the scan read ahead (after a snapshot it serves no one). */
void cb_daemon_base_scan_drop(struct cb_daemon *d);
/* Under the turn lock, once the base watch is set: if turn 0 is not frozen yet, whatever
 * freezes it reads the base after now, so while the watch counts nothing more the base is
 * turn 0 (no drift). */
void cb_daemon_drift_note(struct cb_daemon *d, struct cb_turns *t);
/* Under the turn lock: the base's drift from turn 0 for a fork, kept from the last look while
 * the watch counted nothing since, else looked at now (the whole base; *looked set) and kept.
 * *out is d's: valid until the turn lock is released. */
int cb_daemon_drift_get(struct cb_daemon *d, struct cb_turns *t, const struct cb_ws_drift **out,
			int *looked);
/* Under the turn lock: turn 0 may have changed (fsck --repair rebuilt the database): nothing
 * kept holds. */
void cb_daemon_drift_forget(struct cb_daemon *d);
/* Its progress as "base_hash" in an info reply. */
void cb_daemon_basehash_info(struct cb_daemon *d, json_t *r);
/* Let t use the shared base cache of the home the workspace directory ws_dir is in; a cache
 * that cannot be used is logged (the base is then hashed without it). */
int cb_daemon_basecache_attach(const char *ws_dir, struct cb_turns *t, const char *base);
/* Open the workspace's turn store (meta.db, its blobs, over its base). root: the tree its
 * snapshots read (NULL: none, for what reads recorded rows only); shared: with the shared
 * base cache attached. */
int cb_daemon_turns_open(struct cb_daemon *d, const char *root, int shared, struct cb_turns **t);
/* Log what t's base hashing did (cache hits, files hashed, damage of the shared cache). */
void cb_daemon_base_stats_log(struct cb_turns *t, const char *what);

/* ---- children (daemon/reaper.c) ----
 * The daemon is a child subreaper: orphans of the commands it runs are re-parented to it and
 * reaped by its reaper thread. Code that forks a child it will wait for itself calls
 * cb_daemon_child_claim(pid) while holding cb_daemon_spawn_lock (so the reaper cannot take
 * it first) and cb_daemon_child_release(pid) after its own waitpid. */
void cb_daemon_spawn_lock(void);
void cb_daemon_spawn_unlock(void);
int cb_daemon_child_claim(pid_t pid);
void cb_daemon_child_release(pid_t pid);
int cb_daemon_reaper_start(void);
void cb_daemon_reaper_stop(void);

/* ---- the worker processes (daemon/workproc.c, daemon/worker.c) ----
 * Every I/O the daemon does through its own mount (turn ops, the API's read and write, the
 * working_dir) runs in a worker process that holds no /dev/fuse fd, so a daemon killed at
 * any point can finish dying (see docs/reliability.md). */

/* Fork the spawner (call it single-threaded, before the mount and before SQLite is used). */
int cb_daemon_worker_start(struct cb_daemon *d);
/* The paths are known (the base read from meta.db): start the turn worker. */
int cb_daemon_worker_init(struct cb_daemon *d);
/* Send req (consumed) and wait for its answer: progress lines are forwarded to conn as
 * progress frames of id (conn may be NULL); *result (may be NULL) gets the reply's result
 * and *touched (may be NULL) a rollback's count, also when it failed. 0 or -errno with the
 * worker's message; -EIO naming the signal when the worker died. */
int cb_daemon_worker_call(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *touched);
/* The events of a diff as the protocol sends them, with where each side's bytes can be read
 * when sources is set (base, blob, or the live file under mountpoint). */
struct cb_turns;
struct cb_diff;
json_t *cb_daemon_events_json(const char *mountpoint, const char *base, const char *dir,
			      struct cb_turns *t, const struct cb_diff *diff, long long a,
			      long long b, int sources);
/* A rollback in progress keeps this file in the workspace directory. */
#define CB_DAEMON_ROLLBACK_PENDING "rollback.pending"
/* Before mounting: if a rollback was interrupted (its mark is there), remove its temporary
 * names from the upper layer and say so in the log. */
void cb_daemon_rollback_recover(struct cb_daemon *d);
/* Shut the workers' sockets down: an idle worker exits at once, a busy one when its request
 * is done or fails (its mount requests fail once the FUSE session is destroyed). */
void cb_daemon_worker_stop(struct cb_daemon *d);
/* After the FUSE session is destroyed and no op runs: wait for the spawner (which waits for
 * every worker) and free the daemon's ends. */
void cb_daemon_worker_reap(struct cb_daemon *d);
/* What a backend's read, write and mkdirs go through in the daemon: the file workers. */
extern const struct cb_backend_io cb_daemon_backend_io;

/* Lines of JSON between the daemon and a worker, each optionally followed by "n" raw bytes
 * (the "n" member of the line, or of its "ok" member). */
struct cb_daemon_lines {
	int fd;
	char *buf;
	size_t len, cap;
};
/* The next line as JSON; NULL at EOF or on an error (message set). */
json_t *cb_daemon_line_read(struct cb_daemon_lines *r);
/* Write j (consumed), a newline, then len bytes of data (may be NULL), all of it. */
int cb_daemon_line_write(int fd, json_t *j, const void *data, size_t len);
/* In a worker: serve requests on fd until EOF (daemon/worker.c). */
void cb_daemon_worker_loop(int fd);
/* In a worker: a file op (read, write, mkdirs) on the tree at root; *data (malloc'd) and *n
 * are what follows the reply. */
int cb_daemon_worker_file_op(const char *root, const char *op, json_t *req,
			     struct cb_daemon_lines *r, json_t **res, void **data, size_t *n);

/* ---- idle stop (daemon/idle.c) ---- */
extern const struct cb_daemon_op cb_daemon_ops_idle[];
/* cb_daemon_idle_load and _save: cowbox/daemon.h */
/* The thread that stops the daemon once idle (not pinned, no connection for the timeout),
 * and its end (after d->stopping is set). */
int cb_daemon_idle_start(struct cb_daemon *d);
void cb_daemon_idle_stop(struct cb_daemon *d);
/* "idle_timeout" and "pinned" into an info reply. */
void cb_daemon_idle_info(struct cb_daemon *d, json_t *r);

/* ---- access levels (daemon/access.c) ---- */
extern const struct cb_daemon_op cb_daemon_ops_access[];
/* A connection's own level (it starts at full) and its lowering; what it may do is the lower
 * of it and the workspace's (cb_daemon_access_of). */
int cb_daemon_conn_level(struct cb_daemon_conn *conn);
void cb_daemon_conn_set_level(struct cb_daemon_conn *conn, int level);
/* 0 if conn may run op (req: its request), else -EACCES with a message saying which level
 * the op needs and which the connection has. */
int cb_daemon_access_check(struct cb_daemon_conn *conn, const char *op, json_t *req);
/* {"access": the connection's level, "supported_access": the workspace's}. */
json_t *cb_daemon_access_json(struct cb_daemon_conn *conn);

/* ---- connections (daemon/conn.c) ---- */

/* Serve one accepted client on a reader thread of its own (takes ownership of fd). */
int cb_daemon_conn_start(struct cb_daemon *d, int fd);

/* Wake every reader (shutdown of their sockets) and wait up to timeout_ms for all
 * connections to be gone. */
void cb_daemon_conns_shutdown(struct cb_daemon *d, int timeout_ms);

/* ---- socket addresses (daemon/client.c) ---- */

/* Fill a unix socket address for path; a path too long for sun_path goes through
 * /proc/self/fd/<dirfd>/ (*dirfd is then an open fd of its directory to close after use,
 * else -1). */
struct sockaddr_un;
int cb_daemon_sockaddr(const char *path, struct sockaddr_un *sa, socklen_t *len, int *dirfd);

#endif
