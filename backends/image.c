/* The ns backend's root images: an OCI layout or a name in the local podman store (pulled into
 * it from the user's registries), resolved to its config digest, unpacked once into
 * $COWBOX_HOME/images/<hex>. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "cowbox/image.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"

/* An unpack of a large image on a loaded machine takes minutes, not hours. */
#define IMAGE_TOOL_TIMEOUT 1800
#define OCI_REF_NAME	   "org.opencontainers.image.ref.name"
#define OCI_INDEX	   "application/vnd.oci.image.index.v1+json"
#define STORE_PREFIX	   "containers-storage:"
/* the tag of the layout skopeo copies a store image into */
#define STORE_TAG "image"

/* A resolved OCI image: where its layout is and which tag in it, and its key. */
struct image_ref {
	char *layout; /* the layout's directory (NULL for a store image until copied) */
	char *tag;    /* the tag umoci unpacks */
	char *name;   /* a store image's name as given */
	char hex[65]; /* the config digest's hex: the cache's key */
};

const char *cb_backend_image_of(const struct cb_backend_options *o)
{
	const struct cb_backend_ops *ops = cb_backend_find(o->kind);

	if (o->image || !ops || !ops->default_image)
		return o->image;
	return ops->default_image();
}

enum cb_backend_image_kind cb_backend_image_kind(const char *spec)
{
	if (!strncmp(spec, "oci:", 4))
		return CB_BACKEND_IMAGE_OCI;
	if (!strncmp(spec, STORE_PREFIX, strlen(STORE_PREFIX)))
		return CB_BACKEND_IMAGE_STORE;
	if (spec[0] == '/' || spec[0] == '.')
		return CB_BACKEND_IMAGE_DIR;
	return CB_BACKEND_IMAGE_STORE;
}

static const char *store_name(const char *spec)
{
	return strncmp(spec, STORE_PREFIX, strlen(STORE_PREFIX)) ? spec
								 : spec + strlen(STORE_PREFIX);
}

/* oci:PATH[:TAG]: a ':' after the last '/' starts the tag. */
static int oci_split(const char *spec, char **path, char **tag)
{
	const char *p = spec + 4, *colon = strrchr(p, ':'), *slash = strrchr(p, '/');

	*tag = NULL;
	if (colon && (!slash || colon > slash)) {
		*path = strndup(p, (size_t)(colon - p));
		*tag = strdup(colon + 1);
		if (*path && !*tag) {
			free(*path);
			*path = NULL;
		}
	} else {
		*path = strdup(p);
	}
	return *path ? 0 : cb_error_set(ENOMEM, "image %s: out of memory", spec);
}

int cb_backend_image_check(const char *spec)
{
	char *path = NULL, *tag = NULL;
	int rc = 0;

	if (!*spec)
		return cb_error_set(EINVAL, "backend option image: empty");
	for (const char *c = spec; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			return cb_error_set(EINVAL,
					    "backend option image: control characters in it");
	switch (cb_backend_image_kind(spec)) {
	case CB_BACKEND_IMAGE_DIR:
		break;
	case CB_BACKEND_IMAGE_OCI:
		if ((rc = oci_split(spec, &path, &tag)) < 0)
			break;
		/* umoci takes the layout and its tag as one PATH:TAG argument */
		if (!*path || (tag && !*tag) || strchr(path, ':'))
			rc = cb_error_set(EINVAL,
					  "image %s: oci:PATH[:TAG] needs a layout path without "
					  "':' and a non-empty tag",
					  spec);
		break;
	case CB_BACKEND_IMAGE_STORE:
		/* never an option of podman's */
		if (!*store_name(spec) || *store_name(spec) == '-')
			rc = cb_error_set(EINVAL,
					  "image %s: a name in the local store, not empty and not "
					  "starting with '-'",
					  spec);
		break;
	}
	free(path);
	free(tag);
	return rc;
}

/* The last non-empty line of a tool's output, for an error message. */
static const char *last_line(char *s)
{
	char *end, *start;

	if (!s)
		return "no message";
	end = s + strlen(s);
	while (end > s && (end[-1] == '\n' || end[-1] == ' '))
		*--end = 0;
	start = strrchr(s, '\n');
	start = start ? start + 1 : s;
	/* umoci's lines start with spaces and a mark (U+2A2F) */
	start += strspn(start, " ");
	if (!strncmp(start, "\xe2\xa8\xaf", 3))
		start += 3 + strspn(start + 3, " ");
	return *start ? start : "no message";
}

/* Run a tool (podman, skopeo, umoci) with the daemon's environment minus credentials; 0 with
 * its stdout in *out (malloc'd) when it exits 0, else -fail (-errno when it could not run) and
 * a message naming the image, what was being done and the tool's last line. */
static int image_tool(const char *spec, const char *what, char *const *argv, int fail, char **out)
{
	struct cb_exec_spec es = {.argv = argv, .timeout = IMAGE_TOOL_TIMEOUT};
	struct cb_exec_result res = {0};
	char **env = NULL;
	int rc;

	if (out)
		*out = NULL;
	if ((rc = cb_exec_env_host_stripped(&env)) < 0)
		return rc;
	es.env = env;
	if ((rc = cb_exec_run(&es, &res)) < 0)
		rc = cb_error_wrap(rc, "image %s: %s: ", spec, what);
	else if (res.exit_code == 127 && !res.err_len)
		rc = cb_error_set(ENOENT, "image %s: %s: %s is not installed (scripts/setup)", spec,
				  what, argv[0]);
	else if (res.timed_out)
		rc = cb_error_set(ETIMEDOUT, "image %s: %s: timed out", spec, what);
	else if (res.exit_code)
		rc = cb_error_set(fail, "image %s: %s: %s", spec, what,
				  last_line(res.err_len ? res.err : res.out));
	else if (out && !(*out = strndup(res.out ? res.out : "", res.out_len)))
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
	cb_exec_result_free(&res);
	cb_exec_env_free(env);
	return rc;
}

/* "sha256:<64 lowercase hex>" into hex; anything else is refused, as the hex names paths. */
static int digest_hex(const char *spec, const char *what, const char *digest, char hex[65])
{
	if (!digest || strncmp(digest, "sha256:", 7) || strlen(digest + 7) != 64 ||
	    strspn(digest + 7, "0123456789abcdef") != 64)
		return cb_error_set(EINVAL, "image %s: %s: not a sha256 digest (%s)", spec, what,
				    digest ? digest : "none");
	memcpy(hex, digest + 7, 65);
	return 0;
}

static int load_json(const char *spec, const char *path, const char *what, json_t **out)
{
	json_error_t jerr;

	if (!(*out = json_load_file(path, 0, &jerr)))
		return cb_error_set(access(path, F_OK) ? ENOENT : EINVAL, "image %s: %s %s: %s",
				    spec, what, path, jerr.text);
	return 0;
}

/* The manifest descriptor of index.json that tag (or, without one, its only image) names. */
static int oci_pick(const char *spec, json_t *index, const char *tag, json_t **desc)
{
	json_t *ms = json_object_get(index, "manifests"), *m;
	size_t i, n = 0;

	*desc = NULL;
	json_array_foreach(ms, i, m)
	{
		const char *name = json_string_value(
		    json_object_get(json_object_get(m, "annotations"), OCI_REF_NAME));

		if (tag && name && !strcmp(name, tag))
			*desc = m;
		n++;
	}
	if (!tag && n == 1)
		*desc = json_array_get(ms, 0);
	if (*desc)
		return 0;
	if (tag)
		return cb_error_set(ENOENT, "image %s: no image tagged %s in the layout", spec,
				    tag);
	return cb_error_set(n ? EINVAL : ENOENT,
			    "image %s: the layout holds %zu images; name one with oci:PATH:TAG",
			    spec, n);
}

/* The manifest that tag (or, without one, the layout's only image, whose tag it then sets)
 * names in the OCI layout, after its oci-layout file and index.json. */
static int oci_manifest(const char *spec, const char *layout, char **tag, json_t **manifest)
{
	char path[4200], mhex[65];
	json_t *index = NULL, *desc;
	const char *name, *type;
	struct stat st;
	int rc;

	*manifest = NULL;
	if (stat(layout, &st) < 0)
		return cb_error_set(errno, "image %s: %s: %s", spec, layout, strerror(errno));
	snprintf(path, sizeof path, "%s/oci-layout", layout);
	if (!S_ISDIR(st.st_mode) || stat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return cb_error_set(EINVAL,
				    "image %s: %s is not an OCI image layout (no oci-layout file)",
				    spec, layout);
	snprintf(path, sizeof path, "%s/index.json", layout);
	if ((rc = load_json(spec, path, "not an OCI image layout:", &index)) < 0 ||
	    (rc = oci_pick(spec, index, *tag, &desc)) < 0)
		goto out;
	type = json_string_value(json_object_get(desc, "mediaType"));
	if (type && !strcmp(type, OCI_INDEX)) {
		rc = cb_error_set(EINVAL,
				  "image %s: an image index (several platforms); copy one "
				  "platform's image into a layout",
				  spec);
		goto out;
	}
	name =
	    json_string_value(json_object_get(json_object_get(desc, "annotations"), OCI_REF_NAME));
	if (!*tag && (!name || !(*tag = strdup(name)))) {
		rc = cb_error_set(EINVAL, "image %s: its one image has no tag (%s)", spec,
				  OCI_REF_NAME);
		goto out;
	}
	if ((rc = digest_hex(spec, "manifest", json_string_value(json_object_get(desc, "digest")),
			     mhex)) < 0)
		goto out;
	snprintf(path, sizeof path, "%s/blobs/sha256/%s", layout, mhex);
	rc = load_json(spec, path, "manifest", manifest);
out:
	json_decref(index);
	return rc;
}

/* The config digest's hex of the manifest. */
static int manifest_config_hex(const char *spec, json_t *manifest, char hex[65])
{
	return digest_hex(
	    spec, "config",
	    json_string_value(json_object_get(json_object_get(manifest, "config"), "digest")), hex);
}

/* An OCI layout: the manifest its tag names, and that manifest's config digest (the key: it
 * names the layers' contents, whatever the manifest's encoding). */
static int oci_resolve(const char *spec, struct image_ref *r)
{
	json_t *manifest = NULL;
	int rc;

	if ((rc = oci_split(spec, &r->layout, &r->tag)) < 0 ||
	    (rc = oci_manifest(spec, r->layout, &r->tag, &manifest)) < 0)
		goto out;
	rc = manifest_config_hex(spec, manifest, r->hex);
out:
	json_decref(manifest);
	return rc;
}

/* The registries.conf that names the registries cowbox pulls images from (the user's
 * configuration, in containers-registries.conf(5)'s form): $COWBOX_REGISTRIES_CONF, else
 * $COWBOX_HOME/registries.conf when it exists. *conf NULL: none, so never pull. */
static int registries_conf(const char *spec, char **conf)
{
	const char *env = getenv("COWBOX_REGISTRIES_CONF");
	char *home = NULL;
	int rc;

	*conf = NULL;
	if (env && *env)
		return (*conf = strdup(env))
			   ? 0
			   : cb_error_set(ENOMEM, "image %s: out of memory", spec);
	if ((rc = cb_ws_home(&home)) < 0)
		return rc;
	if (asprintf(conf, "%s/registries.conf", home) < 0) {
		*conf = NULL;
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
	} else if (access(*conf, F_OK) < 0) {
		free(*conf);
		*conf = NULL;
	}
	free(home);
	return rc;
}

/* NAME:TAG@sha256:... (as BoxLite writes a pinned image) is NAME@sha256:...: the digest names
 * the content, and podman refuses a tag beside it. */
static void drop_tag_before_digest(char *name)
{
	char *at = strchr(name, '@'), *colon, *slash;

	if (!at)
		return;
	*at = 0;
	colon = strrchr(name, ':');
	slash = strrchr(name, '/');
	*at = '@';
	if (colon && (!slash || colon > slash))
		memmove(colon, at, strlen(at) + 1);
}

/* A name in the local store: its image ID (the config digest) from podman. One the store lacks
 * is pulled into it (podman pull, by tag or by @sha256: digest) when a registries.conf of the
 * user's names where from; the store then keeps it, so the next use pulls nothing. A name
 * given as containers-storage:NAME is never pulled. */
static int store_resolve(const char *spec, struct image_ref *r)
{
	char confarg[4200];
	char *argv[] = {"env",	    confarg,   "podman", "image", "inspect",
			"--format", "{{.Id}}", "--",	 NULL,	  NULL};
	char *pull[] = {"env", confarg, "podman", "pull", "--quiet", "--", NULL, NULL};
	char *conf = NULL, *out = NULL, *line, id[80];
	char *const *inspect = argv + 2; /* podman alone, without a registries.conf */
	int rc;

	if (!(r->name = strdup(store_name(spec))))
		return cb_error_set(ENOMEM, "image %s: out of memory", spec);
	drop_tag_before_digest(r->name);
	argv[8] = pull[6] = r->name;
	if (strncmp(spec, STORE_PREFIX, strlen(STORE_PREFIX)) &&
	    (rc = registries_conf(spec, &conf)) < 0)
		return rc;
	if (conf) {
		snprintf(confarg, sizeof confarg, "CONTAINERS_REGISTRIES_CONF=%s", conf);
		inspect = argv;
	}
	rc = image_tool(spec, "not found in the local podman store", inspect, ENOENT, &out);
	if (rc == -ENOENT && conf) {
		/* "podman pull --quiet" prints the image ID last */
		rc = image_tool(spec, "not in the local podman store, and podman pull failed", pull,
				ENOENT, &out);
	}
	free(conf);
	if (rc < 0)
		return rc;
	while (*out && out[strlen(out) - 1] == '\n')
		out[strlen(out) - 1] = 0;
	line = strrchr(out, '\n');
	line = line ? line + 1 : out;
	snprintf(id, sizeof id, "sha256:%.*s", (int)strcspn(line, "\n"), line);
	free(out);
	return digest_hex(spec, "podman's image ID", id, r->hex);
}

/* The image's settings commands take from it, its config's Env and User, as <hex>.json beside
 * the root (written before the root is renamed into place, so a root always has one). */
static int settings_save(const char *spec, int dfd, struct image_ref *r)
{
	char path[4200], chex[65], tmp[100], name[80];
	json_t *manifest = NULL, *config = NULL, *out = json_object(), *env = json_array(), *v, *c;
	size_t i;
	int rc, fd = -1;

	if (!out || !env) {
		json_decref(env);
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
		goto out;
	}
	json_object_set_new(out, "env", env);
	if ((rc = oci_manifest(spec, r->layout, &r->tag, &manifest)) < 0 ||
	    (rc = manifest_config_hex(spec, manifest, chex)) < 0)
		goto out;
	snprintf(path, sizeof path, "%s/blobs/sha256/%s", r->layout, chex);
	if ((rc = load_json(spec, path, "config", &config)) < 0)
		goto out;
	c = json_object_get(config, "config");
	json_array_foreach(json_object_get(c, "Env"), i, v)
	{
		const char *e = json_string_value(v);

		if (e && strchr(e, '=') && *e != '=')
			json_array_append(env, v);
	}
	v = json_object_get(c, "User");
	if (json_is_string(v) && *json_string_value(v))
		json_object_set(out, "user", v);
	snprintf(tmp, sizeof tmp, "%s.json.tmp", r->hex);
	snprintf(name, sizeof name, "%s.json", r->hex);
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || json_dumpfd(out, fd, 0) < 0 || renameat(dfd, tmp, dfd, name) < 0)
		rc = cb_error_set(errno ? errno : EIO, "image %s: write its settings %s: %s", spec,
				  name, strerror(errno ? errno : EIO));
out:
	if (fd >= 0)
		close(fd);
	json_decref(manifest);
	json_decref(config);
	json_decref(out);
	return rc;
}

void cb_backend_image_config_free(struct cb_backend_image_config *c)
{
	if (!c)
		return;
	cb_exec_env_free(c->env);
	free(c->user);
	c->env = NULL;
	c->user = NULL;
}

/* <hex>.json into cfg; none (a root unpacked before settings were kept) is no settings. */
static int settings_load(const char *spec, int dfd, const char *hex,
			 struct cb_backend_image_config *cfg)
{
	char name[80];
	json_error_t jerr;
	json_t *j = NULL, *v;
	size_t i;
	int rc = 0, fd;

	snprintf(name, sizeof name, "%s.json", hex);
	if ((fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return errno == ENOENT
			   ? 0
			   : cb_error_set(errno, "image %s: %s: %s", spec, name, strerror(errno));
	if (!(j = json_loadfd(fd, 0, &jerr))) {
		rc = cb_error_set(EINVAL, "image %s: %s: %s", spec, name, jerr.text);
		goto out;
	}
	cfg->env = calloc(json_array_size(json_object_get(j, "env")) + 1, sizeof(char *));
	v = json_object_get(j, "user");
	if (!cfg->env || (json_is_string(v) && !(cfg->user = strdup(json_string_value(v))))) {
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
		goto out;
	}
	json_array_foreach(json_object_get(j, "env"), i, v)
	{
		if (json_is_string(v) && !(cfg->env[i] = strdup(json_string_value(v)))) {
			rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
			goto out;
		}
	}
out:
	if (rc)
		cb_backend_image_config_free(cfg);
	json_decref(j);
	close(fd);
	return rc;
}

/* Bytes (allocated) and inodes of the tree at dfd/name, by directory fd. */
struct tree_size {
	unsigned long long bytes, inodes;
};

static void tree_measure(int dfd, const char *name, struct tree_size *t)
{
	struct stat st;
	int fd;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	t->inodes++;
	t->bytes += (unsigned long long)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode) ||
	    (fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return;
	DIR *d = fdopendir(fd);
	struct dirent *de;

	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			tree_measure(dirfd(d), de->d_name, t);
	closedir(d);
}

/* One layer blob's listing, summed by tar and awk as it streams (no output to hold): "BYTES
 * ENTRIES", or "FAIL" when tar could not read it. */
static const char LAYER_MEASURE[] =
    "{ tar --numeric-owner -tvf \"$1\" || echo '//FAIL//'; } | awk '"
    "$0 == \"//FAIL//\" { bad = 1; next } "
    "{ n++; s += ($1 ~ /^-/ ? int(($3 + 4095) / 4096) * 4096 : 4096) } "
    "END { if (bad) print \"FAIL\"; else printf \"%.0f %.0f\\n\", s, n }'";

/* What the image's layers hold once unpacked, summed over its layers (a later layer's
 * whiteouts are not subtracted: an upper bound), refused over cap before umoci writes
 * anything. */
static int image_measure(const char *spec, const char *layout, const char *tag,
			 const struct cb_backend_image_cap *cap)
{
	char *t = strdup(tag ? tag : ""), *out = NULL, path[4400], hex[65];
	char *argv[] = {"sh", "-c", (char *)LAYER_MEASURE, "sh", path, NULL};
	unsigned long long bytes = 0, inodes = 0;
	json_t *manifest = NULL, *layer;
	size_t i;
	int rc;

	if (!t)
		return cb_error_set(ENOMEM, "image %s: out of memory", spec);
	if ((rc = oci_manifest(spec, layout, &t, &manifest)) < 0)
		goto out;
	json_array_foreach(json_object_get(manifest, "layers"), i, layer)
	{
		unsigned long long b = 0, n = 0;

		if ((rc = digest_hex(spec, "layer",
				     json_string_value(json_object_get(layer, "digest")), hex)) < 0)
			goto out;
		snprintf(path, sizeof path, "%s/blobs/sha256/%s", layout, hex);
		free(out);
		if ((rc = image_tool(spec, "measure a layer", argv, EIO, &out)) < 0)
			goto out;
		if (sscanf(out, "%llu %llu", &b, &n) != 2) {
			rc = cb_error_set(EIO,
					  "image %s: layer %.12s: tar cannot list it (damaged, or "
					  "compressed in a way tar does not know), so its unpacked "
					  "size cannot be checked against the cap",
					  spec, hex);
			goto out;
		}
		bytes += b;
		inodes += n;
		if ((cap->bytes && bytes > cap->bytes) || (cap->inodes && inodes > cap->inodes)) {
			rc = cb_error_set(
			    EFBIG,
			    "image %s: unpacked it would hold more than its cap (%llu "
			    "MiB, %llu inodes; so far %llu MiB, %llu inodes, at layer "
			    "%zu of %zu): refused before unpacking (backend options "
			    "image_max_mb, disk_mb, disk_inodes)",
			    spec, cap->bytes >> 20, cap->inodes, bytes >> 20, inodes, i + 1,
			    json_array_size(json_object_get(manifest, "layers")));
			goto out;
		}
	}
out:
	json_decref(manifest);
	free(out);
	free(t);
	return rc;
}

/* Under the digest's lock, with <hex> absent: copy (a store image) and unpack into <hex>.tmp,
 * then rename its rootfs to <hex>. A <hex>.tmp found here is a killed unpack's: removed, as is
 * this one's when it fails. */
static int image_unpack(const char *spec, const char *images, int dfd, struct image_ref *r,
			const struct cb_backend_image_cap *cap)
{
	char tmp[80], tmp_root[100], path[4400], layout_arg[4400], src[100], root_arg[4400];
	char *copy[] = {"skopeo", "copy", "--quiet", src, layout_arg, NULL};
	char *unpack[] = {"umoci", "raw", "unpack", "--image", layout_arg, root_arg, NULL, NULL};
	int rc;

	snprintf(tmp, sizeof tmp, "%s.tmp", r->hex);
	snprintf(tmp_root, sizeof tmp_root, "%s/rootfs", tmp);
	if ((rc = cb_beneath_remove_tree(dfd, tmp)) < 0 ||
	    (rc = cb_beneath_mkdir(dfd, tmp, 0700)) < 0) {
		rc = cb_error_wrap(rc, "image %s: %s/: ", spec, images);
		goto out;
	}
	if (!r->layout) {
		snprintf(path, sizeof path, "%s/%s/layout", images, tmp);
		if (!(r->layout = strdup(path)) || !(r->tag = strdup(STORE_TAG))) {
			rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
			goto out;
		}
		snprintf(src, sizeof src, STORE_PREFIX "%s", r->hex);
		snprintf(layout_arg, sizeof layout_arg, "oci:%s:%s", r->layout, r->tag);
		if ((rc = image_tool(spec, "skopeo copy out of the local store", copy, EIO, NULL)) <
		    0)
			goto out;
	}
	if (cap && (cap->bytes || cap->inodes) &&
	    (rc = image_measure(spec, r->layout, r->tag, cap)) < 0)
		goto out;
	snprintf(layout_arg, sizeof layout_arg, "%s:%s", r->layout, r->tag);
	snprintf(root_arg, sizeof root_arg, "%s/%s", images, tmp_root);
	/* not root: owners as they can be (umoci maps them to the caller) */
	if (geteuid() != 0) {
		unpack[6] = unpack[5];
		unpack[5] = "--rootless";
	}
	if ((rc = image_tool(spec, "umoci unpack failed", unpack, EIO, NULL)) < 0)
		goto out;
	/* What umoci wrote, counted again: a root well over its cap is never kept. The listing
	 * kept the disk from filling; this checks the result, in allocated blocks (an eighth
	 * of slack: directories and extents cost a little more than the listing counts). */
	if (cap && (cap->bytes || cap->inodes)) {
		struct tree_size t = {0};

		tree_measure(dfd, tmp_root, &t);
		if ((cap->bytes && t.bytes > cap->bytes + cap->bytes / 8) ||
		    (cap->inodes && t.inodes > cap->inodes + cap->inodes / 8)) {
			rc = cb_error_set(EFBIG,
					  "image %s: unpacked it holds %llu MiB, %llu inodes, more "
					  "than its cap (%llu MiB, %llu inodes): removed",
					  spec, t.bytes >> 20, t.inodes, cap->bytes >> 20,
					  cap->inodes);
			goto out;
		}
	}
	if ((rc = settings_save(spec, dfd, r)) < 0)
		goto out;
	/* the root's files on disk before its name says it is complete */
	if (syncfs(dfd) < 0) {
		rc = cb_error_set(errno, "image %s: syncfs %s: %s", spec, images, strerror(errno));
		goto out;
	}
	if (renameat(dfd, tmp_root, dfd, r->hex) < 0)
		rc = cb_error_set(errno, "image %s: rename into %s/%s: %s", spec, images, r->hex,
				  strerror(errno));
out:
	/* what is left of the temporary directory; a failure to remove it keeps rc's message */
	if (cb_beneath_remove_tree(dfd, tmp) < 0 && !rc)
		rc = cb_error_wrap(-EIO, "image %s: ", spec);
	return rc;
}

/* $COWBOX_HOME/images, made if missing, and an fd of it. */
static int images_dir(const char *spec, char **images, int *dfd)
{
	char *home = NULL;
	int rc = cb_ws_home(&home);

	*images = NULL;
	*dfd = -1;
	if (rc < 0)
		return rc;
	if (mkdir(home, 0700) < 0 && errno != EEXIST) {
		rc = cb_error_set(errno, "image %s: mkdir %s: %s", spec, home, strerror(errno));
		goto out;
	}
	if (asprintf(images, "%s/images", home) < 0) {
		*images = NULL;
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
		goto out;
	}
	if (mkdir(*images, 0700) < 0 && errno != EEXIST) {
		rc = cb_error_set(errno, "image %s: mkdir %s: %s", spec, *images, strerror(errno));
		goto out;
	}
	if ((*dfd = open(*images, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = cb_error_set(errno, "image %s: open %s: %s", spec, *images, strerror(errno));
out:
	free(home);
	return rc;
}

void cb_backend_image_cap_of(const struct cb_backend_options *o, struct cb_backend_image_cap *out)
{
	struct cb_backend_options none = {0};
	struct cb_backend_limits lim;

	cb_backend_limits_of(o ? o : &none, &lim);
	out->inodes = lim.disk_inodes;
	if (o && o->image_max_mb == CB_BACKEND_NO_LIMIT)
		out->bytes = 0;
	else if (o && o->image_max_mb)
		out->bytes = (unsigned long long)o->image_max_mb << 20;
	else
		out->bytes = lim.disk_bytes;
}

int cb_backend_image_root(const char *spec, char **root, struct cb_backend_image_config *cfg)
{
	struct cb_backend_image_cap cap;

	cb_backend_image_cap_of(NULL, &cap);
	return cb_backend_image_root_capped(spec, &cap, root, cfg, NULL);
}

int cb_backend_image_root_capped(const char *spec, const struct cb_backend_image_cap *cap,
				 char **root, struct cb_backend_image_config *cfg, int *hold)
{
	enum cb_backend_image_kind kind = cb_backend_image_kind(spec);
	struct image_ref r = {0};
	char *images = NULL, lock[80];
	struct stat st;
	int rc, dfd = -1, lfd = -1;

	*root = NULL;
	if (hold)
		*hold = -1;
	if (cfg)
		*cfg = (struct cb_backend_image_config){0};
	if ((rc = cb_backend_image_check(spec)) < 0)
		return rc;
	if (kind == CB_BACKEND_IMAGE_DIR) {
		if (stat(spec, &st) < 0)
			return cb_error_set(errno, "image %s: %s", spec, strerror(errno));
		if (!S_ISDIR(st.st_mode))
			return cb_error_set(ENOTDIR, "image %s: not a directory", spec);
		return (*root = strdup(spec)) ? 0 : cb_error_set(ENOMEM, "image: out of memory");
	}
	if ((rc = kind == CB_BACKEND_IMAGE_OCI ? oci_resolve(spec, &r) : store_resolve(spec, &r)) <
		0 ||
	    (rc = images_dir(spec, &images, &dfd)) < 0)
		goto out;
	snprintf(lock, sizeof lock, "%s.lock", r.hex);
	if ((lfd = openat(dfd, lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		rc = cb_error_set(errno, "image %s: lock %s/%s: %s", spec, images, lock,
				  strerror(errno));
		goto out;
	}
	/* The digest's lock: shared while a root is used (held: a backend's state, a sandbox's
	 * life; prune takes it exclusively without waiting, so it leaves a held root alone),
	 * exclusive to unpack a missing one. flock's change between the two is not atomic: the
	 * root is looked for again under the shared lock after each unpack. */
	for (int tries = 0;; tries++) {
		if (flock(lfd, LOCK_SH) < 0) {
			rc = cb_error_set(errno, "image %s: lock %s/%s: %s", spec, images, lock,
					  strerror(errno));
			goto out;
		}
		if (fstatat(dfd, r.hex, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
			break;
		if (tries == 3) {
			rc = cb_error_set(EAGAIN, "image %s: its root kept being pruned", spec);
			goto out;
		}
		if (flock(lfd, LOCK_EX) < 0) {
			rc = cb_error_set(errno, "image %s: lock %s/%s: %s", spec, images, lock,
					  strerror(errno));
			goto out;
		}
		if ((fstatat(dfd, r.hex, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)) &&
		    (rc = image_unpack(spec, images, dfd, &r, cap)) < 0)
			goto out;
	}
	if (hold) {
		*hold = lfd;
		lfd = -1;
	}
	if (!rc && cfg)
		rc = settings_load(spec, dfd, r.hex, cfg);
	if (!rc && asprintf(root, "%s/%s", images, r.hex) < 0) {
		*root = NULL;
		rc = cb_error_set(ENOMEM, "image %s: out of memory", spec);
	}
out:
	if (lfd >= 0)
		close(lfd);
	if (dfd >= 0)
		close(dfd);
	free(images);
	free(r.layout);
	free(r.tag);
	free(r.name);
	return rc;
}

/* Is name an unpacked root's ("<64 lowercase hex>")? */
static int root_name(const char *name)
{
	size_t n = strspn(name, "0123456789abcdef");

	return n == 64 && !name[64];
}

/* The roots the workspaces' image options resolve to now, as a JSON object {hex: [refs]}. */
struct image_users {
	json_t *by_hex;
};

static int image_user(const struct cb_ws_info *info, void *arg)
{
	struct image_users *u = arg;
	struct cb_backend_options o;
	struct image_ref r = {0};
	enum cb_backend_image_kind kind;
	int rc;

	if (cb_backend_options_load(info->dir, &o) < 0) {
		cb_error_clear(); /* a workspace being made or removed: it uses nothing yet */
		return 0;
	}
	if (o.image && cb_backend_find(o.kind)->image_root &&
	    (kind = cb_backend_image_kind(o.image)) != CB_BACKEND_IMAGE_DIR) {
		rc = kind == CB_BACKEND_IMAGE_OCI ? oci_resolve(o.image, &r)
						  : store_resolve(o.image, &r);
		if (rc == 0) {
			json_t *refs = json_object_get(u->by_hex, r.hex);

			if (!refs)
				json_object_set_new(u->by_hex, r.hex, refs = json_array());
			json_array_append_new(refs, json_string(info->ref));
		} else {
			cb_error_clear(); /* an image it can no longer resolve: it uses no root */
		}
	}
	free(r.layout);
	free(r.tag);
	free(r.name);
	cb_backend_options_free(&o);
	return 0;
}

/* images/ opened to be walked (its path *images, an fd *dfd, a stream *d), and in u the
 * workspaces that use each root; spec names the command in errors. images_scan_close
 * releases them, also on error. */
static int images_scan_open(const char *spec, struct image_users *u, char **images, int *dfd,
			    DIR **d)
{
	int rc;

	*d = NULL;
	if ((rc = images_dir(spec, images, dfd)) < 0 || (rc = cb_ws_list(image_user, u)) < 0)
		return rc;
	if (!(*d = opendir(*images)))
		return cb_error_set(errno, "image %s: %s: %s", spec, *images, strerror(errno));
	return 0;
}

/* What images_scan_open gave (any part of it may be unset), released. */
static void images_scan_close(struct image_users *u, char *images, int dfd, DIR *d)
{
	if (d)
		closedir(d);
	if (dfd >= 0)
		close(dfd);
	free(images);
	json_decref(u->by_hex);
}

int cb_backend_image_list(json_t **out)
{
	struct image_users u = {.by_hex = json_object()};
	json_t *list = json_array();
	char *images = NULL;
	int rc, dfd = -1;
	DIR *d = NULL;
	struct dirent *de;

	*out = NULL;
	if ((rc = images_scan_open("ls", &u, &images, &dfd, &d)) < 0)
		goto out;
	while ((de = readdir(d))) {
		struct tree_size t = {0};
		struct stat st;
		json_t *refs;

		if (!root_name(de->d_name) ||
		    fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
			continue;
		tree_measure(dfd, de->d_name, &t);
		refs = json_object_get(u.by_hex, de->d_name);
		json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:o}", "id", de->d_name,
						      "bytes", (json_int_t)t.bytes, "inodes",
						      (json_int_t)t.inodes, "workspaces",
						      refs ? json_incref(refs) : json_array()));
	}
	*out = json_pack("{s:s, s:O}", "dir", images, "images", list);
	if (!*out)
		rc = cb_error_set(ENOMEM, "image ls: out of memory");
out:
	images_scan_close(&u, images, dfd, d);
	json_decref(list);
	return rc;
}

/* Remove images/<name> (a root or a killed unpack's leftover) if its lock is free: taken
 * exclusively without waiting (a backend holding the root, or an unpack of it, keeps it), the
 * root renamed out of its name first (an image_root waiting on the lock then finds it gone
 * and unpacks it again), then removed. 1 if removed, 0 if in use, -errno. */
static int prune_one(int dfd, const char *images, const char *name, const char *hex,
		     unsigned long long *bytes)
{
	char lock[80], gone[80];
	struct tree_size t = {0};
	int lfd, rc = 0;

	snprintf(lock, sizeof lock, "%s.lock", hex);
	snprintf(gone, sizeof gone, "%s.pruned", hex);
	if ((lfd = openat(dfd, lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return cb_error_set(errno, "image prune: %s/%s: %s", images, lock, strerror(errno));
	if (flock(lfd, LOCK_EX | LOCK_NB) < 0) {
		rc = errno == EWOULDBLOCK ? 0
					  : cb_error_set(errno, "image prune: lock %s/%s: %s",
							 images, lock, strerror(errno));
		goto out;
	}
	if (root_name(name) && renameat(dfd, name, dfd, gone) < 0) {
		rc = errno == ENOENT ? 0
				     : cb_error_set(errno, "image prune: rename %s/%s: %s", images,
						    name, strerror(errno));
		goto out;
	}
	tree_measure(dfd, root_name(name) ? gone : name, &t);
	if ((rc = cb_beneath_remove_tree(dfd, root_name(name) ? gone : name)) < 0)
		goto out;
	if (root_name(name)) {
		char settings[80];

		snprintf(settings, sizeof settings, "%s.json", hex);
		unlinkat(dfd, settings, 0); /* its Env and User, beside it */
	}
	*bytes += t.bytes;
	rc = 1;
out:
	close(lfd);
	return rc;
}

int cb_backend_image_prune(json_t **out)
{
	struct image_users u = {.by_hex = json_object()};
	json_t *removed = json_array();
	unsigned long long bytes = 0;
	char *images = NULL, hex[65];
	int rc, dfd = -1;
	DIR *d = NULL;
	struct dirent *de;

	*out = NULL;
	if ((rc = images_scan_open("prune", &u, &images, &dfd, &d)) < 0)
		goto out;
	while ((de = readdir(d))) {
		size_t n = strlen(de->d_name);
		struct stat st;
		int r;

		/* roots no workspace uses, a killed unpack's <hex>.tmp, a killed prune's
		 * <hex>.pruned */
		if (n < 64 || strspn(de->d_name, "0123456789abcdef") != 64 ||
		    (n > 64 && strcmp(de->d_name + 64, ".tmp") &&
		     strcmp(de->d_name + 64, ".pruned")))
			continue;
		memcpy(hex, de->d_name, 64);
		hex[64] = 0;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(st.st_mode) || (n == 64 && json_object_get(u.by_hex, hex)))
			continue;
		if ((r = prune_one(dfd, images, de->d_name, hex, &bytes)) < 0) {
			rc = r;
			goto out;
		}
		if (r == 1 && n == 64)
			json_array_append_new(removed, json_string(hex));
	}
	if (!(*out = json_pack("{s:O, s:I}", "removed", removed, "bytes", (json_int_t)bytes)))
		rc = cb_error_set(ENOMEM, "image prune: out of memory");
out:
	images_scan_close(&u, images, dfd, d);
	json_decref(removed);
	return rc;
}
