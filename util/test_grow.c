/* Unit tests for util/grow.c: capacity doubles from the first size, contents survive, and an
 * impossible size fails with a message leaving the array as it was. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"

Test(grow, doubles_from_first_and_keeps_contents)
{
	long *a = NULL;
	size_t cap = 0, n;

	for (n = 0; n < 1000; n++) {
		cr_assert_eq(cb_grow(&a, &cap, n, sizeof(*a), 16, "test"), 0);
		cr_assert_gt(cap, n);
		a[n] = (long)n * 7;
	}
	cr_assert_eq(cap, 1024); /* 16, 32, ..., 1024 */
	for (n = 0; n < 1000; n++)
		cr_assert_eq(a[n], (long)n * 7);
	free(a);
}

Test(grow, no_realloc_while_room_left)
{
	int *a = malloc(4 * sizeof(*a)), *before = a;
	size_t cap = 4;

	cr_assert_eq(cb_grow(&a, &cap, 3, sizeof(*a), 16, "test"), 0);
	cr_assert_eq(a, before);
	cr_assert_eq(cap, 4);
	free(a);
}

Test(grow, overflow_fails_and_leaves_the_array)
{
	char *a = malloc(8), *before = a;
	size_t cap = SIZE_MAX / 2 + 1;

	cr_assert_eq(cb_grow(&a, &cap, cap, 1, 16, "huge list"), -ENOMEM);
	cr_assert_str_eq(cb_error_message(), "huge list: out of memory");
	cr_assert_eq(a, before);
	cr_assert_eq(cap, SIZE_MAX / 2 + 1);
	free(a);
}
