/* Killing a host command's whole tree (no pid namespace holds it): its cgroup frozen or
 * killed at once, or without one, the tree stopped top-down by /proc walks before the signal. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* Everything here runs in the shim, a child cloned from a possibly multi-threaded process:
 * no malloc, no stdio. */

/* Host tree walk: every descendant of this process, found through the children lists in
 * /proc (the shim is single-threaded, so its own list is complete), signalled with sig as
 * found (0: none) and listed in out (up to cap). Returns how many were found. Bounded by
 * the array: a later round catches the rest. */
static int walk_descendants(int sig, pid_t *out, size_t cap)
{
	pid_t queue[1024];
	size_t head = 0, tail = 0;
	int count = 0;
	queue[tail++] = getpid();
	while (head < tail) {
		pid_t pid = queue[head++];
		char dir[64];
		size_t n = cb_exec_cat(dir, 0, sizeof dir, "/proc/");
		n = cb_exec_cat_uint(dir, n, sizeof dir, (unsigned long)pid);
		cb_exec_cat(dir, n, sizeof dir, "/task");
		int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			continue;
		char dents[4096];
		long got;
		while ((got = syscall(SYS_getdents64, dfd, dents, sizeof dents)) > 0) {
			for (long off = 0; off < got;) {
				struct {
					unsigned long long ino;
					long long off;
					unsigned short reclen;
					unsigned char type;
					char name[];
				} *d = (void *)(dents + off);
				off += d->reclen;
				if (d->name[0] == '.')
					continue;
				char path[128], buf[4096];
				size_t m = cb_exec_cat(path, 0, sizeof path, dir);
				m = cb_exec_cat(path, m, sizeof path, "/");
				m = cb_exec_cat(path, m, sizeof path, d->name);
				cb_exec_cat(path, m, sizeof path, "/children");
				int cfd = open(path, O_RDONLY | O_CLOEXEC);
				if (cfd < 0)
					continue;
				ssize_t r = read(cfd, buf, sizeof buf - 1);
				close(cfd);
				if (r <= 0)
					continue;
				buf[r] = 0;
				for (char *s = buf; *s;) {
					unsigned long v = 0;
					while (*s == ' ' || *s == '\n')
						s++;
					if (!*s)
						break;
					while (*s >= '0' && *s <= '9')
						v = v * 10 + (unsigned long)(*s++ - '0');
					if (v && tail < sizeof queue / sizeof queue[0]) {
						queue[tail++] = (pid_t)v;
						if (sig)
							kill((pid_t)v, sig);
						if ((size_t)count < cap)
							out[count] = (pid_t)v;
						count++;
					}
					while (*s && *s != ' ' && *s != '\n')
						s++;
				}
			}
		}
		close(dfd);
	}
	return count;
}

static int group_write(int group, const char *file, const char *value)
{
	int fd = openat(group, file, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, value, strlen(value));
	close(fd);
	return n < 0 ? -1 : 0;
}

/* Read at most size-1 bytes of a small kernel file (relative to dirfd) into buf and end it
 * with a NUL; the byte count, or -1 (0 for an empty file). No allocation: callers may be
 * between fork and exec. */
static ssize_t read_small(int dirfd, const char *path, char *buf, size_t size)
{
	int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size - 1);
	close(fd);
	if (n >= 0)
		buf[n] = 0;
	return n;
}

/* 1 once every process of the group is frozen ("frozen 1" in cgroup.events). */
static int group_frozen(int group)
{
	char buf[256];
	if (read_small(group, "cgroup.events", buf, sizeof buf) <= 0)
		return 0;
	const char *f = strstr(buf, "frozen ");
	return f && f[7] == '1';
}

/* Send sig to every process listed in the group's cgroup.procs. */
static void group_signal_members(int group, int sig)
{
	int fd = openat(group, "cgroup.procs", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	char buf[4096];
	unsigned long v = 0;
	int digits = 0;
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] >= '0' && buf[i] <= '9') {
				v = v * 10 + (unsigned long)(buf[i] - '0');
				digits = 1;
			} else {
				if (digits && v)
					kill((pid_t)v, sig);
				v = 0;
				digits = 0;
			}
		}
	if (digits && v)
		kill((pid_t)v, sig);
	close(fd);
}

/* The whole host group at once: SIGKILL through cgroup.kill; another signal by freezing the
 * group (nobody forks or exits meanwhile, so the member list is complete), signalling each
 * member, thawing. A member stuck in the kernel may keep the freeze from completing: after
 * 100 ms we signal what is listed anyway. */
static void group_signal(int group, int sig)
{
	if (sig == SIGKILL && group_write(group, "cgroup.kill", "1") == 0)
		return;
	int frozen = group_write(group, "cgroup.freeze", "1") == 0;
	for (int i = 0; frozen && i < 1000 && !group_frozen(group); i++) {
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	group_signal_members(group, sig);
	if (frozen)
		group_write(group, "cgroup.freeze", "0");
}

static void sleep_us(long us)
{
	struct timespec ts = {0, us * 1000};
	nanosleep(&ts, NULL);
}

/* 1 once pid is stopped, a zombie or gone: it can no longer fork. */
static int cannot_fork(pid_t pid)
{
	char path[64], buf[512];
	size_t n = cb_exec_cat(path, 0, sizeof path, "/proc/");
	n = cb_exec_cat_uint(path, n, sizeof path, (unsigned long)pid);
	cb_exec_cat(path, n, sizeof path, "/stat");
	if (read_small(AT_FDCWD, path, buf, sizeof buf) <= 0)
		return 1;
	const char *paren = strrchr(buf, ')');
	char state = paren && paren[1] ? paren[2] : 'T';
	return state == 'T' || state == 't' || state == 'Z' || state == 'X';
}

static int listed(const pid_t *pids, int n, pid_t pid)
{
	for (int i = 0; i < n; i++)
		if (pids[i] == pid)
			return 1;
	return 0;
}

/* Without a cgroup: SIGSTOP every descendant, wait until each has stopped, walk again for
 * what was reparented or forked meanwhile, until a walk finds nobody new; then the stopped
 * tree cannot change, and sig goes to all of it before SIGCONT. A parent that dies of the
 * signal no longer hides its children from the walk. Bounded (a process stuck in the kernel
 * never stops): after ~50 ms, or past the array, what is known gets the signal anyway. */
static void stopped_tree_signal(int sig)
{
	pid_t stopped[1024], seen[1024];
	int n = 0;
	for (int round = 0; round < 50; round++) {
		int m = walk_descendants(0, seen, sizeof seen / sizeof seen[0]), fresh = 0;
		if (m > (int)(sizeof seen / sizeof seen[0]))
			m = (int)(sizeof seen / sizeof seen[0]);
		for (int i = 0; i < m; i++)
			if (!listed(stopped, n, seen[i]) &&
			    n < (int)(sizeof stopped / sizeof stopped[0])) {
				kill(seen[i], SIGSTOP);
				stopped[n++] = seen[i];
				fresh++;
			}
		if (!fresh)
			break;
		for (int i = 0, waited = 0; i < n && waited < 1000; i++)
			while (!cannot_fork(stopped[i]) && waited++ < 1000)
				sleep_us(50);
	}
	for (int i = 0; i < n; i++)
		kill(stopped[i], sig);
	for (int i = 0; i < n; i++)
		kill(stopped[i], SIGCONT);
}

void cb_exec_tree_signal(int group, int sig)
{
	int stop_signal =
	    sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU || sig == SIGCONT;
	if (group >= 0) {
		group_signal(group, sig);
		walk_descendants(sig, NULL, 0); /* outside the group: nobody, unless moved out */
	} else if (sig == SIGKILL || stop_signal) {
		walk_descendants(sig, NULL, 0); /* SIGKILL: the caller repeats until none is left */
	} else {
		stopped_tree_signal(sig);
	}
}
