/* Whole reads and writes on a file descriptor (util/fdio.h): the one loop over short counts
 * and EINTR that the CLI's output, the vm agent's client and its frames share. */
#include "config.h"

#include <errno.h>
#include <unistd.h>

#include "util/fdio.h"

int cb_fd_write_all(int fd, const void *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EPIPE;
		buf = (const char *)buf + n;
		len -= (size_t)n;
	}
	return 0;
}

int cb_fd_read_full(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n == 0)
			return -EPIPE;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		got += (size_t)n;
	}
	return 0;
}
