/* The agent binary's --client mode, on the host: one command of a workspace's VM as a host
 * process, so that the daemon's runner supervises it as it does every backend's commands. */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/fdio.h"
#include "vm.h"
#include "vm_frame.h"

static int client_fd = -1;
static uint32_t client_id;

/* Our stdin, as the command's: frames until end of file, then the end frame. The relay
 * serialises nothing of ours, so this thread is the socket's only writer. */
static void *client_stdin(void *arg)
{
	static char buf[65536];

	(void)arg;
	for (;;) {
		ssize_t n = read(0, buf, sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (cb_vm_frame_write(client_fd, client_id, CB_VM_STDIN, buf, (size_t)n) < 0)
			return NULL;
	}
	cb_vm_frame_write(client_fd, client_id, CB_VM_STDIN_END, NULL, 0);
	return NULL;
}

/* See vm.h. Exit codes: the command's; 126 when the guest could not start it; 255 when the
 * VM went away before it ended (the daemon tells those apart by what the relay saw). */
int cb_vm_client_main(const char *sock, const char *id)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	pthread_t t;
	char *end;
	unsigned long v = strtoul(id, &end, 10);

	if (*end || !v || v > UINT32_MAX || strlen(sock) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "cb-vm-agent --client: bad arguments\n");
		return 255;
	}
	client_id = (uint32_t)v;
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	if ((client_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    connect(client_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    cb_fd_write_all(client_fd, &client_id, sizeof(client_id)) < 0) {
		fprintf(stderr, "cowbox: the VM's relay at %s: %s\n", sock, strerror(errno));
		return 255;
	}
	if (pthread_create(&t, NULL, client_stdin, NULL) != 0)
		return 255;
	pthread_detach(t);
	for (;;) {
		uint32_t fid;
		uint8_t type;
		char *buf;
		size_t len;
		int code = -1;

		if (cb_vm_frame_read(client_fd, &fid, &type, &buf, &len) < 0) {
			fprintf(stderr, "cowbox: the VM went away while the command ran\n");
			return 255;
		}
		if (type == CB_VM_STDOUT || type == CB_VM_STDERR) {
			/* a closed output is the runner stopping us: the command goes with us */
			if (cb_fd_write_all(type == CB_VM_STDOUT ? 1 : 2, buf, len) < 0)
				code = 255;
		} else if (type == CB_VM_EXIT) {
			json_t *o = json_loads(buf, 0, NULL);

			code = (int)json_integer_value(json_object_get(o, "exit_code"));
			json_decref(o);
		} else if (type == CB_VM_FAILED) {
			fprintf(stderr, "%s\n", buf);
			code = 126;
		}
		free(buf);
		if (code >= 0)
			return code;
	}
}
