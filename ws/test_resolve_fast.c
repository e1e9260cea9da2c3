/* Unit tests of ws/resolve_fast.c: what cb_ws_find_served refuses to call served (and leaves
 * to the full route); the served case itself needs a daemon and is in test_exec.py. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_home.h"
#include "cowbox/workspace_fast.h"

TestSuite(fast, .init = test_home_setup, .fini = test_home_teardown);

static void expect_not_served(const char *arg)
{
	char ref[CB_WS_REF_LEN + 1] = "x";
	char *mnt = (char *)1, *name = (char *)1;

	cr_expect_eq(cb_ws_find_served(arg, ref, &mnt, &name), 0, "%s", arg);
	cr_expect_null(mnt, "%s", arg);
	cr_expect_null(name, "%s", arg);
	cr_expect_eq(ref[0], '\0', "%s", arg);
	cr_expect_str_eq(cb_error_message(), "", "%s: a message was left behind", arg);
}

static void create(const char *name, char ref[CB_WS_REF_LEN + 1])
{
	char base[128];

	snprintf(base, sizeof(base), "%s/base", test_home_tmp);
	mkdir(base, 0755);
	cr_assert_eq(cb_ws_create(base, name, NULL, ref), 0, "%s", cb_error_message());
}

Test(fast, bad_syntax_and_unknown_names_are_left_to_the_full_route)
{
	expect_not_served("cb-xyz");
	expect_not_served("../etc");
	expect_not_served("");
	expect_not_served("no-such-name");
	expect_not_served("cb-0123456789abcdef0123456789abcdef");
}

Test(fast, a_workspace_without_a_daemon_is_not_served)
{
	char ref[CB_WS_REF_LEN + 1];

	create("idle", ref);
	expect_not_served(ref);
	expect_not_served("idle");
}

/* A live process holds the lock exclusively and names a mount point, but nothing is mounted
 * there (a daemon still starting, or one whose mount was taken away): not served. A lock
 * held shared (an `ls` probe) is no daemon either. */
Test(fast, a_held_lock_without_the_mount_is_not_served)
{
	char ref[CB_WS_REF_LEN + 1], lock[256], mnt[128];
	int go[2];

	create("starting", ref);
	snprintf(lock, sizeof(lock), "%s/home/workspaces/%s/lock", test_home_tmp, ref);
	snprintf(mnt, sizeof(mnt), "%s/mnt-here", test_home_tmp);
	mkdir(mnt, 0755);
	for (int how = LOCK_EX; how; how = how == LOCK_EX ? LOCK_SH : 0) {
		cr_assert_eq(pipe(go), 0);
		pid_t child = fork();
		cr_assert(child >= 0);
		if (child == 0) {
			int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
			char buf[300];
			int len = snprintf(buf, sizeof(buf), "%d\n%s\n", (int)getpid(), mnt);
			if (fd < 0 || flock(fd, how) < 0 || pwrite(fd, buf, (size_t)len, 0) != len)
				_exit(1);
			(void)!write(go[1], "k", 1);
			pause();
			_exit(0);
		}
		char c;
		close(go[1]);
		cr_assert_eq(read(go[0], &c, 1), 1);
		close(go[0]);
		expect_not_served(ref);
		expect_not_served("starting");
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
	}
}
