/* Reading a layer of an OCI layout for import (ws/oci_read.c): its bytes hashed as libarchive
 * reads them, and each tar entry's path and type checked before anything acts on it. */
#ifndef COWBOX_WS_OCI_READ_H
#define COWBOX_WS_OCI_READ_H

#include "oci_int.h"
#include "oci_la.h"

struct oci_layer_in {
	int fd;
	EVP_MD_CTX *md;
	long long size;
	struct archive *ar;
	const char *digest;
	long long want_size;
	unsigned char buf[1 << 16];
};

/* Open the layer desc names (its whole blob checked against the digest first) for reading
 * with libarchive (tar, gzip'd or not). */
int oci_layer_open(int layout_fd, json_t *desc, struct oci_layer_in *li);
/* Read what the archive left (padding) and compare digest and size with the descriptor's. */
int oci_layer_verify(struct oci_layer_in *li);
void oci_layer_close(struct oci_layer_in *li);

/* The path below workspace/ of a tar entry, checked: no "..", ".", empty or absolute
 * component, and only files, directories and symlinks (no device, FIFO or hard link). *rel
 * (malloc'd) is "" for workspace/ itself. */
int oci_entry_check(struct archive_entry *ae, const char *digest, char **rel);

#endif
