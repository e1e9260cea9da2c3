/* Unit tests of libcowbox's lifecycle calls against real daemons: access levels
 * (cb_box_options.access, cb_box_set_access), hooks at create and apply (cb_box_apply), the
 * in-place mode (cb_box_options.in_place). */
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
#include "test_box_home.h"

static char home[] = "/tmp/cb-test-boxlife-XXXXXX";
static char target[] = "/tmp/cb-test-boxlife-to-XXXXXX"; /* outside COWBOX_HOME */

static void setup(void)
{
	box_home_setup(home);
	cr_assert_not_null(mkdtemp(target));
}

static void teardown(void)
{
	box_tree_remove(target);
	box_home_teardown(home);
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

/* Text of the file at target/name, or "" if it cannot be read. */
static void read_target(const char *name, char *buf, size_t size)
{
	char path[4300];
	FILE *f;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "%s/%s", target, name);
	if ((f = fopen(path, "r"))) {
		if (!fgets(buf, (int)size, f))
			buf[0] = '\0';
		fclose(f);
	}
}

Test(boxlife, in_place)
{
	struct cb_box_options o = {.base = target, .in_place = true, .idle_timeout = -1};
	struct cb_box *box = NULL;
	char buf[64], path[4300];
	FILE *f;

	snprintf(path, sizeof(path), "%s/a.txt", target);
	cr_assert_not_null(f = fopen(path, "w"));
	fputs("before\n", f);
	fclose(f);
	cr_assert_eq(cb_box_create(&o, &box), 0, "%s", cb_error_message());
	/* The write lands in the folder itself, and a rollback to turn 0 puts it back. */
	cr_assert_eq(cb_box_write(box, "a.txt", "after\n", 6), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "b.txt", "new\n", 4), 0, "%s", cb_error_message());
	read_target("a.txt", buf, sizeof(buf));
	cr_assert_str_eq(buf, "after\n");
	cr_assert_eq(cb_box_snapshot(box, NULL, NULL), 1, "%s", cb_error_message());
	cr_assert_eq(cb_box_rollback(box, 0), 2, "%s", cb_error_message());
	read_target("a.txt", buf, sizeof(buf));
	cr_assert_str_eq(buf, "before\n");
	snprintf(path, sizeof(path), "%s/b.txt", target);
	cr_assert_eq(access(path, F_OK), -1);
	/* Destroy leaves the folder. */
	cr_assert_eq(cb_box_write(box, "c.txt", "kept\n", 5), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_destroy(cb_box_ref(box)), 0, "%s", cb_error_message());
	cb_box_close(box);
	read_target("c.txt", buf, sizeof(buf));
	cr_assert_str_eq(buf, "kept\n");
	read_target("a.txt", buf, sizeof(buf));
	cr_assert_str_eq(buf, "before\n");
}
