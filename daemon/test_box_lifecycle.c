/* Unit tests of libcowbox's lifecycle calls against real daemons: access levels
 * (cb_box_options.access, cb_box_set_access), hooks at create and apply (cb_box_apply). */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/access.h"
#include "cowbox/apply.h"
#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"

static char home[] = "/tmp/cb-test-boxlife-XXXXXX";
static char target[] = "/tmp/cb-test-boxlife-to-XXXXXX"; /* outside COWBOX_HOME */

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

static void setup(void)
{
	const char *bin = getenv("COWBOX");

	cr_assert(bin && *bin, "COWBOX must name the built cowbox binary (make check sets it)");
	cr_assert_not_null(mkdtemp(home));
	setenv("COWBOX_HOME", home, 1);
	setenv("COWBOX_BIN", bin, 1);
	cr_assert_not_null(mkdtemp(target));
}

static void teardown(void)
{
	cb_ws_list(remove_ws, NULL);
	nftw(home, remove_one, 16, FTW_DEPTH | FTW_PHYS);
	nftw(target, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(boxlife, .init = setup, .fini = teardown);

Test(boxlife, access_levels)
{
	struct cb_box_options o = {.access = "files"};
	struct cb_box *box = NULL, *other = NULL;
	struct cb_box_result res = {0};
	const char *const argv[] = {"true", NULL};
	void *data = NULL;
	size_t len = 0;

	cr_assert_eq(cb_box_create(&o, &box), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "f.txt", "hi", 2), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_read(box, "f.txt", &data, &len), 0, "%s", cb_error_message());
	cr_assert_eq(len, 2);
	free(data);
	cr_assert_eq(cb_box_run(box, argv, NULL, NULL, &res), -EACCES);
	cr_assert_str_eq(cb_box_last_code(), "access_denied");
	cr_assert(strstr(cb_error_message(), "needs full"), "%s", cb_error_message());
	/* Never raised; lowered further, reads are refused too (also through the mount). */
	cr_assert_eq(cb_box_set_access(box, "full"), -EACCES);
	cr_assert_eq(cb_box_set_access(box, "none"), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_read(box, "f.txt", &data, &len), -EACCES);
	cr_assert_eq(cb_box_set_access(box, "most"), -EINVAL);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");
	/* Another box of the workspace starts at what it serves: files. */
	cr_assert_eq(cb_box_open(cb_box_ref(box), &other), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_read(other, "f.txt", &data, &len), 0, "%s", cb_error_message());
	free(data);
	cb_box_detach(other);
	cb_box_close(box);
}

Test(boxlife, hooks_and_apply)
{
	const char *const hooks[] = {"echo hooked > hook.txt", NULL};
	struct cb_box_options o = {.on_create = hooks, .idle_timeout = -1};
	struct cb_box *box = NULL;
	json_t *report = NULL, *events = NULL;
	char path[4300], buf[64] = "";
	FILE *f;

	cr_assert_eq(cb_box_create(&o, &box), 0, "%s", cb_error_message());
	/* The hook ran at create, as its own turn. */
	cr_assert_eq(cb_box_diff(box, 0, 1, &events), 1, "%s", cb_error_message());
	json_decref(events);
	cr_assert_eq(cb_box_write(box, "new.txt", "applied\n", 8), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_apply(box, 0, target, &report), 0, "%s", cb_error_message());
	cr_assert_eq(json_integer_value(json_object_get(report, "written")), 2);
	json_decref(report);
	snprintf(path, sizeof(path), "%s/new.txt", target);
	cr_assert_not_null(f = fopen(path, "r"));
	cr_assert_not_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	cr_assert_str_eq(buf, "applied\n");
	/* Changed there since: refused with the list, nothing written. */
	cr_assert_not_null(f = fopen(path, "w"));
	fputs("mine\n", f);
	fclose(f);
	cr_assert_eq(cb_box_write(box, "new.txt", "again\n", 6), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_apply(box, 0, target, &report), -EEXIST);
	cr_assert_str_eq(cb_box_last_code(), "conflict");
	cr_assert_eq(json_array_size(json_object_get(report, "conflicts")), 1);
	json_decref(report);
	cb_box_close(box);
}
