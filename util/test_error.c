/* Unit tests for util/error.c: messages are kept per thread, and wrapping a message adds
 * context without losing the cause. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "cowbox/error.h"

Test(error, set_returns_negative_errno)
{
	cr_assert_eq(cb_error_set(ENOENT, "open %s", "x"), -ENOENT);
	cr_assert_str_eq(cb_error_message(), "open x");
	cr_assert_eq(cb_error_set(-EINVAL, "bad"), -EINVAL);
}

Test(error, set_may_quote_the_current_message)
{
	cb_error_set(EEXIST, "request 7 is already running");
	cr_assert_eq(cb_error_set(EBUSY, "exec: %s", cb_error_message()), -EBUSY);
	cr_assert_str_eq(cb_error_message(), "exec: request 7 is already running");
}

Test(error, wrap_keeps_cause)
{
	cb_error_set(EACCES, "open meta.db: Permission denied");
	cr_assert_eq(cb_error_wrap(EACCES, "mount %s", "cb-1"), -EACCES);
	cr_assert_str_eq(cb_error_message(), "mount cb-1: open meta.db: Permission denied");
	cb_error_clear();
	cb_error_wrap(ENOSPC, "write");
	cr_assert_str_eq(cb_error_message(), "write: No space left on device");
}

static void *other_thread(void *arg)
{
	(void)arg;
	cb_error_set(EIO, "other thread");
	return NULL;
}

Test(error, per_thread)
{
	pthread_t t;

	cb_error_set(EPERM, "mine");
	pthread_create(&t, NULL, other_thread, NULL);
	pthread_join(t, NULL);
	cr_assert_str_eq(cb_error_message(), "mine");
}
