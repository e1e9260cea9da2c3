/* The vm backend's frames (vm_frame.h): read and write one length-prefixed frame, shared by
 * the daemon's side and the guest agent, which is linked statically and on its own. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/fdio.h"
#include "vm_frame.h"

/* See vm_frame.h. */
void cb_vm_put_u32(unsigned char *p, uint32_t v)
{
	p[0] = v & 0xff;
	p[1] = (v >> 8) & 0xff;
	p[2] = (v >> 16) & 0xff;
	p[3] = (v >> 24) & 0xff;
}

static uint32_t get_u32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* See vm_frame.h. */
uint32_t cb_vm_u32(const char *payload, size_t len)
{
	return len == 4 ? get_u32((const unsigned char *)payload) : 0;
}

/* See vm_frame.h. */
int cb_vm_frame_write(int fd, uint32_t id, uint8_t type, const void *payload, size_t len)
{
	unsigned char head[CB_VM_FRAME_HEAD];
	struct iovec iov[2];
	size_t done = 0, total = sizeof(head) + len;

	if (len > CB_VM_FRAME_MAX)
		return -EMSGSIZE;
	cb_vm_put_u32(head, (uint32_t)(len + 5));
	cb_vm_put_u32(head + 4, id);
	head[8] = type;
	while (done < total) {
		int n_iov = 0;
		ssize_t n;

		if (done < sizeof(head)) {
			iov[n_iov].iov_base = head + done;
			iov[n_iov++].iov_len = sizeof(head) - done;
			if (len) {
				iov[n_iov].iov_base = (void *)payload;
				iov[n_iov++].iov_len = len;
			}
		} else {
			iov[n_iov].iov_base = (char *)payload + (done - sizeof(head));
			iov[n_iov++].iov_len = total - done;
		}
		n = writev(fd, iov, n_iov);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += (size_t)n;
	}
	return 0;
}

/* See vm_frame.h. */
int cb_vm_frame_read(int fd, uint32_t *id, uint8_t *type, char **payload, size_t *len)
{
	unsigned char head[CB_VM_FRAME_HEAD];
	uint32_t size;
	char *buf = NULL;
	int rc;

	*payload = NULL;
	*len = 0;
	if ((rc = cb_fd_read_full(fd, head, sizeof(head))) < 0)
		return rc;
	size = get_u32(head);
	if (size < 5 || size - 5 > CB_VM_FRAME_MAX)
		return -EPROTO;
	*id = get_u32(head + 4);
	*type = head[8];
	if (!(buf = malloc(size - 5 + 1)))
		return -ENOMEM;
	if ((rc = cb_fd_read_full(fd, buf, size - 5)) < 0) {
		free(buf);
		return rc;
	}
	buf[size - 5] = 0;
	*payload = buf;
	*len = size - 5;
	return 0;
}
