/* `cowbox exec` and `cowbox shell`: run a command (or an interactive shell on a pty) in a
 * workspace on its own backend and options, as the API would, or in a plain directory. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <openssl/evp.h>
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
#include "cowbox/box.h"
#include "util/fdio.h"
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
#include "exec.h"
#include "util/beneath.h"

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
	    "  -e, --env K=V|K      add to the environment (repeatable); K alone passes this\n"
	    "                       shell's value of K\n"
	    "  -w, --cwd, --workdir DIR  working directory, relative to /workspace\n"
	    "  -u, --user NAME|UID[:G]  run as this user inside the sandbox (default: the\n"
	    "                       workspace's user option, else the sandbox's root)\n"
	    "  --network MODE       none (default): loopback only; all: outbound TCP/UDP/DNS\n"
	    "                       through pasta, not the host's loopback or its abstract\n"
	    "                       sockets; host: the host's own network namespace (warned).\n"
	    "                       Not given, a workspace's command is in the workspace's\n"
	    "                       own namespace (its network option), as its API commands\n"
	    "  --cpus N             CPU quota (e.g. 0.5)\n"
	    "  --memory SIZE        memory cap in MiB, or 512m, 2g; exceeding it kills the\n"
	    "                       command (exit 137);\n"
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
	    "  --backend ns|local   with --dir: ns (default): namespace sandbox; local: on the\n"
	    "                       host, NOT isolated (a workspace runs on its own backend)\n"
	    "  --json               print the result as the API's run reply (exit_code,\n"
	    "                       signal, timed_out, ..., stdout and stderr in base64)\n"
	    "%s\n"
	    "A workspace's command runs on its backend with its options (backend.json: env,\n"
	    "working_dir, image, user, network, limits), exactly as the API runs it; the\n"
	    "flags override them for this command. ns and local run it from this process,\n"
	    "docker through the workspace's daemon (its container). The environment is the\n"
	    "backend's: PATH, HOME (the persistent /home/cowbox; with --dir a private /tmp),\n"
	    "LANG=C.UTF-8, the options' env, then --env (a shell also gets TERM): nothing else\n"
	    "of the host's; the local backend passes the host's environment minus credentials\n"
	    "(names with TOKEN, SECRET, PASSWORD, API_KEY, AUTH, ...; docs/security.md).\n"
	    "Exit status: the command's; 124 timed out; 128+N killed by signal N (137 also when\n"
	    "the memory cap was hit); 127 not found; 126 not executable; 125 cowbox failed.\n",
	    name, strcmp(name, "exec") ? "" : " [--] CMD [ARG...]",
	    strcmp(name, "exec") ? ""
				 : "  --shell STRING       run STRING with /bin/sh -c (so does a "
				   "single CMD with spaces)\n"
				   "  -i, --interactive    stdin is passed to the command (always: "
				   "accepted as docker's)\n"
				   "  -t, --tty            the command on a pseudo-terminal of the "
				   "caller's size\n"
				   "                       (ns, local, --dir)\n"
				   "  -d, --detach         start it as a background job of the "
				   "workspace's daemon:\n"
				   "                       it runs on after exec returns, until "
				   "the\n"
				   "                       workspace closes (umount, rm, or the "
				   "daemon's idle stop),\n"
				   "                       its output dropped, as the API's jobs; "
				   "`cowbox publish`\n"
				   "                       reaches a server started so\n");
}

/* 0, or -EINVAL with the message a usage error says. */
static int parse_number(const char *opt, const char *s, double *out)
{
	char *end;
	errno = 0;
	*out = strtod(s ? s : "", &end);
	if (!s || !*s || *end || errno || *out < 0)
		return cb_error_set(EINVAL, "%s needs a non-negative number, not '%s'", opt,
				    s ? s : "");
	return 0;
}

/* Returns 0, or the exit status for a usage error (2) or --help (-1 -> 0). Options may come
 * before and after the workspace (cli_getopt's parser); the command starts at the next
 * operand or after "--". */
static int parse_exec_args(int argc, char **argv, int want_cmd, struct cli_exec_opts *o)
{
	/* docker's short options mean what they mean there: -e -w -u -i -t -d */
	enum { OPT_DIR = 1000, OPT_IMAGE, OPT_TIMEOUT };
	static const struct option own[] = {
	    {"dir", required_argument, NULL, OPT_DIR},
	    {"cwd", required_argument, NULL, 'w'},
	    {"workdir", required_argument, NULL, 'w'},
	    {"user", required_argument, NULL, 'u'},
	    {"image", required_argument, NULL, OPT_IMAGE},
	    {"shell", required_argument, NULL, 's'},
	    {"userns", no_argument, NULL, 'U'},
	    {"privileged", no_argument, NULL, 'P'},
	    {"env", required_argument, NULL, 'e'},
	    {"network", required_argument, NULL, 'n'},
	    {"backend", required_argument, NULL, 'b'},
	    {"timeout", required_argument, NULL, OPT_TIMEOUT},
	    {"cpus", required_argument, NULL, 'C'},
	    {"memory", required_argument, NULL, 'm'},
	    {"pids", required_argument, NULL, 'p'},
	    {"interactive", no_argument, NULL, 'i'},
	    {"tty", no_argument, NULL, 't'},
	    {"detach", no_argument, NULL, 'd'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	char *usage = NULL;
	size_t usage_len = 0;
	FILE *f = open_memstream(&usage, &usage_len);
	int status = 0, c;
	double d;

	if (!f)
		return 2;
	exec_usage(f, argv[0]);
	fclose(f);
	o->shell_mode = !want_cmd;
	optind = 1;
	for (;;) {
		c = cli_getopt(argc, argv, want_cmd ? "+e:w:u:itd" : "+e:w:u:", own, &common, usage,
			       &status);
		if (c < 0) {
			status = status == CLI_OK ? -1 : status;
			goto out;
		}
		if (c == 0) {
			/* an operand: the workspace, unless one was given (or "--" came) */
			if (optind < argc && !o->ref && !o->dir && strcmp(argv[optind - 1], "--")) {
				o->ref = argv[optind++];
				continue;
			}
			break;
		}
		switch (c) {
		case OPT_DIR:
			o->dir = optarg;
			break;
		case 'w':
			o->cwd = optarg;
			break;
		case 'i':
			break; /* stdin is passed to the command: the default */
		case 't':
			o->tty = 1;
			break;
		case 'd':
			o->detach = 1;
			break;
		case 'u':
			if (cb_backend_user_check("--user", optarg) < 0) {
				status = cli_usage_error(usage, "%s", cb_error_message());
				goto out;
			}
			o->user = optarg;
			break;
		case OPT_IMAGE:
			o->image = optarg;
			break;
		case 's':
			if (!want_cmd) {
				status = cli_usage_error(usage, "unknown option '--shell'");
				goto out;
			}
			o->shell = optarg;
			break;
		case 'U':
			break; /* the default now */
		case 'P':
			o->privileged = 1;
			break;
		case 'e':
			if (o->n_env >= CLI_EXEC_MAX_ENV) {
				status =
				    cli_usage_error(usage, "more than %d --env", CLI_EXEC_MAX_ENV);
				goto out;
			}
			if (strchr(optarg, '=') && optarg[0] != '=') {
				o->env[o->n_env++] = optarg;
				break;
			}
			/* --env K: this shell's value of K, as docker passes it */
			if (cli_env_arg(optarg, &o->env_taken[o->n_env]) < 0) {
				status = cli_usage_error(usage, "%s", cb_error_message());
				goto out;
			}
			o->env[o->n_env] = o->env_taken[o->n_env];
			o->n_env++;
			break;
		case 'n':
			if (strcmp(optarg, "none") && strcmp(optarg, "all") &&
			    strcmp(optarg, "host")) {
				status = cli_usage_error(
				    usage, "--network is none, all or host, not '%s'", optarg);
				goto out;
			}
			o->net = optarg;
			break;
		case 'b':
			/* what can run in this process: a sandbox of its own, or the host */
			if (!cb_backend_find(optarg) || !cb_backend_find(optarg)->join) {
				status = cli_usage_error(
				    usage, "--backend is ns or local, not '%s'", optarg);
				goto out;
			}
			o->backend = optarg;
			break;
		case 'm': {
			long long mib;

			if (cli_parse_mib(optarg, &mib) < 0) {
				status = cli_usage_error(usage, "--memory: %s", cb_error_message());
				goto out;
			}
			o->memory = (unsigned long)mib, o->set |= CLI_SET_MEMORY;
			break;
		}
		default: /* the numbers */
			if (parse_number(c == OPT_TIMEOUT ? "--timeout"
					 : c == 'C'	  ? "--cpus"
							  : "--pids",
					 optarg, &d) < 0) {
				status = cli_usage_error(usage, "%s", cb_error_message());
				goto out;
			}
			if (c == OPT_TIMEOUT)
				o->timeout = d, o->set |= CLI_SET_TIMEOUT;
			else if (c == 'C')
				o->cpus = d;
			else
				o->pids = (unsigned long)d, o->set |= CLI_SET_PIDS;
		}
	}
	o->json = common.json;
	o->cmd = argv + optind;
	o->n_cmd = argc - optind;
	status = 0;
	if (!o->ref == !o->dir)
		status = cli_usage_error(usage, "give a workspace REF or --dir DIR (one of them)");
	else if (want_cmd && !o->n_cmd && !o->shell)
		status = cli_usage_error(usage, "no command given (cowbox %s REF -- CMD [ARG...])",
					 argv[0]);
	else if (!want_cmd && o->n_cmd)
		status = cli_usage_error(usage, "unexpected argument '%s'", o->cmd[0]);
	else if (!want_cmd && o->json)
		status = cli_usage_error(usage, "--json: a shell is interactive");
out:
	free(usage);
	return status;
}

/* The workspace directory to put at /workspace: --dir, or the ref's live mount. */
static int workspace_dir(const struct cli_exec_opts *o, char **dir, char **name,
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

int cli_exec_forward(void *arg, int stream, const void *buf, size_t len)
{
	(void)arg;
	cb_fd_write_all(stream == 2 ? 2 : 1, buf, len);
	return 0; /* a closed stdout here must not stop the command */
}

void cli_exec_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGQUIT);
	sigaddset(set, SIGWINCH);
	sigaddset(set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, set, NULL);
}

struct signal_thread {
	pthread_t thread;
	sigset_t set;
	struct cli_run *r;
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
				cb_exec_resize(st->r->h, ws.ws_row, ws.ws_col);
			continue;
		}
		if (st->r->b)
			st->r->b->ops->kill(st->r->b, st->r->h, sig);
		else
			cb_exec_kill(st->r->h, sig);
	}
}

/* The terminal's size now, for a shell's pty. */
void cli_tty_size(unsigned short *rows, unsigned short *cols)
{
	struct winsize ws;

	if (isatty(0) && ioctl(0, TIOCGWINSZ, &ws) == 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	}
}

/* Wait for r->h with the signals passed on (and a raw terminal for a pty): r->res filled. */
int cli_exec_wait(struct cli_run *r, int tty)
{
	struct signal_thread st = {.r = r, .tty = tty};
	struct termios saved;
	int rc, raw = 0, thread;

	cli_exec_signals(&st.set);
	thread = pthread_create(&st.thread, NULL, signal_loop, &st) == 0;
	if (tty && isatty(0) && tcgetattr(0, &saved) == 0) {
		struct termios t = saved;
		cfmakeraw(&t);
		raw = tcsetattr(0, TCSANOW, &t) == 0;
	}
	rc = r->b ? r->b->ops->wait(r->b, r->h, &r->res) : cb_exec_wait(r->h, &r->res);
	if (raw)
		tcsetattr(0, TCSANOW, &saved);
	if (thread) {
		pthread_kill(st.thread, SIGUSR1);
		pthread_join(st.thread, NULL);
	}
	return rc;
}

/* The flags over a workspace's options, for this command only; the backend's validate
 * refuses what it cannot enforce (the local backend: --image, --memory, ...). */
static int ref_overrides(const struct cli_exec_opts *o, struct cb_backend *b, struct cli_run *r)
{
	json_t *given = json_object();
	int rc = 0;

	if (o->backend && strcmp(o->backend, b->ops->name))
		rc = cb_error_set(EINVAL, "%s runs on its own backend, %s (--backend is for --dir)",
				  o->ref, b->ops->name);
	else if (!given)
		rc = cb_error_set(ENOMEM, "out of memory");
	if (!rc && o->image) {
		free(b->opt.image);
		if (!(b->opt.image = strdup(o->image)))
			rc = cb_error_set(ENOMEM, "out of memory");
	}
	if (o->cpus > 0)
		b->opt.cpus = o->cpus;
	if (o->set & CLI_SET_MEMORY)
		b->opt.memory_mb = o->memory ? o->memory : CB_BACKEND_NO_LIMIT;
	if (o->set & CLI_SET_PIDS)
		b->opt.pids = o->pids ? o->pids : CB_BACKEND_NO_LIMIT;
	if (!rc && o->net) {
		rc = cb_backend_net_parse(o->net, &b->opt.net);
		json_object_set_new(given, "network", json_string(o->net));
	}
	if (!rc && b->ops->validate)
		rc = b->ops->validate(&b->opt, given);
	if (!rc && o->user && b->opt.privileged)
		rc = cb_error_set(EINVAL, "--user: a privileged sandbox keeps no capability to "
					  "switch users with");
	json_decref(given);
	r->usage = rc < 0;
	if (!rc && o->privileged && !b->opt.privileged && geteuid() == 0)
		rc = cb_error_set(EINVAL,
				  "%s was not configured privileged (backend option "
				  "privileged): its files belong to its own id range",
				  o->ref);
	return rc;
}

/* The namespace the command joins: its own served by pasta (--network all), the workspace's
 * (its daemon's, as the API's commands have it, under root), or none (a fresh one each). */
static int ref_netns(const struct cli_exec_opts *o, const char *ref, struct cb_backend *b,
		     struct cli_user_net *net)
{
	if (o->net && !strcmp(o->net, "all"))
		return cli_user_net_start(net);
	if (o->net && !strcmp(o->net, "host"))
		fprintf(stderr, "cowbox: warning: --network host: the command shares the host's "
				"network namespace (its loopback services, its abstract unix "
				"sockets)\n");
	/* without root the daemon has none either, but a proxied network needs its (and fails
	 * there, saying why) */
	if (o->net || b->opt.net == CB_BACKEND_NET_HOST ||
	    (geteuid() != 0 && !cb_backend_net_proxied(&b->opt)))
		return 0;
	return cli_workspace_netns(ref, &net->netns_fd);
}

/* A workspace: its backend opened and joined in this process (ns, local), the flags over its
 * options, run as the API runs it; a backend only its daemon runs (docker) goes through it. */
static int run_ref(const struct cli_exec_opts *o, struct cli_run *r)
{
	struct cb_backend_cmd cmd = {.stdin_kind = CB_EXEC_STDIN_FD, .stdin_fd = 0};
	struct cb_exec_callbacks cb = {cli_exec_forward, NULL};
	struct cb_backend_limits lim;
	struct cli_user_net net = {.netns_fd = -1};
	const char *env[CLI_EXEC_MAX_ENV + 2] = {0}, *term = getenv("TERM");
	char *mount = NULL, *name = NULL, *wsdir = NULL, ref[CB_WS_REF_LEN + 1], tbuf[256];
	int rc, level;
	sigset_t set;

	if ((rc = workspace_dir(o, &mount, &name, ref)) < 0)
		goto out;
	if (!name || !mount) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	if ((rc = cb_ws_path(ref, NULL, &wsdir)) < 0)
		goto out;
	/* A command is what access full alone allows (cowbox/access.h). */
	if ((level = cb_ws_access_load(wsdir)) < CB_ACCESS_FULL) {
		rc = level < 0
			 ? level
			 : cb_error_set(EACCES, "%s serves at most access %s: commands need full",
					ref, cb_access_name(level));
		goto out;
	}
	if ((rc = cb_backend_open(ref, wsdir, mount, name, &r->b)) < 0)
		goto out;
	if (!r->b->ops->join) {
		if (o->shell_mode || o->tty || o->image || o->cpus > 0 ||
		    o->set & ~CLI_SET_TIMEOUT || o->net || o->privileged || o->backend) {
			r->usage = 1;
			rc = cb_error_set(
			    EINVAL,
			    "the %s backend's commands run through the workspace's "
			    "daemon, on its options: no shell, -t, --image, --network, "
			    "--cpus, --memory, --pids, --privileged or --backend",
			    r->b->ops->name);
			goto out;
		}
		cb_backend_free(r->b);
		r->b = NULL;
		rc = cli_exec_daemon(o, &r->res);
		goto out;
	}
	if ((rc = ref_overrides(o, r->b, r)) < 0 || (rc = ref_netns(o, ref, r->b, &net)) < 0 ||
	    (rc = cb_backend_join(r->b, net.netns_fd)) < 0)
		goto out;
	if (!r->b->ops->confined)
		fprintf(stderr,
			"cowbox: warning: the %s backend runs on the host in %s, NOT isolated\n",
			r->b->ops->name, mount);
	else if (r->b->opt.privileged && geteuid() == 0)
		fprintf(stderr, "cowbox: warning: privileged: the command runs as host uid 0 (no "
				"capabilities), not in a user namespace\n");
	/* an interactive shell (or exec -t): a pty, TERM from here; a shell: bash when there is
	 * one, no timeout */
	if (o->shell_mode || o->tty) {
		snprintf(tbuf, sizeof tbuf, "TERM=%s", term && *term ? term : "dumb");
		env[0] = tbuf;
		cmd.tty = 1;
		cli_tty_size(&cmd.tty_rows, &cmd.tty_cols);
	}
	if (o->shell_mode) {
		cmd.shell = "command -v bash >/dev/null 2>&1 && exec bash -i; exec sh -i";
	} else if (o->shell) {
		cmd.shell = o->shell;
	} else if (o->n_cmd == 1 && strchr(o->cmd[0], ' ')) {
		cmd.shell = o->cmd[0];
	} else {
		cmd.argv = o->cmd;
	}
	memcpy(env + !!env[0], o->env, (size_t)o->n_env * sizeof *env);
	cmd.env = (char *const *)env;
	cmd.user = o->user;
	cmd.cwd = o->cwd;
	/* `cowbox exec` ends what its command started with itself (nothing here keeps a job past
	 * this process): at once, not after the output drain, whatever the workspace's option */
	cmd.background = CB_BACKEND_BG_KILL;
	cmd.timeout = o->set & CLI_SET_TIMEOUT ? (o->timeout > 0 ? o->timeout : -1)
		      : o->shell_mode	       ? -1
					       : 0;
	cb_backend_limits_of(&r->b->opt, &lim);
	r->timeout = cmd.timeout > 0 ? cmd.timeout : lim.timeout;
	r->memory_mb = lim.memory_mb;
	cli_exec_signals(&set);
	if ((rc = r->b->ops->exec(r->b, &cmd, o->json ? NULL : &cb, &r->h)) < 0)
		goto out;
	rc = cli_exec_wait(r, cmd.tty);
out:
	cli_user_net_stop(&net);
	free(wsdir);
	free(mount);
	free(name);
	return rc;
}

/* Bytes as the protocol carries them: base64 (RFC 4648, padded) in a JSON string. */
static json_t *b64_json(const void *data, size_t len)
{
	char *s = len <= INT_MAX / 2 ? malloc(4 * ((len + 2) / 3) + 1) : NULL;
	json_t *j = NULL;

	if (s) {
		EVP_EncodeBlock((unsigned char *)s, data ? data : (const void *)"", (int)len);
		j = json_string(s);
	}
	free(s);
	return j;
}

/* The result: for --json the API's run reply, else what went wrong said on stderr. */
static int print_result(const struct cli_exec_opts *o, const struct cli_run *r)
{
	const struct cb_exec_result *res = &r->res;

	if (o->json) {
		json_t *j = json_pack(
		    "{s:i, s:i, s:b, s:b, s:b, s:b, s:f, s:o, s:o}", "exit_code", res->exit_code,
		    "signal", res->term_signal, "timed_out", res->timed_out, "output_limited",
		    res->output_limited, "killed", res->killed, "oom_killed", res->oom_killed,
		    "duration", res->duration, "stdout", b64_json(res->out, res->out_len), "stderr",
		    b64_json(res->err, res->err_len));

		if (!j) {
			fprintf(stderr, "cowbox: out of memory\n");
			return 125;
		}
		cli_print_json(j);
		return res->exit_code;
	}
	if (res->timed_out)
		fprintf(stderr,
			"cowbox: timed out after %g s; the command and its children were "
			"killed\n",
			r->timeout);
	if (res->output_limited)
		fprintf(stderr, "cowbox: output passed %u bytes; the command was stopped\n",
			CB_EXEC_DEFAULT_OUTPUT_LIMIT);
	if (res->oom_killed)
		fprintf(stderr, "cowbox: the memory cap of %lu MB was exceeded; killed\n",
			r->memory_mb);
	return res->exit_code;
}

/* s single-quoted for sh, appended to *buf (a memstream). */
static void sh_quote(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++)
		if (*s == '\'')
			fputs("'\\''", f);
		else
			fputc(*s, f);
	fputc('\'', f);
}

/* exec -d: the command as a background job of a run through the workspace's daemon (its
 * background option keep for this run), which returns once the job started: the job runs on
 * until the workspace closes, as the API's jobs do, its output dropped. */
static int run_detached(const struct cli_exec_opts *o)
{
	struct cb_box_run_options ro = {
	    .env = o->env, .cwd = o->cwd, .user = o->user, .background = "keep"};
	struct cb_box_result res = {0};
	struct cb_box *box = NULL;
	char *job = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&job, &len);
	int rc;

	if (!f)
		return cb_error_set(ENOMEM, "out of memory");
	fputs("( ", f);
	if (o->shell || o->n_cmd == 1) {
		fputs("sh -c ", f);
		sh_quote(f, o->shell ? o->shell : o->cmd[0]);
	} else {
		fputs("exec", f);
		for (int i = 0; i < o->n_cmd; i++) {
			fputc(' ', f);
			sh_quote(f, o->cmd[i]);
		}
	}
	fputs(" ) </dev/null >/dev/null 2>&1 &", f);
	if (fclose(f) || !job) {
		free(job);
		return cb_error_set(ENOMEM, "out of memory");
	}
	if (!(rc = cb_box_open(o->ref, &box)))
		rc = cb_box_run(box, NULL, job, &ro, &res);
	if (!rc && res.exit_code)
		rc = cb_error_set(EIO, "the job did not start (exit %d): %s", res.exit_code,
				  res.err ? res.err : "");
	cb_box_result_free(&res);
	cb_box_detach(box);
	free(job);
	return rc;
}

static int run_in_workspace(int argc, char **argv, int shell_mode)
{
	struct cli_exec_opts o = {0};
	struct cli_run r = {0};
	int status, rc;

	status = parse_exec_args(argc, argv, !shell_mode, &o);
	if (!status && o.dir)
		status = cli_exec_dir_usage(&o, argv[0]);
	if (!status && o.detach &&
	    (o.dir || o.tty || o.json || o.image || o.net || o.privileged || o.backend || o.set ||
	     o.cpus > 0)) {
		fprintf(stderr,
			"cowbox %s: -d runs a job in a workspace on its own options: no "
			"--dir, -t, --json, --image, --network, --privileged, --backend or "
			"limits\nsee `cowbox %s --help`\n",
			argv[0], argv[0]);
		status = CLI_USAGE;
	}
	if (status)
		goto out;
	if (o.detach) {
		rc = run_detached(&o);
		status = rc < 0 ? cli_fail_rc(argv[0], rc) : CLI_OK;
		goto out;
	}
	rc = o.dir ? cli_exec_dir(&o, &r) : run_ref(&o, &r);
	if (rc < 0) {
		fprintf(stderr, "cowbox %s: %s\n", argv[0], cb_error_message());
		status = r.usage ? 2 : 125;
	} else {
		status = print_result(&o, &r);
	}
	cb_exec_result_free(&r.res);
	cb_exec_free(r.h);
	cb_backend_free(r.b);
out:
	for (int i = 0; i < o.n_env; i++)
		free(o.env_taken[i]);
	return status < 0 ? 0 : status;
}

int cmd_exec(int argc, char **argv)
{
	return run_in_workspace(argc, argv, 0);
}

int cmd_shell(int argc, char **argv)
{
	return run_in_workspace(argc, argv, 1);
}
