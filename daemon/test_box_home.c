/* The libcowbox tests' own $COWBOX_HOME: set up before a suite, and torn down after it with
 * every daemon stopped and its log searched for sanitizer reports. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_box_home.h"

struct report {
	char *buf;
	size_t size;
};

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static int remove_ws(const struct cb_ws_info *info, void *arg)
{
	(void)arg;
	cb_ws_remove(info->ref);
	return 0;
}

static int sanitizer_report(const struct cb_ws_info *info, void *arg)
{
	static const char *markers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
					"runtime error:"};
	struct report *r = arg;
	char *path = NULL, buf[65536];
	FILE *f = NULL;
	size_t n;

	if (r->buf[0] || asprintf(&path, "%s/daemon.log", info->dir) < 0)
		return 0;
	f = fopen(path, "re");
	if (f) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = '\0';
		for (size_t i = 0; i < sizeof(markers) / sizeof(markers[0]) && !r->buf[0]; i++)
			if (strstr(buf, markers[i]))
				snprintf(r->buf, r->size, "%s: %s", path, strstr(buf, markers[i]));
		fclose(f);
	}
	free(path);
	return 0;
}

void box_home_setup(char *home)
{
	const char *bin = getenv("COWBOX");

	cr_assert(bin && *bin, "COWBOX must name the built cowbox binary (make check sets it)");
	cr_assert_not_null(mkdtemp(home));
	setenv("COWBOX_HOME", home, 1);
	setenv("COWBOX_BIN", bin, 1);
}

void box_home_teardown(const char *home)
{
	char report[4300] = "";
	struct report r = {report, sizeof(report)};

	cb_ws_list(sanitizer_report, &r);
	/* Whatever a failed test left: daemons stopped, mounts gone, then the files. */
	cb_ws_list(remove_ws, NULL);
	box_tree_remove(home);
	cr_assert_eq(report[0], '\0', "%s", report);
}

void box_tree_remove(const char *dir)
{
	nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void box_close_checked(struct cb_box *box)
{
	char path[4200], msg[1024], tail[3001] = "";
	const char *home = getenv("COWBOX_HOME");
	FILE *f;
	size_t n;
	int rc;

	snprintf(path, sizeof(path), "%s/workspaces/%s/daemon.log", home ? home : "",
		 cb_box_ref(box));
	rc = cb_box_close(box);
	if (rc == 0)
		return;
	snprintf(msg, sizeof(msg), "%s", cb_error_message());
	/* The daemon's own account: the home (and its log) is removed after the test. */
	if ((f = fopen(path, "re"))) {
		if (fseek(f, -(long)(sizeof(tail) - 1), SEEK_END) < 0)
			rewind(f);
		n = fread(tail, 1, sizeof(tail) - 1, f);
		tail[n] = '\0';
		fclose(f);
	}
	cr_assert_fail("close: %s\n--- the end of %s:\n%s", msg, path, tail);
}
