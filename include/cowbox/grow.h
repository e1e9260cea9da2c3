/* Growing arrays: the one place that doubles an array's capacity, so that every list in
 * cowbox grows (and fails) the same way. */
#ifndef COWBOX_GROW_H
#define COWBOX_GROW_H

#include <stddef.h>

/* Make room for element n of the array *arrayp (a pointer to the array's pointer, of elements
 * of elem bytes) whose capacity is *cap: when n == *cap the array is reallocated to twice *cap
 * (first elements the first time) and *cap updated. 0, or -ENOMEM saying "WHAT: out of
 * memory" with the array and *cap unchanged. */
int cb_grow(void *arrayp, size_t *cap, size_t n, size_t elem, size_t first, const char *what);

#endif
