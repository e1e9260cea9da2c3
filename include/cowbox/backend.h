/* Backends (backends/): where a workspace's commands run: ns (the namespace sandbox), local (a
 * host subprocess), docker (one long-lived container, the docker CLI only) or vm (a qemu VM
 * under its own kernel). One table each. */
#ifndef COWBOX_BACKEND_H
#define COWBOX_BACKEND_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "cowbox/exec.h"
#include "cowbox/net.h"

#define CB_BACKEND_MAX_HOOKS 16
#define CB_BACKEND_CHUNK     (1u << 20) /* the largest read or write chunk, in bytes */

/* What a workspace's commands reach on the network. */
enum cb_backend_net {
	CB_BACKEND_NET_NONE = 0, /* loopback only: a namespace of the workspace's own */
	CB_BACKEND_NET_ALL,	 /* outbound through user-mode networking (ns: pasta; docker:
				    the engine's default network); not the host's loopback */
	CB_BACKEND_NET_HOST,	 /* the host's own namespace (ns, docker; what local always is) */
	CB_BACKEND_NET_PUBLIC,	 /* through the workspace's egress proxy: public addresses only */
	CB_BACKEND_NET_ALLOW,	 /* through the egress proxy: what the allow entries name */
};

/* What becomes of background jobs (&, nohup, setsid) a command leaves when it exits. */
enum cb_backend_bg {
	CB_BACKEND_BG_DEFAULT = 0, /* a command: the options'; the options: keep */
	CB_BACKEND_BG_KEEP,	   /* they run on until the workspace closes */
	CB_BACKEND_BG_KILL,	   /* they end with the command's call */
};

/* Where ns and docker show the workspace's persistent home (<workspace dir>/home), and HOME. */
#define CB_BACKEND_HOME "/home/cowbox"

/* Limits every workspace gets unless its options say otherwise (docs/security.md#limits). */
#define CB_BACKEND_DEFAULT_TIMEOUT   600.0 /* seconds per command */
#define CB_BACKEND_DEFAULT_PIDS	     1024  /* processes and threads */
#define CB_BACKEND_DEFAULT_MEMORY_MB 4096
#define CB_BACKEND_OOM_SCORE_ADJ                                                                   \
	500 /* the sandbox's processes: the host OOM killer's first                                \
	       pick (ns, docker) */
#define CB_BACKEND_DEFAULT_DISK_MB     10240 /* upper-layer bytes (fs quota) */
#define CB_BACKEND_DEFAULT_DISK_INODES 1000000
/* An unsigned limit field set to this means "none" (0 means "the default"); in JSON a limit
 * of 0 means none and a missing key the default. */
#define CB_BACKEND_NO_LIMIT (~0UL)

#define CB_BACKEND_MAX_VOLUMES 8
#define CB_BACKEND_MAX_SECRETS 64

/* A header secret (docs/network.md#header-secrets): the egress proxy sets header to
 * prefix + the secret + suffix on HTTPS requests to host under path_prefix. The secret comes
 * from value (kept in the workspace directory's secrets.json, 0600, never in backend.json) or
 * from file (a host path, read by the daemon each time the proxy starts). */
struct cb_backend_secret {
	char *host, *header;
	char *value;	       /* NULL: from file */
	char *file;	       /* absolute host path, or NULL */
	char *path_prefix;     /* NULL: "/" */
	char *prefix, *suffix; /* NULL: "" */
	int stored;	       /* parsed from backend.json: value still to be read */
};

/* Where the system's CA bundle is, in a root (the host's, or an image), and where the sandbox
 * finds the bundle that also trusts the workspace's CA (bound over it). */
#define CB_BACKEND_SYSTEM_CA "/etc/ssl/certs/ca-certificates.crt"

/* A host directory bound into the sandbox (ns, docker). */
struct cb_backend_volume {
	char *src; /* host directory, absolute (resolved once, when the volume is given) */
	char *dst; /* absolute path inside */
	int writable;
	/* the directory src named when the volume was given (backend.json's volume_ids): every
	 * command's bind must find this very directory there; ino 0: not known (an older file) */
	unsigned long long dev, ino;
};

/* The options every backend takes. They shape a new workspace's backend and are kept in
 * <workspace dir>/backend.json, so that a daemon started later (after a crash, or a close)
 * reattaches with the same ones. Zero fields take the documented defaults; the limits
 * (timeout, pids, memory_mb, disk_mb, disk_inodes) are turned off by CB_BACKEND_NO_LIMIT (a
 * negative timeout). */
struct cb_backend_options {
	char *kind;		   /* "ns" (default), "local", "docker" or "vm" */
	char **env;		   /* "K=V", NULL-terminated: every command gets these, on top of a
				      minimal PATH/HOME/LANG (ns, docker) or the host's environment
				      without credentials (local); nothing else */
	char *working_dir;	   /* where commands start, relative to the workspace root (made if
				      missing when the backend is created); NULL: the root */
	double timeout;		   /* default per-command timeout in seconds; 0: 600; < 0: none */
	enum cb_backend_net net;   /* none (default), all, host, public or allow; docs/network.md */
	char **allow;		   /* network allow: the entries (NULL-terminated; host, host:port,
				    *.domain, address, CIDR) */
	double cpus;		   /* CPU quota; 0: none */
	unsigned long memory_mb;   /* memory cap (ns, docker); 0: 4096 */
	unsigned long pids;	   /* cap on processes and threads (ns, docker); 0: 1024 */
	unsigned long disk_mb;	   /* upper-layer quota in MiB (the filesystem); 0: 10240 */
	unsigned long disk_inodes; /* upper-layer inode quota; 0: 1000000 */
	unsigned long image_max_mb; /* ns: cap on an OCI image's unpacked bytes, MiB (at its first
				       unpack); 0: disk_mb's */
	char *image; /* ns: a directory, oci:PATH[:TAG] or a local podman image (cowbox/image.h);
			docker: an image name (NULL: cb_backend_image_of's default) */
	char *on_create[CB_BACKEND_MAX_HOOKS];	/* shell commands run once, on creation */
	char *on_destroy[CB_BACKEND_MAX_HOOKS]; /* shell commands run by destroy */
	char *setup_script;			/* a shell script run once after on_create */
	double setup_timeout;			/* seconds for the setup script; <= 0: 600 */
	char *shell; /* the shell of command strings and hooks: "sh" (NULL: /bin/sh) or
			"bash" (found on the command's PATH) */
	char *user;  /* ns, docker: commands run as NAME|UID[:GROUP|GID] inside; NULL: the
			sandbox's root (the image's user for docker) */
	enum cb_backend_bg background;				  /* DEFAULT is keep */
	struct cb_backend_volume volumes[CB_BACKEND_MAX_VOLUMES]; /* ns, docker */
	size_t n_volumes;
	int privileged; /* ns as root: no user namespace, the sandbox's uid 0 is the host's
			   (with no capabilities); the workspace's files keep their host ids */
	struct cb_backend_secret *secrets; /* header secrets (network public or allow) */
	size_t n_secrets;
	unsigned long proxy_conns; /* network public or allow: the egress proxy's connections
				      open at once (the longest idle closed past it); 0: 256 */
};

/* One command for a backend. Only argv (or shell) is required. */
struct cb_backend_cmd {
	char *const *argv;
	const char *shell;	       /* instead of argv: /bin/sh -c shell */
	const char *user;	       /* NULL: the options' user */
	enum cb_backend_bg background; /* DEFAULT: the options' */
	char *const *env;	       /* "K=V" over the options' env; NULL: none */
	const char *cwd;	       /* relative to the workspace root (or to working_dir when not
					  absolute); NULL: working_dir */
	double timeout;		       /* seconds; 0: the options' default; < 0: none */
	int stdin_fd;		       /* STDIN_FD: read from this fd (not closed) */
	int tty;		       /* on a pseudo-terminal of tty_rows x tty_cols (0: 24x80) */
	unsigned short tty_rows, tty_cols;
	size_t output_limit;	       /* 0: 10 MiB */
	enum cb_exec_stdin stdin_kind; /* CLOSED, BYTES, STREAM or FD */
	const void *stdin_data;
	size_t stdin_len;
};

struct cb_backend;

/* A backend's table of operations: all that differs between backends is decided here, so
 * that a new backend is one file and one row of backends/backend.c's table. Every function
 * returns 0 or -errno with a message. */
struct cb_backend_ops {
	const char *name;
	/* Its commands are confined (ns, docker): the memory and pids limits apply and the
	 * workspace's persistent home is made for them; 0 (local): the timeout only, no home. */
	int confined;
	/* Its image option is a root tree this host unpacks (cowbox/image.h: checked, and unpacked
	 * at configure); 0: a name its own engine resolves (docker), or none at all (local). */
	int image_root;
	/* Refuse (-EINVAL naming the option) what options ask that this backend cannot enforce,
	 * and settle what it decides itself (local: network host). j: the JSON they came from. */
	int (*validate)(struct cb_backend_options *o, json_t *j);
	/* Bring the JSON of a backend.json an older cowbox saved up to date, before it is
	 * parsed (local: its network "all" is "host" now); NULL: nothing to change. */
	void (*upgrade)(json_t *j);
	/* The environment its commands start from, under the image's and the options' (malloc'd,
	 * for cb_exec_env_free); NULL: the sandbox's own minimal PATH, HOME and LANG. */
	int (*host_env)(char ***out);
	/* Where its commands see the workspace root, mounted at mountpoint on the host. */
	const char *(*workdir)(const char *mountpoint);
	/* The image when the options name none (NULL: none; cb_backend_image_of). */
	const char *(*default_image)(void);
	/* Remove what a crashed daemon's backend left outside the workspace (its container);
	 * NULL: it leaves nothing. */
	int (*remove_leftovers)(const char *ref);
	/* Use, from another process (the CLI), the resources the workspace's daemon made: its
	 * network namespace netns_fd (-1: none; duplicated), creating nothing and running no
	 * hook; then exec, wait and kill work as in the daemon. NULL: commands need the daemon
	 * (docker: it owns the container). */
	int (*join)(struct cb_backend *b, int netns_fd);
	/* Make the backend's resources (a network namespace, a container) and, the first time
	 * for this workspace, run the on_create hooks and the setup script. */
	int (*create)(struct cb_backend *b);
	/* Start a command; the handle is the runner's (cb_exec_wait/kill/stdin/free). */
	int (*exec)(struct cb_backend *b, const struct cb_backend_cmd *cmd,
		    const struct cb_exec_callbacks *cb, struct cb_exec **out);
	/* Wait for a command started by exec, fill res (free it also after an error) and
	 * clean up what it left in the backend (the docker backend kills its tree in the
	 * container). -ENXIO: the backend itself is gone (its container was removed); the
	 * caller should start afresh. The caller frees the handle with cb_exec_free afterwards,
	 * so that a concurrent kill never meets a freed one. */
	int (*wait)(struct cb_backend *b, struct cb_exec *h, struct cb_exec_result *res);
	/* Signal a running command's whole tree. */
	void (*kill)(struct cb_backend *b, struct cb_exec *h, int sig);
	/* Where binary is found on the backend's PATH: *path malloc'd; -ENOENT naming it. */
	int (*which)(struct cb_backend *b, const char *binary, char **path);
	/* A URL that code inside reaches the host's port with, and only that port. */
	int (*host_url)(struct cb_backend *b, int port, char **url);
	/* Let go of the resources (a namespace, the container), keeping the disk; called after
	 * the forwarders were stopped (by cb_backend_free, or by a failed create). */
	void (*close)(struct cb_backend *b);
	/* Run the on_destroy hooks and remove the resources for good (the container). */
	int (*destroy)(struct cb_backend *b);
	/* At configure, an image the options name that is not a root tree (image_root 0): make
	 * sure the engine has it (docker: in its store, else pulled from the registries of the
	 * engine's own configuration), so that a bad image fails the configure naming it; NULL:
	 * nothing to check. */
	int (*check_image)(const char *image);
};

/* A workspace's backend, as a daemon holds it. */
/* Where a backend's file I/O (cb_backend_read, _write, _mkdirs) is done when not in this
 * process: the daemon hands it to its worker processes, so that none of its own threads is
 * ever a client of its own mount (docs/reliability.md). The path is checked already; each
 * call promises what the cb_backend_*_at call of the same name does. */
struct cb_backend_io {
	int (*read)(void *arg, const char *path, off_t off, size_t len, void **data, size_t *n,
		    off_t *size);
	int (*write)(void *arg, const char *path, off_t off, const void *data, size_t len,
		     int truncate, mode_t mode);
	int (*mkdirs)(void *arg, const char *path);
};

struct cb_backend {
	const struct cb_backend_ops *ops;
	struct cb_backend_options opt;
	char *ref;	      /* the workspace's ref */
	char *dir;	      /* $COWBOX_HOME/workspaces/<ref> */
	char *root;	      /* the host path of the workspace (the mount point) */
	char *hostname;	      /* the workspace's name, else its ref */
	int root_fd;	      /* O_PATH of root, for read and write */
	pthread_mutex_t lock; /* guards created, priv and the forwarders */
	int created;
	void *priv;		    /* the backend's own state */
	struct cb_forwarder *fwd;   /* host_url forwarders, one per port */
	struct cb_net_proxy *proxy; /* network public or allow: the egress proxy */
	struct cb_published *pub;   /* published ports */
	int netns_fd; /* its own network namespace while created (the backend's fd); -1 */
	/* Set by the owner before the backend is created: each proxied connection, recorded. */
	void (*net_record)(void *arg, const struct cb_net_record *r);
	void *net_record_arg;
	/* Set by the owner before the backend is created: what a long create (the vm's boot)
	 * is doing now, for a client to show (cb_backend_phase); NULL once it is done. */
	void (*phase)(void *arg, const char *what);
	void *phase_arg;
	const struct cb_backend_io *io; /* NULL: file I/O in this process */
	struct cb_exec_keep *keep;	/* background jobs kept past their commands (ns, local) */
	/* Set by create: the image's own environment, under the options' env (ns: an OCI
	 * image's Env); owned by the backend's state, NULL: none. */
	char *const *image_env;
	void *io_arg;
};

/* The limits options resolve to: defaults filled in, 0 for none (timeout 0: none). The local
 * backend gets the timeout only: it isolates nothing, so it caps nothing either. */
struct cb_backend_limits {
	double timeout;
	unsigned long pids, memory_mb;
	int oom_score_adj;
	unsigned long long disk_bytes, disk_inodes;
	unsigned long long home_bytes; /* the persistent home's own cap (confined: the disk
					  quota, its own filesystem; 0: none) */
};
void cb_backend_limits_of(const struct cb_backend_options *o, struct cb_backend_limits *out);
/* Their JSON form (info): {"timeout","memory_mb","pids","oom_score_adj","disk_bytes",
 * "disk_inodes","home_bytes"}, 0 for none; a new reference. */
json_t *cb_backend_limits_json(const struct cb_backend_limits *l);

/* Parse options from JSON ({"backend":"ns","env":{"K":"V"},"working_dir":...,"timeout":...,
 * "network":"none"|"all"|"host"|"public"|"allow","allow":[...],"cpus":...,"memory_mb":...,"pids":...,"disk_mb":...,
 * "disk_inodes":...,"image":...,"on_create":[...],
 * "on_destroy":[...],"setup_script":...,"setup_timeout":...,"privileged":false,
 * "shell":"sh"|"bash","user":NAME|UID[:GROUP],"background":"keep"|"kill",
 * "volumes":[[HOST_DIR,PATH,"ro"|"rw"],...]}). Unknown
 * keys and wrong types are refused with a message naming them (-EINVAL). Free with
 * cb_backend_options_free. */
int cb_backend_options_from_json(json_t *j, struct cb_backend_options *out);
/* The name of a network mode ("none", "all", "host", "public", "allow"), and the mode of a name:
 * -EINVAL with a message for anything else (NULL included). */
const char *cb_backend_net_name(enum cb_backend_net net);
int cb_backend_net_parse(const char *s, enum cb_backend_net *out);

/* The JSON form of options (a new reference). */
json_t *cb_backend_options_to_json(const struct cb_backend_options *o);
void cb_backend_options_free(struct cb_backend_options *o);

/* A JSON object of strings as a NULL-terminated "NAME=value" array (malloc'd, for
 * cb_exec_env_free, also after an error); -EINVAL naming what ("env", "backend option env")
 * and the key when a value is not a string or a name is empty or holds '='. */
int cb_backend_env_from_json(json_t *obj, const char *what, char ***out);

/* "HOST_DIR:PATH[:ro|rw]" as the JSON form the volumes option takes ([HOST_DIR, PATH, MODE],
 * a new reference in *out); -EINVAL naming spec when it has no PATH. Checked in full by
 * cb_backend_options_from_json. */
int cb_backend_volume_spec(const char *spec, json_t **out);

/* The persistent home's cap in bytes (the disk quota; 0: none, or a backend without a home). */
unsigned long long cb_backend_home_cap(const struct cb_backend_options *o);
/* Make <workspace dir>/home ready for a command's bind: under a cap (and as root), its own
 * ext4 filesystem (home.img, made at the first call, on a loop device) mounted there, nosuid
 * and nodev; an older plain home's files are copied in once. Idempotent and safe between
 * the daemon and cowbox exec REF (a lock file); 0 or -errno with a message. */
int cb_backend_home_ready(struct cb_backend *b);
/* cb_backend_home_ready, then an O_PATH fd of the home to bind from: under a cap, checked to
 * be its filesystem's root (a stop racing the command cannot leave it the plain directory
 * beneath). The fd, or -errno with a message. */
int cb_backend_home_open(struct cb_backend *b);
/* Unmount dir's home if it is mounted (lazily: commands running keep theirs). */
void cb_backend_home_release(const char *dir);

/* Open volume v's host directory for a bind: an O_PATH fd of src reached through no symlink
 * (openat2 RESOLVE_NO_SYMLINKS from /), which must still be the directory (device and inode)
 * it named when the volume was given. The fd, or -errno with a message naming the volume
 * (-ELOOP: a symlink is on the way now; -ESTALE: another directory is in its place). */
int cb_backend_volume_open(const struct cb_backend_volume *v);

/* The background mode of a name ("keep", "kill"): -EINVAL naming what for anything else. */
int cb_backend_bg_parse(const char *what, const char *s, enum cb_backend_bg *out);

/* 0 if s is a user as the user option takes it (NAME|UID[:GROUP|GID], names of letters,
 * digits, '_', '.', '-', not starting with '-'), else -EINVAL naming what. */
int cb_backend_user_check(const char *what, const char *s);

/* Save options as dir/backend.json (atomically), or load them; a missing file loads the
 * defaults (ns, network none). */
int cb_backend_options_save(const char *dir, const struct cb_backend_options *o);
int cb_backend_options_load(const char *dir, struct cb_backend_options *out);

/* Remove what a workspace's backend may have left outside the workspace (the docker
 * container of a daemon that crashed), before the workspace itself is removed; 0 when there
 * is nothing. */
int cb_backend_remove_leftovers(const char *ref_or_name);

/* The table of a backend kind (NULL: the default, ns); NULL if there is none by that name. */
const struct cb_backend_ops *cb_backend_find(const char *kind);

/* The vm backend's accelerator on this host: "kvm" when /dev/kvm opens and makes a VM, else
 * "tcg" (qemu's software emulation); what `cowbox info` says. */
const char *cb_backend_vm_accel(void);

/* The kinds there are, as "ns, local or docker" (for messages). */
const char *cb_backend_kinds(void);

/* Where commands of a kind start: where it shows the workspace mounted at mountpoint, then
 * working_dir (NULL: the root). malloc'd in *out; -EINVAL for an unknown kind. */
int cb_backend_workdir(const char *kind, const char *mountpoint, const char *working_dir,
		       char **out);

/* Make b usable in this process without its daemon's role (ops->join): the working_dir and
 * the home made if missing, then the daemon's network namespace netns_fd joined (-1: none).
 * -EOPNOTSUPP naming the backend when its commands need the daemon. */
int cb_backend_join(struct cb_backend *b, int netns_fd);

/* Open the backend of a workspace: options from dir/backend.json, root as its tree. Nothing
 * is started until cb_backend_ensure. Free with cb_backend_free (which closes it). */
int cb_backend_open(const char *ref, const char *dir, const char *root, const char *hostname,
		    struct cb_backend **out);
void cb_backend_free(struct cb_backend *b);

/* Create the backend's resources once (thread-safe); later calls return at once. */
int cb_backend_ensure(struct cb_backend *b);

/* Say what the create is doing now (b->phase, if set); NULL: it is done. */
void cb_backend_phase(struct cb_backend *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The environment of a command: the backend's base, then the options' env, then extra (later
 * entries replace same-named earlier ones). Free with cb_exec_env_free. */
int cb_backend_env(const struct cb_backend *b, char *const *extra, char ***out);

/* Read up to len bytes at off of path (relative to the workspace root). Refused, with a
 * message naming the path: ".." components and absolute paths (-EXDEV), a symlink at any
 * component, even one pointing inside (-ELOOP), and a FIFO, socket or device (-EINVAL, at
 * once: nothing waits on it). *data is malloc'd; *size is the file's size. */
int cb_backend_read(struct cb_backend *b, const char *path, off_t off, size_t len, void **data,
		    size_t *n, off_t *size);

/* Write data at off of path (created with mode, parents made), truncating first when
 * truncate is set; the same path rules as cb_backend_read. */
int cb_backend_write(struct cb_backend *b, const char *path, off_t off, const void *data,
		     size_t len, int truncate, mode_t mode);

/* The root-relative path a client's read or write path names: one under /workspace taken
 * as the sandbox sees it, a relative one under working_dir (NULL: the root), anything else
 * as given (the path rules then refuse it). malloc'd in *out. */
int cb_backend_api_path(const char *working_dir, const char *path, char **out);

/* mkdir -p of path beneath the workspace root (the same path rules). */
int cb_backend_mkdirs(struct cb_backend *b, const char *path);

/* The same three in this process, on the tree at root (a host path, opened per call), for
 * whoever does a backend's I/O (b->io): path is checked here too. */
int cb_backend_read_at(const char *root, const char *path, off_t off, size_t len, void **data,
		       size_t *n, off_t *size);
int cb_backend_write_at(const char *root, const char *path, off_t off, const void *data, size_t len,
			int truncate, mode_t mode);
int cb_backend_mkdirs_at(const char *root, const char *path);

/* Run a shell command to completion for a hook or the setup script, failing with a message
 * (naming what) when it exits non-zero or times out. */
int cb_backend_hook(struct cb_backend *b, const char *what, const char *shell, double timeout);

/* ---- host_url forwarders (backends/forward.c) ---- */

/* Listen on 127.0.0.1:port inside the network namespace netns_fd and relay every connection
 * to 127.0.0.1:port of the daemon's own (host) namespace; idempotent per port. */
int cb_forwarder_add(struct cb_backend *b, int netns_fd, int port);
/* Stop every forwarder of b. */
void cb_forwarder_stop_all(struct cb_backend *b);

/* ---- published ports (backends/publish.c) ---- */

/* publish: listen on a port of the host's 127.0.0.1 (*host_port in: the one asked for, 0: any
 * free one) and relay each connection to 127.0.0.1:port inside the workspace's own network
 * namespace (b created; never the host's: -EOPNOTSUPP under network host, the local backend
 * or without root); *host_port out says which. Idempotent per port (-EEXIST when it is
 * published at another host port than the one asked for). */
int cb_publish_add(struct cb_backend *b, int port, int *host_port);
/* The published ports, [{"port", "host_port", "address"}], oldest last. */
json_t *cb_publish_json(struct cb_backend *b);
/* Close one published port and its connections (-ENOENT if it is not), or all (with the
 * backend, before its namespace goes). */
int cb_publish_remove(struct cb_backend *b, int port);
void cb_publish_stop_all(struct cb_backend *b);

/* A fresh network namespace with loopback up, as an fd; -errno with a message. */
int cb_netns_new(int *out);
/* A TCP socket listening on 127.0.0.1:port inside the namespace netns_fd. */
int cb_netns_listen(int netns_fd, int port, int *out);

/* ---- the egress proxy (backends/egress.c) ---- */

/* Under network public or allow: start b's proxy on 127.0.0.1:CB_NET_PROXY_PORT inside
 * netns_fd (which then has no other route out), with the options' policy; 0 otherwise. */
int cb_backend_proxy_start(struct cb_backend *b, int netns_fd);
/* The same on a listening socket of the caller's (taken over, also on failure): the vm
 * backend's, which its guest reaches over the agent's port. */
int cb_backend_proxy_serve(struct cb_backend *b, int listen_fd);
/* Stop it (before the namespace goes); no-op without one. */
void cb_backend_proxy_stop(struct cb_backend *b);
/* The policy the options give (NULL for none, all and host): -EINVAL naming a bad entry. */
int cb_backend_policy(const struct cb_backend_options *o, struct cb_net_policy **out);
/* The environment that points a command's clients at the proxy (HTTP_PROXY, ALL_PROXY, their
 * lower-case forms, NO_PROXY for loopback), "NAME=value", NULL-terminated. */
extern const char *const cb_backend_proxy_env[];
/* With header secrets: the variables that make TLS clients trust the workspace's CA in the
 * bundle at CB_BACKEND_SYSTEM_CA (also those that read no system store by default). */
extern const char *const cb_backend_trust_env[];
/* Whether the options' network goes through the proxy. */
int cb_backend_net_proxied(const struct cb_backend_options *o);

/* ---- header secrets (backends/secrets.c) ---- */

/* The "secrets" option: a list of {host, header, value | file, path_prefix, prefix, suffix}
 * (or "stored": true as backend.json has it), each checked: a name or address for host, an
 * HTTP header name that does not frame the request, no line break in any text, an absolute
 * file. -EINVAL naming the entry. */
int cb_backend_secrets_from_json(json_t *v, struct cb_backend_options *out);
/* Their JSON form without any value ("stored": true or "file"); a new reference. */
json_t *cb_backend_secrets_to_json(const struct cb_backend_options *o);
void cb_backend_secrets_free(struct cb_backend_options *o);
/* Beside backend.json in dir: the values in secrets.json (mode 0600 from its first byte;
 * removed when none), and the workspace's CA (cb_net_ca_ensure, named after label). */
int cb_backend_secrets_save(const char *dir, const char *label, const struct cb_backend_options *o);
/* The stored values of options loaded from dir's backend.json, from its secrets.json. */
int cb_backend_secrets_load(const char *dir, struct cb_backend_options *o);
/* The proxy's bindings of o, with file secrets read now: *out (free) points into o and into
 * *values (free with cb_backend_secrets_values_free, which wipes them). */
int cb_backend_secrets_resolve(const struct cb_backend_options *o, struct cb_net_binding **out,
			       char ***values);
void cb_backend_secrets_values_free(char **values);
/* With secrets: b's CA made if missing and its trust bundle (the root's system CAs, then the
 * CA) written in b->dir, for the sandbox to see at CB_BACKEND_SYSTEM_CA; 0 without. */
int cb_backend_trust_prepare(struct cb_backend *b);

#endif
