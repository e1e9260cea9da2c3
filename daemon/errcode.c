/* The protocol's error codes, in one table: which errnos the daemon reports as each code, and
 * which errno a C client (cb_client_code_errno) and the Python client's exception carry. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "cowbox/client.h"
#include "errcode.h"

/* One row per code. client: the errno cb_client_code_errno gives for it (the Python client's
 * exception carries the same, bindings/python/cowbox/errors.py; test_errors.py reads this
 * table). daemon: the errnos a handler's failure is reported as this code (0-terminated);
 * any other errno is unavailable. access_denied, conflict and the framing errors are also
 * replied by name where they are found. Keep one row per line: the test parses them. */
struct code_row {
	const char *code;
	int client;
	int daemon[5];
};

static const struct code_row code_rows[] = {
    {"not_found", ENOENT, {ENOENT, ESRCH}},
    {"invalid_path", EINVAL, {EXDEV, ENAMETOOLONG, ELOOP}},
    {"access_denied", EACCES, {EACCES}},
    {"in_use", EBUSY, {EBUSY, EEXIST, EWOULDBLOCK}}, /* EWOULDBLOCK is EAGAIN: a lock taken */
    {"timeout", ETIMEDOUT, {ETIMEDOUT}},
    {"output_limit", EFBIG, {EFBIG, ENOBUFS}},
    {"invalid_request", EPROTO, {EINVAL, EISDIR, EPROTO, EBADMSG}},
    {"conflict", EEXIST, {0}},
    {"unavailable", EAGAIN, {0}}, /* and every errno not listed above */
};

#define CODE_ROWS (sizeof(code_rows) / sizeof(code_rows[0]))

const char *cb_daemon_error_code(int err)
{
	if (err < 0)
		err = -err;
	for (size_t i = 0; err && i < CODE_ROWS; i++)
		for (const int *e = code_rows[i].daemon; *e; e++)
			if (*e == err)
				return code_rows[i].code;
	return "unavailable";
}

int cb_client_code_errno(const char *code)
{
	for (size_t i = 0; code && i < CODE_ROWS; i++)
		if (!strcmp(code, code_rows[i].code))
			return code_rows[i].client;
	return EIO;
}
