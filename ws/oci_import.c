/* cowbox create --from: a workspace rebuilt from a cowbox export in an OCI layout: its base,
 * then each turn's rows and blobs, every map digest checked, built unseen and published last. */
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
#include "oci_read.h"
#include "turns_int.h"
#include "ws.h"

struct imp {
	const struct cb_oci_import_args *a;
	int layout_fd;
	json_t *manifest, *config, *meta;
	char *base;	   /* the new workspace's base (NULL: empty) */
	char *base_tmp;	   /* bases/.tmp-... being unpacked, removed unless renamed */
	int base_fresh;	   /* base was unpacked by this import (removed if it fails) */
	int bases_lock;	   /* bases.lock, held shared: no prune removes the base meanwhile */
	char *dir;	   /* the staging directory */
	unsigned long ids; /* the workspace's host id range; 0: none */
	struct cb_turns *t;
};

/* ---- the base ---- */

struct dir_mode {
	char *path;
	unsigned mode;
};

static int base_file(struct archive *ar, int root, const char *rel, struct archive_entry *ae)
{
	struct timespec ts[2] = {{0, UTIME_OMIT},
				 {archive_entry_mtime(ae), archive_entry_mtime_nsec(ae)}};
	const void *buf;
	size_t n;
	la_int64_t off;
	int fd = cb_beneath_open(root, rel, O_WRONLY | O_CREAT | O_EXCL, 0600), r, ret = 0;

	if (fd < 0)
		return cb_error_wrap(fd, "unpack the base");
	while ((r = archive_read_data_block(ar, &buf, &n, &off)) == ARCHIVE_OK) {
		if (pwrite(fd, buf, n, off) != (ssize_t)n) {
			ret = cb_error_set(errno ? errno : EIO, "unpack %s: %s", rel,
					   strerror(errno));
			break;
		}
	}
	if (!ret && r != ARCHIVE_EOF)
		ret = cb_error_set(EBADMSG, "unpack %s: %s", rel, archive_error_string(ar));
	if (!ret && ftruncate(fd, archive_entry_size(ae)) < 0)
		ret = cb_error_set(errno, "unpack %s: %s", rel, strerror(errno));
	if (!ret && fchmod(fd, archive_entry_perm(ae) & 07777) < 0)
		ret = cb_error_set(errno, "unpack %s: chmod: %s", rel, strerror(errno));
	if (!ret && futimens(fd, ts) < 0)
		ret = cb_error_set(errno, "unpack %s: time: %s", rel, strerror(errno));
	close(fd);
	return ret;
}

/* Unpack the base layer into root (an empty directory of ours, reached only beneath it). */
static int base_unpack(struct imp *m, json_t *desc, int root)
{
	struct oci_layer_in li = {.fd = -1};
	struct archive_entry *ae;
	struct dir_mode *dirs = NULL;
	size_t ndirs = 0;
	int ret = oci_layer_open(m->layout_fd, desc, &li), r;

	while (!ret && (r = archive_read_next_header(li.ar, &ae)) == ARCHIVE_OK) {
		unsigned type = archive_entry_filetype(ae);
		char *rel;
		const char *slash;

		if ((ret = oci_entry_check(ae, li.digest, &rel)))
			break;
		slash = strrchr(rel, '/');
		if (!strncmp(slash ? slash + 1 : rel, ".wh.", 4)) {
			ret = cb_error_set(EBADMSG, "the base layer holds a whiteout (%s)", rel);
		} else if (!*rel) {
			/* workspace/ itself: the base directory */
			if (type != AE_IFDIR)
				ret = cb_error_set(EBADMSG, OCI_ROOT "/ is no directory");
		} else if (type == AE_IFDIR) {
			struct dir_mode *d = realloc(dirs, (ndirs + 1) * sizeof(*d));

			ret = cb_beneath_mkdir(root, rel, 0700);
			if (ret == -EEXIST)
				ret = 0;
			if (!ret && !d)
				ret = cb_error_set(ENOMEM, "out of memory");
			if (!ret) {
				dirs = d;
				dirs[ndirs].path = rel;
				dirs[ndirs++].mode = archive_entry_perm(ae) & 07777;
				rel = NULL;
			}
		} else if (type == AE_IFLNK) {
			ret = cb_beneath_symlink(root, archive_entry_symlink(ae) ?: "", rel);
		} else {
			ret = base_file(li.ar, root, rel, ae);
		}
		if (ret)
			ret = cb_error_wrap(ret, "the base layer");
		free(rel);
	}
	if (!ret && r != ARCHIVE_EOF)
		ret = cb_error_set(EBADMSG, "the base layer: %s", archive_error_string(li.ar));
	if (!ret)
		ret = oci_layer_verify(&li);
	/* modes last, deepest first: a directory without write permission still got its
	 * children */
	for (size_t i = ndirs; i-- > 0;) {
		int fd = ret ? -1 : cb_beneath_open(root, dirs[i].path, O_RDONLY | O_DIRECTORY, 0);

		if (!ret && (fd < 0 || fchmod(fd, dirs[i].mode) < 0))
			ret = fd < 0 ? fd
				     : cb_error_set(errno, "chmod %s: %s", dirs[i].path,
						    strerror(errno));
		if (fd >= 0)
			close(fd);
		free(dirs[i].path);
	}
	free(dirs);
	oci_layer_close(&li);
	return ret;
}

/* Staging directories of bases whose unpacking process died. */
static void bases_sweep(const char *bases)
{
	DIR *d = opendir(bases);
	struct dirent *de;
	char *path;
	int pid;

	while (d && (de = readdir(d))) {
		if (sscanf(de->d_name, ".tmp-%d-", &pid) != 1 || pid <= 0 ||
		    !(kill(pid, 0) < 0 && errno == ESRCH))
			continue;
		if (!ws_pathf(&path, "%s/%s", bases, de->d_name)) {
			ws_delete_tree(path);
			free(path);
		}
	}
	if (d)
		closedir(d);
	cb_error_clear();
}

/* The base the workspace gets: --base, none, or $COWBOX_HOME/bases/<turn 0's map digest>
 * (shared by every import of the same base; its map is checked like any other). */
static int base_choose(struct imp *m, json_t *desc)
{
	json_t *b = json_object_get(m->meta, "base");
	const char *hex = json_string_value(json_object_get(b, "map"));
	char *home = NULL, *bases = NULL, *final = NULL;
	struct stat st;
	int ret = 0, root;

	if (!hex || strlen(hex) != 64 || strspn(hex, "0123456789abcdef") != 64)
		return cb_error_set(EBADMSG, "the export names no base map digest");
	if (m->a->base) {
		if (!(m->base = realpath(m->a->base, NULL)))
			return cb_error_set(errno, "--base %s: %s", m->a->base, strerror(errno));
		return 0;
	}
	if (json_is_true(json_object_get(b, "empty")))
		return 0;
	if ((ret = cb_ws_home(&home)) || (ret = ws_pathf(&bases, "%s/bases", home)) ||
	    (ret = ws_pathf(&final, "%s/%s", bases, hex)))
		goto out;
	if ((ret = ws_mkdir_home(home)))
		goto out;
	if (mkdir(bases, 0755) < 0 && errno != EEXIST) {
		ret = cb_error_set(errno, "mkdir %s: %s", bases, strerror(errno));
		goto out;
	}
	if ((m->bases_lock = oci_bases_hold(bases)) < 0) {
		ret = m->bases_lock;
		goto out;
	}
	bases_sweep(bases);
	if (stat(final, &st) == 0 && S_ISDIR(st.st_mode)) {
		m->base = final; /* unpacked by an earlier import; its map is checked below */
		final = NULL;
		goto out;
	}
	if (m->a->log)
		fprintf(m->a->log, "cowbox: unpacking the base into %s\n", final);
	if ((ret = ws_pathf(&m->base_tmp, "%s/.tmp-%d-%s", bases, (int)getpid(), hex)))
		goto out;
	if (mkdir(m->base_tmp, 0755) < 0) {
		ret = cb_error_set(errno, "mkdir %s: %s", m->base_tmp, strerror(errno));
		goto out;
	}
	if ((root = open(m->base_tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		ret = cb_error_set(errno, "open %s: %s", m->base_tmp, strerror(errno));
		goto out;
	}
	ret = base_unpack(m, desc, root);
	close(root);
	if (!ret && rename(m->base_tmp, final) < 0 && errno != EEXIST && errno != ENOTEMPTY)
		ret = cb_error_set(errno, "rename to %s: %s", final, strerror(errno));
	if (!ret) {
		ws_delete_tree(m->base_tmp); /* another import renamed the same base first */
		m->base = final;
		m->base_fresh = 1;
		final = NULL;
	}
out:
	free(home);
	free(bases);
	free(final);
	return ret;
}

/* ---- the turns ---- */

struct turn_in {
	long long turn;
	struct cb_entry *e; /* sorted by path */
	unsigned char *seen;
	size_t n;
};

static int entry_cmp(const void *a, const void *b)
{
	return strcmp(((const struct cb_entry *)a)->path, ((const struct cb_entry *)b)->path);
}

static struct cb_entry *turn_find(struct turn_in *ti, const char *path)
{
	struct cb_entry key = {.path = (char *)path};

	return bsearch(&key, ti->e, ti->n, sizeof(key), entry_cmp);
}

static void turn_free(struct turn_in *ti)
{
	for (size_t i = 0; i < ti->n; i++)
		cb_entry_clear(&ti->e[i]);
	free(ti->e);
	free(ti->seen);
}

static int turn_parse(json_t *tj, struct turn_in *ti)
{
	json_t *entries = json_object_get(tj, "entries"), *ej;
	size_t i, n = json_array_size(entries);
	int ret = 0;

	ti->turn = json_integer_value(json_object_get(tj, "turn"));
	ti->e = calloc(n + 1, sizeof(*ti->e));
	ti->seen = calloc(n + 1, 1);
	if (!ti->e || !ti->seen)
		return cb_error_set(ENOMEM, "out of memory");
	ti->n = n;
	json_array_foreach(entries, i, ej) if (!ret) ret = oci_entry_parse(ej, &ti->e[i]);
	if (ret)
		return ret;
	qsort(ti->e, ti->n, sizeof(*ti->e), entry_cmp);
	for (i = 0; i + 1 < ti->n; i++)
		if (!strcmp(ti->e[i].path, ti->e[i + 1].path))
			return cb_error_set(EBADMSG, "the change list names %s twice",
					    ti->e[i].path);
	for (i = 0; i < ti->n; i++)
		if (cb_beneath_check(ti->e[i].path))
			return cb_error_wrap(-EXDEV, "the change list");
	return 0;
}

/* A file's bytes from the layer into the blob store, kept only if they are e's. */
static int turn_blob(struct imp *m, struct archive *ar, const struct cb_entry *e)
{
	char tmp[64];
	const void *buf;
	size_t n;
	la_int64_t off;
	struct cb_hash h;
	long long size = 0;
	int fd = cb_ws_blob_tmp(m->t->blob_fd, tmp), r, ret = 0;

	if (fd < 0)
		return fd;
	while ((r = archive_read_data_block(ar, &buf, &n, &off)) == ARCHIVE_OK)
		if (pwrite(fd, buf, n, off) != (ssize_t)n) {
			ret = cb_error_set(errno ? errno : EIO, "blob %s: %s", e->path,
					   strerror(errno));
			break;
		}
	if (!ret && r != ARCHIVE_EOF)
		ret = cb_error_set(EBADMSG, "%s: %s", e->path, archive_error_string(ar));
	if (!ret && ftruncate(fd, e->size) < 0)
		ret = cb_error_set(errno, "blob %s: %s", e->path, strerror(errno));
	if (!ret && lseek(fd, 0, SEEK_SET) == 0)
		ret = cb_ws_hash_fd(fd, -1, &h, &size);
	if (!ret && (size != e->size || memcmp(h.sha256, e->sha256, CB_SHA256_LEN) ||
		     memcmp(h.xxh3, e->xxh3, CB_XXH128_LEN)))
		ret = cb_error_set(EBADMSG,
				   "%s: the layer's bytes are not the ones its change list "
				   "records",
				   e->path);
	close(fd);
	if (!ret)
		return cb_ws_blob_publish(m->t->blob_fd, tmp, e->xxh3);
	unlinkat(m->t->blob_fd, tmp, 0);
	return ret;
}

/* Each tar entry of a turn's layer must be one its change list records (or a whiteout of a
 * path it records gone); files become blobs. */
static int turn_layer(struct imp *m, json_t *desc, struct turn_in *ti)
{
	struct oci_layer_in li = {.fd = -1};
	struct archive_entry *ae;
	int ret = oci_layer_open(m->layout_fd, desc, &li), r;

	while (!ret && (r = archive_read_next_header(li.ar, &ae)) == ARCHIVE_OK) {
		unsigned type = archive_entry_filetype(ae);
		const char *slash, *base;
		struct cb_entry *e = NULL;
		char *rel, *gone = NULL;

		if ((ret = oci_entry_check(ae, li.digest, &rel)))
			break;
		slash = strrchr(rel, '/');
		base = slash ? slash + 1 : rel;
		if (!strcmp(base, ".wh..wh..opq")) {
			gone = strndup(rel, slash ? (size_t)(slash - rel) : 0);
			e = gone ? turn_find(ti, gone) : NULL;
			if (!e || e->type != CB_ENTRY_DIR)
				ret = cb_error_set(EBADMSG,
						   "an opaque marker below %s, which the "
						   "turn records as no new directory",
						   gone ? gone : "");
		} else if (!strncmp(base, ".wh.", 4)) {
			if (asprintf(&gone, "%.*s%s", slash ? (int)(slash - rel + 1) : 0, rel,
				     base + 4) < 0)
				gone = NULL;
			e = gone ? turn_find(ti, gone) : NULL;
			if (!e || e->type != CB_ENTRY_ABSENT)
				ret = cb_error_set(EBADMSG,
						   "a whiteout of %s, which the turn does "
						   "not record as deleted",
						   gone ? gone : "");
		} else if (!*rel && type != AE_IFDIR) {
			ret = cb_error_set(EBADMSG, OCI_ROOT "/ is no directory");
		} else if (*rel && !(e = turn_find(ti, rel))) {
			ret = cb_error_set(EBADMSG, "%s is not in the turn's change list", rel);
		} else if (e && !((type == AE_IFREG && e->type == CB_ENTRY_FILE) ||
				  (type == AE_IFDIR && e->type == CB_ENTRY_DIR) ||
				  (type == AE_IFLNK && e->type == CB_ENTRY_SYMLINK &&
				   !strcmp(archive_entry_symlink(ae) ?: "", e->target)))) {
			ret = cb_error_set(EBADMSG, "%s is not what the change list records", rel);
		} else if (e && e->type == CB_ENTRY_FILE) {
			ret = turn_blob(m, li.ar, e);
			ti->seen[e - ti->e] = 1;
		}
		free(gone);
		free(rel);
	}
	if (!ret && r != ARCHIVE_EOF)
		ret = cb_error_set(EBADMSG, "%s", archive_error_string(li.ar));
	if (!ret)
		ret = oci_layer_verify(&li);
	oci_layer_close(&li);
	return ret ? cb_error_wrap(ret, "layer of turn %lld", ti->turn) : 0;
}

/* Record the turn's rows, then check its map against the export's digest. */
static int turn_record(struct imp *m, json_t *tj, struct turn_in *ti, long long prev,
		       struct oci_sum *sum)
{
	const char *want = json_string_value(json_object_get(tj, "map"));
	struct cb_entry old = {0}, cur = {0};
	char hex[65];
	int ret = cb_db_turns_begin(m->t->db), intx = !ret;

	for (size_t i = 0; i < ti->n && !ret; i++)
		ret = cb_db_turns_delta_put(m->t->db, ti->turn, &ti->e[i]);
	if (!ret)
		ret = cb_db_turns_add(m->t->db, ti->turn,
				      json_real_value(json_object_get(tj, "time")),
				      json_string_value(json_object_get(tj, "label")),
				      json_integer_value(json_object_get(tj, "changes")));
	if (!ret && !(ret = cb_db_turns_commit(m->t->db)))
		intx = 0;
	if (intx)
		cb_db_turns_rollback(m->t->db);
	for (size_t i = 0; i < ti->n && !ret; i++) {
		if ((ret = ws_entry_at(m->t, ti->e[i].path, prev, &old)) ||
		    (ret = ws_entry_at(m->t, ti->e[i].path, ti->turn, &cur)))
			break;
		oci_sum_entry(sum, &old, -1);
		oci_sum_entry(sum, &cur, 1);
		/* a file the layer left out must lie below what is no directory at the turn */
		if (cur.type == CB_ENTRY_FILE && !ti->seen[i] &&
		    !cb_ws_blob_has(m->t->blob_fd, cur.xxh3)) {
			const char *slash = strrchr(cur.path, '/');
			struct cb_entry p = {0};
			char *parent = slash ? strndup(cur.path, (size_t)(slash - cur.path)) : NULL;

			if (slash && parent)
				ret = ws_entry_at(m->t, parent, ti->turn, &p);
			if (!ret && (!slash || p.type == CB_ENTRY_DIR))
				ret = cb_error_set(EBADMSG, "the layer lacks the content of %s",
						   cur.path);
			cb_entry_clear(&p);
			free(parent);
		}
	}
	cb_entry_clear(&old);
	cb_entry_clear(&cur);
	if (ret)
		return ret;
	oci_sum_hex(sum, hex);
	if (!want || strcmp(want, hex))
		return cb_error_set(EBADMSG, "turn %lld: its map digest is %s, the export says %s",
				    ti->turn, hex, want ? want : "nothing");
	return 0;
}

/* ---- the image ---- */

static int json_blob(struct imp *m, json_t *desc, json_t **out)
{
	const char *digest = json_string_value(json_object_get(desc, "digest"));
	json_t *size = json_object_get(desc, "size");
	json_error_t err;
	char *data;
	size_t len;
	int ret;

	*out = NULL;
	if ((ret =
		 oci_blob_read(m->layout_fd, digest,
			       json_is_integer(size) ? json_integer_value(size) : -1, &data, &len)))
		return ret;
	*out = json_loadb(data, len, 0, &err);
	free(data);
	return *out ? 0 : cb_error_set(EBADMSG, "blob %s: not JSON (%s)", digest, err.text);
}

/* The manifest (by tag, else the only cowbox image), its config and the cowbox section. */
static int image_load(struct imp *m)
{
	json_t *index = NULL, *d, *pick = NULL;
	size_t i;
	int ret, count = 0;

	if (faccessat(m->layout_fd, "index.json", F_OK, AT_SYMLINK_NOFOLLOW) < 0)
		return cb_error_set(ENOENT, "%s is no OCI layout (no index.json)", m->a->layout);
	if ((ret = oci_index_load(m->layout_fd, &index)))
		return ret;
	json_array_foreach(json_object_get(index, "manifests"), i, d)
	{
		const char *tag = json_string_value(
		    json_object_get(json_object_get(d, "annotations"), OCI_REF_NAME));

		if (m->a->tag ? tag && !strcmp(tag, m->a->tag) : 1) {
			pick = d;
			count++;
		}
	}
	if (!pick && m->a->tag)
		ret = cb_error_set(ENOENT, "no image tagged %s in the layout %s", m->a->tag,
				   m->a->layout);
	else if (!pick || count > 1)
		ret = cb_error_set(ENOENT, "%s",
				   !pick ? "no image in the layout"
					 : "the layout holds several images: name a tag");
	if (!ret)
		ret = json_blob(m, pick, &m->manifest);
	if (!ret && !json_is_string(json_object_get(json_object_get(m->manifest, "annotations"),
						    CB_OCI_EXPORT_ANNOTATION)))
		ret = cb_error_set(EBADMSG,
				   "not a cowbox export (its manifest has no %s "
				   "annotation)",
				   CB_OCI_EXPORT_ANNOTATION);
	if (!ret)
		ret = json_blob(m, json_object_get(m->manifest, "config"), &m->config);
	if (!ret && (!json_is_object(m->meta = json_object_get(m->config, "cowbox")) ||
		     json_integer_value(json_object_get(m->meta, "version")) != 1))
		ret = cb_error_set(EBADMSG, "not a cowbox export (its config has no cowbox "
					    "section of version 1)");
	json_decref(index);
	return ret;
}

/* The manifest's layer at the position obj's "layer" names (what the config says it is). */
static json_t *layer_at(struct imp *m, json_t *obj)
{
	json_t *at = json_object_get(obj, "layer");

	if (!json_is_integer(at) || json_integer_value(at) < 0)
		return NULL;
	return json_array_get(json_object_get(m->manifest, "layers"),
			      (size_t)json_integer_value(at));
}

static int sum_base(const struct cb_entry *e, long long from, long long until, void *arg)
{
	(void)from;
	(void)until;
	oci_sum_entry(arg, e, 1);
	return 0;
}

/* Turn 0's map (a walk of the base, hashed) against the export's. */
static int base_check(struct imp *m, struct oci_sum *sum)
{
	const char *want =
	    json_string_value(json_object_get(json_object_get(m->meta, "base"), "map"));
	char hex[65];
	int ret = ws_map_ensure(m->t);

	memset(sum, 0, sizeof(*sum));
	if (!ret)
		ret = cb_db_turns_base_entries(m->t->db, sum_base, sum);
	if (ret)
		return ret;
	oci_sum_hex(sum, hex);
	if (strcmp(hex, want))
		return cb_error_set(EBADMSG,
				    "%s does not hold the exported base (turn 0's map "
				    "digest is %s, the export says %s)",
				    m->base ? m->base : "the empty base", hex, want);
	return 0;
}

static int open_turns(struct imp *m)
{
	char *db = NULL, *blobs = NULL, *upper = NULL;
	int ret;

	if (!(ret = ws_pathf(&db, "%s/meta.db", m->dir)) &&
	    !(ret = ws_pathf(&blobs, "%s/blobs", m->dir)) &&
	    !(ret = ws_pathf(&upper, "%s/upper", m->dir))) {
		struct cb_turns_config cfg = {
		    .db_path = db, .blob_dir = blobs, .base_dir = m->base, .root = upper};

		ret = cb_turns_open(&cfg, &m->t);
	}
	free(db);
	free(blobs);
	free(upper);
	return ret;
}

/* The tree at the last turn: what fork writes into an upper layer (only what differs from
 * the base), through a scratch database that is dropped after. */
static int write_upper(struct imp *m, long long last)
{
	char *upper = NULL, *scratch = NULL, *sdb = NULL, *sblobs = NULL;
	int ret;

	if (!(ret = ws_pathf(&upper, "%s/upper", m->dir)) &&
	    !(ret = ws_pathf(&scratch, "%s/.import-scratch", m->dir)) &&
	    !(ret = ws_pathf(&sdb, "%s/meta.db", scratch)) &&
	    !(ret = ws_pathf(&sblobs, "%s/blobs", scratch))) {
		if (mkdir(scratch, 0700) < 0)
			ret = cb_error_set(errno, "mkdir %s: %s", scratch, strerror(errno));
		if (!ret && m->ids)
			cb_turns_set_restore_ids(m->t, m->ids);
		if (!ret)
			ret = cb_ws_fork(m->t, last, upper, sdb, sblobs, NULL, NULL);
		if (!ret && m->ids)
			ret = cb_ws_ids_shift_tree(upper, m->ids);
		ws_delete_tree(scratch);
	}
	free(upper);
	free(scratch);
	free(sdb);
	free(sblobs);
	return ret;
}

static int import_turns(struct imp *m, struct oci_sum *sum, long long *last)
{
	json_t *tj;
	long long prev = 0;
	size_t i;
	int ret = 0;

	json_array_foreach(json_object_get(m->meta, "turns"), i, tj)
	{
		struct turn_in ti = {0};
		json_t *desc;

		if (!json_is_integer(json_object_get(tj, "turn")) ||
		    json_integer_value(json_object_get(tj, "turn")) <= prev)
			return cb_error_set(EBADMSG, "the export's turns are not in order");
		if (m->a->turn >= 0 && json_integer_value(json_object_get(tj, "turn")) > m->a->turn)
			break;
		ret = turn_parse(tj, &ti);
		if (!ret && !(desc = layer_at(m, tj)))
			ret = cb_error_set(EBADMSG, "the image has no layer of turn %lld", ti.turn);
		if (!ret)
			ret = turn_layer(m, desc, &ti);
		if (!ret)
			ret = turn_record(m, tj, &ti, prev, sum);
		turn_free(&ti);
		if (ret)
			return ret;
		if (m->a->log)
			fprintf(m->a->log, "cowbox: turn %lld imported\n", ti.turn);
		prev = *last = ti.turn;
	}
	if (m->a->turn >= 0 && *last != m->a->turn)
		return cb_error_set(ENOENT, "the export has no turn %lld", m->a->turn);
	return 0;
}

int cb_oci_import(const struct cb_oci_import_args *args, char ref[CB_WS_REF_LEN + 1])
{
	struct imp m = {.a = args, .layout_fd = -1, .bases_lock = -1};
	struct oci_sum sum;
	json_t *base_desc;
	long long last = 0;
	int ret;

	ref[0] = '\0';
	if ((ret = oci_la_load()))
		return cb_error_wrap(ret, "import");
	if ((m.layout_fd = oci_layout_open(args->layout, 0)) < 0)
		return cb_error_wrap(m.layout_fd, "import");
	if ((ret = image_load(&m)))
		goto out;
	if (!(base_desc = layer_at(&m, json_object_get(m.meta, "base")))) {
		ret = cb_error_set(EBADMSG, "not a cowbox export (no base layer)");
		goto out;
	}
	if ((ret = base_choose(&m, base_desc)))
		goto out;
	/* Built where nothing lists or mounts it; published (renamed to its ref) last. */
	if ((ret = cb_ws_create_unpublished(m.base, args->name, ref, &m.dir)))
		goto out;
	if (args->log)
		fprintf(args->log, "cowbox: importing into %s\n", m.dir);
	if (args->own_ids && geteuid() == 0 && (ret = cb_ws_ids_ensure(m.dir, &m.ids)))
		goto out;
	if ((ret = open_turns(&m)) || (ret = base_check(&m, &sum)) ||
	    (ret = import_turns(&m, &sum, &last)) || (ret = ws_map_ensure(m.t)))
		goto out;
	if (last > 0 && (ret = write_upper(&m, last)))
		goto out;
	cb_turns_close(m.t);
	m.t = NULL;
	ret = cb_ws_publish(ref, m.dir, args->name);
	free(m.dir);
	m.dir = NULL;
out:
	cb_turns_close(m.t);
	if (ret && m.dir) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		cb_ws_delete_unpublished(m.dir);
		cb_error_set(-ret, "%s", saved);
	}
	if (m.base_tmp && access(m.base_tmp, F_OK) == 0)
		ws_delete_tree(m.base_tmp);
	/* nothing of a failed import stays, not even the base it unpacked */
	if (ret && m.base_fresh)
		ws_delete_tree(m.base);
	if (ret)
		ref[0] = '\0';
	free(m.dir);
	free(m.base);
	free(m.base_tmp);
	json_decref(m.manifest);
	json_decref(m.config);
	if (m.layout_fd >= 0)
		close(m.layout_fd);
	if (m.bases_lock >= 0)
		close(m.bases_lock);
	return ret ? cb_error_wrap(ret, "import") : 0;
}
