/* greet: the one function of the sample project that a demo can change and test. */
#include <stdio.h>

#include "greet.h"

void greet(const char *name, char *buf, size_t size)
{
	snprintf(buf, size, "Hello, %s!", name && *name ? name : "world");
}
