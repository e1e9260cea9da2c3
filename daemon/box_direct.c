/* libcowbox's high-level API, files straight through the mount when this process sees it:
 * the daemon's own path rule (util/beneath) without base64 and JSON in the way. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "box_private.h"
#include "errcode.h"
#include "cowbox/access.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "util/beneath.h"

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* The workspace's root, if this process sees the daemon's live mount of it; else -1. */
static int direct_root(struct cb_box *box)
{
	char source[128], want[sizeof(source)];
	const char *env = getenv("COWBOX_DIRECT_IO");
	struct statfs sfs;
	int fd;

	if ((env && !strcmp(env, "0")) || !box->mountpoint || !*box->mountpoint)
		return -1;
	snprintf(want, sizeof(want), "cowbox:%s", box->ref);
	if (cb_ws_fuse_mount_source(box->mountpoint, source, sizeof(source)) != 1 ||
	    strcmp(source, want))
		return -1;
	fd = open(box->mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC);
	/* A dead mount (ENOTCONN) or a plain directory is the protocol's to handle. */
	if (fd >= 0 && (fstatfs(fd, &sfs) < 0 || sfs.f_type != FUSE_SUPER_MAGIC)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* The daemon's answer for this error, with its code and the errno the protocol's code maps
 * to (daemon/errcode.c's table); anything the daemon might answer otherwise goes through the
 * protocol (1). */
static int direct_error(const char *op, const char *path, int rc)
{
	const char *code;

	switch (-rc) {
	case ENOENT:
	case EXDEV:
	case ELOOP:
	case ENAMETOOLONG:
	case EINVAL: /* a FIFO, socket or device: refused at once */
	case EISDIR:
		break;
	default:
		return 1;
	}
	code = cb_daemon_error_code(rc);
	cb_box_set_code(code);
	return cb_error_wrap(cb_client_code_errno(code), "%s %s: %s", op, path, code);
}

int cb_box_direct_read(struct cb_box *box, const char *path, void **data, size_t *len)
{
	off_t size;
	int root, rc;

	if (!path || !*path || box->level < CB_ACCESS_FILES) /* the daemon says why not */
		return 1;
	if ((rc = cb_beneath_check(path)) < 0)
		return direct_error("read", path, rc);
	if ((root = direct_root(box)) < 0)
		return 1;
	rc = cb_beneath_read_file(root, path, 0, SIZE_MAX, data, len, &size);
	close(root);
	return rc < 0 ? direct_error("read", path, rc) : 0;
}

int cb_box_direct_write(struct cb_box *box, const char *path, const void *data, size_t len)
{
	int root, rc;

	if (!path || !*path || box->level < CB_ACCESS_FILES) /* the daemon says why not */
		return 1;
	if ((rc = cb_beneath_check(path)) < 0)
		return direct_error("write", path, rc);
	if ((root = direct_root(box)) < 0)
		return 1;
	rc = cb_beneath_write_file(root, path, 0, data, len, 1, 0644);
	close(root);
	return rc < 0 ? direct_error("write", path, rc) : 0;
}
