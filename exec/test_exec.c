/* Unit tests of the process runner on the host: exit codes, timeouts that kill whole trees,
 * the output cap, the drain after exit, binary output, env and fds, reaping, kill and tty. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"

static char *const base_env[] = {"PATH=/usr/bin:/bin", NULL};

static struct cb_exec_result run_shell(const char *script, double timeout)
{
	struct cb_exec_spec spec = {
	    .shell = script, .env = base_env, .timeout = timeout, .grace = 0.5};
	struct cb_exec_result res;
	int rc = cb_exec_run(&spec, &res);
	cr_assert_eq(rc, 0, "cb_exec_run: %s", cb_error_message());
	return res;
}

static int pid_alive(pid_t pid)
{
	return kill(pid, 0) == 0 || errno != ESRCH;
}

Test(exec, exit_codes)
{
	struct cb_exec_result r = run_shell("exit 0", 0);
	cr_expect_eq(r.exit_code, 0);
	cb_exec_result_free(&r);
	r = run_shell("echo out; echo err >&2; exit 1", 0);
	cr_expect_eq(r.exit_code, 1);
	cr_expect_str_eq(r.out, "out\n");
	cr_expect_str_eq(r.err, "err\n");
	cb_exec_result_free(&r);
	r = run_shell("kill -TERM $$", 0);
	cr_expect_eq(r.exit_code, 128 + SIGTERM);
	cr_expect_eq(r.term_signal, SIGTERM);
	cb_exec_result_free(&r);
}

Test(exec, missing_program_is_127_and_named)
{
	char *argv[] = {"no-such-program-cowbox", "x", NULL};
	struct cb_exec_spec spec = {.argv = argv, .env = base_env};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0);
	cr_expect_eq(r.exit_code, 127);
	cr_expect(strstr(r.err, "no-such-program-cowbox") != NULL, "stderr: %s", r.err);
	cb_exec_result_free(&r);
}

/* Create the (empty) file named by the mkstemp template, where a script writes its pids. */
static void make_pidfile(char *template)
{
	int fd = mkstemp(template);
	cr_assert(fd >= 0);
	close(fd);
}

Test(exec, timeout_kills_the_whole_tree)
{
	char pidfile[] = "/tmp/cb-exec-test-XXXXXX";
	make_pidfile(pidfile);
	char script[512];
	/* a plain child, a setsid'd one (another session), and one that ignores SIGTERM */
	snprintf(script, sizeof script,
		 "sleep 100 & echo $! > %s; setsid sleep 100 & echo $! >> %s;"
		 " sh -c 'trap \"\" TERM; sleep 100' & echo $! >> %s; sleep 100",
		 pidfile, pidfile, pidfile);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct cb_exec_result r = run_shell(script, 0.5);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_expect_eq(r.exit_code, 124);
	cr_expect(r.timed_out);
	cr_expect(took < 3.0, "took %.2f s", took);
	FILE *f = fopen(pidfile, "r");
	cr_assert(f);
	int pid, n = 0;
	while (fscanf(f, "%d", &pid) == 1) {
		cr_expect(!pid_alive(pid), "pid %d survived the timeout", pid);
		n++;
	}
	fclose(f);
	unlink(pidfile);
	cr_expect_eq(n, 3);
	cb_exec_result_free(&r);
}

Test(exec, timeout_keeps_output_so_far)
{
	struct cb_exec_result r = run_shell("echo before; sleep 100", 0.3);
	cr_expect_eq(r.exit_code, 124);
	cr_expect_str_eq(r.out, "before\n");
	cb_exec_result_free(&r);
}

Test(exec, output_cap_stops_and_keeps_64k_each)
{
	struct cb_exec_result r =
	    run_shell("head -c 4000 /dev/zero >&2; head -c 30000000 /dev/zero;"
		      " echo done > /dev/null",
		      0);
	cr_expect(r.output_limited);
	cr_expect_eq(r.out_len, 65536);
	cr_expect_eq(r.err_len, 4000);
	cr_expect_neq(r.exit_code, 0);
	cb_exec_result_free(&r);
}

Test(exec, background_job_holding_stdout_returns_within_2s)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct cb_exec_result r = run_shell("sleep 30 & echo hi", 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_expect_eq(r.exit_code, 0);
	cr_expect_str_eq(r.out, "hi\n");
	cr_expect(took < 2.8, "took %.2f s", took);
	cr_expect(r.duration < 1.0, "duration %.2f", r.duration);
	cb_exec_result_free(&r);
}

/* With no keep set, what the command left ends when it does, not at the drain's end: a job
 * holding stdout, a setsid'd one and a double-forked one (each seen running first) leave no
 * mark 1 s later, and their output before the exit is still read. */
Test(exec, jobs_end_with_the_command_without_a_keep_set)
{
	char dir[] = "/tmp/cb-exec-test-XXXXXX", script[1024], path[64];
	struct timespec t0, t1;

	cr_assert(mkdtemp(dir));
	snprintf(script, sizeof script,
		 "cd %s; (echo job; echo > ran-amp; sleep 1; echo > late-amp) & "
		 "setsid sh -c 'echo > ran-setsid; sleep 1; echo > late-setsid' & "
		 "sh -c '(sh -c \"echo > ran-fork; sleep 1; echo > late-fork\" & ) &'; "
		 "for f in ran-amp ran-setsid ran-fork; do "
		 "while [ ! -e $f ]; do sleep 0.01; done; done; echo hi",
		 dir);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct cb_exec_result r = run_shell(script, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_expect_eq(r.exit_code, 0);
	cr_expect_str_eq(r.out, "job\nhi\n");
	cr_expect(took < 1.8, "took %.2f s (held by the 2 s drain?)", took);
	cb_exec_result_free(&r);
	usleep(1500 * 1000);
	const char *names[] = {"amp", "setsid", "fork"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s/ran-%s", dir, names[i]);
		cr_expect_eq(unlink(path), 0, "%s never ran", path);
		snprintf(path, sizeof path, "%s/late-%s", dir, names[i]);
		cr_expect_neq(unlink(path), 0, "%s outlived its command", path);
	}
	cr_expect_eq(rmdir(dir), 0);
}

Test(exec, binary_output_intact)
{
	unsigned char in[256 * 64];
	for (size_t i = 0; i < sizeof in; i++)
		in[i] = (unsigned char)(i * 7 + i / 256);
	char *argv[] = {"cat", NULL};
	struct cb_exec_spec spec = {.argv = argv,
				    .env = base_env,
				    .stdin_kind = CB_EXEC_STDIN_BYTES,
				    .stdin_data = in,
				    .stdin_len = sizeof in};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0);
	cr_assert_eq(r.out_len, sizeof in);
	cr_expect(memcmp(r.out, in, sizeof in) == 0);
	cb_exec_result_free(&r);
}

Test(exec, env_is_only_what_was_given)
{
	char *argv[] = {"/usr/bin/env", NULL};
	char *env[] = {"A=1", "B=two words", NULL};
	setenv("COWBOX_TEST_LEAK", "secret", 1);
	struct cb_exec_spec spec = {.argv = argv, .env = env};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0);
	cr_expect_str_eq(r.out, "A=1\nB=two words\n");
	cb_exec_result_free(&r);
}

Test(exec, only_fds_0_to_2_arrive)
{
	int leak = open("/dev/null", O_RDONLY); /* deliberately without O_CLOEXEC */
	cr_assert(leak >= 0);
	struct cb_exec_result r = run_shell("ls /proc/$$/fd", 0);
	cr_expect_str_eq(r.out, "0\n1\n2\n");
	cb_exec_result_free(&r);
	close(leak);
}

Test(exec, orphans_are_reaped)
{
	struct cb_exec_result r = run_shell("(sleep 0.2; echo late) & sleep 0.5; echo done", 0);
	cr_expect_eq(r.exit_code, 0);
	cr_expect(strstr(r.out, "late\n") && strstr(r.out, "done\n"), "out: %s", r.out);
	cb_exec_result_free(&r);
	/* the supervisor reaped everything and was reaped: nothing is left for us */
	cr_expect_eq(waitpid(-1, NULL, WNOHANG), -1);
	cr_expect_eq(errno, ECHILD);
}

struct killer {
	struct cb_exec *h;
	double after;
	const char *after_path; /* term_when_ready: kill once this file has 16 lines */
	struct timespec sent;	/* term_when_ready: when the SIGTERM went */
};

static void *kill_later(void *arg)
{
	struct killer *k = arg;
	struct timespec ts = {0, (long)(k->after * 1e9)};
	nanosleep(&ts, NULL);
	cb_exec_kill(k->h, SIGKILL);
	return NULL;
}

Test(exec, kill_from_another_thread)
{
	char *argv[] = {"sleep", "30", NULL};
	struct cb_exec_spec spec = {.argv = argv, .env = base_env};
	struct cb_exec *h;
	cr_assert_eq(cb_exec_start(&spec, NULL, &h), 0, "%s", cb_error_message());
	struct killer k = {.h = h, .after = 0.2};
	pthread_t t;
	pthread_create(&t, NULL, kill_later, &k);
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_wait(h, &r), 0);
	pthread_join(t, NULL);
	cr_expect(r.killed);
	cr_expect_eq(r.exit_code, 128 + SIGKILL);
	cr_expect(r.duration < 2.0);
	cb_exec_result_free(&r);
	cb_exec_free(h);
}

static int count_chunks(void *arg, int stream, const void *buf, size_t len)
{
	(void)buf;
	((size_t *)arg)[stream == 2] += len;
	return 0;
}

Test(exec, streaming_with_stdin_writes)
{
	char *argv[] = {"sh", "-c", "cat; echo e >&2", NULL};
	size_t counts[2] = {0, 0};
	struct cb_exec_callbacks cb = {count_chunks, counts};
	struct cb_exec_spec spec = {
	    .argv = argv, .env = base_env, .stdin_kind = CB_EXEC_STDIN_STREAM};
	struct cb_exec *h;
	cr_assert_eq(cb_exec_start(&spec, &cb, &h), 0, "%s", cb_error_message());
	cr_assert_eq(cb_exec_stdin_write(h, "hello ", 6), 0);
	cr_assert_eq(cb_exec_stdin_write(h, "world", 5), 0);
	cb_exec_stdin_close(h);
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_wait(h, &r), 0);
	cr_expect_str_eq(r.out, "hello world");
	cr_expect_eq(counts[0], 11);
	cr_expect_eq(counts[1], 2);
	cb_exec_result_free(&r);
	cb_exec_free(h);
}

Test(exec, tty_gives_a_terminal)
{
	struct cb_exec_spec spec = {.shell = "test -t 0 && test -t 1 && stty size",
				    .env = base_env,
				    .tty = 1,
				    .tty_rows = 33,
				    .tty_cols = 101};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0, "%s", cb_error_message());
	cr_expect_eq(r.exit_code, 0, "out: %s", r.out);
	cr_expect(strstr(r.out, "33 101") != NULL, "out: %s", r.out);
	cb_exec_result_free(&r);
}

Test(exec, tty_with_stdin_bytes)
{
	struct cb_exec_spec spec = {.shell = "read x; echo got-$x",
				    .env = base_env,
				    .tty = 1,
				    .stdin_kind = CB_EXEC_STDIN_BYTES,
				    .stdin_data = "abc\n",
				    .stdin_len = 4};
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0, "%s", cb_error_message());
	cr_expect(strstr(r.out, "got-abc") != NULL, "out: %s", r.out);
	cb_exec_result_free(&r);
}

Test(exec, empty_command_is_an_error)
{
	char *argv[] = {NULL};
	struct cb_exec_spec spec = {.argv = argv};
	struct cb_exec_result r;
	cr_expect_eq(cb_exec_run(&spec, &r), -EINVAL);
	cr_expect(strstr(cb_error_message(), "no command") != NULL);
}

static int count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	int n = 0, c;
	if (!f)
		return 0;
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec t1;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The parent dies of the SIGTERM while its child (another session, ignoring SIGTERM, holding
 * stdout) is reparented to the supervisor: the timeout must still end it at once, not after
 * the 2 s drain nor the 5 s grace. */
static void orphan_of_a_parent_dying_on_sigterm(void)
{
	char pidfile[] = "/tmp/cb-exec-test-XXXXXX";
	make_pidfile(pidfile);
	char script[512];
	snprintf(script, sizeof script,
		 "setsid sh -c 'trap \"\" TERM; echo $$ > %s; exec sleep 100' &"
		 " while [ ! -s %s ]; do sleep 0.01; done; sleep 100",
		 pidfile, pidfile);
	struct cb_exec_spec spec = {.shell = script, .env = base_env, .timeout = 0.3};
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_run(&spec, &r), 0, "cb_exec_run: %s", cb_error_message());
	double took = seconds_since(&t0);
	cr_expect_eq(r.exit_code, 124);
	/* An orphan that lived on would be killed only after the 5 s grace; the slack above
	 * the 0.3 s timeout is for a loaded machine. */
	cr_expect(took < 3.5, "took %.2f s: the orphan lived on past the timeout", took);
	FILE *f = fopen(pidfile, "r");
	cr_assert(f);
	int pid = 0;
	cr_expect_eq(fscanf(f, "%d", &pid), 1);
	fclose(f);
	unlink(pidfile);
	cr_expect(pid > 0 && !pid_alive(pid), "pid %d survived the timeout", pid);
	cb_exec_result_free(&r);
}

static void *term_when_ready(void *arg)
{
	struct killer *k = arg;
	const char *pidfile = k->after_path;
	for (int i = 0; i < 500 && count_lines(pidfile) < 16; i++) {
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	clock_gettime(CLOCK_MONOTONIC, &k->sent);
	cb_exec_kill(k->h, SIGTERM);
	return NULL;
}

/* A chain of sixteen shells, each in its own session and each dying on SIGTERM: every level
 * the kill reaches orphans the one below it. One SIGTERM must reach all of them at once
 * (no one waits for the drain), which a walk of the parent links cannot promise. */
static void sigterm_through_a_dying_chain(void)
{
	char pidfile[] = "/tmp/cb-exec-test-XXXXXX";
	make_pidfile(pidfile);
	const char *script = "echo $$ >> $PF; n=${N:-0}; if [ $n -lt 15 ]; then"
			     " N=$((n+1)) setsid sh -c \"$S\" & wait; else sleep 100; fi";
	char s_var[400], pf_var[64];
	snprintf(s_var, sizeof s_var, "S=%s", script);
	snprintf(pf_var, sizeof pf_var, "PF=%s", pidfile);
	char *env[] = {"PATH=/usr/bin:/bin", s_var, pf_var, NULL};
	struct cb_exec_spec spec = {.shell = script, .env = env};
	struct cb_exec *h;
	cr_assert_eq(cb_exec_start(&spec, NULL, &h), 0, "%s", cb_error_message());
	struct killer k = {.h = h, .after_path = pidfile};
	pthread_t t;
	pthread_create(&t, NULL, term_when_ready, &k);
	struct cb_exec_result r;
	cr_assert_eq(cb_exec_wait(h, &r), 0);
	pthread_join(t, NULL);
	/* Timed from the SIGTERM (starting sixteen shells is slow on a loaded machine): a level
	 * the SIGTERM missed holds stdout, and the call would wait out the 2 s drain. */
	double took = seconds_since(&k.sent);
	cr_expect(took < 1.8, "took %.2f s: a level outlived the SIGTERM", took);
	cr_expect(r.killed);
	cr_expect_eq(r.exit_code, 128 + SIGTERM);
	FILE *f = fopen(pidfile, "r");
	cr_assert(f);
	int pid, n = 0;
	while (fscanf(f, "%d", &pid) == 1) {
		cr_expect(!pid_alive(pid), "level %d (pid %d) survived the SIGTERM", n, pid);
		n++;
	}
	fclose(f);
	unlink(pidfile);
	cr_expect_eq(n, 16);
	cb_exec_result_free(&r);
	cb_exec_free(h);
}

Test(exec, timeout_kills_the_orphan_of_a_parent_dying_on_sigterm)
{
	orphan_of_a_parent_dying_on_sigterm();
}

Test(exec, sigterm_reaches_every_level_of_a_dying_chain)
{
	sigterm_through_a_dying_chain();
}

/* The same without a cgroup (as where no v2 hierarchy is writable): the tree is stopped
 * top-down before the signal. */
Test(exec, without_cgroup_timeout_kills_the_orphan_of_a_parent_dying_on_sigterm)
{
	setenv("COWBOX_EXEC_CGROUP", "0", 1);
	orphan_of_a_parent_dying_on_sigterm();
}

Test(exec, without_cgroup_sigterm_reaches_every_level_of_a_dying_chain)
{
	setenv("COWBOX_EXEC_CGROUP", "0", 1);
	sigterm_through_a_dying_chain();
}

/* The vm agent's way to run as a user: the name looked up in a root's own etc files, then the
 * runner switches to those ids before exec (as root only). */
Test(exec, ids_resolve_in_a_root_and_run_as_them)
{
	char root[] = "/tmp/cb-ids-XXXXXX", path[64];
	struct cb_exec_ids ids;
	gid_t groups[CB_EXEC_MAX_GROUPS];
	struct cb_exec_result r;
	FILE *f;

	cr_assert(mkdtemp(root));
	snprintf(path, sizeof(path), "%s/etc", root);
	cr_assert_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/etc/passwd", root);
	cr_assert((f = fopen(path, "w")));
	fputs("root:x:0:0::/root:/bin/sh\nbob:x:1234:1235::/home/bob:/bin/sh\n", f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/etc/group", root);
	cr_assert((f = fopen(path, "w")));
	fputs("bob:x:1235:\nstaff:x:50:alice,bob\nother:x:60:alice\n", f);
	fclose(f);
	cr_assert_eq(cb_exec_ids_resolve(root, "bob", &ids, groups), 0, "%s", cb_error_message());
	cr_expect_eq(ids.uid, 1234);
	cr_expect_eq(ids.gid, 1235);
	cr_expect_eq(ids.n_groups, 2);
	cr_expect_eq(ids.groups[1], 50);
	cr_assert_eq(cb_exec_ids_resolve(root, "77:staff", &ids, groups), 0);
	cr_expect_eq(ids.uid, 77);
	cr_expect_eq(ids.gid, 50);
	cr_expect_eq(cb_exec_ids_resolve(root, "no-such-user-x", &ids, groups), -ENOENT);
	cr_expect(strstr(cb_error_message(), "no-such-user-x"));
	cr_assert_eq(cb_exec_ids_resolve(root, "bob", &ids, groups), 0);
	if (geteuid() == 0) {
		struct cb_exec_spec spec = {
		    .shell = "id -u; id -g; id -G", .env = base_env, .ids = &ids};

		cr_assert_eq(cb_exec_run(&spec, &r), 0, "%s", cb_error_message());
		cr_expect_str_eq(r.out, "1234\n1235\n1235 50\n");
		cb_exec_result_free(&r);
	}
	unlink(path);
	snprintf(path, sizeof(path), "%s/etc/passwd", root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/etc", root);
	rmdir(path);
	rmdir(root);
}
