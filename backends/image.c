/* The ns backend's root images: an OCI layout or a name in the local podman store (pulled into
 * it from the user's registries), resolved to its config digest, unpacked once into
 * $COWBOX_HOME/images/<hex>. */
#include "config.h"

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

/* Under the digest's lock, with <hex> absent: copy (a store image) and unpack into <hex>.tmp,
 * then rename its rootfs to <hex>. A <hex>.tmp found here is a killed unpack's: removed, as is
 * this one's when it fails. */
static int image_unpack(const char *spec, const char *images, int dfd, struct image_ref *r)
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
	snprintf(layout_arg, sizeof layout_arg, "%s:%s", r->layout, r->tag);
	snprintf(root_arg, sizeof root_arg, "%s/%s", images, tmp_root);
	/* not root: owners as they can be (umoci maps them to the caller) */
	if (geteuid() != 0) {
		unpack[6] = unpack[5];
		unpack[5] = "--rootless";
	}
	if ((rc = image_tool(spec, "umoci unpack failed", unpack, EIO, NULL)) < 0 ||
	    (rc = settings_save(spec, dfd, r)) < 0)
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

int cb_backend_image_root(const char *spec, char **root, struct cb_backend_image_config *cfg)
{
	enum cb_backend_image_kind kind = cb_backend_image_kind(spec);
	struct image_ref r = {0};
	char *images = NULL, lock[80];
	struct stat st;
	int rc, dfd = -1, lfd = -1;

	*root = NULL;
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
	if ((lfd = openat(dfd, lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0 ||
	    flock(lfd, LOCK_EX) < 0) {
		rc = cb_error_set(errno, "image %s: lock %s/%s: %s", spec, images, lock,
				  strerror(errno));
		goto out;
	}
	if (fstatat(dfd, r.hex, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
		rc = image_unpack(spec, images, dfd, &r);
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
