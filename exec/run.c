/* The runner's caller side: starts the shim, supervises it (timeout, output cap, the 2 s
 * drain after exit) and turns what happened into a result. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "internal.h"
#include "run.h"

static const char *env_path(char *const *env)
{
	for (; env && *env; env++)
		if (!strncmp(*env, "PATH=", 5))
			return *env + 5;
	return "/usr/local/bin:/usr/bin:/bin";
}

/* On a pty, stdin goes through the master: copied from an fd, or bytes the loop writes. */
static void tty_stdin(struct cb_exec *h, const struct cb_exec_spec *spec)
{
	if (spec->stdin_kind == CB_EXEC_STDIN_FD) {
		h->stdin_src = spec->stdin_fd;
	} else if (spec->stdin_kind == CB_EXEC_STDIN_BYTES) {
		h->in_bytes = 1;
		h->in_data = spec->stdin_data;
		h->in_len = spec->stdin_len;
	}
}

/* A copy of argv in one block of our own: a sandbox's pid 1 blanks the caller's command line,
 * where the strings may live (cowbox exec passes its own argv). */
static int own_argv(struct cb_exec *h, char *const **argv)
{
	size_t n = 0, bytes = 0;
	while ((*argv)[n])
		bytes += strlen((*argv)[n++]) + 1;
	char **copy = malloc((n + 1) * sizeof *copy + bytes);
	if (!copy)
		return cb_error_set(ENOMEM, "exec: out of memory");
	char *s = (char *)(copy + n + 1);
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen((*argv)[i]) + 1;
		copy[i] = memcpy(s, (*argv)[i], len);
		s += len;
	}
	copy[n] = NULL;
	h->argv_copy = copy;
	*argv = copy;
	return 0;
}

/* The shim's birth: a raw clone (namespace flags, no atfork handlers). ThreadSanitizer cannot
 * follow a raw clone (its runtime's locks, held by other threads at that moment, stay held in
 * the child, which hangs), but it follows fork: so a TSan build (exec/test_run_tsan.sh) makes
 * a plain child, the local backend's, with fork; a sandbox still needs clone's flags. */
static pid_t cb_exec_clone(unsigned long flags)
{
#ifdef CB_EXEC_TSAN
	if (!flags)
		return fork();
#endif
	return (pid_t)syscall(SYS_clone, flags | SIGCHLD, 0UL, 0UL, 0UL, 0UL);
}

int cb_exec_start(const struct cb_exec_spec *spec, const struct cb_exec_callbacks *cb,
		  struct cb_exec **out)
{
	static char *const empty_env[] = {NULL};
	int in[2] = {-1, -1}, o[2] = {-1, -1}, e[2] = {-1, -1}, sp[2] = {-1, -1};
	int slave = -1, rc;
	struct cb_exec *h = calloc(1, sizeof *h);
	*out = NULL;
	if (!h)
		return cb_error_set(ENOMEM, "exec: out of memory");
	h->ctl = h->in_w = h->tty_master = h->stdin_src = h->out.fd = h->err.fd = -1;
	pthread_mutex_init(&h->ctl_lock, NULL);
	pthread_mutex_init(&h->in_lock, NULL);
	h->t0 = cb_exec_now();
	if (cb)
		h->cb = *cb;
	h->timeout = spec->timeout;
	h->grace = spec->grace > 0 ? spec->grace : CB_EXEC_DEFAULT_GRACE;
	h->limit = spec->output_limit ? spec->output_limit : CB_EXEC_DEFAULT_OUTPUT_LIMIT;
	h->keep = spec->keep_bytes ? spec->keep_bytes : CB_EXEC_DEFAULT_KEEP;
	h->keep_set = spec->tty ? NULL : spec->keep;

	struct cb_exec_plan plan = {.envp = spec->env ? spec->env : empty_env,
				    .tty = -1,
				    .fd_in = -1,
				    .fd_out = -1,
				    .fd_err = -1,
				    .group = -1};
	if (spec->shell) {
		h->shell_argv[0] = (char *)(spec->shell_program ? spec->shell_program : "/bin/sh");
		h->shell_argv[1] = "-c";
		h->shell_argv[2] = (char *)spec->shell;
		plan.argv = h->shell_argv;
	} else if (spec->argv && spec->argv[0] && spec->argv[0][0]) {
		plan.argv = spec->argv;
	} else {
		rc = cb_error_set(EINVAL, "exec: no command given (argv is empty and no shell)");
		goto fail;
	}
	plan.path = env_path(plan.envp);
	if (spec->sandbox && (rc = own_argv(h, &plan.argv)) < 0)
		goto fail;

	if (spec->tty && spec->sandbox) {
		plan.sandbox_tty = 1; /* the shim makes it inside and sends the master */
		plan.rows = spec->tty_rows;
		plan.cols = spec->tty_cols;
	} else if (spec->tty) {
		if ((rc = cb_exec_pty_open(spec, &h->tty_master, &slave)) < 0)
			goto fail;
		plan.tty = slave;
		h->out.fd = h->tty_master;
		h->in_w = h->tty_master;
		tty_stdin(h, spec);
	} else {
		if ((rc = cb_exec_pipe(o)) < 0 || (rc = cb_exec_pipe(e)) < 0) {
			rc = cb_error_set(-rc, "exec: pipe: %s", strerror(-rc));
			goto fail;
		}
		if (spec->stdin_kind == CB_EXEC_STDIN_FD) {
			plan.fd_in = cb_exec_fd_above_2(fcntl(spec->stdin_fd, F_DUPFD_CLOEXEC, 3));
			if (plan.fd_in < 0) {
				rc = cb_error_set(errno, "exec: stdin fd %d: %s", spec->stdin_fd,
						  strerror(errno));
				goto fail;
			}
		} else {
			if ((rc = cb_exec_pipe(in)) < 0) {
				rc = cb_error_set(-rc, "exec: pipe: %s", strerror(-rc));
				goto fail;
			}
			plan.fd_in = in[0];
			in[0] = -1;
			if (spec->stdin_kind == CB_EXEC_STDIN_CLOSED) {
				cb_exec_close_fd(&in[1]);
			} else {
				h->in_w = in[1];
				in[1] = -1;
				if (spec->stdin_kind == CB_EXEC_STDIN_BYTES) {
					h->in_bytes = 1;
					h->in_data = spec->stdin_data;
					h->in_len = spec->stdin_len;
					fcntl(h->in_w, F_SETFL, O_NONBLOCK);
				}
			}
		}
		plan.fd_out = o[1];
		plan.fd_err = e[1];
		h->out.fd = o[0];
		h->err.fd = e[0];
		o[0] = e[0] = o[1] = e[1] = -1;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
		rc = cb_error_set(errno, "exec: socketpair: %s", strerror(errno));
		goto fail;
	}
	sp[0] = cb_exec_fd_above_2(sp[0]);
	sp[1] = cb_exec_fd_above_2(sp[1]);
	plan.ctl = sp[1];
	h->ctl = sp[0];
	sp[0] = -1;

	unsigned long flags = 0;
	if (spec->sandbox) {
		if ((rc = cb_ns_plan_build(spec->sandbox, &h->ns)) < 0)
			goto fail;
		plan.ns = h->ns;
		flags = h->ns->clone_flags;
		if (h->ns->privileged_parent && (rc = cb_ns_plan_open_trees(h->ns)) < 0)
			goto fail;
		if ((rc = cb_cgroup_create(spec->sandbox, &h->cg)) < 0 &&
		    !(spec->sandbox->limits_optional &&
		      (rc == -EACCES || rc == -EPERM || rc == -EROFS || rc == -ENOENT)))
			goto fail;
		if (rc < 0)
			cb_error_clear(); /* default caps we may not set: none */
		plan.wait_go = h->ns->userns || h->cg;
		static char workspace_root[] = "/workspace";
		plan.cwd = workspace_root;
		if (spec->cwd) {
			/* relative to /workspace; the child does no allocation, so build it here */
			size_t n = strlen(spec->cwd) + sizeof workspace_root + 1;
			char *cwd = malloc(n);
			if (!cwd) {
				rc = cb_error_set(ENOMEM, "exec: out of memory");
				goto fail;
			}
			if (spec->cwd[0] == '/')
				snprintf(cwd, n, "%s", spec->cwd);
			else
				snprintf(cwd, n, "%s/%s", workspace_root, spec->cwd);
			h->cwd = cwd;
			plan.cwd = cwd;
		}
	} else {
		plan.cwd = spec->cwd;
		if (spec->ids) {
			/* copied: the child reads the plan, not the caller's memory */
			if (spec->ids->n_groups > CB_NS_MAX_GROUPS) {
				rc = cb_error_set(EINVAL, "exec: more than %d groups",
						  CB_NS_MAX_GROUPS);
				goto fail;
			}
			plan.set_ids = 1;
			plan.ids = *spec->ids;
			if (spec->ids->n_groups)
				memcpy(plan.ids_groups, spec->ids->groups,
				       spec->ids->n_groups * sizeof(gid_t));
			plan.ids.groups = plan.ids_groups;
		}
		/* its own group, so that a kill reaches every process however it reparents */
		if ((rc = cb_cgroup_host_create(&h->cg)) < 0)
			goto fail;
		plan.group = cb_cgroup_dirfd(h->cg);
	}

	/* Joining a network namespace: the child is born in this thread's, so this thread steps
	 * into it around clone (a child in a new user namespace could not setns there). */
	int home_net = -1;
	if (spec->sandbox && spec->sandbox->net == CB_NET_JOIN) {
		home_net = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
		if (home_net < 0 || setns(spec->sandbox->netns_fd, CLONE_NEWNET) < 0) {
			rc = cb_error_set(errno, "exec: join network namespace fd %d: %s",
					  spec->sandbox->netns_fd, strerror(errno));
			if (home_net >= 0)
				close(home_net);
			goto fail;
		}
	}
	pid_t pid = cb_exec_clone(flags);
	int clone_err = errno;
	if (home_net >= 0 && pid != 0) {
		int back = setns(home_net, CLONE_NEWNET);
		int err = errno;
		close(home_net);
		if (back < 0) {
			/* should never happen (we came from there); say so loudly, run nothing */
			rc = cb_error_set(err,
					  "exec: could not return this thread to its network "
					  "namespace (it is left in the sandbox's): %s",
					  strerror(err));
			if (pid > 0) {
				h->shim = pid;
				goto fail_child;
			}
			goto fail;
		}
	}
	errno = clone_err;
	if (pid < 0) {
		rc = cb_error_set(errno, "exec: clone (%s): %s",
				  flags ? "new namespaces" : "supervisor", strerror(errno));
		goto fail;
	}
	if (pid == 0)
		cb_exec_shim_main(&plan);
	h->shim = pid;
	cb_exec_close_fd(&sp[1]);
	cb_exec_close_fd(&plan.fd_in);
	cb_exec_close_fd(&plan.fd_out);
	cb_exec_close_fd(&plan.fd_err);
	cb_exec_close_fd(&slave);
	if (plan.wait_go) {
		char go = CB_MSG_GO;
		if (h->ns->userns && ((rc = cb_ns_write_maps(h->ns, pid)) < 0 ||
				      (rc = cb_ns_idmap_late(h->ns, pid)) < 0))
			goto fail_child;
		if (h->cg && (rc = cb_cgroup_attach(h->cg, pid)) < 0)
			goto fail_child;
		if (h->ns)
			cb_ns_write_oom(h->ns, pid);
		send(h->ctl, &go, 1, MSG_NOSIGNAL);
	}
	if (plan.sandbox_tty) {
		if ((rc = cb_exec_pty_receive(h)) < 0)
			goto fail_child;
		tty_stdin(h, spec);
	}
	*out = h;
	return 0;
fail_child:
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	h->shim = 0;
fail:
	cb_exec_close_fd(&in[0]);
	cb_exec_close_fd(&in[1]);
	cb_exec_close_fd(&o[0]);
	cb_exec_close_fd(&o[1]);
	cb_exec_close_fd(&e[0]);
	cb_exec_close_fd(&e[1]);
	cb_exec_close_fd(&sp[0]);
	cb_exec_close_fd(&sp[1]);
	cb_exec_close_fd(&slave);
	cb_exec_close_fd(&plan.fd_in);
	cb_exec_close_fd(&plan.fd_out);
	cb_exec_close_fd(&plan.fd_err);
	cb_exec_free(h);
	return rc;
}

/* One datagram from the shim; returns 0 when the shim has gone. */
static int pump_ctl(struct cb_exec *h, int *status, int *have_status)
{
	char msg[600];
	ssize_t n = recv(h->ctl, msg, sizeof msg - 1, MSG_DONTWAIT);
	if (n < 0)
		return errno == EAGAIN || errno == EINTR;
	if (n == 0)
		return 0;
	if (msg[0] == CB_MSG_STATUS && n >= (ssize_t)(1 + sizeof(int))) {
		memcpy(status, msg + 1, sizeof(int));
		*have_status = 1;
	} else if (msg[0] == CB_MSG_ERROR && !h->setup_error[0]) {
		msg[n] = 0;
		snprintf(h->setup_error, sizeof h->setup_error, "%s", msg + 1);
	}
	return 1;
}

static void cut_stream(struct stream *s, size_t keep)
{
	if (s->len > keep)
		s->len = keep;
}

/* Hand the shim, with the read ends of the output pipes to drain, to the keep set: the
 * handle lets go of its pid, control socket and cgroup. 0, or -errno with nothing moved. */
static int detach(struct cb_exec *h)
{
	int fds[2], n = 0, rc;
	char tag = CB_MSG_DETACH;
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &tag, .iov_len = 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (h->out.fd >= 0)
		fds[n++] = h->out.fd;
	if (h->err.fd >= 0)
		fds[n++] = h->err.fd;
	if (n) {
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
		memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
	}
	pthread_mutex_lock(&h->ctl_lock);
	rc = sendmsg(h->ctl, &mh, MSG_NOSIGNAL) < 0 ? -errno : 0;
	if (!rc && (rc = cb_exec_keep_add(h->keep_set, h->shim, h->ctl, h->cg)) == 0) {
		h->ctl = -1; /* the set's now: a late cb_exec_kill does nothing */
		h->cg = NULL;
	}
	pthread_mutex_unlock(&h->ctl_lock);
	if (rc)
		cb_error_clear(); /* not kept: the tree is killed as without a set */
	return rc;
}

int cb_exec_wait(struct cb_exec *h, struct cb_exec_result *res)
{
	int status = 0, have_status = 0, shim_alive = 1, term_sent = 0, kill_sent = 0, rc = 0;
	double deadline = h->timeout > 0 ? h->t0 + h->timeout : 0, kill_at = 0, drain_until = 0;
	double ended = 0;
	memset(res, 0, sizeof *res);
	if (h->waited)
		return cb_error_set(EINVAL, "exec: cb_exec_wait called twice");
	h->waited = 1;
	if (h->out.fd >= 0)
		fcntl(h->out.fd, F_SETFL, O_NONBLOCK);
	if (h->err.fd >= 0)
		fcntl(h->err.fd, F_SETFL, O_NONBLOCK);
	int src = h->stdin_src, src_flags = src >= 0 ? fcntl(src, F_GETFL) : -1;
	if (src >= 0 && src_flags >= 0)
		fcntl(src, F_SETFL, src_flags | O_NONBLOCK);
	for (;;) {
		double t = cb_exec_now();
		if ((have_status || !shim_alive) && !ended) {
			ended = t;
			drain_until = t + CB_EXEC_EXIT_DRAIN;
		}
		if (ended && ((h->out.fd < 0 && h->err.fd < 0) || t >= drain_until))
			break;
		/* A timed-out command has been told to end and has: what is left of its tree goes
		 * now, not after the drain (which still reads what the pipes hold). */
		if (ended && res->timed_out && !kill_sent) {
			kill_sent = 1;
			cb_exec_send_kill(h, SIGKILL);
		}
		/* Nowhere to keep what the command left (no keep set: background "kill", the CLI's
		 * `cowbox exec`): it ends with the command, now, not at the drain's end (a job that
		 * holds stdout would otherwise run up to 2 s more, and write); the drain then
		 * reads what the pipes still hold. */
		if (ended && have_status && !h->keep_set && !kill_sent) {
			kill_sent = 1;
			cb_exec_send_kill(h, SIGKILL);
		}
		if (deadline && !term_sent && t >= deadline && !ended) {
			res->timed_out = 1;
			term_sent = 1;
			cb_exec_send_kill(h, SIGTERM);
			kill_at = t + h->grace;
		}
		if (term_sent && !kill_sent && t >= kill_at) {
			kill_sent = 1;
			cb_exec_send_kill(h, SIGKILL);
		}
		double wake = ended ? drain_until : 0;
		if (deadline && !term_sent && (!wake || deadline < wake))
			wake = deadline;
		if (term_sent && !kill_sent && (!wake || kill_at < wake))
			wake = kill_at;
		int ms = wake ? (int)((wake - t) * 1000) + 1 : -1;

		struct pollfd pf[5];
		int n = 0, i_out = -1, i_err = -1, i_ctl = -1, i_in = -1, i_src = -1;
		if (h->out.fd >= 0)
			pf[i_out = n++] = (struct pollfd){.fd = h->out.fd, .events = POLLIN};
		if (h->err.fd >= 0)
			pf[i_err = n++] = (struct pollfd){.fd = h->err.fd, .events = POLLIN};
		if (shim_alive)
			pf[i_ctl = n++] = (struct pollfd){.fd = h->ctl, .events = POLLIN};
		if (h->in_bytes && h->in_w >= 0)
			pf[i_in = n++] = (struct pollfd){.fd = h->in_w, .events = POLLOUT};
		if (h->stdin_src >= 0)
			pf[i_src = n++] = (struct pollfd){.fd = h->stdin_src, .events = POLLIN};
		if (poll(pf, (nfds_t)n, ms) < 0 && errno != EINTR) {
			rc = cb_error_set(errno, "exec: poll: %s", strerror(errno));
			break;
		}
		if (i_out >= 0 && pf[i_out].revents && !cb_exec_pump_output(h, &h->out, 1)) {
			if (h->out.fd == h->tty_master)
				h->out.fd = -1; /* the master stays open for stdin until free */
			else
				cb_exec_close_fd(&h->out.fd);
		}
		if (i_err >= 0 && pf[i_err].revents && !cb_exec_pump_output(h, &h->err, 2))
			cb_exec_close_fd(&h->err.fd);
		if (i_ctl >= 0 && pf[i_ctl].revents && !pump_ctl(h, &status, &have_status))
			shim_alive = 0;
		if (i_in >= 0 && pf[i_in].revents)
			cb_exec_pump_stdin_bytes(h);
		if (i_src >= 0 && pf[i_src].revents)
			cb_exec_pump_stdin_src(h);
	}
	/* Both flags are set by other threads (kill, the output callback's stop): atomics. */
	int sigkill_before_exit = __atomic_load_n(&h->sigkill_sent, __ATOMIC_ACQUIRE);
	if (!ended)
		ended = cb_exec_now();
	if (src >= 0 && src_flags >= 0)
		fcntl(src, F_SETFL, src_flags); /* it may be the caller's terminal */
	int oom = h->cg && cb_cgroup_oom_killed(h->cg), shim_status = 0;
	/* A command that ended by itself may leave background jobs to the keep set; otherwise
	 * whatever is left (background jobs, a stuck tree) goes now. Then reap the shim. */
	if (!(h->keep_set && have_status && shim_alive && !rc && !h->setup_error[0] &&
	      !res->timed_out && !sigkill_before_exit &&
	      !__atomic_load_n(&h->killed, __ATOMIC_ACQUIRE) && h->total <= h->limit &&
	      detach(h) == 0)) {
		cb_exec_send_kill(h, SIGKILL);
		pthread_mutex_lock(&h->ctl_lock);
		cb_exec_close_fd(&h->ctl);
		pthread_mutex_unlock(&h->ctl_lock);
		pid_t reaped;
		while ((reaped = waitpid(h->shim, &shim_status, 0)) < 0 && errno == EINTR)
			;
		if (reaped < 0 && !have_status && !rc)
			rc = cb_error_set(errno,
					  "exec: the supervisor (pid %d) was reaped elsewhere "
					  "before it reported (a waitpid(-1) in this process?): %s",
					  (int)h->shim, strerror(errno));
	}
	h->shim = 0;

	res->duration = ended - h->t0;
	res->killed = __atomic_load_n(&h->killed, __ATOMIC_ACQUIRE);
	if (!have_status && sigkill_before_exit)
		status = SIGKILL; /* a sandbox's init dies with its namespace, status unsent */
	else if (!have_status)
		status = shim_status;
	if (WIFSIGNALED(status)) {
		res->term_signal = WTERMSIG(status);
		res->exit_code = 128 + res->term_signal;
	} else {
		res->exit_code = WEXITSTATUS(status);
	}
	if (oom) {
		res->oom_killed = 1;
		res->exit_code = 137;
	}
	if (res->timed_out)
		res->exit_code = 124;
	if (h->total > h->limit) {
		res->output_limited = 1;
		cut_stream(&h->out, h->keep);
		cut_stream(&h->err, h->keep);
	}
	for (int i = 0; i < 2; i++) {
		struct stream *s = i ? &h->err : &h->out;
		char *buf = s->buf ? s->buf : malloc(1);
		if (!buf) {
			rc = cb_error_set(ENOMEM, "exec: out of memory");
			break;
		}
		buf[s->len] = 0;
		*(i ? &res->err : &res->out) = buf;
		*(i ? &res->err_len : &res->out_len) = s->len;
		s->buf = NULL;
		s->len = s->cap = 0;
	}
	if (!rc && h->setup_error[0])
		rc = cb_error_set(EIO, "exec: sandbox setup: %s", h->setup_error);
	return rc;
}

void cb_exec_kill(struct cb_exec *h, int sig)
{
	__atomic_store_n(&h->killed, 1, __ATOMIC_RELEASE);
	cb_exec_send_kill(h, sig);
}

pid_t cb_exec_pid(const struct cb_exec *h)
{
	return h->shim;
}

void cb_exec_free(struct cb_exec *h)
{
	if (!h)
		return;
	if (h->shim > 0) {
		cb_exec_send_kill(h, SIGKILL);
		cb_exec_close_fd(&h->ctl);
		while (waitpid(h->shim, NULL, 0) < 0 && errno == EINTR)
			;
	}
	cb_exec_close_fd(&h->ctl);
	if (h->in_w != h->tty_master)
		cb_exec_close_fd(&h->in_w);
	if (h->out.fd != h->tty_master)
		cb_exec_close_fd(&h->out.fd);
	cb_exec_close_fd(&h->tty_master);
	cb_exec_close_fd(&h->err.fd);
	free(h->out.buf);
	free(h->err.buf);
	free(h->cwd);
	free(h->argv_copy);
	cb_cgroup_destroy(h->cg);
	cb_ns_plan_free(h->ns);
	pthread_mutex_destroy(&h->ctl_lock);
	pthread_mutex_destroy(&h->in_lock);
	free(h);
}

int cb_exec_run(const struct cb_exec_spec *spec, struct cb_exec_result *res)
{
	struct cb_exec *h;
	memset(res, 0, sizeof *res);
	int rc = cb_exec_start(spec, NULL, &h);
	if (rc < 0)
		return rc;
	rc = cb_exec_wait(h, res);
	cb_exec_free(h);
	return rc;
}

void cb_exec_result_free(struct cb_exec_result *res)
{
	free(res->out);
	free(res->err);
	res->out = res->err = NULL;
	res->out_len = res->err_len = 0;
}
