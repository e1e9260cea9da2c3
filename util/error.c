/* Thread-local error messages: the one place where "what failed and why" is kept until
 * the caller (CLI, daemon, client) shows it. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cowbox/error.h"

#define CB_ERROR_MAX 1024

static _Thread_local char cb_error_buf[CB_ERROR_MAX];

/* Format in a scratch buffer, then keep it: an argument may be the current message itself
 * (cb_error_set(e, "%s", cb_error_message())). A too-long message is cut, never overflowed. */
int cb_error_set(int err, const char *fmt, ...)
{
	char msg[CB_ERROR_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(cb_error_buf, msg, sizeof(cb_error_buf));
	return err > 0 ? -err : err;
}

/* Build "<context>: <old message>" in a scratch buffer first, since the old message is the
 * destination too. */
int cb_error_wrap(int err, const char *fmt, ...)
{
	char ctx[CB_ERROR_MAX];
	char old[CB_ERROR_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ctx, sizeof(ctx), fmt, ap);
	va_end(ap);
	memcpy(old, cb_error_buf, sizeof(old));
	if (old[0] == '\0')
		snprintf(old, sizeof(old), "%s", strerror(err > 0 ? err : -err));
	/* Cut the parts explicitly: the total is bounded by the buffer, never overflowed. */
	snprintf(cb_error_buf, sizeof(cb_error_buf), "%.*s: %.*s", CB_ERROR_MAX / 2 - 2, ctx,
		 CB_ERROR_MAX / 2 - 1, old);
	return err > 0 ? -err : err;
}

const char *cb_error_message(void)
{
	return cb_error_buf;
}

void cb_error_clear(void)
{
	cb_error_buf[0] = '\0';
}
