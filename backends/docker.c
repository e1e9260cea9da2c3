/* The docker backend, through the docker CLI only: one long-lived container per workspace
 * with the mount at /workspace, a `docker exec` per command under coreutils timeout in a
 * process group of its own (so a timeout or a kill ends the whole tree inside). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "cowbox/error.h"
#include "cowbox/image.h"
#include "exec/pasta_guard.h"

#define DOCKER_MAX_ARGS	   4096
#define DOCKER_MAX_RUNNING 256

struct docker_running {
	struct cb_exec *h;
	unsigned long token;
	double timeout;
	int killed;   /* docker_kill signalled its tree */
	int end_jobs; /* background kill: what the command left goes with it */
};

/* timeout's -k: how long a timed-out tree has between SIGTERM and SIGKILL (the runner's grace,
 * so that every backend ends a command that ignores SIGTERM alike). */
#define DOCKER_KILL_AFTER CB_EXEC_DEFAULT_GRACE

struct docker_state {
	char name[64]; /* cowbox-<ref> */
	int netns_fd;
	struct cb_pasta_guard *guard; /* network all: the host's addresses kept out */
	pthread_mutex_t lock;	      /* guards running and next_token */
	struct docker_running running[DOCKER_MAX_RUNNING];
	unsigned long next_token;
};

/* The docker CLI itself, with the daemon's environment minus provider credentials (it needs
 * DOCKER_HOST, HOME and PATH). */
static int docker_cli(char *const *argv, double timeout, struct cb_exec_result *res)
{
	struct cb_exec_spec spec = {.argv = argv, .timeout = timeout};
	char **env = NULL;
	int rc = cb_exec_env_host_stripped(&env);

	memset(res, 0, sizeof(*res));
	if (rc < 0)
		return rc;
	spec.env = env;
	rc = cb_exec_run(&spec, res);
	cb_exec_env_free(env);
	if (!rc && res->exit_code == 127 && !res->err_len)
		rc = cb_error_set(ENOENT, "docker backend: the docker CLI is not on PATH");
	if (rc)
		cb_exec_result_free(res); /* callers free it only on success */
	return rc;
}

/* docker rm -f NAME: 0 once the CLI ran, whatever it answered (a container that is already
 * gone is what the caller wants); -errno only when the CLI could not run. */
static int docker_remove_quietly(const char *name)
{
	char *argv[] = {"docker", "rm", "-f", (char *)name, NULL};
	struct cb_exec_result res;
	int rc = docker_cli(argv, 60, &res);

	if (!rc)
		cb_exec_result_free(&res);
	return rc;
}

/* Run docker with argv; a non-zero exit is an error quoting docker's own message. */
static int docker_check(char *const *argv, double timeout, char **out)
{
	struct cb_exec_result res;
	int rc = docker_cli(argv, timeout, &res);

	if (out)
		*out = NULL;
	if (!rc && res.exit_code) {
		char *msg = res.err_len ? res.err : res.out;

		msg[strcspn(msg, "\n")] = 0;
		rc = cb_error_set(res.timed_out ? ETIMEDOUT : EIO, "docker %s: %s", argv[1],
				  res.timed_out ? "timed out" : msg);
	} else if (!rc && out) {
		res.out[strcspn(res.out, "\n")] = 0;
		if (!(*out = strdup(res.out)))
			rc = cb_error_set(ENOMEM, "docker: out of memory");
	}
	cb_exec_result_free(&res);
	return rc;
}

/* Network all: the engine's bridge routes the container to every address of the host, whose
 * services listen there. Two walls, neither within the container's reach (it has no
 * CAP_NET_ADMIN over its namespace, nor raw sockets): its namespace's firewall rejects each
 * address of the host's interfaces, rewritten on each change of them (exec/pasta_guard.c);
 * and the host's INPUT refuses the container's own addresses in the direction of the
 * connections it starts, per packet, so a new address is refused before that rewrite. */
static int docker_guard(struct docker_state *s)
{
	char *inspect[] = {"docker",
			   "inspect",
			   "-f",
			   "{{range .NetworkSettings.Networks}}{{.IPAddress}} "
			   "{{.GlobalIPv6Address}} {{end}}",
			   s->name,
			   NULL};
	char *addrs = NULL, *save = NULL, *a, *c;
	int rc, n = 0;

	if (s->netns_fd < 0)
		return cb_error_set(EOPNOTSUPP,
				    "network all: the container's network namespace is out of "
				    "reach (a remote engine?), so the host's own addresses cannot "
				    "be kept from it");
	if ((rc = cb_pasta_guard_start(s->netns_fd, &s->guard)) < 0 ||
	    (rc = docker_check(inspect, 60, &addrs)) < 0)
		return rc;
	cb_pasta_source_purge(s->name); /* a killed daemon's, for an address now another's */
	for (c = addrs; !rc && (a = strtok_r(c, " ", &save)); c = NULL, n++)
		rc = cb_pasta_source_rule(a, s->name);
	if (!rc && !n)
		rc = cb_error_set(EOPNOTSUPP,
				  "network all: the container %s has no address on the engine's "
				  "network to keep from the host's own",
				  s->name);
	free(addrs);
	return rc;
}

static int docker_create(struct cb_backend *b)
{
	struct docker_state *s = calloc(1, sizeof(*s));
	const char *image = cb_backend_image_of(&b->opt);
	char vol[4200], homevol[4200], cpus[32], mem[32], pids[32], oom[16], nspath[64];
	char cavol[4300];
	char *pid = NULL;
	struct cb_backend_limits lim;
	char vols[CB_BACKEND_MAX_VOLUMES][2200];
	char *argv[42 + 2 * CB_BACKEND_MAX_VOLUMES];
	int n = 0, rc;

	if (!s)
		return cb_error_set(ENOMEM, "docker backend: out of memory");
	s->netns_fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	snprintf(s->name, sizeof(s->name), "cowbox-%s", b->ref);
	/* A container left by an earlier daemon has a dead bind of the old mount: replace it. */
	docker_remove_quietly(s->name);
	snprintf(vol, sizeof(vol), "%s:/workspace", b->root);
	argv[n++] = "docker";
	argv[n++] = "run";
	argv[n++] = "-d";
	argv[n++] = "--name";
	argv[n++] = s->name;
	argv[n++] = "--hostname";
	argv[n++] = b->hostname;
	/* all: the engine's default network (its own namespace, NAT out); host: the host's. */
	if (b->opt.net != CB_BACKEND_NET_ALL) {
		argv[n++] = "--network";
		argv[n++] = b->opt.net == CB_BACKEND_NET_HOST ? "host" : "none";
	} else {
		/* no raw sockets: a frame of its own making would pass the namespace's rules
		 * and could carry another source address past the host's (docker_guard) */
		argv[n++] = "--cap-drop";
		argv[n++] = "NET_RAW";
	}
	/* host_url's forwarder listens on the container's own loopback. */
	argv[n++] = "--add-host";
	argv[n++] = "host.docker.internal:127.0.0.1";
	if (b->opt.cpus > 0) {
		snprintf(cpus, sizeof(cpus), "%g", b->opt.cpus);
		argv[n++] = "--cpus";
		argv[n++] = cpus;
	}
	cb_backend_limits_of(&b->opt, &lim);
	if (lim.memory_mb) {
		snprintf(mem, sizeof(mem), "%lum", lim.memory_mb);
		argv[n++] = "--memory";
		argv[n++] = mem;
	}
	if (lim.pids) {
		snprintf(pids, sizeof(pids), "%lu", lim.pids);
		argv[n++] = "--pids-limit";
		argv[n++] = pids;
	}
	snprintf(oom, sizeof(oom), "%d", lim.oom_score_adj);
	argv[n++] = "--oom-score-adj";
	argv[n++] = oom;
	argv[n++] = "-v";
	argv[n++] = vol;
	snprintf(homevol, sizeof(homevol), "%s/home:" CB_BACKEND_HOME, b->dir);
	argv[n++] = "-v";
	argv[n++] = homevol;
	/* header secrets: the container's TLS clients trust the workspace's CA (the bundle is
	 * the host's system CAs and that CA, over the image's own) */
	if (b->opt.n_secrets) {
		if ((rc = cb_backend_trust_prepare(b)) < 0)
			goto out;
		snprintf(cavol, sizeof(cavol),
			 "%s/" CB_NET_CA_BUNDLE ":" CB_BACKEND_SYSTEM_CA ":ro", b->dir);
		argv[n++] = "-v";
		argv[n++] = cavol;
	}
	for (size_t i = 0; i < b->opt.n_volumes; i++) {
		/* the engine binds by path: checked here (no symlink on the way, the directory
		 * it named when given), the window until the engine resolves it remains */
		int vfd = cb_backend_volume_open(&b->opt.volumes[i]);

		if (vfd < 0) {
			rc = vfd;
			goto out;
		}
		close(vfd);
		snprintf(vols[i], sizeof(vols[i]), "%s:%s:%s", b->opt.volumes[i].src,
			 b->opt.volumes[i].dst, b->opt.volumes[i].writable ? "rw" : "ro");
		argv[n++] = "-v";
		argv[n++] = vols[i];
	}
	argv[n++] = "-w";
	argv[n++] = "/workspace";
	argv[n++] = (char *)image;
	/* A shell as PID 1 reaps the orphans of commands; sleep alone would not. */
	argv[n++] = "/bin/sh";
	argv[n++] = "-c";
	argv[n++] = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done";
	argv[n] = NULL;
	if ((rc = docker_check(argv, 120, NULL)) < 0) {
		if (!strcmp(image, CB_BACKEND_DOCKER_DEFAULT_IMAGE))
			cb_error_wrap(rc,
				      "docker backend: the default image %s (scripts/setup-podman "
				      "builds it; else set the image option): ",
				      image);
		goto out;
	}
	{
		char *inspect[] = {"docker", "inspect", "-f", "{{.State.Pid}}", s->name, NULL};

		if ((rc = docker_check(inspect, 60, &pid)) < 0)
			goto out;
	}
	snprintf(nspath, sizeof(nspath), "/proc/%s/ns/net", pid);
	/* Only a local engine's container is reachable this way; host_url says so if not. */
	s->netns_fd = open(nspath, O_RDONLY | O_CLOEXEC);
	/* public, allow: the container runs with --network none; its one way out is the proxy */
	if (cb_backend_net_proxied(&b->opt) &&
	    (rc = s->netns_fd < 0 ? cb_error_set(EOPNOTSUPP,
						 "network %s: the container's network namespace "
						 "is out of reach (a remote engine?)",
						 cb_backend_net_name(b->opt.net))
				  : cb_backend_proxy_start(b, s->netns_fd)) < 0) {
		close(s->netns_fd);
		docker_remove_quietly(s->name);
		goto out;
	}
	if (b->opt.net == CB_BACKEND_NET_ALL && (rc = docker_guard(s)) < 0) {
		cb_pasta_guard_stop(s->guard);
		cb_pasta_source_purge(s->name);
		if (s->netns_fd >= 0)
			close(s->netns_fd);
		docker_remove_quietly(s->name);
		goto out;
	}
	b->priv = s;
	b->netns_fd = s->netns_fd;
	s = NULL;
out:
	free(pid);
	if (s)
		pthread_mutex_destroy(&s->lock);
	free(s);
	return rc;
}

static int docker_exec(struct cb_backend *b, const struct cb_backend_cmd *cmd,
		       const struct cb_exec_callbacks *cb, struct cb_exec **out)
{
	struct docker_state *s = b->priv;
	struct cb_exec_spec spec = {0};
	char **env = NULL, *rel = NULL, *argv[DOCKER_MAX_ARGS], wrapper[400], tmo[32], wd[4200];
	char envfile[4200], user[80];
	FILE *ef = NULL;
	size_t n = 0, slot;
	double timeout = cb_backend_timeout(b, cmd);
	unsigned long token;
	int rc;

	if ((rc = cb_backend_env(b, cmd->env, &env)) < 0)
		return rc;
	if ((rc = cb_backend_cwd(b, cmd->cwd, 1, &rel)) < 0)
		goto out;
	pthread_mutex_lock(&s->lock);
	for (slot = 0; slot < DOCKER_MAX_RUNNING && s->running[slot].h; slot++)
		;
	token = ++s->next_token;
	if (slot < DOCKER_MAX_RUNNING)
		s->running[slot].h = (struct cb_exec *)1; /* reserved until started */
	pthread_mutex_unlock(&s->lock);
	if (slot == DOCKER_MAX_RUNNING) {
		rc = cb_error_set(EBUSY, "docker backend: %d commands already run",
				  DOCKER_MAX_RUNNING);
		goto out;
	}
	snprintf(wd, sizeof(wd), "%s%s", rel[0] == '/' ? "" : "/workspace/", rel);
	snprintf(tmo, sizeof(tmo), "%g", timeout > 0 ? timeout : 0);
	/* A kill may come before the tree exists: docker_signal_tree leaves the signal in a
	 * file first and reads the pid second, the wrapper writes its pid first and looks for
	 * the file second, so one of them always sees the other. */
	/* COWBOX_EXEC_ID marks every process of the tree, also those that leave its process
	 * group (setsid): docker_signal_tree finds them by it. */
	snprintf(wrapper, sizeof(wrapper),
		 "echo $$ >/tmp/.cowbox-exec-%lu; s=$(cat /tmp/.cowbox-kill-%lu 2>/dev/null) && "
		 "exit $((128 + s)); export COWBOX_EXEC_ID=%lu; exec timeout -k %g %s \"$@\"",
		 token, token, token, DOCKER_KILL_AFTER, tmo);
	argv[n++] = "docker";
	argv[n++] = "exec";
	argv[n++] = "-i";
	argv[n++] = "-w";
	argv[n++] = wd;
	/* The environment goes in a 0600 file, not on the command line where `ps` shows it;
	 * a value with a newline cannot be in that file and stays an argument. */
	snprintf(envfile, sizeof(envfile), "%s/docker-env-%d-%lu", b->dir, (int)getpid(), token);
	if ((ef = fopen(envfile, "wxe"))) {
		fchmod(fileno(ef), 0600);
		argv[n++] = "--env-file";
		argv[n++] = envfile;
	}
	for (size_t i = 0; env[i] && n < DOCKER_MAX_ARGS - 16; i++) {
		if (ef && !strchr(env[i], '\n')) {
			fprintf(ef, "%s\n", env[i]);
			continue;
		}
		argv[n++] = "-e";
		argv[n++] = env[i];
	}
	if (ef && fclose(ef) != 0) {
		rc = cb_error_set(EIO, "docker backend: write %s", envfile);
		goto release;
	}
	if (cb_backend_user(b, cmd)) {
		snprintf(user, sizeof(user), "--user=%s", cb_backend_user(b, cmd));
		argv[n++] = user;
	}
	argv[n++] = s->name;
	argv[n++] = "/bin/sh";
	argv[n++] = "-c";
	argv[n++] = wrapper;
	argv[n++] = "sh";
	if (cmd->shell) {
		argv[n++] = cb_backend_shell_program(b) ? "bash" : "/bin/sh";
		argv[n++] = "-c";
		argv[n++] = (char *)cmd->shell;
	}
	for (size_t i = 0; cmd->argv && cmd->argv[i] && n < DOCKER_MAX_ARGS - 1; i++)
		argv[n++] = cmd->argv[i];
	argv[n] = NULL;
	{
		char **host = NULL;

		if ((rc = cb_exec_env_host_stripped(&host)) < 0)
			goto release;
		spec.env = host;
		spec.argv = argv;
		/* Inside, timeout ends the tree; out here only a hung CLI is cut short. */
		spec.timeout = timeout > 0 ? timeout + 30 : 0;
		spec.output_limit = cmd->output_limit;
		spec.stdin_kind = cmd->stdin_kind;
		spec.stdin_data = cmd->stdin_data;
		spec.stdin_len = cmd->stdin_len;
		rc = cb_exec_start(&spec, cb, out);
		cb_exec_env_free(host);
	}
release:
	if (rc && ef)
		unlink(envfile);
	pthread_mutex_lock(&s->lock);
	s->running[slot].h = rc ? NULL : *out;
	s->running[slot].token = token;
	s->running[slot].timeout = timeout;
	s->running[slot].killed = 0;
	s->running[slot].end_jobs = !cb_backend_keep(b, cmd);
	pthread_mutex_unlock(&s->lock);
out:
	free(rel);
	cb_exec_env_free(env);
	return rc;
}

static struct docker_running *docker_find(struct docker_state *s, struct cb_exec *h)
{
	for (size_t i = 0; i < DOCKER_MAX_RUNNING; i++)
		if (s->running[i].h == h)
			return &s->running[i];
	return NULL;
}

/* Signal the command's process group inside the container (timeout made it the leader), or
 * the wrapper itself before timeout made the group, and every process that carries the
 * command's COWBOX_EXEC_ID (its setsid'd descendants); the signal is left in a file for a
 * wrapper that has not started yet (see docker_exec). */
static void docker_signal_tree(struct docker_state *s, unsigned long token, int sig)
{
	char script[640];
	char *argv[] = {"docker", "exec", s->name, "/bin/sh", "-c", script, NULL};
	struct cb_exec_result res;

	snprintf(script, sizeof(script),
		 "echo %d >/tmp/.cowbox-kill-%lu; p=$(cat /tmp/.cowbox-exec-%lu 2>/dev/null) && "
		 "{ kill -%d -$p 2>/dev/null || kill -%d $p 2>/dev/null; }; "
		 "for d in /proc/[0-9]*; do tr '\\0' '\\n' <$d/environ 2>/dev/null | "
		 "grep -qx COWBOX_EXEC_ID=%lu && kill -%d ${d#/proc/} 2>/dev/null; done; true",
		 sig, token, token, sig, sig, token, sig);
	if (docker_cli(argv, 30, &res) == 0)
		cb_exec_result_free(&res);
}

static int docker_wait(struct cb_backend *b, struct cb_exec *h, struct cb_exec_result *res)
{
	struct docker_state *s = b->priv;
	struct docker_running *r;
	unsigned long token = 0;
	double timeout = 0;
	int rc = cb_exec_wait(h, res), killed = 0, end_jobs = 0;

	pthread_mutex_lock(&s->lock);
	if ((r = docker_find(s, h))) {
		token = r->token;
		timeout = r->timeout;
		killed = r->killed;
		end_jobs = r->end_jobs;
		r->h = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	if (token) {
		char envfile[4200];

		snprintf(envfile, sizeof(envfile), "%s/docker-env-%d-%lu", b->dir, (int)getpid(),
			 token);
		unlink(envfile); /* the CLI read it long ago */
	}
	if (killed)
		res->killed = 1;
	/* timeout ends 124 when the command obeyed SIGTERM, 137 when it had to be killed after
	 * DOCKER_KILL_AFTER more seconds; by then nothing but the timeout can have ended it. */
	if (!rc && timeout > 0 &&
	    ((res->exit_code == 124 && res->duration >= timeout - 0.05) ||
	     (res->exit_code == 128 + SIGKILL && !killed &&
	      res->duration >= timeout + DOCKER_KILL_AFTER - 0.05))) {
		res->timed_out = 1;
		res->exit_code = 124;
		res->term_signal = 0;
	}
	/* The CLI was stopped (output cap, kill, its own timeout), the command timed out, or
	 * its background jobs end with it: what is left of the tree inside goes now. */
	if (!rc && token && (res->output_limited || res->killed || res->timed_out || end_jobs))
		docker_signal_tree(s, token, SIGKILL);
	/* The engine refused to run anything (the container was removed or stopped behind our
	 * back): not the command's failure. -ENXIO tells the daemon to stop; the next use
	 * starts a new daemon, which makes a new container. */
	if (!rc && res->exit_code == 1 && !res->out_len && res->err_len &&
	    !strncmp(res->err, "Error response from daemon:", 27)) {
		res->err[strcspn(res->err, "\n")] = 0;
		rc = cb_error_set(ENXIO,
				  "docker backend: container %s cannot run commands (%s); the "
				  "daemon stops, the next use starts a new container",
				  s->name, res->err + 28);
	}
	return rc;
}

static void docker_kill(struct cb_backend *b, struct cb_exec *h, int sig)
{
	struct docker_state *s = b->priv;
	struct docker_running *r;
	unsigned long token = 0;

	pthread_mutex_lock(&s->lock);
	if ((r = docker_find(s, h))) {
		token = r->token;
		r->killed = 1;
	}
	pthread_mutex_unlock(&s->lock);
	/* The CLI is left alone: it returns the status of the tree it runs once that ends. */
	if (token)
		docker_signal_tree(s, token, sig);
	else
		cb_exec_kill(h, sig);
}

static int docker_which(struct cb_backend *b, const char *binary, char **path)
{
	struct docker_state *s = b->priv;
	char *argv[] = {"docker", "exec",	  s->name, "/bin/sh", "-c", CB_BACKEND_WHICH_SCRIPT,
			"sh",	  (char *)binary, NULL};
	struct cb_exec_result res;
	int rc = docker_cli(argv, 30, &res);

	*path = NULL;
	if (rc)
		return rc;
	return cb_backend_which_result(&res, binary, "container", path);
}

static int docker_host_url(struct cb_backend *b, int port, char **url)
{
	struct docker_state *s = b->priv;
	int rc;

	if (s->netns_fd < 0)
		return cb_error_set(EOPNOTSUPP,
				    "host_url: the container's network namespace is "
				    "not reachable from this daemon (a remote engine?)");
	if ((rc = cb_forwarder_add(b, s->netns_fd, port)) < 0)
		return rc;
	if (asprintf(url, "http://host.docker.internal:%d", port) < 0) {
		*url = NULL;
		return cb_error_set(ENOMEM, "host_url: out of memory");
	}
	return 0;
}

/* The container goes with the daemon: its bind of the mount dies with the mount anyway. */
static void docker_close(struct cb_backend *b)
{
	struct docker_state *s = b->priv;

	if (!s)
		return;
	docker_remove_quietly(s->name);
	cb_pasta_guard_stop(s->guard);
	cb_pasta_source_purge(s->name);
	b->netns_fd = -1;
	if (s->netns_fd >= 0)
		close(s->netns_fd);
	pthread_mutex_destroy(&s->lock);
	free(s);
	b->priv = NULL;
}

static int docker_destroy(struct cb_backend *b)
{
	struct docker_state *s = b->priv;
	char *argv[] = {"docker", "rm", "-f", s->name, NULL};

	return docker_check(argv, 60, NULL);
}

/* docker rm -f of the workspace's container, which a crashed daemon left running. */
static int docker_remove_leftovers(const char *ref)
{
	char name[64];

	snprintf(name, sizeof(name), "cowbox-%s", ref);
	cb_pasta_source_purge(name);
	return docker_remove_quietly(name);
}

/* The image is a name the docker CLI takes, never one of its options; the user namespace is
 * the engine's to choose. */
static int docker_validate(struct cb_backend_options *o, json_t *j)
{
	(void)j;
	if (o->image && (!*o->image || *o->image == '-'))
		return cb_error_set(EINVAL, "backend option image: an image name, not empty and "
					    "not starting with '-'");
	if (o->privileged)
		return cb_error_set(EINVAL, "backend option privileged: only the ns backend has a "
					    "user namespace to leave out");
	return 0;
}

/* The image in the engine's store, or pulled into it now from the registries the engine's
 * own configuration names (podman: registries.conf); what docker run would have done at the
 * first command, done at configure so that a bad image fails it naming the image. */
static int docker_check_image(const char *image)
{
	char *inspect[] = {"docker",  "image",	     "inspect", "--format",
			   "{{.Id}}", (char *)image, NULL};
	char *pull[] = {"docker", "pull", "--quiet", (char *)image, NULL};
	int rc;

	if (docker_check(inspect, 60, NULL) == 0)
		return 0;
	if ((rc = docker_check(pull, 600, NULL)) < 0)
		return cb_error_wrap(rc == -EIO ? -ENOENT : rc,
				     "docker backend: image %s is not in the engine's store and "
				     "could not be pulled",
				     image);
	return 0;
}

static const char *docker_workdir(const char *mountpoint)
{
	(void)mountpoint;
	return "/workspace";
}

/* COWBOX_DOCKER_IMAGE, else CB_BACKEND_DOCKER_DEFAULT_IMAGE. */
static const char *docker_default_image(void)
{
	const char *env = getenv("COWBOX_DOCKER_IMAGE");

	return env && *env ? env : CB_BACKEND_DOCKER_DEFAULT_IMAGE;
}

const struct cb_backend_ops cb_backend_docker = {
    .name = "docker",
    .confined = 1,
    .validate = docker_validate,
    .workdir = docker_workdir,
    .default_image = docker_default_image,
    .remove_leftovers = docker_remove_leftovers,
    .create = docker_create,
    .exec = docker_exec,
    .wait = docker_wait,
    .kill = docker_kill,
    .which = docker_which,
    .host_url = docker_host_url,
    .close = docker_close,
    .destroy = docker_destroy,
    .check_image = docker_check_image,
};
