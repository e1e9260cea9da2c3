/* `cowbox exec` and `cowbox shell`: run a command (or an interactive shell on a pty) in a
 * workspace, isolated in the namespace sandbox or, when asked, on the host. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/access.h"
#include "cowbox/backend.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/image.h"
#include "cowbox/net.h"
#include "cowbox/sandbox.h"
#include "cowbox/workspace.h"
#include "cowbox/workspace_fast.h"
#include "util/beneath.h"

#define MAX_ENV 256

enum { SET_TIMEOUT = 1, SET_MEMORY = 2, SET_PIDS = 4 };

struct exec_opts {
	const char *ref, *dir, *cwd, *image, *shell, *user;
	char *ws_user, *ws_shell; /* the workspace's options user and shell (owned) */
	char *ws_image;		  /* the workspace's ns image option (owned) */
	char *image_root;	  /* the root directory of --image, else of ws_image (owned) */
	struct cb_backend_image_config image_cfg; /* that image's Env and User (owned) */
	/* a workspace's persistent home and volumes, bound as its daemon's commands get them */
	struct cb_sandbox_bind binds[1 + CB_BACKEND_MAX_VOLUMES];
	size_t n_binds;
	int env_home; /* --env HOME=... was given: it wins */
	struct cb_backend_volume vols[CB_BACKEND_MAX_VOLUMES]; /* owned */
	char home[4200];
	double timeout, cpus;
	unsigned long memory, pids;
	int set;	 /* SET_*: the limits given on the command line (0 there means none) */
	const char *net; /* --network: NULL (none), "none", "all" or "host" */
	int ws_proxied;	 /* the workspace's network is public or allow */
	char *ws_bundle; /* with header secrets: the workspace's CA bundle (owned) */
	int local, privileged;
	const char *env[MAX_ENV];
	int n_env;
	char **cmd;
	int n_cmd;
};

static void exec_usage(FILE *out, const char *name)
{
	fprintf(
	    out,
	    "usage: cowbox %s REF|--dir DIR [OPTIONS]%s\n\n"
	    "  --dir DIR            use a plain directory as the workspace\n"
	    "  --timeout S          SIGTERM the whole tree after S seconds (SIGKILL 5 s later, "
	    "or\n"
	    "                       as soon as the command has ended), exit 124; default 600\n"
	    "                       (the workspace's option; a shell: none), 0: none\n"
	    "  --env K=V            add to the environment (repeatable)\n"
	    "  --cwd DIR            working directory, relative to /workspace\n"
	    "  --user NAME|UID[:G]  run as this user inside the sandbox (default: the\n"
	    "                       workspace's user option, else the sandbox's root)\n"
	    "  --network MODE       none (default): loopback only; all: outbound TCP/UDP/DNS\n"
	    "                       through pasta, not the host's loopback or its abstract\n"
	    "                       sockets; host: the host's own network namespace (warned).\n"
	    "                       A workspace of network public or allow: its own namespace\n"
	    "                       and egress proxy, as its API commands get, unless given\n"
	    "  --cpus N             CPU quota (e.g. 0.5)\n"
	    "  --memory MB          memory cap; exceeding it kills the command (exit 137);\n"
	    "                       default 4096 (or the workspace's option), 0: none. The\n"
	    "                       command's oom_score_adj is 500: the host OOM killer's\n"
	    "                       first pick\n"
	    "  --pids N             cap on processes and threads; default 1024, 0: none\n"
	    "  --image IMAGE        root instead of the host's /usr, /etc, ...: a directory,\n"
	    "                       oci:PATH[:TAG] or a name in the local podman store (the\n"
	    "                       workspace's image option when not given)\n"
	    "  --privileged         as root, no user namespace: the command runs as host uid 0\n"
	    "                       (no capabilities); by default its root is a host id range\n"
	    "                       of its own (with --dir: 2147418112-2147483647, DIR's owner\n"
	    "                       shown as its root; a workspace: the range `cowbox info`\n"
	    "                       shows). A workspace's is chosen when it is configured\n"
	    "  --userns             accepted for compatibility: a user namespace is the default\n"
	    "  --backend ns|local   ns (default): namespace sandbox; local: on the host, NOT "
	    "isolated\n"
	    "%s\n"
	    "In the sandbox the environment is PATH, HOME (a workspace's persistent home,\n"
	    "/home/cowbox, outside /workspace; with --dir a private /tmp), TERM (from here),\n"
	    "LANG=C.UTF-8 and --env: nothing else of the\n"
	    "host's; the local backend passes the host's environment minus credentials (names\n"
	    "with TOKEN, SECRET, PASSWORD, API_KEY, AUTH, ...; docs/security.md), then --env.\n"
	    "Exit status: the command's; 124 timed out; 128+N killed by signal N (137 also when\n"
	    "the memory cap was hit); 127 not found; 126 not executable; 125 cowbox failed.\n",
	    name, strcmp(name, "exec") ? "" : " [--] CMD [ARG...]",
	    strcmp(name, "exec") ? ""
				 : "  --shell STRING       run STRING with /bin/sh -c (so does a "
				   "single CMD with spaces)\n");
}

static int parse_number(const char *opt, const char *s, double *out)
{
	char *end;
	errno = 0;
	*out = strtod(s ? s : "", &end);
	if (!s || !*s || *end || errno || *out < 0) {
		fprintf(stderr, "cowbox: %s needs a non-negative number, not '%s'\n", opt,
			s ? s : "");
		return -1;
	}
	return 0;
}

/* Returns 0, or the exit status for a usage error (2) or --help (-1 -> 0). */
static int parse_exec_args(int argc, char **argv, int want_cmd, struct exec_opts *o)
{
	int i;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		double d;
		if (!strcmp(a, "--")) {
			i++;
			break;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			exec_usage(stdout, argv[0]);
			return -1;
		}
		if (a[0] != '-' || !a[1]) {
			if (!o->ref && !o->dir) {
				o->ref = a;
				continue;
			}
			break; /* the command starts here */
		}
		int takes = strcmp(a, "--userns") != 0 && strcmp(a, "--privileged") != 0;
		if (takes && !v) {
			fprintf(stderr, "cowbox %s: %s needs a value\n", argv[0], a);
			return 2;
		}
		if (!strcmp(a, "--dir"))
			o->dir = v;
		else if (!strcmp(a, "--cwd"))
			o->cwd = v;
		else if (!strcmp(a, "--user")) {
			if (cb_backend_user_check("--user", v) < 0) {
				fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
				return 2;
			}
			o->user = v;
		} else if (!strcmp(a, "--image"))
			o->image = v;
		else if (!strcmp(a, "--shell") && want_cmd)
			o->shell = v;
		else if (!strcmp(a, "--userns"))
			; /* the default now */
		else if (!strcmp(a, "--privileged"))
			o->privileged = 1;
		else if (!strcmp(a, "--env")) {
			if (!strchr(v, '=') || v[0] == '=') {
				fprintf(stderr, "cowbox %s: --env needs K=V, not '%s'\n", argv[0],
					v);
				return 2;
			}
			if (o->n_env >= MAX_ENV) {
				fprintf(stderr, "cowbox %s: more than %d --env\n", argv[0],
					MAX_ENV);
				return 2;
			}
			o->env[o->n_env++] = v;
			o->env_home |= !strncmp(v, "HOME=", 5);
		} else if (!strcmp(a, "--network")) {
			if (strcmp(v, "none") && strcmp(v, "all") && strcmp(v, "host")) {
				fprintf(stderr,
					"cowbox %s: --network is none, all or host, not '%s'\n",
					argv[0], v);
				return 2;
			}
			o->net = v;
		} else if (!strcmp(a, "--backend")) {
			if (strcmp(v, "ns") && strcmp(v, "local")) {
				fprintf(stderr, "cowbox %s: --backend is ns or local, not '%s'\n",
					argv[0], v);
				return 2;
			}
			o->local = !strcmp(v, "local");
		} else if (!strcmp(a, "--timeout") || !strcmp(a, "--cpus") ||
			   !strcmp(a, "--memory") || !strcmp(a, "--pids")) {
			if (parse_number(a, v, &d) < 0)
				return 2;
			if (a[2] == 't')
				o->timeout = d, o->set |= SET_TIMEOUT;
			else if (a[2] == 'c')
				o->cpus = d;
			else if (a[2] == 'm')
				o->memory = (unsigned long)d, o->set |= SET_MEMORY;
			else
				o->pids = (unsigned long)d, o->set |= SET_PIDS;
		} else {
			fprintf(stderr, "cowbox %s: unknown option %s (see cowbox %s --help)\n",
				argv[0], a, argv[0]);
			return 2;
		}
		i++;
	}
	o->cmd = argv + i;
	o->n_cmd = argc - i;
	if (!o->ref == !o->dir) {
		fprintf(stderr, "cowbox %s: give a workspace REF or --dir DIR (one of them)\n",
			argv[0]);
		return 2;
	}
	if (want_cmd && !o->n_cmd && !o->shell) {
		fprintf(stderr, "cowbox %s: no command given (cowbox %s REF -- CMD [ARG...])\n",
			argv[0], argv[0]);
		return 2;
	}
	if (!want_cmd && o->n_cmd) {
		fprintf(stderr, "cowbox %s: unexpected argument '%s'\n", argv[0], o->cmd[0]);
		return 2;
	}
	return 0;
}

/* The workspace directory to put at /workspace: --dir, or the ref's live mount. */
static int workspace_dir(const struct exec_opts *o, char **dir, char **name,
			 char ref[CB_WS_REF_LEN + 1])
{
	pid_t pid;
	int rc;
	*dir = *name = NULL;
	ref[0] = 0;
	if (o->dir) {
		if (!(*dir = realpath(o->dir, NULL)))
			return cb_error_set(errno, "--dir %s: %s", o->dir, strerror(errno));
		const char *base = strrchr(*dir, '/');
		*name = strdup(base && base[1] ? base + 1 : "cowbox");
		return 0;
	}
	/* A served workspace is found from its lock and the mount table alone; the full route
	 * below (meta.db opened three times, the daemon asked for a hello) starts one. */
	if ((rc = cb_ws_find_served(o->ref, ref, dir, name)) != 0)
		return rc < 0 ? rc : 0;
	if ((rc = cb_ws_resolve(o->ref, ref)) < 0)
		return rc;
	if ((rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) < 0)
		return rc;
	if ((rc = cb_ws_daemon(ref, &pid, dir)) < 0)
		return rc;
	if (!*dir)
		return cb_error_set(ENOENT, "%s: its daemon exited before the command started",
				    ref);
	if (!cb_ws_ref_syntax(o->ref)) {
		*name = strdup(o->ref); /* given by name: no need to look it up */
		return 0;
	}
	struct cb_ws_info info; /* (it also sizes upper/, so only when given a ref) */
	if (cb_ws_info(ref, &info) == 0) {
		*name = strdup(info.name ? info.name : ref);
		cb_ws_info_free(&info);
	} else {
		*name = strdup(ref);
	}
	return 0;
}

/* How the sandbox's ids meet the workspace's: --dir binds the directory through an idmapped
 * mount (unless --privileged); a workspace's daemon shows its files in the workspace's own
 * range, or as they are when its options made it privileged, and the sandbox follows. The
 * limits are the workspace's options (REF) or the defaults (--dir), then the flags given;
 * an interactive shell has no default timeout. */
static int sandbox_setup(struct exec_opts *o, const char *ref, int shell_mode,
			 struct cb_sandbox *sb, struct cb_backend_limits *lim)
{
	struct cb_backend_options bo = {0};
	char *wsdir = NULL, *kind;
	int rc = 0;

	sb->privileged = o->privileged;
	if (!o->dir && ((rc = cb_ws_path(ref, NULL, &wsdir)) < 0 ||
			(rc = cb_backend_options_load(wsdir, &bo)) < 0))
		goto out;
	/* A command is what access full alone allows (cowbox/access.h). */
	if (!o->dir && (rc = cb_ws_access_load(wsdir)) < CB_ACCESS_FULL) {
		if (rc >= 0)
			rc = cb_error_set(EACCES, "%s serves at most access %s: commands need full",
					  ref, cb_access_name(rc));
		goto out;
	}
	rc = 0;
	/* the workspace's user, shell and egress proxy apply to its commands from here too */
	o->ws_proxied = !o->dir && cb_backend_net_proxied(&bo);
	/* header secrets: the proxy answers bound hosts with the workspace CA's certificates */
	if (o->ws_proxied && bo.n_secrets &&
	    asprintf(&o->ws_bundle, "%s/" CB_NET_CA_BUNDLE, wsdir) < 0) {
		o->ws_bundle = NULL;
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	o->ws_user = bo.user;
	o->ws_shell = bo.shell;
	if (bo.kind && !strcmp(bo.kind, "ns")) {
		o->ws_image = bo.image; /* docker's is a name for its engine, not a root */
		bo.image = NULL;
	}
	if (!o->dir && !o->local) {
		snprintf(o->home, sizeof o->home, "%s/home", wsdir);
		if ((mkdir(o->home, 0700) < 0 && errno != EEXIST) || chmod(o->home, 01777) < 0) {
			rc = cb_error_set(errno, "%s: %s", o->home, strerror(errno));
			goto out;
		}
		o->binds[o->n_binds++] =
		    (struct cb_sandbox_bind){.src = o->home, .dst = CB_BACKEND_HOME, .writable = 1};
		memcpy(o->vols, bo.volumes, sizeof o->vols);
		for (size_t i = 0; i < bo.n_volumes; i++)
			o->binds[o->n_binds++] =
			    (struct cb_sandbox_bind){.src = o->vols[i].src,
						     .dst = o->vols[i].dst,
						     .writable = o->vols[i].writable};
		bo.n_volumes = 0;
	}
	bo.user = bo.shell = NULL;
	kind = bo.kind; /* this CLI runs ns or local, whatever the workspace's API uses */
	bo.kind = NULL;
	cb_backend_limits_of(&bo, lim);
	bo.kind = kind;
	if (o->local)
		lim->pids = lim->memory_mb = 0, lim->oom_score_adj = 0;
	if (o->set & SET_TIMEOUT)
		lim->timeout = o->timeout;
	else if (shell_mode)
		lim->timeout = 0;
	if (o->set & SET_MEMORY)
		lim->memory_mb = o->memory;
	if (o->set & SET_PIDS)
		lim->pids = o->pids;
	if (o->dir || geteuid() != 0)
		goto out;
	sb->privileged = bo.privileged;
	if (o->privileged && !sb->privileged) {
		rc = cb_error_set(EINVAL,
				  "%s was not configured privileged (backend option "
				  "privileged): its files belong to its own id range",
				  ref);
		goto out;
	}
	if (!sb->privileged && (rc = cb_ws_ids_get(wsdir, &sb->id_base)) < 0) {
		if (rc == -ENOENT)
			rc = cb_error_set(ENOENT,
					  "%s has no id range yet (its daemon predates "
					  "them): cowbox umount it and try again",
					  ref);
		goto out;
	}
	rc = 0;
out:
	cb_backend_options_free(&bo);
	free(wsdir);
	return rc;
}

/* The command's environment: built from scratch in the sandbox, the host's minus
 * credentials with the local backend; --env entries replace same-named ones. */
/* entry ("KEY=VALUE") in env, replacing KEY's earlier one; a failed strdup leaves a NULL
 * that build_env finds. */
static void env_set(char **env, size_t *n, const char *entry)
{
	size_t klen = strcspn(entry, "=") + 1, j;

	for (j = 0; j < *n; j++)
		if (env[j] && !strncmp(env[j], entry, klen))
			break;
	if (j < *n)
		free(env[j]);
	else
		j = (*n)++;
	env[j] = strdup(entry);
}

static char **build_env(const struct exec_opts *o)
{
	char **host = NULL;
	size_t n = 0, cap = (size_t)o->n_env + 8;
	for (size_t i = 0; o->image_cfg.env && o->image_cfg.env[i]; i++)
		cap++;
	if (o->local) {
		if (cb_exec_env_host_stripped(&host) < 0)
			return NULL;
		while (host[n])
			n++;
		cap += n;
	}
	char **env = calloc(cap + 1, sizeof *env);
	if (!env) {
		cb_exec_env_free(host);
		return NULL;
	}
	if (o->local) {
		memcpy(env, host, n * sizeof *env);
		free(host);
	} else {
		const char *term = getenv("TERM");
		char buf[256];
		snprintf(buf, sizeof buf, "TERM=%s", term && *term ? term : "dumb");
		env[n++] =
		    strdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
		env[n++] = strdup("HOME=/tmp");
		env[n++] = strdup(buf);
		env[n++] = strdup("LANG=C.UTF-8");
	}
	/* the image's (its PATH, say) over the base but under --env; HOME stays the sandbox's */
	for (size_t i = 0; o->image_cfg.env && o->image_cfg.env[i]; i++)
		if (strncmp(o->image_cfg.env[i], "HOME=", 5))
			env_set(env, &n, o->image_cfg.env[i]);
	for (int i = 0; i < o->n_env; i++)
		env_set(env, &n, o->env[i]);
	for (size_t j = 0; j < n; j++)
		if (!env[j]) {
			cb_exec_env_free(env);
			return NULL;
		}
	return env;
}

static int write_all(int fd, const void *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf = (const char *)buf + n;
		len -= (size_t)n;
	}
	return 0;
}

static int forward_output(void *arg, int stream, const void *buf, size_t len)
{
	(void)arg;
	write_all(stream == 2 ? 2 : 1, buf, len);
	return 0; /* a closed stdout here must not stop the command */
}

struct signal_thread {
	pthread_t thread;
	sigset_t set;
	struct cb_exec *h;
	int tty;
};

/* Signals to cowbox go to the command's whole tree; SIGWINCH resizes its terminal. */
static void *signal_loop(void *arg)
{
	struct signal_thread *st = arg;
	for (;;) {
		int sig;
		if (sigwait(&st->set, &sig))
			continue;
		if (sig == SIGUSR1)
			return NULL;
		if (sig == SIGWINCH) {
			struct winsize ws;
			if (st->tty && ioctl(0, TIOCGWINSZ, &ws) == 0)
				cb_exec_resize(st->h, ws.ws_row, ws.ws_col);
			continue;
		}
		cb_exec_kill(st->h, sig);
	}
}

/* --network all for one command: a namespace of its own served by pasta, whose files live
 * in a private directory, all gone when the command is. */
struct user_net {
	int netns_fd;
	struct cb_pasta *pasta;
	char dir[64];
};

static int user_net_start(struct user_net *n)
{
	char log[128], pid[128];
	int rc;

	snprintf(n->dir, sizeof n->dir, "/tmp/cowbox-net-XXXXXX");
	if (!mkdtemp(n->dir)) {
		n->dir[0] = 0;
		return cb_error_set(errno, "network all: mkdtemp: %s", strerror(errno));
	}
	snprintf(log, sizeof log, "%s/pasta.log", n->dir);
	snprintf(pid, sizeof pid, "%s/pasta.pid", n->dir);
	if ((rc = cb_netns_new(&n->netns_fd)) < 0)
		return rc;
	return cb_pasta_start(n->netns_fd, log, pid, &n->pasta);
}

static void user_net_stop(struct user_net *n)
{
	char path[128];

	cb_pasta_stop(n->pasta);
	if (n->netns_fd >= 0)
		close(n->netns_fd);
	if (!n->dir[0])
		return;
	snprintf(path, sizeof path, "%s/pasta.log", n->dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/pasta.pid", n->dir);
	unlink(path);
	rmdir(n->dir);
}

static int run_in_workspace(int argc, char **argv, int shell_mode)
{
	struct exec_opts o = {0};
	struct cb_sandbox sb = {0};
	struct cb_backend_limits lim = {0};
	struct cb_exec_spec spec = {0};
	struct cb_exec_callbacks cb = {forward_output, NULL};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;
	struct signal_thread st = {0};
	struct user_net net = {.netns_fd = -1};
	struct termios saved;
	char *dir = NULL, *name = NULL, **env = NULL, *cwd = NULL, ref[CB_WS_REF_LEN + 1];
	int status = 125, raw = 0, rc, thread = 0;

	rc = parse_exec_args(argc, argv, !shell_mode, &o);
	if (rc)
		return rc < 0 ? 0 : rc;
	if (o.local && o.user) {
		fprintf(stderr, "cowbox %s: --user needs the ns backend\n", argv[0]);
		return 2;
	}
	if (o.local && (o.image || o.cpus > 0 || o.memory || o.pids || o.privileged ||
			(o.net && strcmp(o.net, "host")))) {
		fprintf(stderr,
			"cowbox %s: --image, --network, --cpus, --memory, --pids and "
			"--privileged need the ns backend\n",
			argv[0]);
		return 2;
	}
	/* On the host nothing else keeps --cwd inside the workspace: the workspace path rule. */
	if (o.local && o.cwd && cb_beneath_check(o.cwd) < 0) {
		fprintf(stderr, "cowbox %s: --cwd %s: must be a path inside the workspace (%s)\n",
			argv[0], o.cwd, cb_error_message());
		return 2;
	}
	if ((rc = workspace_dir(&o, &dir, &name, ref)) < 0 || !name) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0],
			rc < 0 ? cb_error_message() : "out of memory");
		goto out;
	}
	if ((rc = sandbox_setup(&o, ref, shell_mode, &sb, &lim)) < 0) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
		goto out;
	}
	/* an OCI image: unpacked once into the cache, shared with the workspace's daemon */
	if (!o.local && (o.image || o.ws_image) &&
	    (rc = cb_backend_image_root(o.image ? o.image : o.ws_image, &o.image_root,
					&o.image_cfg)) < 0) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
		goto out;
	}
	if (!(env = build_env(&o))) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], "cannot build the environment");
		goto out;
	}
	spec.env = env;
	for (size_t i = 0; o.n_binds && env[i]; i++)
		if (!strncmp(env[i], "HOME=", 5) && !o.env_home) {
			free(env[i]);
			if (!(env[i] = strdup("HOME=" CB_BACKEND_HOME))) {
				fprintf(stderr, "cowbox %s: out of memory\n", argv[0]);
				goto out;
			}
		}
	spec.timeout = lim.timeout;
	if (o.local) {
		fprintf(stderr,
			"cowbox: warning: the local backend runs on the host in %s, NOT "
			"isolated\n",
			dir);
		if (asprintf(&cwd, "%s/%s", dir, o.cwd ? o.cwd : "") < 0) {
			cwd = NULL;
			goto out;
		}
		spec.cwd = cwd;
	} else {
		sb.workspace = dir;
		sb.image = o.image_root;
		sb.hostname = name;
		if (o.net && !strcmp(o.net, "host")) {
			fprintf(stderr, "cowbox: warning: --network host: the command shares the "
					"host's network namespace (its loopback services, its "
					"abstract unix sockets)\n");
			sb.net = CB_NET_ALL;
		} else if (o.net && !strcmp(o.net, "all")) {
			if ((rc = user_net_start(&net)) < 0) {
				fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
				goto out;
			}
			sb.net = CB_NET_JOIN;
			sb.netns_fd = net.netns_fd;
		} else if (!o.net && o.ws_proxied) {
			/* public, allow: the workspace's namespace, whose one way out is its proxy
			 */
			if ((rc = cli_workspace_netns(ref, &net.netns_fd)) < 0 ||
			    (rc = cli_env_add(&env, cb_backend_proxy_env)) < 0 ||
			    (o.ws_bundle && (rc = cli_env_add(&env, cb_backend_trust_env)) < 0)) {
				fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
				goto out;
			}
			spec.env = env;
			sb.net = CB_NET_JOIN;
			sb.netns_fd = net.netns_fd;
			sb.ca_bundle = o.ws_bundle;
		} else {
			sb.net = CB_NET_NONE;
		}
		sb.cpus = o.cpus;
		sb.memory_mb = lim.memory_mb;
		sb.pids = lim.pids;
		sb.oom_score_adj = lim.oom_score_adj;
		sb.limits_optional = !(o.set & (SET_MEMORY | SET_PIDS));
		sb.user = o.user ? o.user : o.ws_user;
		/* the image's User, as the daemon's commands get it */
		if (!sb.user && !sb.privileged)
			sb.user = o.image_cfg.user;
		sb.binds = o.binds;
		sb.n_binds = o.n_binds;
		if (sb.privileged && geteuid() == 0)
			fprintf(stderr, "cowbox: warning: privileged: the command runs as host "
					"uid 0 (no capabilities), not in a user namespace\n");
		spec.sandbox = &sb;
		spec.cwd = o.cwd;
	}
	static char *shell_argv[] = {"/bin/sh", "-i", NULL};
	if (shell_mode) {
		static char *bash_argv[] = {"/bin/bash", "-i", NULL};
		char probe[4096];
		snprintf(probe, sizeof probe, "%s/usr/bin/bash", o.image_root ? o.image_root : "");
		spec.argv = access(probe, X_OK) == 0 ? bash_argv : shell_argv;
		spec.tty = 1;
		struct winsize ws;
		if (isatty(0) && ioctl(0, TIOCGWINSZ, &ws) == 0) {
			spec.tty_rows = ws.ws_row;
			spec.tty_cols = ws.ws_col;
		}
	} else if (o.shell) {
		spec.shell = o.shell;
	} else if (o.n_cmd == 1 && strchr(o.cmd[0], ' ')) {
		spec.shell = o.cmd[0];
	} else {
		spec.argv = o.cmd;
	}
	if (o.ws_shell && !strcmp(o.ws_shell, "bash"))
		spec.shell_program = "bash";
	spec.stdin_kind = CB_EXEC_STDIN_FD;
	spec.stdin_fd = 0;

	sigemptyset(&st.set);
	sigaddset(&st.set, SIGINT);
	sigaddset(&st.set, SIGTERM);
	sigaddset(&st.set, SIGHUP);
	sigaddset(&st.set, SIGQUIT);
	sigaddset(&st.set, SIGWINCH);
	sigaddset(&st.set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &st.set, NULL);
	if ((rc = cb_exec_start(&spec, &cb, &h)) < 0) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
		goto out;
	}
	st.h = h;
	st.tty = spec.tty;
	thread = pthread_create(&st.thread, NULL, signal_loop, &st) == 0;
	if (spec.tty && isatty(0) && tcgetattr(0, &saved) == 0) {
		struct termios t = saved;
		cfmakeraw(&t);
		raw = tcsetattr(0, TCSANOW, &t) == 0;
	}
	rc = cb_exec_wait(h, &res);
	if (raw)
		tcsetattr(0, TCSANOW, &saved);
	if (rc < 0) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
		goto out;
	}
	status = res.exit_code;
	if (res.timed_out)
		fprintf(stderr,
			"cowbox: timed out after %g s; the command and its children were "
			"killed\n",
			lim.timeout);
	if (res.output_limited)
		fprintf(stderr, "cowbox: output passed %u bytes; the command was stopped\n",
			CB_EXEC_DEFAULT_OUTPUT_LIMIT);
	if (res.oom_killed)
		fprintf(stderr, "cowbox: the memory cap of %lu MB was exceeded; killed\n",
			lim.memory_mb);
out:
	if (thread) {
		pthread_kill(st.thread, SIGUSR1);
		pthread_join(st.thread, NULL);
	}
	cb_exec_result_free(&res);
	cb_exec_free(h);
	user_net_stop(&net);
	cb_exec_env_free(env);
	free(cwd);
	free(dir);
	free(name);
	free(o.ws_user);
	free(o.ws_bundle);
	free(o.ws_shell);
	free(o.ws_image);
	free(o.image_root);
	cb_backend_image_config_free(&o.image_cfg);
	for (size_t i = 0; i < CB_BACKEND_MAX_VOLUMES; i++) {
		free(o.vols[i].src);
		free(o.vols[i].dst);
	}
	return status;
}

int cmd_exec(int argc, char **argv)
{
	return run_in_workspace(argc, argv, 0);
}

int cmd_shell(int argc, char **argv)
{
	return run_in_workspace(argc, argv, 1);
}
