/* The blob store: content-addressed copies of file contents a turn needs (blobs/<xxh3-128
 * hex>), written under a temp name then renamed, deduplicated, reflinked when possible. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "turns_int.h"

#define BLOB_TMP_PREFIX "tmp."

/* The blob's file name: 32 hex digits + NUL. */
static void cb_ws_blob_name(const unsigned char *xxh3, char out[2 * CB_XXH128_LEN + 1])
{
	cb_hex(xxh3, CB_XXH128_LEN, out);
}

int cb_ws_blob_has(int blob_fd, const unsigned char *xxh3)
{
	char name[2 * CB_XXH128_LEN + 1];

	cb_ws_blob_name(xxh3, name);
	return faccessat(blob_fd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Copy [off, end) by plain pread/pwrite, for pairs of files where copy_file_range does not
 * work (a FUSE file on one side, on older kernels). */
static int copy_rw(int src, int dst, off_t off, off_t end)
{
	char *buf = malloc(256 * 1024);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	while (off < end) {
		size_t want = end - off < 256 * 1024 ? (size_t)(end - off) : 256 * 1024;
		ssize_t r = pread(src, buf, want, off), done = 0;

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			break;
		}
		if (r == 0)
			break;
		while (done < r) {
			ssize_t w = pwrite(dst, buf + done, (size_t)(r - done), off + done);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				ret = -errno;
				goto out;
			}
			done += w;
		}
		off += r;
	}
out:
	free(buf);
	return ret;
}

/* Copy one data segment [off, end): copy_file_range, else read/write. */
static int copy_segment(int src, int dst, off_t off, off_t end)
{
	while (off < end) {
		loff_t in = off, out = off;
		ssize_t n = copy_file_range(src, &in, dst, &out, (size_t)(end - off), 0);

		if (n > 0) {
			off += n;
			continue;
		}
		if (n == 0)
			return 0;
		if (errno == EINTR)
			continue;
		if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP && errno != ENOSYS)
			return -errno;
		return copy_rw(src, dst, off, end);
	}
	return 0;
}

/* Copy all of src_fd into dst_fd (both from offset 0): reflink, else copy_file_range or
 * read/write of the data segments only (holes stay holes). */
static int cb_ws_copy_fd(int src_fd, int dst_fd)
{
	struct stat st;
	off_t off = 0;
	int ret = 0, sparse;

	if (ioctl(dst_fd, FICLONE, src_fd) == 0)
		return 0;
	if (fstat(src_fd, &st) < 0 || ftruncate(dst_fd, 0) < 0)
		return cb_error_set(errno, "copy: %s", strerror(errno));
	/* Only the data segments: a hole stays a hole (a sparse file is not made dense). */
	sparse = ws_holes_trusted(src_fd);
	if (!sparse)
		ret = copy_segment(src_fd, dst_fd, 0, st.st_size);
	while (sparse && off < st.st_size && !ret) {
		off_t data = lseek(src_fd, off, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break;
		if (data < 0)
			data = off;
		hole = lseek(src_fd, data, SEEK_HOLE);
		if (hole < 0 || hole > st.st_size)
			hole = st.st_size;
		if (hole <= data)
			break;
		ret = copy_segment(src_fd, dst_fd, data, hole);
		off = hole;
	}
	if (!ret && ftruncate(dst_fd, st.st_size) < 0)
		ret = -errno;
	if (ret)
		return cb_error_set(-ret, "copy: %s", strerror(-ret));
	return 0;
}

int cb_ws_copy_checked(int src_fd, int dst_fd, const struct cb_entry *want, const char *what)
{
	char hex[2 * CB_XXH128_LEN + 1];
	struct cb_hash got;
	long long size = 0;
	int ret;

	if (dst_fd >= 0 && ftruncate(dst_fd, 0) < 0)
		return cb_error_set(errno, "copy %s: %s", what, strerror(errno));
	ret = cb_ws_hash_fd(src_fd, dst_fd, &got, &size);
	if (ret)
		return cb_error_wrap(ret, "copy %s", what);
	if (size == want->size && !memcmp(got.xxh3, want->xxh3, CB_XXH128_LEN) &&
	    !memcmp(got.sha256, want->sha256, CB_SHA256_LEN))
		return 0;
	cb_hex(want->xxh3, CB_XXH128_LEN, hex);
	return cb_error_set(EBADMSG,
			    "%s is damaged: it holds %lld bytes that do not hash to the content "
			    "%s (%lld bytes) recorded for %s",
			    what, size, hex, want->size, want->path);
}

int cb_ws_blob_tmp(int blob_fd, char name[64])
{
	static unsigned counter;
	int fd;

	for (int i = 0; i < 100; i++) {
		snprintf(name, 64, BLOB_TMP_PREFIX "%d.%u", (int)getpid(),
			 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
		fd = openat(blob_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
		if (fd >= 0)
			return fd;
		if (errno != EEXIST)
			break;
	}
	return cb_error_set(errno, "blob store: temp file: %s", strerror(errno));
}

int cb_ws_blob_publish(int blob_fd, const char *tmpname, const unsigned char *xxh3)
{
	char name[2 * CB_XXH128_LEN + 1];

	cb_ws_blob_name(xxh3, name);
	/* NOREPLACE: an existing blob with this name already holds these bytes; keep it. */
	if (renameat2(blob_fd, tmpname, blob_fd, name, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno == EEXIST) {
		unlinkat(blob_fd, tmpname, 0);
		return 0;
	}
	int err = errno;
	unlinkat(blob_fd, tmpname, 0);
	return cb_error_set(err, "blob store: publish %s: %s", name, strerror(err));
}

int cb_ws_blob_put_fd(int blob_fd, int src_fd, const unsigned char *xxh3)
{
	char tmp[64];
	int fd, ret;

	if (cb_ws_blob_has(blob_fd, xxh3))
		return 0;
	fd = cb_ws_blob_tmp(blob_fd, tmp);
	if (fd < 0)
		return fd;
	ret = lseek(src_fd, 0, SEEK_SET) < 0 ? -errno : 0;
	if (!ret)
		ret = cb_ws_copy_fd(src_fd, fd);
	close(fd);
	if (ret) {
		unlinkat(blob_fd, tmp, 0);
		return cb_error_wrap(ret, "blob store: copy");
	}
	return cb_ws_blob_publish(blob_fd, tmp, xxh3);
}

int cb_ws_blob_open(int blob_fd, const unsigned char *xxh3)
{
	char name[2 * CB_XXH128_LEN + 1];
	int fd;

	cb_ws_blob_name(xxh3, name);
	fd = openat(blob_fd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "blob %s: %s", name, strerror(errno));
	return fd;
}

/* Parse a blob file name back into its xxh3; 0 if the name is not one. */
static int blob_parse(const char *name, unsigned char *xxh3)
{
	if (strlen(name) != 2 * CB_XXH128_LEN)
		return 0;
	for (int i = 0; i < CB_XXH128_LEN; i++) {
		unsigned v;

		if (sscanf(name + 2 * i, "%2x", &v) != 1)
			return 0;
		xxh3[i] = (unsigned char)v;
	}
	return 1;
}

/* Walk the store: fn gets each blob (or leftover temp when xxh3 is NULL) and its stat. */
static int blob_walk(int blob_fd,
		     int (*fn)(int, const char *, const unsigned char *, const struct stat *,
			       void *),
		     void *arg)
{
	int fd = openat(blob_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	if (fd < 0 || !(dir = fdopendir(fd))) {
		ret = cb_error_set(errno, "blob store: list: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	while ((de = readdir(dir))) {
		unsigned char xxh3[CB_XXH128_LEN];
		struct stat st;
		int isblob;

		if (de->d_name[0] == '.')
			continue;
		isblob = blob_parse(de->d_name, xxh3);
		if (!isblob && strncmp(de->d_name, BLOB_TMP_PREFIX, strlen(BLOB_TMP_PREFIX)))
			continue;
		if (fstatat(blob_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		ret = fn(blob_fd, de->d_name, isblob ? xxh3 : NULL, &st, arg);
		if (ret)
			break;
	}
	closedir(dir);
	return ret;
}

struct blob_usage {
	long long count, bytes;
};

static int blob_usage_one(int blob_fd, const char *name, const unsigned char *xxh3,
			  const struct stat *st, void *arg)
{
	struct blob_usage *u = arg;

	(void)blob_fd;
	(void)name;
	if (xxh3) {
		u->count++;
		u->bytes += (long long)st->st_blocks * 512;
	}
	return 0;
}

int cb_ws_blob_usage(int blob_fd, long long *count, long long *bytes)
{
	struct blob_usage u = {0, 0};
	int ret = blob_walk(blob_fd, blob_usage_one, &u);

	*count = u.count;
	*bytes = u.bytes;
	return ret;
}

struct blob_gc {
	int (*needed)(const unsigned char *, void *);
	void *arg;
	long long removed, freed;
};

static int blob_gc_one(int blob_fd, const char *name, const unsigned char *xxh3,
		       const struct stat *st, void *arg)
{
	struct blob_gc *gc = arg;
	int need = 0;

	/* Temps of this process are in use right now; any other's are leftovers of a crash. */
	if (!xxh3) {
		char mine[32];

		snprintf(mine, sizeof(mine), BLOB_TMP_PREFIX "%d.", (int)getpid());
		if (!strncmp(name, mine, strlen(mine)))
			return 0;
	} else {
		need = gc->needed(xxh3, gc->arg);
		if (need < 0)
			return need;
	}
	if (need)
		return 0;
	if (unlinkat(blob_fd, name, 0) < 0)
		return cb_error_set(errno, "blob store: remove %s: %s", name, strerror(errno));
	gc->removed++;
	/* A blob hard-linked into a fork's store keeps its blocks: count only the last link. */
	if (st->st_nlink <= 1)
		gc->freed += (long long)st->st_blocks * 512;
	return 0;
}

int cb_ws_blob_gc(int blob_fd, int (*needed)(const unsigned char *xxh3, void *), void *arg,
		  long long *removed, long long *freed)
{
	struct blob_gc gc = {needed, arg, 0, 0};
	int ret = blob_walk(blob_fd, blob_gc_one, &gc);

	*removed = gc.removed;
	*freed = gc.freed;
	return ret;
}

int cb_ws_blob_share(int from_fd, int to_fd, const unsigned char *xxh3)
{
	char name[2 * CB_XXH128_LEN + 1];
	int src, ret;

	if (cb_ws_blob_has(to_fd, xxh3))
		return 0;
	cb_ws_blob_name(xxh3, name);
	if (linkat(from_fd, name, to_fd, name, 0) == 0 || errno == EEXIST)
		return 0;
	if (errno != EXDEV && errno != EMLINK && errno != EPERM)
		return cb_error_set(errno, "blob %s: link into fork: %s", name, strerror(errno));
	src = cb_ws_blob_open(from_fd, xxh3);
	if (src < 0)
		return src;
	ret = cb_ws_blob_put_fd(to_fd, src, xxh3);
	close(src);
	return ret;
}

int cb_ws_blob_usage_dir(const char *blob_dir, long long *count, long long *bytes)
{
	int fd = open(blob_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret;

	*count = *bytes = 0;
	if (fd < 0)
		return errno == ENOENT
			   ? 0
			   : cb_error_set(errno, "blob store %s: %s", blob_dir, strerror(errno));
	ret = cb_ws_blob_usage(fd, count, bytes);
	close(fd);
	return ret;
}
