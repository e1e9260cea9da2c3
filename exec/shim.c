/* The supervisor side of the runner after clone: the shim (pid 1 of the sandbox, or a child
 * subreaper on the host) starts the command, reports its status, kills and reaps its tree. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Everything here runs in a child cloned from a possibly multi-threaded process: no malloc,
 * no stdio, only syscalls and small string helpers on the stack. */

/* strerror without the allocation glibc may do for an unknown errno */
static const char *errtext(int err)
{
	const char *d = strerrordesc_np(err);
	return d ? d : "unknown error";
}

size_t cb_exec_cat(char *buf, size_t off, size_t cap, const char *s)
{
	while (*s && off + 1 < cap)
		buf[off++] = *s++;
	buf[off] = 0;
	return off;
}

size_t cb_exec_cat_uint(char *buf, size_t off, size_t cap, unsigned long v)
{
	char tmp[24];
	int i = 0;
	do {
		tmp[i++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (i > 0 && off + 1 < cap)
		buf[off++] = tmp[--i];
	buf[off] = 0;
	return off;
}

void cb_exec_child_error(int fd, const char *what, const char *detail, int err)
{
	char msg[512];
	size_t n = 0;
	msg[n++] = CB_MSG_ERROR;
	n = cb_exec_cat(msg, n, sizeof msg, what);
	if (detail) {
		n = cb_exec_cat(msg, n, sizeof msg, " ");
		n = cb_exec_cat(msg, n, sizeof msg, detail);
	}
	if (err) {
		n = cb_exec_cat(msg, n, sizeof msg, ": ");
		n = cb_exec_cat(msg, n, sizeof msg, errtext(err));
	}
	(void)!send(fd, msg, n, MSG_NOSIGNAL);
}

static int command_child_entry(void *arg);

struct spawn_arg {
	const struct cb_exec_plan *p;
	int go_r, go_w;	    /* the command waits for a byte: we have shed our privileges */
	int done_r, done_w; /* closes at the command's exec (or death): our memory is ours again */
};

/* Start the command as posix_spawn does: sharing our memory (no page-table copy of the
 * caller's big address space) on its own stack, with us waiting until it execs or dies. In
 * a sandbox, pid 1 gives up its capabilities before the command runs anything of its own:
 * the command took its copy at clone and waits for that. */
static pid_t spawn_command(const struct cb_exec_plan *p)
{
	size_t size = 256 * 1024;
	int go[2] = {-1, -1}, done[2] = {-1, -1}, err;
	pid_t pid = -1;
	char c;
	char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
	if (stack == MAP_FAILED)
		return -1;
	if (pipe2(go, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) {
		err = errno;
		goto out;
	}
	struct spawn_arg a = {p, go[0], go[1], done[0], done[1]};
#ifdef CB_EXEC_TSAN
	/* A child sharing our memory, thread state included, runs TSan's instrumented code
	 * beside ours and corrupts it (a crash whose report deadlocks): a copy instead. */
	pid = fork();
	if (pid == 0)
		_exit(command_child_entry(&a));
#else
	pid = clone(command_child_entry, stack + size, CLONE_VM | SIGCHLD, &a);
#endif
	err = errno;
	close(go[0]);
	close(done[1]);
	go[0] = done[1] = -1;
	if (pid > 0) {
		if (p->ns)
			cb_ns_shed_privileges();
		(void)!write(go[1], "g", 1);
		while (read(done[0], &c, 1) < 0 && errno == EINTR)
			;
	}
out:
	for (int i = 0; i < 2; i++) {
		if (go[i] >= 0)
			close(go[i]);
		if (done[i] >= 0)
			close(done[i]);
	}
	munmap(stack, size);
	errno = err;
	return pid;
}

static void write_str(int fd, const char *s)
{
	(void)!write(fd, s, strlen(s));
}

/* Look the program up in PATH as a shell would; returns only on failure. */
static void exec_program(const struct cb_exec_plan *p)
{
	const char *prog = p->argv[0];
	int err = ENOENT;
	if (strchr(prog, '/')) {
		execve(prog, p->argv, p->envp);
		err = errno;
	} else {
		const char *dir = p->path;
		int saw_eacces = 0;
		while (dir) {
			const char *end = strchr(dir, ':');
			size_t dl = end ? (size_t)(end - dir) : strlen(dir);
			char full[4096];
			size_t n = 0;
			if (dl + strlen(prog) + 2 < sizeof full) {
				memcpy(full, dir, dl);
				n = dl;
				if (n == 0)
					full[n++] = '.';
				full[n++] = '/';
				full[n] = 0;
				cb_exec_cat(full, n, sizeof full, prog);
				execve(full, p->argv, p->envp);
				if (errno == EACCES)
					saw_eacces = 1;
				else if (errno != ENOENT && errno != ENOTDIR)
					err = errno;
			}
			dir = end ? end + 1 : NULL;
		}
		if (saw_eacces && err == ENOENT)
			err = EACCES;
	}
	char msg[600];
	size_t n = cb_exec_cat(msg, 0, sizeof msg, "cowbox: ");
	n = cb_exec_cat(msg, n, sizeof msg, prog);
	n = cb_exec_cat(msg, n, sizeof msg, err == ENOENT ? ": command not found\n" : ": ");
	if (err != ENOENT) {
		n = cb_exec_cat(msg, n, sizeof msg, errtext(err));
		cb_exec_cat(msg, n, sizeof msg, "\n");
	}
	write_str(2, msg);
	_exit(err == ENOENT ? 127 : 126);
}

static _Noreturn void command_child(const struct cb_exec_plan *p)
{
	sigset_t all;
	setsid();
	if (p->tty >= 0) {
		if (ioctl(p->tty, TIOCSCTTY, 0) < 0) {
			cb_exec_child_error(p->ctl, "set controlling terminal", NULL, errno);
			_exit(126);
		}
		dup2(p->tty, 0);
		dup2(p->tty, 1);
		dup2(p->tty, 2);
	} else {
		/* fd_out/fd_err are never 0-2 (the parent moved them), so order is safe. */
		dup2(p->fd_in, 0);
		dup2(p->fd_out, 1);
		dup2(p->fd_err, 2);
	}
	/* Into the host group before anything can fork: the shim is stopped until we exec, so
	 * no kill can come between. */
	if (p->group >= 0) {
		int fd = openat(p->group, "cgroup.procs", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, "0", 1) != 1) {
			cb_exec_child_error(p->ctl, "join the command's cgroup", NULL, errno);
			_exit(126);
		}
		close(fd);
	}
	/* Only 0-2 reach the program: the rest closes at exec (ctl stays usable until then). */
	syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
	for (int s = 1; s < 65; s++) {
		struct sigaction sa = {.sa_handler = SIG_DFL};
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &sa, NULL);
	}
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	if (p->ns && p->ns->oom_adj[0]) {
		/* init's -1000 is not the command's; raising needs no privilege */
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			write_str(fd, p->ns->oom_adj);
			close(fd);
		}
	}
	/* Raw syscalls: glibc's wrappers would signal threads this copy of the caller's memory
	 * still lists. Before chdir, so that the directory is reached with the user's rights. */
	if (p->ns && p->ns->set_user &&
	    ((p->ns->privileged_parent &&
	      syscall(SYS_setgroups, p->ns->n_groups, p->ns->groups) < 0) ||
	     syscall(SYS_setresgid, p->ns->gid, p->ns->gid, p->ns->gid) < 0 ||
	     syscall(SYS_setresuid, p->ns->uid, p->ns->uid, p->ns->uid) < 0)) {
		cb_exec_child_error(p->ctl, "switch to the user", NULL, errno);
		_exit(126);
	}
	if (p->set_ids && (syscall(SYS_setgroups, p->ids.n_groups, p->ids.groups) < 0 ||
			   syscall(SYS_setresgid, p->ids.gid, p->ids.gid, p->ids.gid) < 0 ||
			   syscall(SYS_setresuid, p->ids.uid, p->ids.uid, p->ids.uid) < 0)) {
		cb_exec_child_error(p->ctl, "switch to the user", NULL, errno);
		_exit(126);
	}
	if (p->cwd && chdir(p->cwd) < 0) {
		cb_exec_child_error(p->ctl, "chdir", p->cwd, errno);
		_exit(126);
	}
	if (p->ns && cb_ns_harden(p->ns, p->ctl) < 0)
		_exit(126);
	exec_program(p);
	_exit(127);
}

static int command_child_entry(void *arg)
{
	const struct spawn_arg *a = arg;
	char c = 0;
	ssize_t n;
	close(a->go_w);
	close(a->done_r);
	while ((n = read(a->go_r, &c, 1)) < 0 && errno == EINTR)
		;
	if (n != 1)
		_exit(126); /* the supervisor is gone */
	close(a->go_r);
	command_child(a->p);
}

static void signal_tree(const struct cb_exec_plan *p, int sig)
{
	if (p->ns)
		kill(-1, sig); /* pid 1 of the namespace: every other process in it */
	else
		cb_exec_tree_signal(p->group, sig);
}

static void send_status(int ctl, int status)
{
	char msg[1 + sizeof(int)];
	msg[0] = CB_MSG_STATUS;
	memcpy(msg + 1, &status, sizeof status);
	(void)!send(ctl, msg, sizeof msg, MSG_NOSIGNAL);
}

/* Reap what has ended; returns 1 when no child is left. */
static int reap(pid_t cmd, int ctl, int *cmd_done)
{
	for (;;) {
		int st;
		pid_t r = waitpid(-1, &st, WNOHANG);
		if (r == 0)
			return 0;
		if (r < 0)
			return errno == ECHILD;
		if (r == cmd && !*cmd_done) {
			*cmd_done = 1;
			send_status(ctl, st);
		}
	}
}

/* Kill everything and wait until no child is left (host: rounds of walking /proc). */
static _Noreturn void finish(const struct cb_exec_plan *p, pid_t cmd, int *cmd_done)
{
	if (p->ns)
		_exit(0); /* the kernel kills the rest of the pid namespace with us */
	/* Bounded: a process stuck in the kernel (a hung FUSE read) must not hang the caller;
	 * after 10 s what is left goes to our parent to reap. */
	for (int round = 0; round < 10000; round++) {
		cb_exec_tree_signal(p->group, SIGKILL);
		if (reap(cmd, p->ctl, cmd_done))
			_exit(0);
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	_exit(0);
}

/* Close every fd of the caller but ours: other commands' pipes must not stay open here. */
static void close_foreign_fds(const struct cb_exec_plan *p)
{
	int keep[48], n = 0, maxfd = 2;
	keep[n++] = p->ctl;
	keep[n++] = p->fd_in;
	keep[n++] = p->fd_out;
	keep[n++] = p->fd_err;
	keep[n++] = p->tty;
	keep[n++] = p->group;
	for (size_t i = 0; p->ns && i < p->ns->n_entries && n < 48; i++)
		keep[n++] = p->ns->entries[i].tree;
	for (int i = 0; i < n; i++)
		if (keep[i] > maxfd)
			maxfd = keep[i];
	for (int fd = 3; fd <= maxfd; fd++) {
		int k = 0;
		for (int i = 0; i < n; i++)
			k |= keep[i] == fd;
		if (!k)
			close(fd);
	}
	syscall(SYS_close_range, (unsigned)maxfd + 1, ~0U, 0U);
}

/* A pty in the sandbox's own devpts (so ttyname and job control work inside); its master
 * goes to the caller over ctl. Returns the slave fd, or -1 having reported why. */
static int sandbox_pty(const struct cb_exec_plan *p)
{
	int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC), unlock = 0, n = -1;
	if (master < 0 || ioctl(master, TIOCSPTLCK, &unlock) < 0 ||
	    ioctl(master, TIOCGPTN, &n) < 0) {
		cb_exec_child_error(p->ctl, "open a pseudo-terminal in the sandbox", NULL, errno);
		return -1;
	}
	char path[64];
	size_t len = cb_exec_cat(path, 0, sizeof path, "/dev/pts/");
	cb_exec_cat_uint(path, len, sizeof path, (unsigned long)n);
	int slave = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (slave < 0) {
		cb_exec_child_error(p->ctl, "open", path, errno);
		close(master);
		return -1;
	}
	struct winsize ws = {.ws_row = p->rows ? p->rows : 24, .ws_col = p->cols ? p->cols : 80};
	ioctl(master, TIOCSWINSZ, &ws);
	char tag = CB_MSG_TTY;
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = &tag, .iov_len = 1};
	struct msghdr msg = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &master, sizeof master);
	if (sendmsg(p->ctl, &msg, MSG_NOSIGNAL) < 0) {
		close(master);
		close(slave);
		return -1;
	}
	close(master);
	return slave;
}

/* The sandbox's pid 1 before the command starts: nothing of the host in its command line
 * (the caller's, which may name the workspace's host path; the runner gave the command its
 * own copy of argv) and not dumpable (its memory and environ are the caller's). */
static void shim_hide(const struct cb_exec_plan *p)
{
	if (p->ns->arg_start && p->ns->arg_len > 0) {
		static const char name[] = "cowbox-init";
		size_t n = sizeof name < p->ns->arg_len ? sizeof name : p->ns->arg_len;
		memset(p->ns->arg_start, 0, p->ns->arg_len);
		memcpy(p->ns->arg_start, name, n - 1);
	}
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

/* Background jobs the caller let go of may still write to the command's pipes: read and
 * drop it, so that they neither block on a full pipe nor die of SIGPIPE. 0 at end. */
static ssize_t drain_some(int fd)
{
	char buf[4096];
	ssize_t n;

	while ((n = read(fd, buf, sizeof buf)) < 0 && errno == EINTR)
		;
	return n < 0 && errno == EAGAIN ? 1 : n;
}

/* One datagram from the caller; a CB_MSG_DETACH's fds (at most two) go to drain. */
static ssize_t recv_ctl(int ctl, char *msg, size_t size, int drain[2])
{
	union {
		char buf[CMSG_SPACE(2 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = msg, .iov_len = size};
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	ssize_t n = recvmsg(ctl, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
			if (msg[0] == CB_MSG_DETACH && i < 2 && drain[i] < 0) {
				fcntl(fd, F_SETFL, O_NONBLOCK);
				drain[i] = fd;
			} else {
				close(fd);
			}
		}
	}
	return n;
}

void cb_exec_shim_main(const struct cb_exec_plan *given)
{
	struct cb_exec_plan plan = *given, *p = &plan;
	close_foreign_fds(p);
	/* Nor should the supervisor hold the caller's stdio (a terminal, a log, a pipe someone
	 * waits on): the command gets its own 0-2 from the plan, which are all above 2. */
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (nul >= 0) {
		dup2(nul, 0);
		dup2(nul, 1);
		dup2(nul, 2);
		if (nul > 2)
			close(nul);
	}
	/* The raw call: this process is a clone of a threaded caller (the daemon), and a
	 * sanitizer's prctl(PR_SET_NAME) takes its thread registry's lock, which another thread
	 * of the caller may have held at the clone: the init then waited forever, ignoring
	 * SIGTERM, outliving its daemon and its home (found left after `make check`). */
	syscall(SYS_prctl, PR_SET_NAME, (unsigned long)"cowbox-init", 0UL, 0UL, 0UL);
	if (p->wait_go) {
		char c = 0;
		if (recv(p->ctl, &c, 1, 0) != 1 || c != CB_MSG_GO)
			_exit(1);
	}
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	if (p->ns) {
		if (cb_ns_setup_root(p->ns, p->ctl) < 0)
			_exit(1);
		if (p->sandbox_tty && (p->tty = sandbox_pty(p)) < 0)
			_exit(1);
	} else {
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	}
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		cb_exec_child_error(p->ctl, "signalfd", NULL, errno);
		_exit(1);
	}
	if (p->ns) {
		shim_hide(p);
		if (cb_ns_drop_privileges(p->ns, p->ctl) < 0)
			_exit(1);
	}
	pid_t cmd = spawn_command(p);
	if (cmd < 0) {
		cb_exec_child_error(p->ctl, "start the command", NULL, errno);
		_exit(1);
	}
	/* the binds are attached by now, and the command must not get their fds */
	for (size_t i = 0; p->ns && i < p->ns->n_entries; i++)
		if (p->ns->entries[i].tree >= 0)
			close(p->ns->entries[i].tree);
	if (p->tty >= 0)
		close(p->tty);
	else {
		close(p->fd_in);
		close(p->fd_out);
		close(p->fd_err);
	}
	int cmd_done = 0, drain[2] = {-1, -1};
	for (;;) {
		struct pollfd pf[4] = {{.fd = p->ctl, .events = POLLIN},
				       {.fd = sfd, .events = POLLIN},
				       {.fd = drain[0], .events = POLLIN},
				       {.fd = drain[1], .events = POLLIN}};
		if (poll(pf, 4, -1) < 0 && errno != EINTR)
			finish(p, cmd, &cmd_done);
		if (pf[1].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0)
				;
			if (reap(cmd, p->ctl, &cmd_done) && cmd_done)
				_exit(0);
		}
		for (int i = 0; i < 2; i++)
			if (drain[i] >= 0 && pf[2 + i].revents && drain_some(drain[i]) <= 0) {
				close(drain[i]);
				drain[i] = -1;
			}
		if (pf[0].revents) {
			char msg[16];
			ssize_t n = recv_ctl(p->ctl, msg, sizeof msg, drain);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
				finish(p, cmd, &cmd_done); /* the caller is gone: so are we */
			if (n >= (ssize_t)(1 + sizeof(int)) && msg[0] == CB_MSG_KILL) {
				int sig;
				memcpy(&sig, msg + 1, sizeof sig);
				if (sig == SIGKILL)
					finish(p, cmd, &cmd_done);
				signal_tree(p, sig);
			}
		}
	}
}
