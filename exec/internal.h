/* Private to exec/: the plan that the runner prepares in the caller and the supervisor (shim)
 * and the command child follow after clone, plus the sandbox and cgroup helpers they call. */
#ifndef COWBOX_EXEC_INTERNAL_H
#define COWBOX_EXEC_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

#include "cowbox/exec.h"
#include "cowbox/sandbox.h"
#include "exec/pasta_guard.h"

/* A ThreadSanitizer build (exec/test_run_tsan.sh): TSan follows fork but not a raw clone,
 * whose child inherits the runtime's locks and thread state as they were (run.c, shim.c). */
#if defined(__SANITIZE_THREAD__)
#define CB_EXEC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CB_EXEC_TSAN 1
#endif
#endif

/* Messages on the control socket (SOCK_SEQPACKET), one per datagram. */
#define CB_MSG_GO     'G' /* parent -> shim: maps and cgroups are in place, go on */
#define CB_MSG_KILL   'K' /* parent -> shim: + int signal for the whole tree */
#define CB_MSG_STATUS 'S' /* shim -> parent: + int wait status of the command */
#define CB_MSG_ERROR  'E' /* shim or command -> parent: setup failed, + text */
#define CB_MSG_TTY    'T' /* shim -> parent: the sandbox pty's master, as SCM_RIGHTS */
#define CB_MSG_DETACH                                                                              \
	'D' /* parent -> shim: the caller lets go of the command's leftover                        \
	       background jobs; the output pipes' read ends come as SCM_RIGHTS,                    \
	       for the shim to drain until they close */

/* One entry of the sandbox root, prepared in the parent so the child only makes syscalls. */
enum cb_ns_entry_kind {
	CB_NS_BIND_RO,
	CB_NS_BIND_RW,
	CB_NS_SYMLINK,
	CB_NS_DEV,
	CB_NS_MASK, /* hide a host secret (/etc) or kernel state (/proc) behind an empty file or
		       directory, bound read-only */
};

struct cb_ns_entry {
	enum cb_ns_entry_kind kind;
	char *src;   /* host path (bind, dev) or link target (symlink) */
	char *dst;   /* path relative to the new root, e.g. "usr", "dev/null" */
	dev_t rdev;  /* CB_NS_DEV: the host node's device number (mknod without userns) */
	int is_file; /* bind of a file (device node) rather than a directory */
	int over;    /* onto a file the root has already (no mount point made) */
	int tree;    /* detached clone opened by a privileged caller before clone, else -1 */
	int idmap;   /* bind through an idmapped mount (plan->idmap_*) */
	int hide;    /* read-only directory shown as an overlay's layer (cb_ns_attach_hidden) */
};

#define CB_NS_MAX_ENTRIES 64
#define CB_NS_MAX_GROUPS  CB_EXEC_MAX_GROUPS

/* Everything the sandbox child needs, computed before clone (no allocation after it). */
struct cb_ns_plan {
	struct cb_ns_entry *entries;
	size_t n_entries;
	int userns;
	int privileged_parent; /* the caller is root: it may allow setgroups in the namespace */
	uid_t map_uid;	       /* host id of the sandbox's uid/gid 0 ... */
	gid_t map_gid;
	unsigned long map_count; /* ... and how many ids follow (65536, or 1 without root) */
	uid_t idmap_uid;	 /* the workspace directory's owner and group: shown through */
	gid_t idmap_gid;	 /* the idmapped bind as the sandbox's root */
	int idmap_late;		 /* the idmap is the sandbox's own user namespace: applied once its
				    maps are written (cb_ns_idmap_late), no helper namespace */
	int deny_setid;		 /* files made in the workspace keep a host owner: the command
				    may not set setuid/setgid bits (seccomp) */
	int net_none;
	int set_user; /* the command switches to uid/gid/groups before it starts */
	uid_t uid;
	gid_t gid;
	gid_t groups[CB_NS_MAX_GROUPS];
	size_t n_groups;
	char *hostname;
	char *tmp_opts; /* tmpfs options of the private /tmp */
	unsigned long nofile;
	int memory_limited; /* protect the in-sandbox init from the OOM killer */
	char oom_adj[12];   /* the command's oom_score_adj, ready to write (init's is
			       -1000 under a memory cap); "" with none: it keeps 0 */
	unsigned long clone_flags;
	void *seccomp_prog; /* struct sock_fprog, shared and never freed (built once) */
	void *setid_prog;   /* deny_setid: the set-id mode filter, likewise; else NULL */
	char *arg_start;    /* the caller's command line in memory (what /proc/PID/cmdline shows),
			       which the sandbox's pid 1 blanks: it names host paths */
	size_t arg_len;
};

/* What the shim and the command child do after clone. */
struct cb_exec_plan {
	char *const *argv;
	char *const *envp;
	const char *path;	   /* PATH to search for a bare program name */
	const char *cwd;	   /* NULL: stay where setup left us */
	int fd_in, fd_out, fd_err; /* child ends; with tty all three are the pty slave */
	int tty;
	int sandbox_tty; /* make the pty in the sandbox's own devpts and send its master up */
	unsigned short rows, cols;
	int ctl;		     /* child end of the control socket */
	int wait_go;		     /* wait for CB_MSG_GO before setting up */
	int group;		     /* host: the command's v2 group directory, or -1 */
	const struct cb_ns_plan *ns; /* NULL: on the host */
	struct cb_exec_ids ids;	     /* host: the ids to switch to (set_ids) */
	gid_t ids_groups[CB_NS_MAX_GROUPS];
	int set_ids;
};

/* The shim: set up the sandbox (if any), start the command, report its status, forward
 * kills to the whole tree, reap everything. Never returns. */
_Noreturn void cb_exec_shim_main(const struct cb_exec_plan *p);

/* Append s (or v in decimal) to buf at off, NUL-terminated within cap; the new length.
 * Async-signal-safe string building for code that runs after clone. */
size_t cb_exec_cat(char *buf, size_t off, size_t cap, const char *s);
size_t cb_exec_cat_uint(char *buf, size_t off, size_t cap, unsigned long v);

/* Shim, on the host: send sig to every process of the command's tree at once, so that none
 * escapes by being reparented while the signal goes out. group (the command's v2 cgroup
 * directory, or -1): cgroup.kill, or freeze, signal each member, thaw; without a group the
 * tree is stopped (SIGSTOP, walked until complete) before the signal and continued after.
 * SIGKILL without a group is one walk: callers repeat it until nothing is left. */
void cb_exec_tree_signal(int group, int sig);

/* Send a CB_MSG_ERROR datagram "what: strerror(err)" on fd; async-signal-safe. */
void cb_exec_child_error(int fd, const char *what, const char *detail, int err);

/* Build a plan for sb (parent side): every path checked and every string made now, so the
 * child only makes syscalls. Bad input fails here, naming the path and why. */
int cb_ns_plan_build(const struct cb_sandbox *sb, struct cb_ns_plan **out);
/* Give the sandbox's first process (pid, not yet running) the plan's oom_score_adj, from
 * outside: inside a user namespace /proc/self/oom_score_adj is not its own to write. Every
 * process of the sandbox inherits it. Best effort. */
void cb_ns_write_oom(const struct cb_ns_plan *p, pid_t pid);

/* Resolve sb->user (NAME|UID[:GROUP|GID]) in the root's etc/passwd and etc/group (the
 * image's, read beneath it, else the host's) into plan's uid, gid and groups, checked
 * against the ids the plan maps. Nothing to do without sb->user. -errno with a message. */
int cb_ns_user_resolve(const struct cb_sandbox *sb, struct cb_ns_plan *plan);

/* Free a plan and close the trees it holds; NULL is fine. */
void cb_ns_plan_free(struct cb_ns_plan *plan);

/* Privileged caller, before clone: clone the bind sources as detached trees, so that paths
 * the sandbox's (mapped) root could not traverse still bind. 0 or -errno with a message. */
int cb_ns_plan_open_trees(struct cb_ns_plan *plan);

/* Child side, in the new namespaces: build the root and pivot into it. 0 or -errno, having
 * sent a CB_MSG_ERROR naming the step on ctl. */
int cb_ns_setup_root(const struct cb_ns_plan *plan, int ctl);

/* The sandbox's pid 1, once set up and before the command starts (which inherits all of it):
 * RLIMIT_NOFILE, no_new_privs, locked securebits, and only the capabilities (and bounding
 * set) the command keeps: none as host root, root's over its own ids in a user namespace.
 * -1 having reported why on ctl. */
int cb_ns_drop_privileges(const struct cb_ns_plan *plan, int ctl);

/* The sandbox's pid 1 once the command has its copy of them: no capability, empty
 * bounding set (best effort: nothing is left to report to). */
void cb_ns_shed_privileges(void);

/* Command child, last step before execve: umask, the seccomp filters. */
int cb_ns_harden(const struct cb_ns_plan *plan, int ctl);

/* The seccomp program (struct sock_fprog *), built once per process. */
int cb_ns_seccomp_prog(void **out);

/* The extra filter of a sandbox with deny_setid (see ns_harden.c), built once. */
int cb_ns_seccomp_setid_prog(void **out);

/* Write uid_map/gid_map of pid for a user namespace plan. */
int cb_ns_write_maps(const struct cb_ns_plan *plan, pid_t pid);

/* With idmap_late, idmap the workspace's tree through the user namespace of the sandbox's
 * pid 1 (its maps written, before it attaches the tree). 0 or -errno with a message. */
int cb_ns_idmap_late(const struct cb_ns_plan *plan, pid_t pid);

struct cb_cgroup;

/* A fresh group with sb's limits (cpus, memory, pids) under cowbox/ in our own cgroup, v2
 * when its controllers are delegated, else v1. *out NULL and 0 when no limit is asked for. */
int cb_cgroup_create(const struct cb_sandbox *sb, struct cb_cgroup **out);

/* Move pid (before it starts anything) into the group; its children follow. */
int cb_cgroup_attach(struct cb_cgroup *cg, pid_t pid);

/* 1 if the memory cap made the kernel kill a process in the group, else 0. */
int cb_cgroup_oom_killed(struct cb_cgroup *cg);

/* A plain v2 group (no limits) for a command run on the host, so that the shim can freeze and
 * kill its whole tree however it reparents. *out NULL and 0 when there is no writable v2
 * hierarchy (the shim then walks /proc). */
int cb_cgroup_host_create(struct cb_cgroup **out);

/* The host group's directory fd (close-on-exec, owned by cg), or -1. */
int cb_cgroup_dirfd(const struct cb_cgroup *cg);

/* Remove the group once its processes are gone (waiting briefly for them); NULL is fine. */
void cb_cgroup_destroy(struct cb_cgroup *cg);

/* Child side, before pivot_root (the new root is rootfd, at /tmp): replace the read-only bind
 * of a directory at dst under rootfd by a read-only overlay whose one real layer it is (the
 * other an empty tmpfs), so that /proc/self/mountinfo shows the overlay's root "/" and
 * "lowerdir=/proc/self/fd/N:..." where the bind showed the directory's path in its
 * filesystem (a host path). 0 done; 1 not done, the bind left as it was (no overlay
 * filesystem, or a layer it refuses: too deep a stack); -1 with errno when the bind is gone. */
int cb_ns_hide_bind(int rootfd, const char *dst);

/* Child side, before pivot_root: a copy of the file tree holds (a detached clone) made in
 * the root tmpfs and bound read-only at dst, its name then removed: mountinfo shows a
 * deleted file of the tmpfs, not the host file's path. 0, or -1 with errno. */
int cb_ns_copy_file(int tree, int rootfd, const char *dst);

#endif
