/* Unit test of libcowbox's merge call against real daemons: a fork's change merged back into
 * the original (cb_box_merge), its dry run, and the refusal when the original changed the
 * same path since its latest turn. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/apply.h"
#include "cowbox/box.h"
#include "cowbox/error.h"
#include "test_box_home.h"

static char home[] = "/tmp/cb-test-boxmerge-XXXXXX";

static void setup(void)
{
	box_home_setup(home);
}

static void teardown(void)
{
	box_home_teardown(home);
}

TestSuite(boxmerge, .init = setup, .fini = teardown, .timeout = 120);

Test(boxmerge, fork_merged_back)
{
	struct cb_box_options o = {.idle_timeout = -1};
	struct cb_box *box = NULL, *fork = NULL;
	json_t *report = NULL;
	long long t1;
	void *data = NULL;
	size_t len = 0;

	cr_assert_eq(cb_box_create(&o, &box), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "a.txt", "one\ntwo\nthree\n", 14), 0, "%s",
		     cb_error_message());
	t1 = cb_box_snapshot(box, NULL, NULL);
	cr_assert_gt(t1, 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_fork(box, t1, "mfork", &fork), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(fork, "a.txt", "one\ntwo\nthree (fork)\n", 21), 0, "%s",
		     cb_error_message());
	cr_assert_gt(cb_box_snapshot(fork, NULL, NULL), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_write(box, "a.txt", "one (box)\ntwo\nthree\n", 20), 0, "%s",
		     cb_error_message());

	/* Not yet snapshotted in the box: refused, nothing written. */
	cr_assert_eq(cb_box_merge(box, "mfork", -1, NULL, false, &report), -EEXIST);
	cr_assert_str_eq(cb_box_last_code(), "conflict");
	cr_assert_eq(json_array_size(json_object_get(report, "conflicts")), 1);
	json_decref(report);
	cr_assert_gt(cb_box_snapshot(box, NULL, NULL), t1, "%s", cb_error_message());

	cr_assert_eq(cb_box_merge(box, "mfork", -1, "merge", true, &report), 0, "%s",
		     cb_error_message());
	cr_assert(json_is_null(json_object_get(report, "turn")));
	cr_assert_eq(json_array_size(json_object_get(report, "merged")), 1);
	json_decref(report);

	cr_assert_eq(cb_box_merge(box, "mfork", -1, NULL, false, &report), 0, "%s",
		     cb_error_message());
	cr_assert(json_is_integer(json_object_get(report, "turn")));
	cr_assert_eq(json_array_size(json_object_get(report, "conflicts")), 0);
	json_decref(report);
	cr_assert_eq(cb_box_read(box, "a.txt", &data, &len), 0, "%s", cb_error_message());
	cr_assert_eq(len, 27);
	cr_assert(!memcmp(data, "one (box)\ntwo\nthree (fork)\n", 27));
	free(data);
	box_close_checked(fork);
	box_close_checked(box);
}
