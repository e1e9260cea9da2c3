/* The bases imports unpack under $COWBOX_HOME/bases/<map digest>: the lock that keeps a prune
 * from removing one an import is about to use, and the prune of those no workspace uses. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/oci.h"
#include "oci_int.h"
#include "ws.h"

/* bases.lock (beside bases/, which holds bases only): shared by every import from its look
 * at bases/ until its workspace is published (or it failed), exclusive for a prune. */
static int bases_lock(const char *bases, int how)
{
	char *path = NULL;
	int fd, ret;

	if ((ret = ws_pathf(&path, "%s.lock", bases)))
		return ret;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	free(path);
	if (fd < 0)
		return cb_error_set(errno, "%s.lock: %s", bases, strerror(errno));
	while (flock(fd, how) < 0) {
		if (errno == EINTR)
			continue;
		ret = errno == EWOULDBLOCK
			  ? -EWOULDBLOCK
			  : cb_error_set(errno, "flock %s.lock: %s", bases, strerror(errno));
		close(fd);
		return ret;
	}
	return fd;
}

int oci_bases_hold(const char *bases)
{
	return bases_lock(bases, LOCK_SH);
}

struct used {
	char *real_bases;
	json_t *names;
};

static int note_used(const struct cb_ws_info *info, void *arg)
{
	struct used *u = arg;
	char *real, *copy;

	if (!info->base || !(real = realpath(info->base, NULL)))
		return 0;
	copy = strdup(real);
	if (copy && !strcmp(dirname(copy), u->real_bases))
		json_object_set_new(u->names, basename(real), json_true());
	free(copy);
	free(real);
	return 0;
}

static unsigned long long tree_bytes;

static int count_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)path;
	(void)flag;
	(void)ftw;
	tree_bytes += (unsigned long long)st->st_blocks * 512ULL;
	return 0;
}

int cb_oci_bases_prune(void (*removed)(const char *hex, unsigned long long bytes, void *arg),
		       void *arg, int *busy)
{
	struct used u = {.names = json_object()};
	char *home = NULL, *bases = NULL, *path = NULL;
	struct dirent *de;
	struct stat st;
	DIR *d = NULL;
	int ret, lock = -1;

	*busy = 0;
	if (!u.names)
		return cb_error_set(ENOMEM, "out of memory");
	if ((ret = cb_ws_home(&home)) || (ret = ws_pathf(&bases, "%s/bases", home)))
		goto out;
	if (stat(bases, &st) < 0 || !S_ISDIR(st.st_mode))
		goto out; /* no import ever unpacked a base here */
	if ((lock = bases_lock(bases, LOCK_EX | LOCK_NB)) == -EWOULDBLOCK) {
		*busy = 1; /* an import is running: its base is left for the next prune */
		lock = -1;
		goto out;
	}
	if (lock < 0) {
		ret = lock;
		goto out;
	}
	if (!(u.real_bases = realpath(bases, NULL))) {
		ret = cb_error_set(errno, "%s: %s", bases, strerror(errno));
		goto out;
	}
	if ((ret = cb_ws_list(note_used, &u)))
		goto out;
	if (!(d = opendir(bases))) {
		ret = cb_error_set(errno, "%s: %s", bases, strerror(errno));
		goto out;
	}
	while ((de = readdir(d))) {
		if (strlen(de->d_name) != 64 || strspn(de->d_name, "0123456789abcdef") != 64 ||
		    json_object_get(u.names, de->d_name))
			continue;
		free(path);
		if ((ret = ws_pathf(&path, "%s/%s", bases, de->d_name)))
			goto out;
		if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		tree_bytes = 0;
		nftw(path, count_one, 16, FTW_PHYS | FTW_MOUNT);
		if ((ret = ws_delete_tree(path)))
			goto out;
		if (removed)
			removed(de->d_name, tree_bytes, arg);
	}
out:
	if (d)
		closedir(d);
	if (lock >= 0)
		close(lock);
	json_decref(u.names);
	free(u.real_bases);
	free(path);
	free(bases);
	free(home);
	return ret ? cb_error_wrap(ret, "prune the imported bases") : 0;
}
