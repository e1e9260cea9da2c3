/* cowbox error messages: every library function returns 0 (or a count) on success and
 * -errno on failure, and leaves a message for the caller to show in this thread. */
#ifndef COWBOX_ERROR_H
#define COWBOX_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Record a message for the calling thread and return -err (err is a positive errno value;
 * a negative one is accepted too). The message says what failed and why, e.g.
 * "open meta.db: Permission denied". */
int cb_error_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context ("mount cb-...: " + old message) and return
 * -err, so a caller can add where it was without losing why it failed. */
int cb_error_wrap(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last message; "" if none was set. Valid until the next set/clear. */
const char *cb_error_message(void);

/* Forget the calling thread's message. */
void cb_error_clear(void);

#ifdef __cplusplus
}
#endif

#endif
