/* Unit tests of libcowbox's high-level API (daemon/box.c, daemon/box_run.c) against real
 * daemons ($COWBOX is the binary they run as), each test in a COWBOX_HOME of its own. */
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_box_home.h"

static char home[] = "/tmp/cb-test-box-XXXXXX";

static void setup(void)
{
	box_home_setup(home);
}

static void teardown(void)
{
	box_home_teardown(home);
}

TestSuite(box, .init = setup, .fini = teardown, .timeout = 60);

static int count_fds(void)
{
	struct dirent *e;
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static struct cb_box *create_empty(void)
{
	struct cb_box_options opts = {.name = "t1"};
	struct cb_box *box = NULL;
	int rc = cb_box_create(&opts, &box);

	cr_assert_eq(rc, 0, "create: %s", cb_error_message());
	return box;
}

static int count_ws(const struct cb_ws_info *info, void *arg)
{
	(void)info;
	(*(int *)arg)++;
	return 0;
}

Test(box, refusals_and_codes)
{
	struct cb_box_options bad = {.backend = "bogus"};
	struct cb_box *box = NULL, *again = NULL;
	int n = 0;

	cr_assert_eq(cb_box_open("/etc", &box), -EINVAL);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	cr_assert_eq(cb_box_open("nosuchname", &box), -ENOENT);
	cr_assert_str_eq(cb_box_last_code(), "not_found");
	cr_assert_null(box);
	/* A gone ref is destroyed quietly, and so is an unknown name. */
	cr_assert_eq(cb_box_destroy("cb-0123456789abcdef0123456789abcdef"), 0, "%s",
		     cb_error_message());
	cr_assert_eq(cb_box_destroy("nosuchname"), 0, "%s", cb_error_message());
	/* Refused options leave nothing behind. */
	cr_assert_eq(cb_box_create(&bad, &box), -EPROTO);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	cr_assert(strstr(cb_error_message(), "bogus"), "%s", cb_error_message());
	cb_ws_list(count_ws, &n);
	cr_assert_eq(n, 0);

	/* A taken name, a base that is no directory. */
	box = create_empty();
	cr_assert_eq(cb_box_create(&(struct cb_box_options){.name = "t1"}, &again), -EEXIST);
	cr_assert_str_eq(cb_box_last_code(), "in_use");
	cr_assert(strstr(cb_error_message(), "t1"), "%s", cb_error_message());
	cr_assert_eq(cb_box_create(&(struct cb_box_options){.base = "/etc/passwd"}, &again),
		     -ENOTDIR);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	box_close_checked(box);
}

/* Both ways files travel: through the mount (this process sees it) and over the protocol. */
static void read_write_case(int direct)
{
	const char *ln[] = {"ln", "-s", "/etc/passwd", "link", NULL};
	const char *fifo[] = {"mkfifo", "p", NULL};
	struct cb_box *box;
	struct cb_box_result r;
	json_t *events = NULL;
	const char *comm = NULL;
	long long turn;
	size_t big = (3u << 20) + 17, len = 0;
	unsigned char *data = malloc(big);
	void *back = NULL;

	int fds = count_fds();

	setenv("COWBOX_DIRECT_IO", direct ? "1" : "0", 1);
	box = create_empty();
	cr_assert_not_null(data);
	for (size_t i = 0; i < big; i++)
		data[i] = (unsigned char)(i * 7 + i / 4096);
	cr_assert_eq(cb_box_write(box, "d/e/big.bin", data, big), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_read(box, "d/e/big.bin", &back, &len), 0, "%s", cb_error_message());
	cr_assert_eq(len, big);
	cr_assert_eq(memcmp(back, data, big), 0);
	free(back);
	free(data);
	cr_assert_eq(cb_box_write(box, "empty", "", 0), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_read(box, "empty", &back, &len), 0, "%s", cb_error_message());
	cr_assert_eq(len, 0);
	free(back);

	cr_assert_eq(cb_box_read(box, "missing.txt", &back, &len), -ENOENT);
	cr_assert_str_eq(cb_box_last_code(), "not_found");
	cr_assert(strstr(cb_error_message(), "missing.txt"), "%s", cb_error_message());
	cr_assert_eq(cb_box_read(box, "../../etc/passwd", &back, &len), -EINVAL);
	cr_assert_str_eq(cb_box_last_code(), "invalid_path");
	cr_assert(strstr(cb_error_message(), "../../etc/passwd"), "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "/etc/evil", "x", 1), -EINVAL);
	cr_assert_str_eq(cb_box_last_code(), "invalid_path");
	cr_assert(strstr(cb_error_message(), "/etc/evil"), "%s", cb_error_message());
	cr_assert_eq(cb_box_run(box, ln, NULL, NULL, &r), 0, "%s", cb_error_message());
	cb_box_result_free(&r);
	cr_assert_eq(cb_box_read(box, "link", &back, &len), -EINVAL, "%s", cb_error_message());
	cr_assert_str_eq(cb_box_last_code(), "invalid_path");
	cr_assert_eq(cb_box_read(box, "d", &back, &len), -EPROTO, "%s", cb_error_message());
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	/* A FIFO the command made: refused at once, naming it (direct or protocol), and the
	 * daemon still answers. */
	cr_assert_eq(cb_box_run(box, fifo, NULL, NULL, &r), 0, "%s", cb_error_message());
	cb_box_result_free(&r);
	cr_assert_eq(cb_box_read(box, "p", &back, &len), -EPROTO, "%s", cb_error_message());
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	cr_assert(strstr(cb_error_message(), "p: a FIFO"), "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "p", "x", 1), -EPROTO, "%s", cb_error_message());
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	cr_assert_eq(cb_box_write(box, "build..old/x", "x", 1), 0, "%s", cb_error_message());

	/* Who wrote shows in the journal: this process, or the daemon on its behalf. */
	turn = cb_box_snapshot(box, NULL, NULL);
	cr_assert_geq(turn, 1, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "attr.txt", "x", 1), 0, "%s", cb_error_message());
	cr_assert_geq(cb_box_diff(box, turn, -1, &events), 1, "%s", cb_error_message());
	for (size_t i = 0; i < json_array_size(events); i++)
		if (!strcmp(json_string_value(json_object_get(json_array_get(events, i), "path"))
				?: "",
			    "attr.txt"))
			comm =
			    json_string_value(json_object_get(json_array_get(events, i), "comm"));
	cr_assert_not_null(comm);
	if (direct) {
		char self[64] = "";
		FILE *f = fopen("/proc/self/comm", "re");

		cr_assert(f && fgets(self, sizeof(self), f));
		fclose(f);
		self[strcspn(self, "\n")] = '\0';
		cr_assert_str_eq(comm, self, "a direct write is this process's own");
	} else {
		cr_assert_str_eq(comm, "cowbox", "a protocol write is the daemon's");
	}
	json_decref(events);
	box_close_checked(box);
	cr_assert_eq(count_fds(), fds, "no fd is left open");
}

Test(box, read_write_through_the_mount)
{
	read_write_case(1);
}

Test(box, read_write_over_the_protocol)
{
	read_write_case(0);
}

Test(box, run_results_and_limits)
{
	struct cb_box *box = create_empty();
	const char *echo[] = {"echo", "hello", NULL}, *env[] = {"GREETING=hi there", NULL};
	struct cb_box_run_options o = {0};
	struct cb_box_result r;
	char *path = NULL;

	cr_assert_eq(cb_box_run(box, echo, NULL, NULL, &r), 0, "%s", cb_error_message());
	cr_assert_eq(r.exit_code, 0);
	cr_assert_str_eq(r.out, "hello\n");
	cb_box_result_free(&r);

	cr_assert_eq(cb_box_write(box, "sub/f", "x", 1), 0, "%s", cb_error_message());
	o.env = env;
	o.cwd = "sub";
	o.stdin_data = "fed\n";
	o.stdin_len = 4;
	cr_assert_eq(cb_box_run(box, NULL,
				"read l; echo \"$GREETING $l $(ls)\"; echo e >&2; exit 3", &o, &r),
		     0, "%s", cb_error_message());
	cr_assert_eq(r.exit_code, 3);
	cr_assert_str_eq(r.out, "hi there fed f\n");
	cr_assert_str_eq(r.err, "e\n");
	cb_box_result_free(&r);

	memset(&o, 0, sizeof(o));
	o.timeout = 0.3;
	cr_assert_eq(cb_box_run(box, NULL, "sleep 30", &o, &r), 0, "%s", cb_error_message());
	cr_assert(r.timed_out);
	cr_assert_eq(r.exit_code, 124);
	cb_box_result_free(&r);
	o.strict = true;
	cr_assert_eq(cb_box_run(box, NULL, "echo partial; sleep 30", &o, &r), -ETIMEDOUT);
	cr_assert_str_eq(cb_box_last_code(), "timeout");
	cr_assert(r.timed_out, "a strict failure still carries the result");
	cr_assert_str_eq(r.out, "partial\n");
	cb_box_result_free(&r);
	o.timeout = 0;
	o.output_limit = 1000;
	cr_assert_eq(cb_box_run(box, NULL, "yes", &o, &r), -EFBIG);
	cr_assert_str_eq(cb_box_last_code(), "output_limit");
	cr_assert(r.output_limited);
	cb_box_result_free(&r);

	cr_assert_eq(cb_box_run(box, echo, "echo", NULL, &r), -EINVAL);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	cr_assert_eq(cb_box_run(box, (const char *[]){NULL}, NULL, NULL, &r), -EINVAL);
	cr_assert_eq(cb_box_run(box, echo, NULL, &(struct cb_box_run_options){.stdin_len = 3}, &r),
		     -EINVAL);
	cr_assert_eq(cb_box_write(box, "x", NULL, 3), -EINVAL);
	cr_assert_eq(
	    cb_box_run(box, echo, NULL,
		       &(struct cb_box_run_options){.env = (const char *[]){"NOEQUALS", NULL}}, &r),
	    -EINVAL);
	cr_assert(strstr(cb_error_message(), "NOEQUALS"), "%s", cb_error_message());
	cr_assert_eq(cb_box_which(box, "sh", &path), 0, "%s", cb_error_message());
	cr_assert_eq(path[0], '/');
	free(path);
	cr_assert_eq(cb_box_which(box, "no-such-binary-here", &path), -ENOENT);
	cr_assert_str_eq(cb_box_last_code(), "not_found");
	cr_assert(strstr(cb_error_message(), "no-such-binary-here"), "%s", cb_error_message());
	cr_assert_eq(cb_box_host_url(box, 8080, &path), 0, "%s", cb_error_message());
	cr_assert_str_eq(path, "http://127.0.0.1:8080");
	free(path);
	box_close_checked(box);
}

struct collected {
	char out[4096], err[4096];
	size_t out_len, err_len, chunks;
};

static void collect(int stream, const void *data, size_t len, void *arg)
{
	struct collected *c = arg;
	char *buf = stream == 1 ? c->out : c->err;
	size_t *have = stream == 1 ? &c->out_len : &c->err_len;

	if (*have + len < sizeof(c->out)) {
		memcpy(buf + *have, data, len);
		*have += len;
		buf[*have] = '\0';
	}
	c->chunks++;
}

struct counted {
	size_t bytes;
	unsigned long sum;
};

static void count_bytes(int stream, const void *data, size_t len, void *arg)
{
	struct counted *c = arg;

	cr_assert_eq(stream, 1);
	c->bytes += len;
	for (size_t i = 0; i < len; i++)
		c->sum += ((const unsigned char *)data)[i];
}

Test(box, exec_streams_stdin_and_kill)
{
	int fds = count_fds();
	struct cb_box *box = create_empty();
	struct cb_box_proc *p = NULL;
	struct collected c = {0};
	struct cb_box_result r;
	int rc;

	cr_assert_eq(
	    cb_box_exec(box, NULL, "while read l; do echo out:$l; echo err:$l >&2; done", NULL, &p),
	    0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_write(p, "a\n", 2), 0, "%s", cb_error_message());
	/* The first line comes back while stdin is still open: it streams. */
	while (c.out_len < 6 && (rc = cb_box_proc_poll(p, 100, collect, &c, NULL)) == 0)
		;
	cr_assert_str_eq(c.out, "out:a\n");
	cr_assert_eq(cb_box_proc_write(p, "b\n", 2), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_close_stdin(p), 0, "%s", cb_error_message());
	rc = cb_box_proc_poll(p, -1, collect, &c, &r);
	cr_assert_eq(rc, 1, "%d %s", rc, cb_error_message());
	cr_assert_eq(r.exit_code, 0);
	cr_assert_str_eq(c.out, "out:a\nout:b\n");
	cr_assert_str_eq(c.err, "err:a\nerr:b\n");
	cb_box_result_free(&r);
	cb_box_proc_free(p);

	/* A command echoing a large input: feeding it must keep taking its output. */
	size_t big = 4u << 20;
	char *in = malloc(big);
	struct counted cnt = {0, 0};

	cr_assert_not_null(in);
	for (size_t i = 0; i < big; i++)
		in[i] = (char)('a' + i % 26);
	cr_assert_eq(cb_box_exec(box, (const char *[]){"cat", NULL}, NULL, NULL, &p), 0, "%s",
		     cb_error_message());
	cr_assert_eq(cb_box_proc_write(p, in, big), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_close_stdin(p), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_poll(p, 30000, count_bytes, &cnt, &r), 1, "%s",
		     cb_error_message());
	cr_assert_eq(r.exit_code, 0);
	cr_assert_eq(cnt.bytes, big);
	unsigned long want = 0;
	for (size_t i = 0; i < big; i++)
		want += (unsigned char)in[i];
	cr_assert_eq(cnt.sum, want);
	free(in);
	cb_box_result_free(&r);
	cb_box_proc_free(p);

	cr_assert_eq(cb_box_exec(box, NULL, "sleep 30", NULL, &p), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_poll(p, 100, NULL, NULL, &r), 0, "still running");
	cr_assert_eq(cb_box_proc_kill(p, SIGKILL), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_proc_poll(p, 10000, NULL, NULL, &r), 1, "%s", cb_error_message());
	cr_assert(r.killed);
	cr_assert_eq(r.exit_code, 128 + SIGKILL);
	cb_box_result_free(&r);
	cb_box_proc_free(p);
	box_close_checked(box);
	cr_assert_eq(count_fds(), fds, "no fd is left open");
}

Test(box, turns_fork_close_reopen)
{
	struct cb_box *box = create_empty(), *fork = NULL, *again = NULL;
	json_t *files = NULL, *events = NULL;
	char ref[64];
	void *data = NULL;
	size_t len;
	long long t1, t2;
	int rc;

	snprintf(ref, sizeof(ref), "%s", cb_box_ref(box));
	cr_assert(cb_ws_ref_syntax(ref));
	cr_assert_str_eq(cb_box_workdir(box), "/workspace");
	cr_assert_eq(cb_box_write(box, "a.txt", "one\n", 4), 0, "%s", cb_error_message());
	t1 = cb_box_snapshot(box, "first", &files);
	cr_assert_geq(t1, 1, "%s", cb_error_message());
	cr_assert_str_eq(json_string_value(json_object_get(files, "a.txt")),
			 "2c8b08da5ce60398e1f19af0e5dccc744df274b826abe585eaba68c525434806");
	json_decref(files);
	cr_assert_eq(cb_box_write(box, "a.txt", "two\n", 4), 0, "%s", cb_error_message());
	t2 = cb_box_snapshot(box, NULL, NULL);
	cr_assert_eq(t2, t1 + 1, "%s", cb_error_message());
	rc = cb_box_diff(box, t1, t2, &events);
	cr_assert_eq(rc, 1, "%d %s", rc, cb_error_message());
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(events, 0), "path")),
			 "a.txt");
	json_decref(events);
	cr_assert_eq(cb_box_diff(box, 99, -1, &events), -ENOENT, "%s", cb_error_message());

	/* A fork starts at t1, independent of the original. */
	cr_assert_eq(cb_box_fork(box, t1, "forked", &fork), 0, "%s", cb_error_message());
	cr_assert_str_neq(cb_box_ref(fork), ref);
	cr_assert_eq(cb_box_read(fork, "a.txt", &data, &len), 0, "%s", cb_error_message());
	cr_assert_str_eq(data, "one\n");
	free(data);
	cr_assert_eq(cb_box_close(fork), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_destroy("forked"), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_open("forked", &fork), -ENOENT);

	rc = cb_box_rollback(box, t1);
	cr_assert_gt(rc, t2, "%d %s", rc, cb_error_message());
	/* Closed means the daemon is gone; open boots a new one over the same disk. */
	box_close_checked(box);
	cr_assert_eq(cb_box_open("t1", &again), 0, "%s", cb_error_message());
	cr_assert_str_eq(cb_box_ref(again), ref);
	cr_assert_eq(cb_box_read(again, "a.txt", &data, &len), 0, "%s", cb_error_message());
	cr_assert_str_eq(data, "one\n");
	free(data);
	cb_box_detach(again);
	cr_assert_eq(cb_box_destroy(ref), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_destroy(ref), 0, "a second destroy is quiet: %s", cb_error_message());
}

Test(box, local_backend_workdir_is_the_mount)
{
	const char *env[] = {"FROM_OPTIONS=yes", NULL};
	char hook[4300], marker[4200], ref[64];
	const char *on_create[] = {"echo made > made_by_hook", NULL};
	const char *on_destroy[] = {hook, NULL};
	struct cb_box_options opts = {.backend = "local",
				      .env = env,
				      .working_dir = "w",
				      .on_create = on_create,
				      .on_destroy = on_destroy};
	struct cb_box_result r;
	struct cb_box *box = NULL;
	char want[4200];
	void *data = NULL;
	size_t len;

	snprintf(marker, sizeof(marker), "%s/destroyed", home);
	snprintf(hook, sizeof(hook), "touch %s", marker);
	cr_assert_eq(cb_box_create(&opts, &box), 0, "%s", cb_error_message());
	snprintf(ref, sizeof(ref), "%s", cb_box_ref(box));
	snprintf(want, sizeof(want), "%s/w", cb_box_mountpoint(box));
	cr_assert_str_eq(cb_box_workdir(box), want);
	cr_assert_eq(cb_box_run(box, NULL, "echo \"$(pwd) $FROM_OPTIONS\"", NULL, &r), 0, "%s",
		     cb_error_message());
	snprintf(want, sizeof(want), "%s/w yes\n", cb_box_mountpoint(box));
	cr_assert_str_eq(r.out, want);
	cb_box_result_free(&r);
	/* The hooks ran when the backend booted (in working_dir) and run on destroy. */
	/* a relative path starts at working_dir (protocol.md "Files") */
	cr_assert_eq(cb_box_read(box, "made_by_hook", &data, &len), 0, "%s", cb_error_message());
	cr_assert_str_eq(data, "made\n");
	free(data);
	box_close_checked(box);
	cr_assert_neq(access(marker, F_OK), 0);
	cr_assert_eq(cb_box_destroy(ref), 0, "%s", cb_error_message());
	cr_assert_eq(access(marker, F_OK), 0, "the on_destroy hook ran");
}

Test(box, a_killed_daemon_comes_back)
{
	const char *t[] = {"true", NULL};
	struct cb_box *box = create_empty();
	struct cb_box_result r;
	pid_t pid = 0;
	char *mnt = NULL;

	cr_assert_eq(cb_box_write(box, "kept", "yes", 3), 0, "%s", cb_error_message());
	cr_assert_eq(cb_ws_daemon(cb_box_ref(box), &pid, &mnt), 0);
	free(mnt);
	cr_assert_gt(pid, 0);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	for (int i = 0; i < 500 && waitpid(pid, NULL, WNOHANG) != pid; i++)
		usleep(10000);
	/* The next request boots a new daemon over the same disk (the stale mount cleared). */
	cr_assert_eq(cb_box_run(box, t, NULL, NULL, &r), 0, "%s", cb_error_message());
	cr_assert_eq(r.exit_code, 0);
	cb_box_result_free(&r);
	cr_assert_eq(cb_ws_daemon(cb_box_ref(box), &pid, &mnt), 0);
	free(mnt);
	cr_assert_gt(pid, 0);
	box_close_checked(box);
}

struct runner {
	struct cb_box *box;
	int rc;
	char out[64], code[32];
};

static void *run_sleeper(void *arg)
{
	struct runner *t = arg;
	struct cb_box_result r;
	void *data = NULL;
	size_t len;

	t->rc = cb_box_run(t->box, NULL, "sleep 1; echo done", NULL, &r);
	if (!t->rc)
		snprintf(t->out, sizeof(t->out), "%s", r.out);
	cb_box_result_free(&r);
	/* Each thread keeps its own last code. */
	if (cb_box_read(t->box, "nothing-here", &data, &len) == -ENOENT)
		snprintf(t->code, sizeof(t->code), "%s", cb_box_last_code());
	return NULL;
}

Test(box, two_boxes_run_concurrently)
{
	struct runner a = {.box = create_empty()}, b = {0};
	struct timespec t0, t1;
	pthread_t ta, tb;
	double secs;

	cr_assert_eq(cb_box_open(cb_box_ref(a.box), &b.box), 0, "%s", cb_error_message());
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(pthread_create(&ta, NULL, run_sleeper, &a), 0);
	cr_assert_eq(pthread_create(&tb, NULL, run_sleeper, &b), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_assert_eq(a.rc, 0);
	cr_assert_eq(b.rc, 0);
	cr_assert_str_eq(a.out, "done\n");
	cr_assert_str_eq(b.out, "done\n");
	cr_assert_str_eq(a.code, "not_found");
	cr_assert_str_eq(b.code, "not_found");
	cr_assert_lt(secs, 1.9, "two 1 s commands took %.2f s: they did not overlap", secs);
	cb_box_detach(b.box);
	cr_assert_eq(cb_box_close(a.box), 0, "%s", cb_error_message());
}

/* The delta form: only what changed since the box's previous snapshot; the whole-map form
 * built from the same deltas, a copy the caller may change. */
Test(box, snapshot_changes)
{
	struct cb_box *box = create_empty();
	json_t *changed = NULL, *deleted = NULL, *files = NULL;
	struct cb_box_result r = {0};
	long long t1, t2, t3;

	cr_assert_eq(cb_box_write(box, "a.txt", "one\n", 4), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "d/b.txt", "b\n", 2), 0, "%s", cb_error_message());
	t1 = cb_box_snapshot_changes(box, NULL, &changed, &deleted);
	cr_assert_geq(t1, 1, "%s", cb_error_message());
	cr_assert_eq(json_object_size(changed), 2);
	cr_assert_eq(json_array_size(deleted), 0);
	json_decref(changed);
	json_decref(deleted);

	cr_assert_eq(cb_box_write(box, "a.txt", "two\n", 4), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_run(box, NULL, "rm -r d", NULL, &r), 0, "%s", cb_error_message());
	cr_assert_eq(r.exit_code, 0);
	cb_box_result_free(&r);
	t2 = cb_box_snapshot_changes(box, "second", &changed, &deleted);
	cr_assert_eq(t2, t1 + 1, "%s", cb_error_message());
	cr_assert_eq(json_object_size(changed), 1);
	cr_assert_str_eq(json_string_value(json_object_get(changed, "a.txt")),
			 "27dd8ed44a83ff94d557f9fd0412ed5a8cbca69ea04922d88c01184a07300a5a");
	cr_assert_eq(json_array_size(deleted), 1);
	cr_assert_str_eq(json_string_value(json_array_get(deleted, 0)), "d/b.txt");
	json_decref(changed);
	json_decref(deleted);

	/* Nothing changed: nothing reported, and no new turn (the latest is the answer). */
	t3 = cb_box_snapshot_changes(box, NULL, &changed, &deleted);
	cr_assert_eq(t3, t2, "%s", cb_error_message());
	cr_assert_eq(json_object_size(changed), 0);
	cr_assert_eq(json_array_size(deleted), 0);
	json_decref(changed);
	json_decref(deleted);

	cr_assert_eq(cb_box_write(box, "c.txt", "c\n", 2), 0, "%s", cb_error_message());
	cr_assert_geq(cb_box_snapshot(box, NULL, &files), t3 + 1, "%s", cb_error_message());
	cr_assert_eq(json_object_size(files), 2);
	cr_assert(json_object_get(files, "c.txt"));
	json_object_del(files, "a.txt"); /* the caller's copy */
	json_decref(files);
	/* no change since: the same turn, and its whole map (not the caller's changed copy) */
	cr_assert_eq(cb_box_snapshot(box, NULL, &files), t3 + 1, "%s", cb_error_message());
	cr_assert_eq(json_object_size(files), 2);
	cr_assert(json_object_get(files, "a.txt"));
	json_decref(files);
	box_close_checked(box);
}
