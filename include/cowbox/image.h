/* Root images of the ns backend: a directory as given, or an OCI image (an OCI layout, or a name
 * in the local podman store) unpacked once by umoci into a root cached under $COWBOX_HOME. */
#ifndef COWBOX_IMAGE_H
#define COWBOX_IMAGE_H

#include <jansson.h>

/* The docker backend's image when neither its image option nor $COWBOX_DOCKER_IMAGE names one:
 * the Debian 12 minbase image that scripts/setup-podman builds into the local store. */
#define CB_BACKEND_DOCKER_DEFAULT_IMAGE "cowbox-debian:bookworm"

struct cb_backend_options;

/* The image a backend's commands run in: ns: its image option (NULL: the host's root); docker:
 * its image option, else $COWBOX_DOCKER_IMAGE, else CB_BACKEND_DOCKER_DEFAULT_IMAGE; local:
 * NULL. Points into o or the environment. */
const char *cb_backend_image_of(const struct cb_backend_options *o);

/* What an ns image option names. */
enum cb_backend_image_kind {
	CB_BACKEND_IMAGE_DIR = 0, /* "/PATH" or "./PATH": a root directory, used in place */
	CB_BACKEND_IMAGE_OCI,	  /* "oci:PATH[:TAG]": an OCI image layout */
	CB_BACKEND_IMAGE_STORE,	  /* "containers-storage:NAME" or a bare NAME: podman's store */
};

/* The kind of image spec names; never fails (anything else is a name in the store). */
enum cb_backend_image_kind cb_backend_image_kind(const char *spec);

/* 0 if spec is spelled like an image the ns backend takes (a non-empty directory path, layout
 * path or name, without control characters); else -EINVAL and a message naming it. Looks at
 * nothing on disk. */
int cb_backend_image_check(const char *spec);

/* What commands take from an OCI image beyond its files: its config's Env ("KEY=VALUE",
 * NULL-terminated; NULL: none) and User (NULL: none). A directory has neither. */
struct cb_backend_image_config {
	char **env;
	char *user;
};

/* Free what c holds and zero it; safe on a zeroed one. */
void cb_backend_image_config_free(struct cb_backend_image_config *c);

/* The root directory for the ns image option spec, malloc'd in *root, and (cfg not NULL) the
 * image's settings in *cfg (the caller frees them with cb_backend_image_config_free). A
 * directory is itself, without settings. An OCI image is unpacked (by umoci, which refuses paths
 * out of the root, follows no symlink out of it and applies whiteouts) into
 * $COWBOX_HOME/images/<hex of the image's config digest> on first use and reused after, by any
 * workspace: a changed image has a new config digest and so a new root. The unpack goes to a
 * temporary directory renamed into place once complete, under a lock per digest, so a process
 * killed mid-unpack leaves nothing that looks complete (the next one removes its leftover). Errors
 * name the image and what went wrong (not found, not an OCI layout, unpack failed); a name is
 * looked up in the local store only, never pulled. */
int cb_backend_image_root(const char *spec, char **root, struct cb_backend_image_config *cfg);

struct cb_backend_options;

/* What an unpack may write: the sum of the image's layers' entries (each file rounded up to a
 * 4 KiB block) and their count; 0: no cap. */
struct cb_backend_image_cap {
	unsigned long long bytes, inodes;
};
/* The cap options o give (image_max_mb, else the disk quota; disk_inodes); o NULL: the
 * defaults. */
void cb_backend_image_cap_of(const struct cb_backend_options *o, struct cb_backend_image_cap *out);
/* cb_backend_image_root, with an unpack (a first use) measured first: the layers are listed
 * (tar -tv, whatever their compression) and an image over cap is refused (-EFBIG, naming the
 * image, what it would unpack to and the cap) before anything is written. cap NULL: none. */
int cb_backend_image_root_capped(const char *spec, const struct cb_backend_image_cap *cap,
				 char **root, struct cb_backend_image_config *cfg, int *hold);
/* hold (not NULL): for an unpacked root, *hold is an fd holding it (a shared lock) until
 * closed, so that cb_backend_image_prune leaves it alone; -1 for a directory image. */

/* The unpacked roots under $COWBOX_HOME/images: {"dir", "images": [{"id" (the config
 * digest's hex), "bytes" (allocated), "inodes", "workspaces": [refs whose image option
 * resolves to it now]}]}; a new reference in *out. */
int cb_backend_image_list(json_t **out);
/* Remove every root no workspace's image option resolves to now and none holds (a running
 * backend or sandbox, an unpack: each holds its digest's lock, which prune takes without
 * waiting), and the leftovers of killed unpacks. Idempotent; a create racing it finds its
 * root gone and unpacks it again. {"removed": [ids], "bytes"}; a new reference in *out. */
int cb_backend_image_prune(json_t **out);

#endif
