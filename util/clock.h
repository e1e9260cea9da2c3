/* Monotonic laps: the seconds between two points of an op, for the timings that replies and
 * logs report (a fork's phases, a rollback's parts). */
#ifndef CB_UTIL_CLOCK_H
#define CB_UTIL_CLOCK_H

#include <time.h>

/* Seconds from a to b (b later). */
double cb_clock_between(const struct timespec *a, const struct timespec *b);
/* Seconds since *at, and *at moved to now: successive calls time successive phases. */
double cb_clock_lap(struct timespec *at);

#endif
