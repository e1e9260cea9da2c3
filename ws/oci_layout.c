/* The OCI layout directory that export writes and import reads (blobs named by their SHA-256,
 * index.json), and what both compute the same way: map digests and entries as JSON. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "oci_int.h"
#include "util/fdio.h"

/* ---- map digests ---- */

static void sum_term(const struct cb_entry *e, unsigned char out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	char head[160];
	unsigned len = 0;
	int n;

	n = snprintf(head, sizeof(head), "%d %o %lld %d %lld %d %u %u %zu", (int)e->type, e->mode,
		     e->type == CB_ENTRY_DIR ? 0 : e->size, e->has_mtime,
		     e->has_mtime ? e->mtime_ns : 0, e->has_owner, e->has_owner ? e->uid : 0,
		     e->has_owner ? e->gid : 0, e->xattrs_len);
	if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
		memset(out, 0, 32); /* only when out of memory: the digest then fails to match */
		EVP_MD_CTX_free(md);
		return;
	}
	EVP_DigestUpdate(md, e->path, strlen(e->path) + 1);
	EVP_DigestUpdate(md, head, (size_t)n + 1);
	if (e->type == CB_ENTRY_FILE || e->type == CB_ENTRY_SYMLINK) {
		EVP_DigestUpdate(md, e->sha256, CB_SHA256_LEN);
		EVP_DigestUpdate(md, e->xxh3, CB_XXH128_LEN);
	}
	if (e->type == CB_ENTRY_SYMLINK && e->target)
		EVP_DigestUpdate(md, e->target, strlen(e->target) + 1);
	if (e->xattrs_len)
		EVP_DigestUpdate(md, e->xattrs, e->xattrs_len);
	EVP_DigestFinal_ex(md, out, &len);
	EVP_MD_CTX_free(md);
}

void oci_sum_entry(struct oci_sum *s, const struct cb_entry *e, int sign)
{
	unsigned char t[32];
	int carry = 0;

	if (e->type == CB_ENTRY_ABSENT)
		return;
	sum_term(e, t);
	/* little-endian byte order: v[0] is the lowest byte */
	for (int i = 0; i < 32; i++) {
		int x = sign > 0 ? s->v[i] + t[i] + carry : s->v[i] - t[i] - carry;

		carry = sign > 0 ? x > 255 : x < 0;
		s->v[i] = (unsigned char)(x & 255);
	}
}

void oci_sum_hex(const struct oci_sum *s, char out[65])
{
	cb_hex(s->v, sizeof(s->v), out);
}

static int unhex(const char *s, unsigned char *out, size_t n);

int oci_sum_parse(struct oci_sum *s, const char *hex)
{
	return unhex(hex, s->v, sizeof(s->v))
		   ? cb_error_set(EBADMSG, "'%s' is no map digest", hex ? hex : "")
		   : 0;
}

/* ---- entries as JSON ---- */

static int unhex(const char *s, unsigned char *out, size_t n)
{
	if (!s || strlen(s) != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (unsigned char)v;
	}
	return 0;
}

json_t *oci_entry_json(const struct cb_entry *e)
{
	char sha[2 * CB_SHA256_LEN + 1], xx[2 * CB_XXH128_LEN + 1];
	json_t *j = json_pack("{s:s, s:i, s:i, s:I}", "path", e->path, "type", (int)e->type, "mode",
			      (int)e->mode, "size", (json_int_t)e->size);

	if (!j)
		return NULL;
	if (e->type == CB_ENTRY_FILE || e->type == CB_ENTRY_SYMLINK) {
		cb_hex(e->sha256, CB_SHA256_LEN, sha);
		cb_hex(e->xxh3, CB_XXH128_LEN, xx);
		json_object_set_new(j, "sha256", json_string(sha));
		json_object_set_new(j, "xxh3", json_string(xx));
	}
	if (e->target)
		json_object_set_new(j, "target", json_string(e->target));
	if (e->pid)
		json_object_set_new(j, "pid", json_integer(e->pid));
	if (e->comm)
		json_object_set_new(j, "comm", json_string(e->comm));
	if (e->has_mtime)
		json_object_set_new(j, "mtime_ns", json_integer(e->mtime_ns));
	if (e->has_owner) {
		json_object_set_new(j, "uid", json_integer(e->uid));
		json_object_set_new(j, "gid", json_integer(e->gid));
	}
	if (e->xattrs_len) {
		char *x = malloc(2 * e->xattrs_len + 1);

		if (!x) {
			json_decref(j);
			return NULL;
		}
		cb_hex(e->xattrs, e->xattrs_len, x);
		json_object_set_new(j, "xattrs", json_string(x));
		free(x);
	}
	return j;
}

int oci_entry_parse(json_t *j, struct cb_entry *out)
{
	const char *path = json_string_value(json_object_get(j, "path"));
	const char *target = json_string_value(json_object_get(j, "target"));
	const char *comm = json_string_value(json_object_get(j, "comm"));
	const char *xattrs = json_string_value(json_object_get(j, "xattrs"));
	json_t *type = json_object_get(j, "type"), *mode = json_object_get(j, "mode");
	json_t *size = json_object_get(j, "size"), *mt = json_object_get(j, "mtime_ns");
	json_t *uid = json_object_get(j, "uid"), *gid = json_object_get(j, "gid");

	cb_entry_clear(out);
	if (!path || !*path || !json_is_integer(type) || json_integer_value(type) < 0 ||
	    json_integer_value(type) > CB_ENTRY_SYMLINK || !json_is_integer(mode) ||
	    !json_is_integer(size) || json_integer_value(size) < 0)
		return cb_error_set(EBADMSG, "an entry of the change list is malformed");
	out->type = (enum cb_entry_type)json_integer_value(type);
	out->mode = (unsigned)json_integer_value(mode) & 07777;
	out->size = json_integer_value(size);
	if (out->type == CB_ENTRY_FILE || out->type == CB_ENTRY_SYMLINK) {
		if (unhex(json_string_value(json_object_get(j, "sha256")), out->sha256,
			  CB_SHA256_LEN) ||
		    unhex(json_string_value(json_object_get(j, "xxh3")), out->xxh3, CB_XXH128_LEN))
			return cb_error_set(EBADMSG, "entry %s: malformed content hashes", path);
	}
	if (out->type == CB_ENTRY_SYMLINK && !target)
		return cb_error_set(EBADMSG, "entry %s: a symlink without a target", path);
	out->pid = (pid_t)json_integer_value(json_object_get(j, "pid"));
	if (json_is_integer(mt)) {
		out->has_mtime = 1;
		out->mtime_ns = json_integer_value(mt);
	}
	if (json_is_integer(uid) && json_is_integer(gid)) {
		out->has_owner = 1;
		out->uid = (unsigned)json_integer_value(uid);
		out->gid = (unsigned)json_integer_value(gid);
	}
	if (!(out->path = strdup(path)) || (target && !(out->target = strdup(target))) ||
	    (comm && !(out->comm = strdup(comm))))
		return cb_error_set(ENOMEM, "out of memory");
	if (xattrs) {
		out->xattrs_len = strlen(xattrs) / 2;
		if (!(out->xattrs = malloc(out->xattrs_len + 1)))
			return cb_error_set(ENOMEM, "out of memory");
		if (unhex(xattrs, out->xattrs, out->xattrs_len))
			return cb_error_set(EBADMSG, "entry %s: malformed xattrs", path);
	}
	return 0;
}

/* ---- blobs ---- */

void oci_digest_of(const void *data, size_t len, char out[OCI_DIGEST_LEN])
{
	unsigned char md[32];
	unsigned n = 0;

	EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
	memcpy(out, "sha256:", 7);
	cb_hex(md, sizeof(md), out + 7);
}

int oci_digest_check(const char *digest)
{
	if (!digest || strncmp(digest, "sha256:", 7) || strlen(digest) != 71 ||
	    strspn(digest + 7, "0123456789abcdef") != 64)
		return cb_error_set(EBADMSG, "'%s' is not a sha256 digest", digest ? digest : "");
	return 0;
}

/* Temporary blobs of writers that died (an export killed midway): never named by an index. */
static void layout_sweep(int fd)
{
	int dfd = openat(fd, "blobs/sha256", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	struct dirent *de;
	int pid;

	if (!d && dfd >= 0)
		close(dfd);
	while (d && (de = readdir(d)))
		if (sscanf(de->d_name, ".tmp-%d-", &pid) == 1 && pid > 0 && kill(pid, 0) < 0 &&
		    errno == ESRCH)
			unlinkat(dfd, de->d_name, 0);
	if (d)
		closedir(d);
}

int oci_layout_open(const char *dir, int create)
{
	int fd;

	if (create && (mkdir(dir, 0755) < 0 && errno != EEXIST))
		return cb_error_set(errno, "mkdir %s: %s", dir, strerror(errno));
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "OCI layout %s: %s", dir, strerror(errno));
	if (create && ((mkdirat(fd, "blobs", 0755) < 0 && errno != EEXIST) ||
		       (mkdirat(fd, "blobs/sha256", 0755) < 0 && errno != EEXIST))) {
		int err = errno;

		close(fd);
		return cb_error_set(err, "OCI layout %s: mkdir blobs: %s", dir, strerror(err));
	}
	if (create)
		layout_sweep(fd);
	return fd;
}

static void blob_path(const char *digest, char path[96])
{
	snprintf(path, 96, "blobs/sha256/%s", digest + 7);
}

int oci_blob_has(int layout_fd, const char *digest)
{
	char path[96];
	struct stat st;

	if (oci_digest_check(digest))
		return 0;
	blob_path(digest, path);
	return fstatat(layout_fd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

int oci_blob_open(int layout_fd, const char *digest)
{
	char path[96];
	int fd, ret;

	if ((ret = oci_digest_check(digest)))
		return ret;
	blob_path(digest, path);
	fd = openat(layout_fd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "blob %s: %s", digest, strerror(errno));
	return fd;
}

/* JSON blobs (manifests, configs) past this are refused: no export writes one that big. */
#define OCI_JSON_MAX (256LL << 20)

int oci_blob_read(int layout_fd, const char *digest, long long size, char **data, size_t *len)
{
	char got[OCI_DIGEST_LEN];
	struct stat st;
	int fd = oci_blob_open(layout_fd, digest), ret = 0;

	*data = NULL;
	*len = 0;
	if (fd < 0)
		return fd;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > OCI_JSON_MAX) {
		ret =
		    cb_error_set(EBADMSG, "blob %s: not a regular file of at most 256 MiB", digest);
		goto out;
	}
	if (size >= 0 && st.st_size != size) {
		ret = cb_error_set(EBADMSG, "blob %s: %lld bytes where its descriptor says %lld",
				   digest, (long long)st.st_size, size);
		goto out;
	}
	if (!(*data = malloc((size_t)st.st_size + 1))) {
		ret = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	if ((ret = cb_fd_read_full(fd, *data, (size_t)st.st_size)) < 0) {
		ret = cb_error_set(-ret, "read blob %s: %s", digest, strerror(-ret));
		goto out;
	}
	ret = 0;
	(*data)[st.st_size] = '\0';
	*len = (size_t)st.st_size;
	oci_digest_of(*data, *len, got);
	if (strcmp(got, digest))
		ret = cb_error_set(EBADMSG, "blob %s: digest mismatch: its bytes hash to %s",
				   digest, got);
out:
	close(fd);
	if (ret) {
		free(*data);
		*data = NULL;
		*len = 0;
	}
	return ret;
}

int oci_stream_begin(struct oci_stream *s, int layout_fd)
{
	static unsigned seq;

	memset(s, 0, sizeof(*s));
	s->layout_fd = layout_fd;
	snprintf(s->tmp, sizeof(s->tmp), "blobs/sha256/.tmp-%d-%u", (int)getpid(), seq++);
	s->fd = openat(layout_fd, s->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (s->fd < 0)
		return cb_error_set(errno, "blob: create %s: %s", s->tmp, strerror(errno));
	if (!(s->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(s->md, EVP_sha256(), NULL)) {
		oci_stream_abort(s);
		return cb_error_set(ENOMEM, "blob: out of memory");
	}
	return 0;
}

int oci_stream_write(struct oci_stream *s, const void *data, size_t len)
{
	int ret = cb_fd_write_all(s->fd, data, len);

	if (ret < 0)
		return cb_error_set(-ret, "blob: write: %s", strerror(-ret));
	EVP_DigestUpdate(s->md, data, len);
	s->size += (long long)len;
	return 0;
}

int oci_stream_finish(struct oci_stream *s, char digest_out[OCI_DIGEST_LEN])
{
	unsigned char md[32];
	char path[96];
	unsigned n = 0;
	int ret = 0;

	EVP_DigestFinal_ex(s->md, md, &n);
	memcpy(digest_out, "sha256:", 7);
	cb_hex(md, sizeof(md), digest_out + 7);
	blob_path(digest_out, path);
	if (fsync(s->fd) < 0 || close(s->fd) < 0)
		ret = cb_error_set(errno, "blob: write: %s", strerror(errno));
	s->fd = -1;
	if (!ret && renameat(s->layout_fd, s->tmp, s->layout_fd, path) < 0)
		ret = cb_error_set(errno, "blob: rename to %s: %s", path, strerror(errno));
	oci_stream_abort(s);
	return ret;
}

void oci_stream_abort(struct oci_stream *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	if (s->tmp[0])
		unlinkat(s->layout_fd, s->tmp, 0);
	s->tmp[0] = '\0';
	EVP_MD_CTX_free(s->md);
	s->md = NULL;
}

int oci_blob_put(int layout_fd, const void *data, size_t len, char digest_out[OCI_DIGEST_LEN])
{
	struct oci_stream s;
	int ret = oci_stream_begin(&s, layout_fd);

	if (!ret)
		ret = oci_stream_write(&s, data, len);
	if (!ret)
		ret = oci_stream_finish(&s, digest_out);
	oci_stream_abort(&s);
	return ret;
}

/* ---- index.json ---- */

int oci_index_load(int layout_fd, json_t **out)
{
	json_error_t err;
	int fd = openat(layout_fd, "index.json", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	json_t *j;

	*out = NULL;
	if (fd < 0 && errno == ENOENT) {
		*out = json_pack("{s:i, s:[]}", "schemaVersion", 2, "manifests");
		return *out ? 0 : cb_error_set(ENOMEM, "out of memory");
	}
	if (fd < 0)
		return cb_error_set(errno, "index.json: %s", strerror(errno));
	j = json_loadfd(fd, 0, &err);
	close(fd);
	if (!j || !json_is_array(json_object_get(j, "manifests"))) {
		json_decref(j);
		return cb_error_set(EBADMSG, "index.json: not an OCI index (%s)",
				    j ? "no manifests" : err.text);
	}
	*out = j;
	return 0;
}

static int write_small(int dirfd, const char *name, const char *text)
{
	char tmp[64];
	int fd, ret;

	snprintf(tmp, sizeof(tmp), ".%s.tmp-%d", name, (int)getpid());
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return cb_error_set(errno, "write %s: %s", name, strerror(errno));
	ret = cb_fd_write_all(fd, text, strlen(text));
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	if (!ret && renameat(dirfd, tmp, dirfd, name) < 0)
		ret = -errno;
	if (ret) {
		unlinkat(dirfd, tmp, 0);
		return cb_error_set(-ret, "write %s: %s", name, strerror(-ret));
	}
	return 0;
}

int oci_index_store(int layout_fd, json_t *index)
{
	char *text = json_dumps(index, JSON_COMPACT);
	int ret;

	if (!text)
		return cb_error_set(ENOMEM, "out of memory");
	ret = write_small(layout_fd, "oci-layout", "{\"imageLayoutVersion\":\"1.0.0\"}");
	if (!ret)
		ret = write_small(layout_fd, "index.json", text);
	free(text);
	return ret;
}
