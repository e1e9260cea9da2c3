/* `cowbox exec REF` for a backend whose commands only its daemon can run (docker: the daemon
 * owns the container): the API's streamed exec, fed from stdin, its output passed on. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cmd_common.h"
#include "exec.h"

/* Output as it comes: to fds 1 and 2, or kept for --json. */
struct daemon_out {
	struct cli_phase_watch *watch; /* the boot's phases, until the first output */
	int json;
	char *buf[2];
	size_t len[2];
	int failed;
};

static void daemon_output(int stream, const void *data, size_t len, void *arg)
{
	struct daemon_out *d = arg;
	int s = stream == 2;

	cli_phase_watch_stop(d->watch);
	d->watch = NULL;
	if (!d->json) {
		for (size_t off = 0; off < len;) {
			ssize_t n = write(s ? 2 : 1, (const char *)data + off, len - off);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return; /* a closed stdout here must not stop the command */
			off += (size_t)n;
		}
		return;
	}
	char *grown = realloc(d->buf[s], d->len[s] + len + 1);

	if (!grown) {
		d->failed = 1;
		return;
	}
	memcpy(grown + d->len[s], data, len);
	d->len[s] += len;
	grown[d->len[s]] = 0;
	d->buf[s] = grown;
}

/* The signals cowbox gets go to the command, through the main loop (cb_box_proc is used
 * from one thread). */
struct daemon_sig {
	pthread_t thread;
	sigset_t set;
	atomic_int pending;
};

static void *daemon_sig_loop(void *arg)
{
	struct daemon_sig *s = arg;

	for (;;) {
		int sig;

		if (sigwait(&s->set, &sig))
			continue;
		if (sig == SIGUSR1)
			return NULL;
		if (sig != SIGWINCH)
			atomic_store(&s->pending, sig);
	}
}

int cli_exec_daemon(const struct cli_exec_opts *o, struct cb_exec_result *res)
{
	/* as in-process: the command's background jobs end with it (cmd_exec.c, run_ref) */
	struct cb_box_run_options ro = {
	    .env = o->env, .cwd = o->cwd, .user = o->user, .background = "kill"};
	struct cb_box_result br = {0};
	struct daemon_out out = {.json = o->json};
	struct daemon_sig sig = {0};
	struct cb_box_proc *p = NULL;
	struct cb_box *box = NULL;
	int rc, thread = 0, in_open = 1;
	char buf[65536];

	memset(res, 0, sizeof(*res));
	if (o->set & CLI_SET_TIMEOUT)
		ro.timeout = o->timeout; /* 0: the workspace's option (the API has no "none") */
	if ((rc = cb_box_open(o->ref, &box)) < 0)
		goto out;
	if ((rc = cb_box_exec(box, o->shell ? NULL : (const char *const *)o->cmd, o->shell, &ro,
			      &p)) < 0)
		goto out;
	/* the first command boots the backend (the vm: minutes under TCG): how far it is, on a
	 * terminal, until the command's first output */
	out.watch = cli_phase_watch_start("exec", cb_box_ref(box));
	cli_exec_signals(&sig.set);
	thread = pthread_create(&sig.thread, NULL, daemon_sig_loop, &sig) == 0;
	for (;;) {
		struct pollfd pfd = {.fd = 0, .events = POLLIN};
		int s = atomic_exchange(&sig.pending, 0);

		if (s && (rc = cb_box_proc_kill(p, s)) < 0)
			goto out;
		if (in_open && poll(&pfd, 1, 0) > 0) {
			ssize_t n = read(0, buf, sizeof buf);

			if (n > 0) {
				rc = cb_box_proc_write(p, buf, (size_t)n);
			} else if (n == 0 || errno != EINTR) {
				in_open = 0;
				rc = cb_box_proc_close_stdin(p);
			}
			if (rc < 0)
				goto out;
		}
		if ((rc = cb_box_proc_poll(p, in_open ? 20 : 200, daemon_output, &out, &br)) != 0)
			break;
	}
	if (rc < 0)
		goto out;
	rc = 0;
	if (out.failed) {
		rc = cb_error_set(ENOMEM, "the command's output: out of memory");
		goto out;
	}
	res->exit_code = br.exit_code;
	res->term_signal = br.signal;
	res->timed_out = br.timed_out;
	res->output_limited = br.output_limited;
	res->killed = br.killed;
	res->oom_killed = br.oom_killed;
	res->duration = br.duration;
	res->out = out.buf[0];
	res->out_len = out.len[0];
	res->err = out.buf[1];
	res->err_len = out.len[1];
	out.buf[0] = out.buf[1] = NULL;
out:
	cli_phase_watch_stop(out.watch);
	if (thread) {
		pthread_kill(sig.thread, SIGUSR1);
		pthread_join(sig.thread, NULL);
	}
	cb_box_proc_free(p);
	cb_box_result_free(&br);
	cb_box_detach(box);
	free(out.buf[0]);
	free(out.buf[1]);
	return rc;
}
