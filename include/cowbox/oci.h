/* Workspaces as OCI images (ws/oci_*.c): a workspace's base and each of its turns written as
 * the layers of an image in an OCI layout directory, and a workspace rebuilt from one. */
#ifndef COWBOX_OCI_H
#define COWBOX_OCI_H

#include "cowbox/workspace.h"

/* The annotation a cowbox export's manifest carries (its value: the format's version). */
#define CB_OCI_EXPORT_ANNOTATION "dev.cowbox.export"

struct cb_oci_export_args {
	const char *ref;	 /* the workspace (a ref) */
	long long turn;		 /* the last turn exported; < 0: the latest */
	const char *layout;	 /* the OCI layout directory, made if missing */
	const char *tag;	 /* the tag the image gets in the layout's index */
	const char *runtime_tag; /* NULL, or a tag in layout whose layers go first (a root for
				  * `podman run`); its tag is left in the index */
};

struct cb_oci_export_stats {
	long long turn;		  /* the last turn exported */
	int layers_written;	  /* cowbox layers written now */
	int layers_reused;	  /* cowbox layers the layout held already (by digest) */
	long long bytes_written;  /* bytes of the layers written now */
	long long files_trusted;  /* base files written unhashed: the base cache's row for their
				   * stat holds the recorded SHA-256 */
	long long files_hashed;	  /* files whose bytes were hashed and checked on the way */
	char manifest_digest[72]; /* "sha256:..." */
};

/* Write the image of args->ref up to args->turn into args->layout, tagged args->tag: the base
 * as one layer, each turn's changes as one more (whiteouts and opaque directories as the
 * image spec writes them), everything under workspace/, and per turn its number, label, time,
 * map digest and entries in the config. A layer whose digest the workspace's cache
 * (oci-layers.json) knows and the layout holds is not written again. */
int cb_oci_export(const struct cb_oci_export_args *args, struct cb_oci_export_stats *stats);

struct cb_oci_import_args {
	const char *layout; /* an OCI layout directory holding a cowbox export */
	const char *tag;    /* its tag; NULL: the layout's only cowbox image */
	long long turn;	    /* the last turn imported; < 0: all */
	const char *base;   /* NULL: the image's base layer, unpacked under $COWBOX_HOME/bases;
			     * else a directory whose tree must be the exported base */
	const char *name;   /* the new workspace's name, or NULL */
	int own_ids;	    /* as root: owners go into the workspace's own id range (what
			     * its non-privileged sandbox maps); 0: as recorded */
	FILE *log;	    /* progress lines, or NULL */
};

/* Rebuild a workspace from an export: the same turns with the same maps (each turn's map
 * digest checked against the image's), the blobs its files need, and its tree at the last
 * turn. Every blob is checked against its digest; an image that is not a cowbox export, a
 * layer with a path outside workspace/, "..", a device node or a hard link, or an entry the
 * turn's change list lacks fails it with a message naming the problem. Built in a staging
 * directory and published (renamed to its ref) last: a failure or a kill leaves no
 * workspace. */
int cb_oci_import(const struct cb_oci_import_args *args, char ref[CB_WS_REF_LEN + 1]);

/* Remove the bases imports unpacked ($COWBOX_HOME/bases/<digest>) that no workspace uses:
 * removed (may be NULL) gets each one's digest and its bytes on disk. While an import runs
 * (it holds bases.lock) nothing is removed and *busy is set. */
int cb_oci_bases_prune(void (*removed)(const char *hex, unsigned long long bytes, void *arg),
		       void *arg, int *busy);

#endif
