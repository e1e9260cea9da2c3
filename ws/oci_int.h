/* Internal to ws/oci_*.c: the OCI layout directory (blobs by SHA-256, index.json), the map
 * digest of a turn and the JSON form of a turn's entries, shared by export and import. */
#ifndef COWBOX_WS_OCI_INT_H
#define COWBOX_WS_OCI_INT_H

#include <jansson.h>
#include <openssl/evp.h>

#include "cowbox/oci.h"
#include "cowbox/turn_store.h"

#define OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define OCI_CONFIG   "application/vnd.oci.image.config.v1+json"
#define OCI_LAYER    "application/vnd.oci.image.layer.v1.tar"
#define OCI_REF_NAME "org.opencontainers.image.ref.name"
/* What each cowbox layer says it is: "base" or "turn" (its number in dev.cowbox.turn). */
#define OCI_LAYER_KIND "dev.cowbox.layer"
#define OCI_LAYER_TURN "dev.cowbox.turn"
#define OCI_LAYER_MAP  "dev.cowbox.map"
/* Every path of a cowbox layer is below this directory: the image runs with the workspace
 * at /workspace. */
#define OCI_ROOT       "workspace"
#define OCI_DIGEST_LEN 72 /* "sha256:" + 64 hex + NUL */

/* A turn's map digest: the sum modulo 2^256 of the SHA-256 of each entry (path, type, mode,
 * size, content hashes, target and the kept metadata), so that turn N's is turn N-1's minus
 * the old entries of the paths N changed plus their new ones: O(changes) per turn. It checks
 * that an import rebuilt the same maps; the layers' own SHA-256 digests are what protect the
 * content. */
struct oci_sum {
	unsigned char v[32];
};
/* Add (sign > 0) or take away (sign < 0) e's term; an absent entry has none. */
void oci_sum_entry(struct oci_sum *s, const struct cb_entry *e, int sign);
void oci_sum_hex(const struct oci_sum *s, char out[65]);
/* The digest back from its hex; -EBADMSG if hex is not one. */
int oci_sum_parse(struct oci_sum *s, const char *hex);

/* An entry as JSON and back (the strings of *out owned by it); bad JSON is -EBADMSG naming
 * what. */
json_t *oci_entry_json(const struct cb_entry *e);
int oci_entry_parse(json_t *j, struct cb_entry *out);

/* "sha256:<hex>" of bytes. */
void oci_digest_of(const void *data, size_t len, char out[OCI_DIGEST_LEN]);
/* 0 if digest is "sha256:" and 64 lowercase hex digits, else -EBADMSG naming it. */
int oci_digest_check(const char *digest);

/* Open (mkdir'ing it and blobs/sha256 when create) the layout directory. */
int oci_layout_open(const char *dir, int create);
/* 1 if the layout holds the blob, else 0. */
int oci_blob_has(int layout_fd, const char *digest);
/* Open a blob for reading (the caller checks its digest while reading). */
int oci_blob_open(int layout_fd, const char *digest);
/* A whole small blob (JSON), checked against its digest and size (< 0: not known). */
int oci_blob_read(int layout_fd, const char *digest, long long size, char **data, size_t *len);
/* Store bytes as a blob; digest_out gets its digest. */
int oci_blob_put(int layout_fd, const void *data, size_t len, char digest_out[OCI_DIGEST_LEN]);

/* A blob written in a stream: to a temporary file of blobs/sha256, hashed on the way,
 * renamed to its digest by oci_stream_finish (a blob already there is kept). */
struct oci_stream {
	int layout_fd, fd;
	char tmp[64];
	EVP_MD_CTX *md;
	long long size;
};
int oci_stream_begin(struct oci_stream *s, int layout_fd);
int oci_stream_write(struct oci_stream *s, const void *data, size_t len);
int oci_stream_finish(struct oci_stream *s, char digest_out[OCI_DIGEST_LEN]);
/* Drop an unfinished stream (its temporary file removed); safe after finish. */
void oci_stream_abort(struct oci_stream *s);

/* The layout's index.json (a new empty index when it has none). */
int oci_index_load(int layout_fd, json_t **out);
/* Write index (atomically) and oci-layout. */
int oci_index_store(int layout_fd, json_t *index);

/* Hold the bases directory (bases.lock shared) against a prune until the returned fd is
 * closed: an import holds it from its look at bases/ to its end. */
int oci_bases_hold(const char *bases);

#endif
