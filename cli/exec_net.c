/* The network of `cowbox exec REF`: the workspace's own namespace (its forwarders, pasta or
 * egress proxy), fetched from its daemon, as the API's commands have it. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd_common.h"
#include "cowbox/backend.h"
#include "cowbox/client.h"
#include "cowbox/client_served.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/sandbox.h"
#include "exec.h"

int cli_workspace_netns(const char *ref, int *out)
{
	struct cb_client *c = NULL;
	json_t *reply = NULL;
	char path[64];
	struct stat st;
	int rc, fd = -1;

	*out = -1;
	/* A served workspace's daemon answers at once (ensuring one would read its database);
	 * else one is started. */
	if (cb_daemon_connect_ref(ref, &c) < 0) {
		cb_error_clear();
		if ((rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) < 0 ||
		    (rc = cb_daemon_connect(ref, &c)) < 0)
			goto out;
	}
	if ((rc = cb_client_request(c, json_pack("{s:s}", "op", "netns"), -1, &reply)) < 0)
		goto out;
	snprintf(path, sizeof path, "/proc/%lld/fd/%lld",
		 (long long)json_integer_value(json_object_get(reply, "pid")),
		 (long long)json_integer_value(json_object_get(reply, "fd")));
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		rc = cb_error_set(errno, "the workspace's network namespace (%s): %s", path,
				  strerror(errno));
		goto out;
	}
	/* The daemon may have closed that fd since it answered: join nothing else. */
	if (fstat(fd, &st) < 0 ||
	    (json_int_t)st.st_ino != json_integer_value(json_object_get(reply, "inode")) ||
	    ioctl(fd, NS_GET_NSTYPE) != CLONE_NEWNET) {
		rc = cb_error_set(ESTALE, "the workspace's network namespace went away (its "
					  "daemon stopped?): try again");
		goto out;
	}
	*out = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	json_decref(reply);
	cb_client_close(c);
	return rc;
}

int cli_user_net_start(struct cli_user_net *n)
{
	char log[128], pid[128];
	int rc;

	snprintf(n->dir, sizeof n->dir, "/tmp/cowbox-net-XXXXXX");
	if (!mkdtemp(n->dir)) {
		n->dir[0] = 0;
		return cb_error_set(errno, "network all: mkdtemp: %s", strerror(errno));
	}
	snprintf(log, sizeof log, "%s/pasta.log", n->dir);
	snprintf(pid, sizeof pid, "%s/pasta.pid", n->dir);
	if ((rc = cb_netns_new(&n->netns_fd)) < 0)
		return rc;
	return cb_pasta_start(n->netns_fd, log, pid, &n->pasta);
}

void cli_user_net_stop(struct cli_user_net *n)
{
	char path[128];

	cb_pasta_stop(n->pasta);
	if (n->netns_fd >= 0)
		close(n->netns_fd);
	if (!n->dir[0])
		return;
	snprintf(path, sizeof path, "%s/pasta.log", n->dir);
	unlink(path);
	snprintf(path, sizeof path, "%s/pasta.pid", n->dir);
	unlink(path);
	rmdir(n->dir);
}
