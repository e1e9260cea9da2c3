/* Reading a layer for import: the blob hashed whole before libarchive parses it and again as
 * it is read, and each entry's path and type checked (see ws/oci_read.h). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "oci_read.h"

static la_ssize_t oci_layer_read_cb(struct archive *a, void *arg, const void **buf)
{
	struct oci_layer_in *li = arg;
	ssize_t r;

	do
		r = read(li->fd, li->buf, sizeof(li->buf));
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		archive_set_error(a, errno, "read: %s", strerror(errno));
		return -1;
	}
	EVP_DigestUpdate(li->md, li->buf, (size_t)r);
	li->size += r;
	*buf = li->buf;
	return r;
}

/* The whole blob hashed before any parser sees a byte of it: a tampered or truncated layer is
 * named as such, not as whatever its damaged tar happens to look like. */
static int layer_precheck(struct oci_layer_in *li)
{
	int ret;

	if (!(li->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(li->md, EVP_sha256(), NULL) ||
	    !(li->ar = archive_read_new()))
		return cb_error_set(ENOMEM, "out of memory");
	ret = oci_layer_verify(li);
	archive_read_free(li->ar);
	li->ar = NULL;
	EVP_MD_CTX_free(li->md);
	li->md = NULL;
	li->size = 0;
	if (!ret && lseek(li->fd, 0, SEEK_SET) < 0)
		ret = cb_error_set(errno, "layer %s: %s", li->digest, strerror(errno));
	return ret;
}

int oci_layer_open(int layout_fd, json_t *desc, struct oci_layer_in *li)
{
	int ret;

	json_t *size = json_object_get(desc, "size");

	li->fd = -1;
	li->digest = json_string_value(json_object_get(desc, "digest"));
	if (!json_is_integer(size))
		return cb_error_set(EBADMSG, "a layer descriptor without a size");
	li->want_size = json_integer_value(size);
	if ((li->fd = oci_blob_open(layout_fd, li->digest)) < 0)
		return li->fd;
	if ((ret = layer_precheck(li)))
		return ret;
	if (!(li->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(li->md, EVP_sha256(), NULL) ||
	    !(li->ar = archive_read_new()))
		return cb_error_set(ENOMEM, "out of memory");
	/* tar only (gzip'd or not): no other format's parser is exposed to the image */
	archive_read_support_format_tar(li->ar);
	archive_read_support_filter_gzip(li->ar);
	if (archive_read_open(li->ar, li, NULL, oci_layer_read_cb, NULL) != ARCHIVE_OK)
		return cb_error_set(EBADMSG, "layer %s: %s", li->digest,
				    archive_error_string(li->ar));
	return 0;
}

int oci_layer_verify(struct oci_layer_in *li)
{
	unsigned char md[32];
	char got[OCI_DIGEST_LEN];
	const void *b;
	unsigned n = 0;
	la_ssize_t r;

	while ((r = oci_layer_read_cb(li->ar, li, &b)) > 0)
		;
	if (r < 0)
		return cb_error_set(EIO, "layer %s: %s", li->digest, archive_error_string(li->ar));
	EVP_DigestFinal_ex(li->md, md, &n);
	memcpy(got, "sha256:", 7);
	cb_hex(md, sizeof(md), got + 7);
	if (strcmp(got, li->digest))
		return cb_error_set(EBADMSG,
				    "layer %s: digest mismatch: its bytes hash to %s (truncated or "
				    "tampered)",
				    li->digest, got);
	if (li->size != li->want_size)
		return cb_error_set(EBADMSG, "layer %s: %lld bytes where the manifest says %lld",
				    li->digest, li->size, li->want_size);
	return 0;
}

void oci_layer_close(struct oci_layer_in *li)
{
	if (li->ar)
		archive_read_free(li->ar);
	if (li->fd >= 0)
		close(li->fd);
	EVP_MD_CTX_free(li->md);
	li->ar = NULL;
	li->fd = -1;
	li->md = NULL;
}

/* The path below workspace/ of a tar entry, checked: no "..", ".", empty or absolute
 * component, and only files, directories and symlinks (no device, FIFO or hard link). rel
 * is "" for workspace/ itself. */
int oci_entry_check(struct archive_entry *ae, const char *digest, char **rel)
{
	const char *name = archive_entry_pathname(ae);
	unsigned type = archive_entry_filetype(ae);
	size_t len;
	char *r;

	*rel = NULL;
	if (!name || strncmp(name, OCI_ROOT, strlen(OCI_ROOT)) ||
	    (name[strlen(OCI_ROOT)] != '/' && name[strlen(OCI_ROOT)] != '\0'))
		return cb_error_set(EXDEV, "layer %s: '%s' is outside " OCI_ROOT "/", digest,
				    name ? name : "");
	name += strlen(OCI_ROOT);
	name += *name == '/';
	if (!(r = strdup(name)))
		return cb_error_set(ENOMEM, "out of memory");
	len = strlen(r);
	while (len && r[len - 1] == '/')
		r[--len] = '\0';
	for (char *c = r, *end; len && c; c = end ? end + 1 : NULL) {
		size_t n;

		end = strchr(c, '/');
		n = end ? (size_t)(end - c) : strlen(c);
		if (!n || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) {
			cb_error_set(EXDEV,
				     "layer %s: the path '%s' has a '%.*s' component: "
				     "refused (a path must stay below " OCI_ROOT "/)",
				     digest, archive_entry_pathname(ae), (int)n, c);
			free(r);
			return -EXDEV;
		}
	}
	if (archive_entry_hardlink(ae)) {
		free(r);
		return cb_error_set(EBADMSG, "layer %s: '%s' is a hard link: refused", digest,
				    archive_entry_pathname(ae));
	}
	if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
		free(r);
		return cb_error_set(
		    EBADMSG, "layer %s: '%s' is a %s: refused", digest, archive_entry_pathname(ae),
		    type == AE_IFCHR || type == AE_IFBLK ? "device node" : "special file");
	}
	*rel = r;
	return 0;
}
