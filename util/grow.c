/* Growing arrays by doubling (cowbox/grow.h): the realloc that every list of paths, events,
 * refs and rows would otherwise write again. */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"

int cb_grow(void *arrayp, size_t *cap, size_t n, size_t elem, size_t first, const char *what)
{
	size_t want;
	void *array, *grown;

	if (n < *cap)
		return 0;
	/* A size that cannot be counted is as out of reach as memory that is not there. */
	if (*cap > SIZE_MAX / 2 || n == SIZE_MAX)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	want = *cap ? 2 * *cap : first;
	if (want <= n)
		want = n + 1;
	if (elem && want > SIZE_MAX / elem)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	/* The caller's pointer is copied in and out as bytes: it may be any object type. */
	memcpy(&array, arrayp, sizeof(array));
	grown = realloc(array, want * elem);
	if (!grown)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	memcpy(arrayp, &grown, sizeof(grown));
	*cap = want;
	return 0;
}
