/* Unit tests of ws/workspace*.c: ref and name rules, create/resolve/list/remove under a
 * private COWBOX_HOME, and the refusals that happen before anything is touched. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_home.h"

TestSuite(ws, .init = test_home_setup, .fini = test_home_teardown);

Test(ws, ref_and_name_rules)
{
	cr_assert(cb_ws_ref_syntax("cb-0123456789abcdef0123456789abcdef"));
	cr_assert_not(cb_ws_ref_syntax("cb-0123456789ABCDEF0123456789abcdef"));
	cr_assert_not(cb_ws_ref_syntax("cb-xyz"));
	cr_assert_not(cb_ws_ref_syntax("cb-0123456789abcdef0123456789abcdef0"));
	cr_assert_not(cb_ws_ref_syntax(NULL));
	cr_assert_eq(cb_ws_name_check("fix-bug_42.v2"), 0);
	cr_assert_eq(cb_ws_name_check("../x"), -EINVAL);
	cr_assert(strstr(cb_error_message(), "'../x'"));
	cr_assert_eq(cb_ws_name_check("cb-lookalike"), -EINVAL);
	cr_assert_eq(cb_ws_name_check(".hidden"), -EINVAL);
	cr_assert_eq(cb_ws_name_check("a/b"), -EINVAL);
	cr_assert_eq(cb_ws_name_check(""), -EINVAL);
	char longname[80];

	memset(longname, 'a', 65);
	longname[65] = '\0';
	cr_assert_eq(cb_ws_name_check(longname), -EINVAL);
}

Test(ws, home_from_the_environment)
{
	char *home = NULL;

	cr_assert_eq(cb_ws_home(&home), 0);
	cr_assert(strstr(home, test_home_tmp));
	free(home);
	setenv("COWBOX_HOME", "relative/dir", 1);
	cr_assert_eq(cb_ws_home(&home), -EINVAL);
	cr_assert(strstr(cb_error_message(), "absolute"));
	unsetenv("COWBOX_HOME");
	cr_assert_eq(cb_ws_home(&home), 0);
	cr_assert_str_eq(home, geteuid() == 0 ? "/var/lib/cowbox" : home);
	free(home);
}

Test(ws, create_resolve_remove)
{
	char ref[CB_WS_REF_LEN + 1], got[CB_WS_REF_LEN + 1], base[128], *dir = NULL;
	struct cb_ws_info info;

	snprintf(base, sizeof(base), "%s/base", test_home_tmp);
	cr_assert_eq(mkdir(base, 0755), 0);
	cr_assert_eq(cb_ws_create(base, "alpha", NULL, ref), 0, "%s", cb_error_message());
	cr_assert(cb_ws_ref_syntax(ref));
	cr_assert_eq(cb_ws_resolve("alpha", got), 0);
	cr_assert_str_eq(got, ref);
	cr_assert_eq(cb_ws_resolve(ref, got), 0);
	cr_assert_eq(cb_ws_info("alpha", &info), 0, "%s", cb_error_message());
	cr_assert_str_eq(info.base, base);
	cr_assert_str_eq(info.name, "alpha");
	cr_assert_eq(info.state, CB_WS_UNMOUNTED);
	cr_assert_eq(info.daemon_pid, 0);
	cb_ws_info_free(&info);

	/* Taken names and missing bases fail before anything is made. */
	cr_assert_eq(cb_ws_create(NULL, "alpha", NULL, got), -EEXIST);
	cr_assert(strstr(cb_error_message(), ref), "%s", cb_error_message());
	cr_assert_eq(cb_ws_create("/nonexistent/base", NULL, NULL, got), -ENOENT);
	cr_assert_str_eq(got, "");

	cr_assert_eq(cb_ws_resolve("cb-xyz", got), -EINVAL);
	cr_assert(strstr(cb_error_message(), "not a cowbox ref"));
	cr_assert_eq(cb_ws_resolve("../x", got), -EINVAL);
	cr_assert_eq(cb_ws_resolve("beta", got), -ENOENT);
	cr_assert_eq(cb_ws_resolve("cb-00000000000000000000000000000000", got), -ENOENT);

	cr_assert_eq(cb_ws_path(ref, NULL, &dir), 0);
	cr_assert_eq(cb_ws_remove("alpha"), 0, "%s", cb_error_message());
	cr_assert_eq(access(dir, F_OK), -1);
	cr_assert_eq(cb_ws_remove(ref), 0);			 /* gone: quiet */
	cr_assert_eq(cb_ws_remove("alpha"), -ENOENT);		 /* an unknown name is not a ref */
	cr_assert_eq(cb_ws_create(NULL, "alpha", NULL, got), 0); /* the name is free again */
	free(dir);
}

static int count_ws(const struct cb_ws_info *info, void *arg)
{
	char *last = arg;

	cr_assert_gt(strcmp(info->ref, last), 0, "list not in ref order");
	strcpy(last, info->ref);
	return 0;
}

Test(ws, interrupted_creation_and_list)
{
	char ref[CB_WS_REF_LEN + 1], got[CB_WS_REF_LEN + 1], *db = NULL;
	char last[CB_WS_REF_LEN + 1] = "";

	for (int i = 0; i < 5; i++)
		cr_assert_eq(cb_ws_create(NULL, NULL, NULL, ref), 0);
	cr_assert_eq(cb_ws_list(count_ws, last), 0);
	cr_assert_eq(cb_ws_path(ref, "meta.db", &db), 0);
	cr_assert_eq(unlink(db), 0);
	cr_assert_eq(cb_ws_resolve(ref, got), -EUCLEAN);
	cr_assert(strstr(cb_error_message(), "cowbox rm"), "%s", cb_error_message());
	cr_assert_eq(cb_ws_remove(ref), 0, "%s", cb_error_message());
	free(db);
}
