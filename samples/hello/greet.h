/* greet: builds the greeting that hello prints. */
#ifndef GREET_H
#define GREET_H

#include <stddef.h>

/* Write "Hello, NAME!" into buf (at most size bytes, always terminated). */
void greet(const char *name, char *buf, size_t size);

#endif
