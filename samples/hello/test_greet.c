/* test_greet: checks greet() for a name and for the default. */
#include <stdio.h>
#include <string.h>

#include "greet.h"

static int check(const char *name, const char *want)
{
	char got[128];

	greet(name, got, sizeof(got));
	if (strcmp(got, want)) {
		fprintf(stderr, "greet(%s): got '%s', want '%s'\n", name ? name : "NULL", got,
			want);
		return 1;
	}
	return 0;
}

int main(void)
{
	int failed = check("cowbox", "Hello, cowbox!") + check(NULL, "Hello, world!") +
		     check("", "Hello, world!");

	puts(failed ? "FAIL" : "PASS");
	return failed != 0;
}
