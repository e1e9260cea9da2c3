/* Monotonic laps: the seconds between two points of an op, for the timings that replies and
 * logs report. */
#include "config.h"

#include "util/clock.h"

double cb_clock_between(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

double cb_clock_lap(struct timespec *at)
{
	struct timespec now;
	double s;

	clock_gettime(CLOCK_MONOTONIC, &now);
	s = cb_clock_between(at, &now);
	*at = now;
	return s;
}
