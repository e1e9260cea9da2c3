/* The network of `cowbox exec REF` under network public or allow: the workspace's own
 * namespace, fetched from its daemon, with the egress proxy's environment, as the API gives. */
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
#include "cowbox/error.h"
#include "cowbox/exec.h"

int cli_workspace_netns(const char *ref, int *out)
{
	struct cb_client *c = NULL;
	json_t *reply = NULL;
	char path[64];
	struct stat st;
	int rc, fd = -1;

	*out = -1;
	if ((rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) < 0 ||
	    (rc = cb_daemon_connect(ref, &c)) < 0 ||
	    (rc = cb_client_request(c, json_pack("{s:s}", "op", "netns"), -1, &reply)) < 0)
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

/* Whether env sets the variable of entry ("NAME=..."). */
static int env_has(char **env, const char *entry)
{
	size_t klen = strcspn(entry, "=") + 1;

	for (size_t j = 0; env[j]; j++)
		if (!strncmp(env[j], entry, klen))
			return 1;
	return 0;
}

int cli_env_add(char ***env, const char *const *vars)
{
	size_t n = 0, k = 0, m = 0;
	char **e;

	while ((*env)[n])
		n++;
	while (vars[k])
		k++;
	if (!(e = calloc(n + k + 1, sizeof(*e))))
		return cb_error_set(ENOMEM, "environment: out of memory");
	/* An --env of the same name given on the command line wins. */
	for (size_t i = 0; i < k; i++) {
		if (env_has(*env, vars[i]))
			continue;
		if (!(e[m++] = strdup(vars[i]))) {
			cb_exec_env_free(e);
			return cb_error_set(ENOMEM, "environment: out of memory");
		}
	}
	memcpy(e + m, *env, n * sizeof(*e));
	free(*env);
	*env = e;
	return 0;
}
