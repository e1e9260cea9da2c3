/* Shared fixture of the ws/ unit tests: a private COWBOX_HOME under a fresh temporary
 * directory for each test, removed afterwards. Include once, from a test file. */
#ifndef COWBOX_WS_TEST_HOME_H
#define COWBOX_WS_TEST_HOME_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

static char test_home_tmp[64];

/* Make /tmp/cb-wstest-XXXXXX and point COWBOX_HOME at its home/ (created on first use). */
static void test_home_setup(void)
{
	char home[128];

	snprintf(test_home_tmp, sizeof(test_home_tmp), "/tmp/cb-wstest-XXXXXX");
	cr_assert_not_null(mkdtemp(test_home_tmp));
	snprintf(home, sizeof(home), "%s/home", test_home_tmp);
	setenv("COWBOX_HOME", home, 1);
}

/* Remove everything the test left under its temporary directory. */
static void test_home_teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", test_home_tmp);
	cr_assert_eq(system(cmd), 0);
}

#endif
