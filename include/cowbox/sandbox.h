/* The namespace sandbox (exec/ns*.c): what a command sees when the runner isolates it: a
 * fresh root of read-only host (or image) binds, the workspace at /workspace, limits. */
#ifndef COWBOX_SANDBOX_H
#define COWBOX_SANDBOX_H

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Network of the sandbox. The allow-list mode is built from the pieces here: the proxy runs
 * outside, its unix socket is bound in (cb_sandbox_bind) or it listens in a kept namespace
 * the commands join (CB_NET_JOIN); an enum value for it can be added without changing these. */
enum cb_sandbox_net {
	CB_NET_NONE = 0, /* a fresh network namespace with only loopback, up */
	CB_NET_ALL,	 /* the host's own network namespace (what `network host` asks for;
			    `network all` is CB_NET_JOIN of a namespace that pasta serves) */
	CB_NET_JOIN,	 /* join netns_fd: a namespace the caller keeps, e.g. one per workspace
			    shared by its commands (and the forwarders or proxy it runs there);
			    also saves creating a namespace per command (the main cost of one) */
};

/* One more host path shown in the sandbox, e.g. the unix socket of an allow-list proxy that
 * runs outside. dst is absolute inside the sandbox and must not fall under the root's own
 * directories (/usr, /etc, /bin, /lib*, /workspace, /tmp, /proc, /dev): /run/... is typical. */
struct cb_sandbox_bind {
	const char *src; /* host path: a directory, file or socket */
	const char *dst;
	int writable; /* else read-only (a socket can still be connected to) */
};

/* The host ids of a sandbox given no id_base: its uids/gids 0-65535 are host ids
 * [CB_SANDBOX_DIR_ID_BASE, CB_SANDBOX_DIR_ID_BASE + 65536), just below 2^31. */
#define CB_SANDBOX_DIR_ID_BASE 0x7fff0000UL

/* Zero-initialise and fill what you need; zero fields take the documented defaults.
 * Limits live in a per-command cgroup under a cowbox/ child of the caller's own cgroup (v2
 * where the controllers are delegated to it, else each v1 hierarchy), removed afterwards.
 * The command runs in a user namespace: as root, its uids/gids 0-65535 are a host range of
 * their own (id_base), so its root is no host user's and root-only host files are out of its
 * reach; without root, its root is the caller. privileged (as root only) runs it as host
 * uid 0 instead, with no capabilities and host secrets in /etc masked. Both ways /proc's
 * kernel state (slabinfo, kpage*, sched_debug, timer_list) is masked, /proc/sys read-only. */
struct cb_sandbox {
	const char *workspace; /* host directory (or FUSE mount) bound read-write at /workspace */
	const char *image;     /* root image directory (debootstrap tree); NULL: the host's
				  /usr /etc /bin /sbin /lib* read-only */
	const char *hostname;  /* the workspace's name; NULL: "cowbox" */
	enum cb_sandbox_net net;
	int netns_fd; /* CB_NET_JOIN: an fd of /proc/PID/ns/net (the caller still owns it) */
	double cpus;  /* CPU quota in cpus (cgroup cpu quota per 100 ms period), 0: none */
	unsigned long memory_mb; /* memory cap, 0: none; exceeding it kills (137, oom_killed) */
	unsigned long pids;	 /* cap on processes+threads, 0: none */
	int oom_score_adj;	 /* the command's /proc/PID/oom_score_adj (0-1000; a positive
				    one makes the host OOM killer pick its processes first) */
	int limits_optional;	 /* memory_mb and pids are defaults, not asked for: where no
				    cgroup may be made (not root, nothing delegated) the command
				    runs without them rather than not at all */
	unsigned long nofile;	 /* RLIMIT_NOFILE, 0: 1024 */
	unsigned long tmp_mb;	 /* size of the private /tmp, 0: 512 */
	const struct cb_sandbox_bind *binds; /* extra binds (at most 16), in this order */
	size_t n_binds;
	const char *ca_bundle; /* a PEM file bound read-only over the root's
				  etc/ssl/certs/ca-certificates.crt (when it has that file) */
	const char *user;      /* run the command as NAME|UID[:GROUP|GID], looked up in the root's
				  etc/passwd and etc/group (the image's, else the host's); a uid
				  needs to be mapped (0-65535 as root). NULL: the sandbox's root.
				  Not with privileged (no capability left to switch with). */
	int userns;	       /* ignored: a user namespace is the default (kept for callers) */
	int privileged;	       /* as root: no user namespace (sandbox uid 0 is host uid 0) */
	unsigned long id_base; /* as root: host id of the sandbox's uid/gid 0, the first of
				  65536. Nonzero: the workspace already shows the sandbox's
				  ids (a cowbox FUSE mount with this id_base). 0: the range at
				  CB_SANDBOX_DIR_ID_BASE, and the workspace directory is bound
				  through an idmapped mount so that its owner's files are the
				  sandbox root's (files made there get that owner on disk; a
				  seccomp filter refuses setuid, and setgid on files, there) */
};

/* User-mode networking (exec/pasta.c) for a network namespace the caller keeps: pasta, from
 * Debian's passt package, relays the namespace's outbound TCP, UDP (and so DNS) through host
 * sockets, while the host's loopback, its abstract unix sockets and every port of the host
 * stay out of reach (no port forwarding either way, the gateway is not mapped to the host),
 * and so does every other address of the host's interfaces: pasta runs with a group of its
 * own whose packets to any local address a chain of the host's firewall (COWBOX-PASTA) rejects,
 * and the namespace's firewall rejects them too, rewritten by a thread of the caller whenever
 * the host's addresses change (both need Debian's iptables). A thread of the caller keeps pasta: it
 * ends with cb_pasta_stop or, if the caller's process dies, with it (a parent-death signal);
 * nothing is left running. */
struct cb_pasta;

/* Start pasta for netns_fd (an fd of a network namespace with loopback up; duplicated, the
 * caller keeps its own) and return once the namespace has its interface, address and routes.
 * log_path gets pasta's messages, pid_path its pid (files in a directory only root may write).
 * -errno with a message quoting pasta's own when it fails or takes over 10 s. */
int cb_pasta_start(int netns_fd, const char *log_path, const char *pid_path, struct cb_pasta **out);

/* Kill and reap pasta and free p; NULL is fine. */
void cb_pasta_stop(struct cb_pasta *p);

#ifdef __cplusplus
}
#endif

#endif
