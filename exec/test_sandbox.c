/* Unit tests of the runner with the namespace sandbox: the command's view (pid 1, root,
 * hostname, env), timeouts, kill, a pty from the sandbox's devpts, and limit cgroups cleaned up. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/sandbox.h"

static char *const base_env[] = {"PATH=/usr/bin:/bin", NULL};
static char workspace[] = "/tmp/cb-sandbox-test-XXXXXX";

static void setup(void)
{
	if (geteuid() != 0)
		cr_skip_test("the sandbox tests run as root");
	cr_assert(mkdtemp(workspace) != NULL);
}

static void teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", workspace);
	(void)!system(cmd);
}

TestSuite(sandbox, .init = setup, .fini = teardown);

static struct cb_exec_result run_in(struct cb_sandbox *sb, const char *script, double timeout)
{
	struct cb_exec_spec spec = {
	    .shell = script, .env = base_env, .timeout = timeout, .grace = 0.5, .sandbox = sb};
	struct cb_exec_result res;
	int rc = cb_exec_run(&spec, &res);
	cr_assert_eq(rc, 0, "cb_exec_run: %s", cb_error_message());
	return res;
}

Test(sandbox, the_commands_view)
{
	struct cb_sandbox sb = {.workspace = workspace, .hostname = "unit-ws"};
	struct cb_exec_result r =
	    run_in(&sb,
		   "echo $$; hostname; pwd; env | sort | tr '\\n' ' '; echo;"
		   " ls /proc | grep '^[0-9]' | sort -n | head -2 | tr '\\n' ' '; echo;"
		   " cat /proc/1/comm",
		   0);
	cr_expect_eq(r.exit_code, 0, "err: %s", r.err);
	cr_expect_str_eq(r.out, "2\nunit-ws\n/workspace\nPATH=/usr/bin:/bin PWD=/workspace \n"
				"1 2 \ncowbox-init\n");
	cb_exec_result_free(&r);
}

Test(sandbox, pid1_sheds_capabilities_and_host_command_line)
{
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_result r = run_in(&sb,
					 "grep -E '^Cap(Prm|Eff|Bnd)' /proc/1/status | cut -f2;"
					 " tr '\\0' '\\n' < /proc/1/cmdline | grep .",
					 0);
	cr_expect_eq(r.exit_code, 0, "err: %s", r.err);
	cr_expect_str_eq(r.out, "0000000000000000\n0000000000000000\n0000000000000000\n"
				"cowbox-init\n");
	cb_exec_result_free(&r);
}

Test(sandbox, kernel_state_is_masked)
{
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_result r = run_in(&sb,
					 "cat /proc/slabinfo /proc/kpageflags /proc/timer_list"
					 " /proc/sched_debug 2>/dev/null | wc -c;"
					 " echo x > /proc/timer_list && echo WROTE",
					 0);
	cr_expect_str_eq(r.out, "0\n", "err: %s", r.err);
	cb_exec_result_free(&r);
}

Test(sandbox, exit_codes_and_timeout)
{
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_result r = run_in(&sb, "exit 7", 0);
	cr_expect_eq(r.exit_code, 7);
	cb_exec_result_free(&r);
	r = run_in(&sb, "kill -SEGV $$", 0);
	cr_expect_eq(r.exit_code, 128 + SIGSEGV);
	cb_exec_result_free(&r);
	r = run_in(&sb, "echo so-far; setsid sh -c 'trap \"\" TERM; sleep 100' & sleep 100", 0.3);
	cr_expect_eq(r.exit_code, 124);
	cr_expect(r.timed_out);
	cr_expect_str_eq(r.out, "so-far\n");
	cr_expect(r.duration < 2.0, "duration %.2f", r.duration);
	cb_exec_result_free(&r);
}

Test(sandbox, missing_program)
{
	char *argv[] = {"definitely-not-installed", NULL};
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_spec spec = {.argv = argv, .env = base_env, .sandbox = &sb};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0, "%s", cb_error_message());
	cr_expect_eq(r.exit_code, 127);
	cr_expect(strstr(r.err, "definitely-not-installed") != NULL, "err: %s", r.err);
	cb_exec_result_free(&r);
}

static void *kill_soon(void *arg)
{
	struct timespec ts = {0, 200000000};
	nanosleep(&ts, NULL);
	cb_exec_kill(arg, SIGKILL);
	return NULL;
}

Test(sandbox, kill_from_another_thread)
{
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_spec spec = {
	    .shell = "sleep 100 & sleep 100", .env = base_env, .sandbox = &sb};
	struct cb_exec *h;
	cr_assert_eq(cb_exec_start(&spec, NULL, &h), 0, "%s", cb_error_message());
	pthread_t t;
	pthread_create(&t, NULL, kill_soon, h);
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_wait(h, &r), 0);
	pthread_join(t, NULL);
	cr_expect(r.killed);
	cr_expect_eq(r.exit_code, 128 + SIGKILL);
	cb_exec_result_free(&r);
	cb_exec_free(h);
}

Test(sandbox, pty_from_the_sandbox_devpts)
{
	struct cb_sandbox sb = {.workspace = workspace};
	struct cb_exec_spec spec = {.shell = "tty; stty size",
				    .env = base_env,
				    .tty = 1,
				    .tty_rows = 40,
				    .tty_cols = 120,
				    .sandbox = &sb};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0, "%s", cb_error_message());
	cr_expect_eq(r.exit_code, 0, "out: %s", r.out);
	cr_expect(strstr(r.out, "/dev/pts/0") != NULL, "out: %s", r.out);
	cr_expect(strstr(r.out, "40 120") != NULL, "out: %s", r.out);
	cb_exec_result_free(&r);
}

/* Count our own per-command cgroups under a hierarchy's cowbox/ directories. */
static int own_cgroups(void)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd,
		 "find /sys/fs/cgroup/pids /sys/fs/cgroup/memory /sys/fs/cgroup/cpu -type d "
		 "-path '*/cowbox/%d-*' 2>/dev/null | wc -l",
		 (int)getpid());
	FILE *f = popen(cmd, "r");
	int n = -1;
	cr_assert(f);
	cr_assert_eq(fscanf(f, "%d", &n), 1);
	pclose(f);
	return n;
}

Test(sandbox, limits_apply_and_their_cgroups_go_away)
{
	struct cb_sandbox sb = {.workspace = workspace, .pids = 20, .memory_mb = 256, .cpus = 1};
	struct cb_exec_result r =
	    run_in(&sb, "cat /sys/fs/cgroup/pids.max 2>/dev/null; ulimit -n", 0);
	cr_expect_eq(r.exit_code, 0);
	cr_expect_str_eq(r.out, "1024\n"); /* no /sys inside; the fd limit is the default */
	cb_exec_result_free(&r);
	cr_expect_eq(own_cgroups(), 0);
	sb.nofile = 77;
	r = run_in(&sb, "ulimit -n", 0);
	cr_expect_str_eq(r.out, "77\n");
	cb_exec_result_free(&r);
}

/* The v1 pids group a command of ours with counter ID would get, as a shell path. */
static void pids_group(char *out, size_t cap, unsigned id)
{
	char cmd[256];
	snprintf(cmd, sizeof cmd,
		 "printf '/sys/fs/cgroup/pids%%s/cowbox/%d-%u' "
		 "\"$(awk -F: '$2==\"pids\"{print $3}' /proc/self/cgroup | sed 's|^/$||')\"",
		 (int)getpid(), id);
	FILE *f = popen(cmd, "r");
	cr_assert(f);
	cr_assert(fgets(out, (int)cap, f) != NULL);
	pclose(f);
}

/* A dead process with our pid may have left its groups behind (kill -9, or members slower to
 * leave than the destroy waits): an empty one is reclaimed, a populated one is passed over. */
Test(sandbox, a_recycled_pids_leftover_groups_do_not_fail_a_command)
{
	char stale[512], busy[512], procs[600];
	pids_group(stale, sizeof stale, 1);
	pids_group(busy, sizeof busy, 2);
	if (access("/sys/fs/cgroup/pids/cgroup.procs", F_OK) < 0)
		cr_skip_test("no v1 pids hierarchy here");
	char parent[512];
	snprintf(parent, sizeof parent, "%s", stale);
	*strrchr(parent, '/') = 0;
	mkdir(parent, 0755);
	cr_assert(mkdir(stale, 0755) == 0 || errno == EEXIST, "%s: %s", stale, strerror(errno));
	cr_assert(mkdir(busy, 0755) == 0 || errno == EEXIST, "%s: %s", busy, strerror(errno));
	pid_t squatter = fork();
	cr_assert(squatter >= 0);
	if (squatter == 0) {
		/* holds no pipe of criterion's and dies with the test, whatever its outcome */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		closefrom(0);
		pause();
		_exit(0);
	}
	snprintf(procs, sizeof procs, "%s/cgroup.procs", busy);
	FILE *f = fopen(procs, "w");
	cr_assert(f, "%s: %s", procs, strerror(errno));
	fprintf(f, "%d\n", (int)squatter);
	cr_assert_eq(fclose(f), 0);

	struct cb_sandbox sb = {.workspace = workspace, .pids = 20};
	for (int i = 0; i < 2; i++) {
		struct cb_exec_result r = run_in(&sb, "echo ok", 0);
		cr_expect_eq(r.exit_code, 0);
		cr_expect_str_eq(r.out, "ok\n");
		cb_exec_result_free(&r);
	}
	kill(squatter, SIGKILL);
	waitpid(squatter, NULL, 0);
	for (int i = 0; i < 200 && rmdir(busy) < 0 && errno == EBUSY; i++)
		usleep(5000);
	cr_expect_eq(own_cgroups(), 0);
}

Test(sandbox, bad_workspace_and_image_are_named)
{
	struct cb_sandbox sb = {.workspace = "/nonexistent/cowbox-ws"};
	struct cb_exec_spec spec = {.shell = "true", .env = base_env, .sandbox = &sb};
	struct cb_exec_result r;
	cr_expect_eq(cb_exec_run(&spec, &r), -ENOENT);
	cr_expect(strstr(cb_error_message(), "/nonexistent/cowbox-ws") != NULL, "%s",
		  cb_error_message());
	sb.workspace = workspace;
	sb.image = workspace;
	cr_expect_lt(cb_exec_run(&spec, &r), 0);
	cr_expect(strstr(cb_error_message(), "no usr/") != NULL, "%s", cb_error_message());
}

static void *make_netns(void *arg)
{
	if (unshare(CLONE_NEWNET) == 0)
		*(int *)arg = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	return NULL;
}

Test(sandbox, join_a_kept_network_namespace)
{
	int netns = -1;
	pthread_t t;
	pthread_create(&t, NULL, make_netns, &netns);
	pthread_join(t, NULL);
	cr_assert(netns >= 0, "could not make a network namespace");
	struct stat st;
	cr_assert_eq(fstat(netns, &st), 0);
	char before[64], after[64], want[64];
	ssize_t n = readlink("/proc/thread-self/ns/net", before, sizeof before - 1);
	cr_assert(n > 0);
	before[n] = 0;
	struct cb_sandbox sb = {.workspace = workspace, .net = CB_NET_JOIN, .netns_fd = netns};
	snprintf(want, sizeof want, "net:[%lu]\n", (unsigned long)st.st_ino);
	for (int i = 0; i < 2; i++) { /* both commands land in the same namespace */
		struct cb_exec_result r = run_in(&sb, "readlink /proc/self/ns/net", 0);
		cr_expect_str_eq(r.out, want);
		cb_exec_result_free(&r);
	}
	n = readlink("/proc/thread-self/ns/net", after, sizeof after - 1);
	cr_assert(n > 0);
	after[n] = 0;
	cr_expect_str_eq(after, before, "the calling thread must be back in its own namespace");
	sb.userns = 1;		/* the user-namespace path joins from the parent's side */
	chmod(workspace, 0755); /* its root is host uid 65534 now */
	struct cb_exec_result r = run_in(&sb, "readlink /proc/self/ns/net", 0);
	cr_expect_str_eq(r.out, want);
	cb_exec_result_free(&r);
	close(netns);
}

static void *serve_once(void *arg)
{
	int fd = accept(*(int *)arg, NULL, NULL);
	if (fd >= 0) {
		(void)!write(fd, "PROXY\n", 6);
		close(fd);
	}
	return NULL;
}

Test(sandbox, extra_bind_bridges_a_unix_socket)
{
	char dir[] = "/tmp/cb-proxy-XXXXXX", path[64];
	cr_assert(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/proxy.sock", dir);
	int srv = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
	cr_assert_eq(bind(srv, (struct sockaddr *)&addr, sizeof addr), 0);
	cr_assert_eq(listen(srv, 1), 0);
	chmod(path, 0666); /* the sandbox's root is no host root: the socket must let it in */
	pthread_t t;
	pthread_create(&t, NULL, serve_once, &srv);
	struct cb_sandbox_bind binds[] = {{.src = path, .dst = "/run/cowbox/proxy.sock"}};
	struct cb_sandbox sb = {.workspace = workspace, .binds = binds, .n_binds = 1};
	struct cb_exec_result r =
	    run_in(&sb,
		   "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); "
		   "s.connect(\"/run/cowbox/proxy.sock\"); print(s.recv(10).decode(), end=\"\")'",
		   10);
	cr_expect_str_eq(r.out, "PROXY\n", "err: %s", r.err);
	cb_exec_result_free(&r);
	pthread_join(t, NULL);
	close(srv);
	unlink(path);
	rmdir(dir);
	/* targets the sandbox builds itself are refused, naming the target */
	struct cb_sandbox_bind bad[] = {{.src = dir, .dst = "/etc/evil"}};
	sb.binds = bad;
	struct cb_exec_spec spec = {.shell = "true", .env = base_env, .sandbox = &sb};
	cr_expect_eq(cb_exec_run(&spec, &r), -ENOENT); /* the source is gone by now */
	mkdir(dir, 0700);
	cr_expect_eq(cb_exec_run(&spec, &r), -EINVAL);
	cr_expect(strstr(cb_error_message(), "/etc/evil") != NULL, "%s", cb_error_message());
	rmdir(dir);
}

static int count_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	cr_assert(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

struct worker {
	int id, ok;
};

/* Each thread runs commands, sandboxed and not, while the others do the same: no output
 * crosses over and no thread's pipes stay open in another's supervisor. */
static void *worker_run(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < 6; i++) {
		char script[64], want[64];
		struct cb_sandbox sb = {.workspace = workspace};
		snprintf(script, sizeof script, "echo w%d-%d; sleep 0.0%d", w->id, i, i);
		snprintf(want, sizeof want, "w%d-%d\n", w->id, i);
		struct cb_exec_spec spec = {
		    .shell = script, .env = base_env, .sandbox = i % 2 ? &sb : NULL};
		struct cb_exec_result r;
		if (cb_exec_run(&spec, &r) == 0 && r.exit_code == 0 && !strcmp(r.out, want) &&
		    r.duration < 1.5)
			w->ok++;
		cb_exec_result_free(&r);
	}
	return NULL;
}

Test(sandbox, concurrent_callers)
{
	int before = count_fds();
	pthread_t t[4];
	struct worker w[4];
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.id = i};
		pthread_create(&t[i], NULL, worker_run, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(w[i].ok, 6, "thread %d: %d of 6 commands right", i, w[i].ok);
	}
	cr_expect_eq(count_fds(), before, "fds leaked");
	cr_expect_eq(waitpid(-1, NULL, WNOHANG), -1); /* every supervisor was reaped */
}
