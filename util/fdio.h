/* Whole reads and writes on a file descriptor: pipes, sockets and virtio-serial ports all
 * return short counts and EINTR, which every caller would otherwise loop over itself. */
#ifndef CB_UTIL_FDIO_H
#define CB_UTIL_FDIO_H

#include <stddef.h>

/* Writes all len bytes of buf to fd, retrying short writes and EINTR. Returns 0, or -errno
 * (-EPIPE for a write that took nothing); no message is set, the caller names the fd. */
int cb_fd_write_all(int fd, const void *buf, size_t len);

/* Reads exactly len bytes into buf, retrying short reads and EINTR. Returns 0, -EPIPE when
 * the fd ends first, or -errno; no message is set. */
int cb_fd_read_full(int fd, void *buf, size_t len);

#endif
