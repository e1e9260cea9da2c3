/* Workspaces (ws/): where they live under $COWBOX_HOME, their refs and names, creating,
 * resolving, describing and removing them. */
#ifndef COWBOX_WORKSPACE_H
#define COWBOX_WORKSPACE_H

#include <stdio.h>
#include <sys/types.h>

/* "cb-" + 32 lowercase hex digits. */
#define CB_WS_REF_LEN 35

enum cb_ws_state {
	CB_WS_UNMOUNTED = 0, /* no daemon, nothing mounted */
	CB_WS_MOUNTED,	     /* a daemon holds the lock (it owns the mount while it lives) */
	CB_WS_STALE,	     /* no daemon, but a dead FUSE mount or socket is left over */
	CB_WS_INCOMPLETE,    /* creation was interrupted: only `rm` accepts it */
	CB_WS_BROKEN,	     /* its meta.db cannot be read (corrupt): only `rm` accepts it */
};

struct cb_ws_info {
	char ref[CB_WS_REF_LEN + 1];
	char *name;	  /* NULL if the workspace has none */
	char *base;	  /* absolute path; NULL for an empty workspace */
	char *dir;	  /* $COWBOX_HOME/workspaces/<ref> */
	char *mountpoint; /* the daemon's mount point, else the default <dir>/mnt */
	enum cb_ws_state state;
	pid_t daemon_pid;      /* 0 when no daemon runs */
	long long upper_bytes; /* disk used by upper/ (0 in place: the folder is the user's) */
	int in_place;	       /* the upper layer is the base folder itself */
};

/* The state directory: $COWBOX_HOME, else /var/lib/cowbox for root, else
 * $XDG_DATA_HOME/cowbox or ~/.local/share/cowbox. *out is malloc'd; it may not exist yet. */
int cb_ws_home(char **out);

/* 1 if s is spelled like a ref cowbox makes ("cb-" + 32 lowercase hex), else 0. */
int cb_ws_ref_syntax(const char *s);

/* 0 if name is usable as a workspace name (1-64 of [A-Za-z0-9._-], starting with a letter or
 * digit, not starting with "cb-" so it never looks like a ref); else -EINVAL and a message. */
int cb_ws_name_check(const char *name);

/* Create a workspace over base (NULL: empty) with an optional unique name. The ref directory
 * is made first and reported on log (if not NULL), so that a crash part-way leaves a ref that
 * `cowbox rm` cleans. Bad names, taken names and missing bases fail before anything is made. */
int cb_ws_create(const char *base, const char *name, FILE *log, char ref[CB_WS_REF_LEN + 1]);

/* Create an in-place workspace over folder: the mount's upper layer is folder itself, so the
 * agent's edits land there, journaled as usual. folder is recorded as turn 0 (hashed and
 * every file kept as a blob, which costs a copy of its files in $COWBOX_HOME), so snapshot,
 * diff and rollback work as for any workspace; removing the workspace leaves folder as it
 * is. Refused for /, a folder inside $COWBOX_HOME or one holding it. */
int cb_ws_create_in_place(const char *folder, const char *name, FILE *log,
			  char ref[CB_WS_REF_LEN + 1]);

/* 1 and *found ("FOLDER (workspace REF)", malloc'd) if path (a real path) holds or lies in
 * the folder of an in-place workspace: that folder is written only through its mount, by
 * the daemon that journals it (a sandbox writing it directly could race the daemon's paths
 * there). 0 and NULL if none; -errno. */
int cb_ws_in_place_overlap(const char *path, char **found);

/* A workspace built in a hidden directory (*dir, malloc'd) that nothing lists, resolves or
 * mounts until cb_ws_publish: what a fork fills. name is only checked here; it is claimed
 * by publishing. Its meta.db is written without fsync: the filler fsyncs it before
 * publishing (cb_ws_fork does). */
int cb_ws_create_unpublished(const char *base, const char *name, char ref[CB_WS_REF_LEN + 1],
			     char **dir);
/* Make a filled unpublished workspace a workspace: rename it to its ref (atomic), then claim
 * name. On failure it is deleted. */
int cb_ws_publish(const char *ref, const char *dir, const char *name);
/* Delete an unpublished workspace (a fork that failed). */
void cb_ws_delete_unpublished(const char *dir);
/* Delete unpublished workspaces whose builder is dead (a fork killed midway): gone, or a
 * zombie. Run by every command that opens $COWBOX_HOME to name a workspace (find, ls,
 * create, rm) and by the daemon's start. */
void cb_ws_clean_unpublished(void);
/* The same, calling fn (may be NULL) with each removed directory's path; returns how many. */
int cb_ws_sweep_unpublished(int (*fn)(const char *path, void *arg), void *arg);

/* The upper layer under a byte cap (ws/upper_image.c): <dir>/upper becomes the root of an
 * ext4 of its own in <dir>/upper.img, made (its files copied in: a plain upper/, or an image
 * made for another cap) and mounted now, as root with loop devices only. 1: it is, and the
 * kernel enforces bytes at write(2); 0: it could not be here (cb_error_message says why; the
 * caller counts in the FUSE layer); -EIO: the image is there but could not be mounted;
 * other <0: errors. bytes 0 or COWBOX_UPPER_IMAGE=0: 0, an existing image mounted. */
int cb_ws_upper_image(const char *dir, unsigned long long bytes, unsigned long long inodes);
/* Mount an existing image at <dir>/upper for a reader while no daemon serves it (fsck);
 * *attached (may be NULL) says whether cb_ws_upper_release is the caller's to call. */
int cb_ws_upper_attach(const char *dir, int *attached);
/* Unmount the image (lazily; its loop device goes with its last user). */
void cb_ws_upper_release(const char *dir);
/* 1 when <dir>/upper.img exists. */
int cb_ws_upper_imaged(const char *dir);

/* Turn a ref or a name into the ref of a complete workspace cowbox created; anything else
 * (a malformed ref, an unknown name, a path, an interrupted creation) is refused with a
 * message saying why, before the caller does anything. */
int cb_ws_resolve(const char *ref_or_name, char ref[CB_WS_REF_LEN + 1]);

/* Turn a ref or a name into the ref of a workspace directory that exists, complete or not
 * (what fsck and rm need for a damaged one). */
int cb_ws_find(const char *ref_or_name, char ref[CB_WS_REF_LEN + 1]);

/* "$COWBOX_HOME/workspaces/<ref>/<leaf>" (leaf NULL: the directory), malloc'd into *out. */
int cb_ws_path(const char *ref, const char *leaf, char **out);

/* The host id range of a workspace's sandbox (run as root): its uids and gids 0-65535 are
 * host ids [base, base + CB_WS_IDS_SIZE), a slot of its own among the workspaces of this
 * $COWBOX_HOME, from CB_WS_IDS_FIRST up to CB_WS_IDS_END; `cowbox exec --dir` (no
 * workspace) uses the slot at CB_WS_IDS_END. */
#define CB_WS_IDS_SIZE	65536UL
#define CB_WS_IDS_FIRST 0x40000000UL /* 2^30: above subordinate ids (/etc/subuid) in use */
#define CB_WS_IDS_END	0x7fff0000UL /* the last slot below 2^31 is the --dir range */

/* The base kept in dir (a workspace directory): 0, or -ENOENT when it has none yet (other
 * errors with a message). */
int cb_ws_ids_get(const char *dir, unsigned long *base);

/* The base kept in dir, allocated first if it has none: the lowest slot no workspace under
 * $COWBOX_HOME holds, chosen under $COWBOX_HOME/ids.lock and kept in dir/ids. */
int cb_ws_ids_ensure(const char *dir, unsigned long *base);

/* Shift the owner of everything under top (not crossing mounts, not following symlinks)
 * whose uid or gid is below 65536 into [base, base + 65536), keeping its mode (set-id bits
 * included, now that they name an id of the range): for an upper layer that root wrote
 * directly (fork). Only for a tree nothing else can reach yet. */
int cb_ws_ids_shift_tree(const char *top, unsigned long base);

/* Describe a workspace (state, daemon, mount point, upper size). Free with cb_ws_info_free. */
int cb_ws_info(const char *ref, struct cb_ws_info *out);
void cb_ws_info_free(struct cb_ws_info *info);

/* Call fn for every workspace, in ref order; fn returns 0 to go on. */
int cb_ws_list(int (*fn)(const struct cb_ws_info *info, void *arg), void *arg);

/* Stop the workspace's daemon (SIGTERM, then SIGKILL after a grace), unmount what is left and
 * delete everything. A well-formed ref that no longer exists returns 0 quietly. */
int cb_ws_remove(const char *ref_or_name);

/* The live daemon of a workspace: *pid > 0 and *mountpoint (malloc'd) when one holds the lock,
 * else *pid = 0 and *mountpoint = NULL. */
int cb_ws_daemon(const char *ref, pid_t *pid, char **mountpoint);

/* 1 if path is the mount point of a FUSE mount (alive or dead) in this mount namespace. */
int cb_ws_is_fuse_mount(const char *path);

/* Like cb_ws_is_fuse_mount, and copies the mount's source (the fsname, "cowbox:<ref>" for a
 * workspace) into source. */
int cb_ws_fuse_mount_source(const char *path, char *source, size_t size);

/* Detach a FUSE mount left behind by a dead daemon (umount2 MNT_DETACH as root, else
 * fusermount3 -u -z); 0 if nothing was mounted there. */
int cb_ws_unmount(const char *path);

/* 1 if pid was killed but cannot finish exiting (its leader is a zombie while threads remain,
 * or a SIGKILL is pending): what a daemon whose threads wait on its own mount looks like; also
 * 1 if pid is gone (asked of the pid in a lock that is still held: its workers hold it, and
 * stay only while they wait on its dead mount). */
int cb_ws_pid_dying(pid_t pid);
/* 1 while pid runs and is neither a zombie nor about to die of a pending SIGKILL: a daemon
 * named by a held lock that still serves (right after a kill -9 its workers hold the lock
 * a moment longer). */
int cb_ws_pid_serving(pid_t pid);

/* Abort the FUSE connection of the mount at path (fusectl's abort file, mounting fusectl on
 * /sys/fs/fuse/connections if needed), which fails every request waiting on it, then detach
 * the mount. 0 if there is no FUSE mount there; needs root. */
int cb_ws_fuse_abort(const char *path);

/* Clean what a dead daemon left (its FUSE mounts of this workspace, the socket file) while
 * holding the workspace lock, so that no daemon can be starting meanwhile; -EBUSY if one
 * runs. Afterwards the workspace is "unmounted". */
int cb_ws_clear_stale(const char *ref);

/* "mounted", "unmounted", "stale", "incomplete", "broken". */
const char *cb_ws_state_name(enum cb_ws_state state);

/* The workspace side of access levels (cowbox/access.h). */
/* The widest level the workspace in dir serves: what cb_ws_access_save wrote, or full when
 * nothing was; -errno with a message when the file is unreadable or holds no level. */
int cb_ws_access_load(const char *dir);

/* Record level as the widest the workspace in dir serves (written to a temporary file and
 * renamed, so a reader sees the old level or the new one). 0 or -errno with a message. */
int cb_ws_access_save(const char *dir, int level);

/* The workspace side of apply (cowbox/apply.h's cb_box_apply goes through the daemon). */
struct cb_turns;

/* What an apply did, or why it refused: conflicts[] are "PATH: why" lines (the folder's
 * entry is neither what turn a recorded nor what turn b did). */
struct cb_ws_apply_result {
	long long written, deleted,
	    unchanged; /* paths written (or chmod'ed), removed, already so */
	char **conflicts;
	size_t nconflicts;
};

/* Write the changes from turn a to turn b (recorded turns; 0 = the base) onto the directory
 * target: every path is checked first against what turn a recorded (type, content by
 * SHA-256, symlink target); a path already as turn b has it is left alone. Any other state is
 * a conflict, and then nothing is written: -EEXIST with the list in res. Otherwise deletions
 * go first (deepest first), then directories, files (content copied from the base or its
 * blob into a temporary name beside it, "NAME.cowbox-apply-REF", listed first in the
 * workspace's apply.pending for cb_ws_apply_sweep; checked against the turn's hashes, then
 * renamed over)
 * and symlinks. Every path goes through util/beneath.c (no symlink, no "..", nothing outside
 * target). Free res with cb_ws_apply_result_free. */
int cb_ws_apply(struct cb_turns *t, long long a, long long b, const char *target,
		struct cb_ws_apply_result *res);
void cb_ws_apply_result_free(struct cb_ws_apply_result *res);

/* Remove the temporary files an apply of the workspace in ws_dir left in its target when it
 * was killed (named "NAME.cowbox-apply-REF", listed in ws_dir/apply.pending before each was
 * made; only such names, beneath the target, are touched), then the list. A list whose
 * applier is still alive is left alone. fn (may be NULL) gets each removed file's full
 * path. Returns how many were removed, or -errno with a message. */
int cb_ws_apply_sweep(const char *ws_dir, int (*fn)(const char *path, void *arg), void *arg);

#endif
