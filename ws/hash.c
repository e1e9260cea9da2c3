/* Content hashing for turns: SHA-256 (OpenSSL EVP, SHA-NI where present) and xxh3-128 in one
 * read pass, optionally copying the bytes read, with a stat check that the file held still. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "turns_int.h"

#define HASH_BUF	    (256 * 1024)
#define HASH_TRIES	    10
#define HASH_BACKOFF_MAX_US 50000

static void hash_xxh_out(XXH128_hash_t h, unsigned char *out)
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, h);
	memcpy(out, c.digest, CB_XXH128_LEN);
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int cb_ws_hash_fd(int fd, int copy_fd, struct cb_hash *out, long long *size)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	XXH3_state_t *xx = XXH3_createState();
	unsigned char *buf = malloc(HASH_BUF);
	unsigned int mdlen = 0;
	long long total = 0;
	int ret = 0;

	if (!md || !xx || !buf) {
		ret = cb_error_set(ENOMEM, "hash: out of memory");
		goto out;
	}
	if (!EVP_DigestInit_ex(md, EVP_sha256(), NULL) || XXH3_128bits_reset(xx) != XXH_OK) {
		ret = cb_error_set(EIO, "hash: cannot start SHA-256/xxh3");
		goto out;
	}
	for (;;) {
		ssize_t r = read(fd, buf, HASH_BUF);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = cb_error_set(errno, "hash: read: %s", strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		EVP_DigestUpdate(md, buf, (size_t)r);
		XXH3_128bits_update(xx, buf, (size_t)r);
		if (copy_fd >= 0 && (ret = write_all(copy_fd, buf, (size_t)r)) < 0) {
			ret = cb_error_set(ret, "hash: write copy: %s", strerror(-ret));
			goto out;
		}
		total += r;
	}
	EVP_DigestFinal_ex(md, out->sha256, &mdlen);
	hash_xxh_out(XXH3_128bits_digest(xx), out->xxh3);
	if (size)
		*size = total;
out:
	free(buf);
	XXH3_freeState(xx);
	EVP_MD_CTX_free(md);
	return ret;
}

void cb_ws_hash_bytes(const void *data, size_t len, struct cb_hash *out)
{
	unsigned int mdlen = 0;

	EVP_Digest(data, len, out->sha256, &mdlen, EVP_sha256(), NULL);
	hash_xxh_out(XXH3_128bits(data, len), out->xxh3);
}

/* The fields that move when a file is written: if they agree before and after the read,
 * no write landed in between (mtime/ctime are updated by every write and truncate). */
static int hash_stat_same(const struct stat *a, const struct stat *b)
{
	return a->st_size == b->st_size && a->st_ino == b->st_ino &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
	       a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

int cb_ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out,
		       struct stat *st)
{
	struct stat before, after;
	long long size = 0;
	int fd, ret = 0;

	/* Beneath dirfd and through no symlink: a link planted in the tree is not followed. */
	if (dirfd == AT_FDCWD) {
		fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
		if (fd < 0)
			fd = -errno;
	} else {
		fd = ws_open_beneath(dirfd, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
	}
	if (fd < 0)
		return cb_error_set(-fd, "hash %s: open: %s", path, strerror(-fd));
	for (int tries = 0;; tries++) {
		if (fstat(fd, &before) < 0) {
			ret = cb_error_set(errno, "hash %s: stat: %s", path, strerror(errno));
			goto out;
		}
		if (!S_ISREG(before.st_mode)) {
			ret = cb_error_set(EINVAL, "hash %s: not a regular file", path);
			goto out;
		}
		ret = cb_ws_hash_fd(fd, copy_fd, out, &size);
		if (ret) {
			ret = cb_error_wrap(ret, "hash %s", path);
			goto out;
		}
		if (fstat(fd, &after) < 0) {
			ret = cb_error_set(errno, "hash %s: stat: %s", path, strerror(errno));
			goto out;
		}
		if (hash_stat_same(&before, &after) && size == before.st_size)
			break;
		if (tries + 1 >= HASH_TRIES) {
			ret = cb_error_set(EAGAIN, "hash %s: still being written after %d tries",
					   path, HASH_TRIES);
			goto out;
		}
		/* It moved under us: start again from the top, and the copy too. */
		if (lseek(fd, 0, SEEK_SET) < 0 ||
		    (copy_fd >= 0 &&
		     (ftruncate(copy_fd, 0) < 0 || lseek(copy_fd, 0, SEEK_SET) < 0))) {
			ret = cb_error_set(errno, "hash %s: rewind: %s", path, strerror(errno));
			goto out;
		}
		/* 1, 2, 4 ... ms, at most 50 ms: ~0.2 s in all before giving up on this file */
		usleep((1000u << tries) < HASH_BACKOFF_MAX_US ? (1000u << tries)
							      : HASH_BACKOFF_MAX_US);
	}
	if (st)
		*st = after;
out:
	close(fd);
	return ret;
}
