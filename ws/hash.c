/* Content hashing for turns: SHA-256 (OpenSSL EVP, SHA-NI where present) and xxh3-128 in one
 * read pass that skips holes, optionally copying (sparse), with a stat check that the file
 * held still. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "turns_int.h"
#include "util/beneath.h"

#define HASH_BUF	    (256 * 1024)
#define HASH_TRIES	    10
#define HASH_BACKOFF_MAX_US 50000

static void hash_xxh_out(XXH128_hash_t h, unsigned char *out)
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, h);
	memcpy(out, c.digest, CB_XXH128_LEN);
}

/* Write n bytes at off; a run that is all zeros is left as a hole (the copy is sparse where
 * the source was, and where it held zeros). */
static int write_at(int fd, const unsigned char *p, size_t n, off_t off)
{
	while (n > 0) {
		ssize_t w = pwrite(fd, p, n, off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		off += w;
		n -= (size_t)w;
	}
	return 0;
}

static int all_zero(const unsigned char *p, size_t n)
{
	static const unsigned char zero[4096];

	for (; n >= sizeof(zero); p += sizeof(zero), n -= sizeof(zero))
		if (memcmp(p, zero, sizeof(zero)))
			return 0;
	return !n || !memcmp(p, zero, n);
}

/* FUSE answers SEEK_DATA/SEEK_HOLE from the server's file, which does not yet have what the
 * kernel's writeback cache holds: there a hole may be data, so every byte is read. */
#define FUSE_SUPER_MAGIC 0x65735546

int ws_holes_trusted(int fd)
{
	struct statfs sfs;

	return fstatfs(fd, &sfs) == 0 && sfs.f_type != FUSE_SUPER_MAGIC;
}

/* Where the next data at or after off is: the data's start, or the file's end when the rest
 * is a hole. A filesystem without SEEK_DATA (EINVAL) is all data. */
static off_t next_data(int fd, off_t off, off_t end)
{
	off_t d = lseek(fd, off, SEEK_DATA);

	if (d < 0)
		return errno == ENXIO ? end : off;
	return d < end ? d : end;
}

static off_t next_hole(int fd, off_t off, off_t end)
{
	off_t h = lseek(fd, off, SEEK_HOLE);

	return h < 0 || h > end ? end : h;
}

/* What a hole reads as. Never written, so it costs no memory (the kernel's zero page backs
 * it); a calloc per file cost a 256 KiB memset and page faults for every file hashed. */
static unsigned char hash_zero[HASH_BUF];

/* Asked every HASH_STOP_EVERY buffers: whether the caller gave up on this hash. */
#define HASH_STOP_EVERY 256

static int hash_stopped(int (*stopping)(void *), void *arg, unsigned *chunks)
{
	return stopping && (++*chunks % HASH_STOP_EVERY) == 0 && stopping(arg);
}

static int hash_fd(int fd, int copy_fd, struct cb_hash *out, long long *size,
		   int (*stopping)(void *), void *arg)
{
	unsigned chunks = 0;
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	XXH3_state_t *xx = XXH3_createState();
	unsigned char *buf = malloc(HASH_BUF);
	const unsigned char *zero = hash_zero;
	unsigned int mdlen = 0;
	off_t off = 0, end, data, hole;
	struct stat st;
	int ret = 0, sparse;

	if (!md || !xx || !buf) {
		ret = cb_error_set(ENOMEM, "hash: out of memory");
		goto out;
	}
	if (!EVP_DigestInit_ex(md, EVP_sha256(), NULL) || XXH3_128bits_reset(xx) != XXH_OK) {
		ret = cb_error_set(EIO, "hash: cannot start SHA-256/xxh3");
		goto out;
	}
	if (fstat(fd, &st) < 0) {
		ret = cb_error_set(errno, "hash: stat: %s", strerror(errno));
		goto out;
	}
	/* Holes are hashed as the zeros they read as, without reading them; data is read up
	 * to the size seen at the start and then until EOF (a file that grew is still hashed
	 * whole, and the caller's stat check notices it moved). */
	end = st.st_size;
	sparse = ws_holes_trusted(fd);
	while (off < end) {
		data = sparse ? next_data(fd, off, end) : off;
		for (; off < data; off += (off_t)HASH_BUF < data - off ? HASH_BUF : data - off) {
			size_t n = (off_t)HASH_BUF < data - off ? HASH_BUF : (size_t)(data - off);

			if (hash_stopped(stopping, arg, &chunks))
				goto stopped;
			EVP_DigestUpdate(md, zero, n);
			XXH3_128bits_update(xx, zero, n);
		}
		if (off >= end)
			break;
		hole = sparse ? next_hole(fd, off, end) : end;
		if (hole <= off)
			hole = end;
		while (off < hole) {
			size_t want =
			    (off_t)HASH_BUF < hole - off ? HASH_BUF : (size_t)(hole - off);
			ssize_t r;

			if (hash_stopped(stopping, arg, &chunks))
				goto stopped;
			r = pread(fd, buf, want, off);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				ret = cb_error_set(errno, "hash: read: %s", strerror(errno));
				goto out;
			}
			if (r == 0) {
				end = hole = off; /* shrank while we read: the stat check sees it */
				break;
			}
			EVP_DigestUpdate(md, buf, (size_t)r);
			XXH3_128bits_update(xx, buf, (size_t)r);
			if (copy_fd >= 0 && !all_zero(buf, (size_t)r) &&
			    (ret = write_at(copy_fd, buf, (size_t)r, off)) < 0) {
				ret = cb_error_set(-ret, "hash: write copy: %s", strerror(-ret));
				goto out;
			}
			off += r;
		}
	}
	/* Bytes appended after the stat: read them too, so *size is what was hashed. */
	for (;;) {
		ssize_t r;

		if (hash_stopped(stopping, arg, &chunks))
			goto stopped;
		r = pread(fd, buf, HASH_BUF, off);
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
		if (copy_fd >= 0 && (ret = write_at(copy_fd, buf, (size_t)r, off)) < 0) {
			ret = cb_error_set(-ret, "hash: write copy: %s", strerror(-ret));
			goto out;
		}
		off += r;
	}
	/* The copy's size: trailing holes and skipped zeros are not written. */
	if (copy_fd >= 0 && ftruncate(copy_fd, off) < 0) {
		ret = cb_error_set(errno, "hash: write copy: %s", strerror(errno));
		goto out;
	}
	EVP_DigestFinal_ex(md, out->sha256, &mdlen);
	hash_xxh_out(XXH3_128bits_digest(xx), out->xxh3);
	if (size)
		*size = (long long)off;
	goto out;
stopped:
	ret = cb_error_set(ECANCELED, "hash: stopped after %lld bytes", (long long)off);
out:
	free(buf);
	XXH3_freeState(xx);
	EVP_MD_CTX_free(md);
	return ret;
}

int cb_ws_hash_fd(int fd, int copy_fd, struct cb_hash *out, long long *size)
{
	return hash_fd(fd, copy_fd, out, size, NULL, NULL);
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

/* See turns_int.h. */
int ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out, struct stat *st,
		    int (*stopping)(void *), void *arg)
{
	int fd, ret;

	/* Beneath dirfd and through no symlink: a link planted in the tree is not followed. */
	if (dirfd == AT_FDCWD) {
		fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
		if (fd < 0)
			return cb_error_set(errno, "hash %s: open: %s", path, strerror(errno));
	} else {
		fd = cb_beneath_open(dirfd, path, O_RDONLY | O_NONBLOCK, 0);
		if (fd < 0)
			return cb_error_wrap(fd, "hash");
	}
	ret = ws_hash_open_file(fd, path, copy_fd, out, st, stopping, arg);
	close(fd);
	return ret;
}

int cb_ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out,
		       struct stat *st)
{
	return ws_hash_file_at(dirfd, path, copy_fd, out, st, NULL, NULL);
}

int cb_ws_hash_open_file(int fd, const char *path, int copy_fd, struct cb_hash *out,
			 struct stat *st)
{
	return ws_hash_open_file(fd, path, copy_fd, out, st, NULL, NULL);
}

/* See turns_int.h. */
int ws_hash_open_file(int fd, const char *path, int copy_fd, struct cb_hash *out, struct stat *st,
		      int (*stopping)(void *), void *arg)
{
	struct stat before, after;
	long long size = 0;
	int ret = 0;

	for (int tries = 0;; tries++) {
		if (fstat(fd, &before) < 0) {
			ret = cb_error_set(errno, "hash %s: stat: %s", path, strerror(errno));
			goto out;
		}
		if (!S_ISREG(before.st_mode)) {
			ret = cb_error_set(EINVAL, "hash %s: not a regular file", path);
			goto out;
		}
		ret = hash_fd(fd, copy_fd, out, &size, stopping, arg);
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
	return ret;
}
