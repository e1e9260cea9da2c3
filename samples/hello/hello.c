/* hello: prints a greeting for its first argument (or the world). */
#include <stdio.h>

#include "greet.h"

int main(int argc, char **argv)
{
	char line[128];

	greet(argc > 1 ? argv[1] : NULL, line, sizeof(line));
	puts(line);
	return 0;
}
