/* Serving a workspace (`cowbox serve`, `cowbox mount`): run its daemon in this process, and
 * the idle timeout a workspace keeps. Talking to a running daemon is cowbox/client.h. */
#ifndef COWBOX_DAEMON_H
#define COWBOX_DAEMON_H

#ifdef __cplusplus
extern "C" {
#endif

struct cb_daemon_options {
	const char *ref;	/* a ref or name; resolved first */
	const char *mountpoint; /* NULL: <dir>/mnt */
	int foreground;		/* log to stderr instead of daemon.log */
	int debug;		/* FUSE request tracing */
	int pinned;		/* never stop when idle (`cowbox mount`), only when told to */
};

/* Run the daemon until the workspace is unmounted, `close` is asked or SIGTERM/SIGINT come:
 * lock, journal, mount, control socket. Returns 0 after a clean stop; -errno with a message
 * (e.g. "workspace cb-... is in use by pid N") when it cannot start. */
int cb_daemon_serve(const struct cb_daemon_options *opt);

#define CB_DAEMON_IDLE_DEFAULT 600.0 /* seconds, when the workspace sets none */

/* The idle timeout the workspace in dir (its directory under $COWBOX_HOME) keeps, in seconds
 * (0: never stop when idle; the default when none was kept); 0 or -errno. */
int cb_daemon_idle_load(const char *dir, double *timeout);

/* Keep timeout (seconds >= 0, 0: never) for the workspace in dir; its daemon reads it at
 * start. 0 or -errno. */
int cb_daemon_idle_save(const char *dir, double timeout);

#ifdef __cplusplus
}
#endif

#endif
