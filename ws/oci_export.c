/* cowbox export: a workspace's base and turns written as the layers of an OCI image (tar by
 * libarchive, every byte checked against the turn's SHA-256 on the way), reusing by digest. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "oci_int.h"
#include "oci_la.h"
#include "turns_int.h"
#include "util/smallfile.h"
#include "ws.h"

#define EXP_BUF (1 << 20)

/* A row of meta.db's base cache: the stat a base file had when it was hashed, and its SHA-256.
 * Loaded once, by path (the base map's order too), so the base layer trusts a base file whose
 * stat still is the row's without hashing its bytes again, as a snapshot does. */
struct trust_row {
	char *path;
	long long size, mtime_ns, ctime_ns, ino;
	unsigned char sha256[CB_SHA256_LEN];
};

struct exp {
	struct cb_turns *t;
	int layout_fd;
	char *ws_dir;
	json_t *cache;	/* oci-layers.json: layer key -> {digest, size} */
	json_t *layers; /* the manifest's cowbox layer descriptors */
	json_t *diff_ids;
	json_t *history;
	unsigned char *buf;
	struct cb_oci_export_stats *st;
	struct trust_row *trust; /* the base cache's rows, by path (the base layer's pass) */
	size_t ntrust, trust_cap, trust_at;
	long long map_id;
	int dir_fd; /* the directory of the last base file opened (dir_path) */
	char *dir_path;
	char what[96]; /* where a file's bytes come from, for its errors */
};

/* One layer being written: a tar stream into a blob of the layout. */
struct layer_out {
	struct archive *a;
	struct oci_stream s;
	struct archive_entry *ae; /* one entry cleared for each header, and its name */
	char *name;
	size_t name_cap;
};

static la_ssize_t layer_write_cb(struct archive *a, void *arg, const void *buf, size_t n)
{
	if (oci_stream_write(arg, buf, n)) {
		archive_set_error(a, EIO, "%s", cb_error_message());
		return -1;
	}
	return (la_ssize_t)n;
}

static int layer_fail(struct layer_out *lo, const char *what)
{
	return cb_error_set(EIO, "layer: %s: %s", what, archive_error_string(lo->a));
}

static int layer_begin(struct exp *x, struct layer_out *lo)
{
	int ret = oci_stream_begin(&lo->s, x->layout_fd);

	if (ret)
		return ret;
	lo->a = archive_write_new();
	if (!lo->a)
		return cb_error_set(ENOMEM, "layer: out of memory");
	/* pax: long paths and nanosecond times; no padding of the last block past the spec's */
	/* 1 MiB per write: the default 10 KiB block is a write(2) and a digest update each */
	if (archive_write_set_format_pax_restricted(lo->a) != ARCHIVE_OK ||
	    archive_write_set_bytes_per_block(lo->a, 1 << 20) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(lo->a, 1) != ARCHIVE_OK ||
	    archive_write_open2(lo->a, &lo->s, NULL, layer_write_cb, NULL, NULL) != ARCHIVE_OK)
		return layer_fail(lo, "open");
	return 0;
}

static void layer_abort(struct layer_out *lo)
{
	if (lo->a)
		archive_write_free(lo->a);
	lo->a = NULL;
	if (lo->ae)
		archive_entry_free(lo->ae);
	lo->ae = NULL;
	free(lo->name);
	lo->name = NULL;
	lo->name_cap = 0;
	oci_stream_abort(&lo->s);
}

/* A header of the layer: rel under workspace/ ("" for the directory itself). */
static int layer_header(struct layer_out *lo, const char *rel, unsigned type, unsigned mode,
			long long size, long long mtime_ns, unsigned uid, unsigned gid,
			const char *target)
{
	size_t len = strlen(rel), need = sizeof(OCI_ROOT "/") + len;
	struct archive_entry *ae;

	if (need > lo->name_cap) {
		char *bigger = realloc(lo->name, need * 2);

		if (!bigger)
			return cb_error_set(ENOMEM, "layer: out of memory");
		lo->name = bigger;
		lo->name_cap = need * 2;
	}
	memcpy(lo->name, OCI_ROOT "/", sizeof(OCI_ROOT "/") - 1);
	memcpy(lo->name + sizeof(OCI_ROOT "/") - 1, rel, len + 1);
	if (lo->ae)
		ae = archive_entry_clear(lo->ae);
	else if (!(ae = lo->ae = archive_entry_new()))
		return cb_error_set(ENOMEM, "layer: out of memory");
	archive_entry_set_pathname(ae, lo->name);
	archive_entry_set_filetype(ae, type);
	archive_entry_set_perm(ae, mode & 07777);
	archive_entry_set_size(ae, type == AE_IFREG ? size : 0);
	archive_entry_set_mtime(ae, mtime_ns / 1000000000LL, mtime_ns % 1000000000LL);
	archive_entry_set_uid(ae, uid);
	archive_entry_set_gid(ae, gid);
	if (target)
		archive_entry_set_symlink(ae, target);
	if (archive_write_header(lo->a, ae) < ARCHIVE_WARN)
		return layer_fail(lo, lo->name);
	return 0;
}

/* Write src's bytes as e's content, checking size and SHA-256 against e: a blob or base file
 * that no longer holds what the turn recorded is never exported as if it did. */
static int layer_content(struct exp *x, struct layer_out *lo, const struct cb_entry *e, int src,
			 const char *what, int trusted)
{
	unsigned char md[32];
	EVP_MD_CTX *ctx = trusted ? NULL : EVP_MD_CTX_new();
	long long total = 0;
	unsigned n = 0;
	int ret = 0;

	if (!trusted && (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL))) {
		EVP_MD_CTX_free(ctx);
		return cb_error_set(ENOMEM, "layer: out of memory");
	}
	for (;;) {
		ssize_t r = read(src, x->buf, EXP_BUF);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = cb_error_set(errno, "read %s: %s", what, strerror(errno));
			break;
		}
		if (r == 0)
			break;
		total += r;
		if (total > e->size)
			break;
		if (ctx)
			EVP_DigestUpdate(ctx, x->buf, (size_t)r);
		if (archive_write_data(lo->a, x->buf, (size_t)r) != r) {
			ret = layer_fail(lo, e->path);
			break;
		}
	}
	if (ctx) {
		EVP_DigestFinal_ex(ctx, md, &n);
		EVP_MD_CTX_free(ctx);
	}
	if (!ret && (total != e->size || (!trusted && memcmp(md, e->sha256, sizeof(md)))))
		ret = cb_error_set(EBADMSG,
				   "%s: %s no longer holds the bytes the turn recorded (%lld bytes "
				   "read, %lld recorded)",
				   e->path, what, total, e->size);
	return ret;
}

/* The base file at path, opened as tar opens files (a stat of the name, then the open, no
 * walk of the whole path each time): below the directory of the previous one, which stays
 * open (opened beneath the base), by a name that is no symlink, never a FIFO or device
 * (looked at before it is opened, and the open file is the one looked at). */
static int base_open(struct exp *x, const char *path, struct stat *st)
{
	const char *slash = strrchr(path, '/'), *leaf = slash ? slash + 1 : path;
	size_t plen = slash ? (size_t)(slash - path) : 0;
	struct stat pre;
	int dir, fd;

	if (!slash) {
		dir = x->t->base_fd;
	} else {
		if (x->dir_fd < 0 || strlen(x->dir_path) != plen ||
		    memcmp(x->dir_path, path, plen)) {
			char *parent = strndup(path, plen);

			if (x->dir_fd >= 0)
				close(x->dir_fd);
			free(x->dir_path);
			x->dir_path = parent;
			x->dir_fd =
			    parent ? cb_beneath_open(x->t->base_fd, parent, O_PATH | O_DIRECTORY, 0)
				   : cb_error_set(ENOMEM, "out of memory");
			if (x->dir_fd < 0) {
				int ret = x->dir_fd;

				free(x->dir_path);
				x->dir_path = NULL;
				return ret;
			}
		}
		dir = x->dir_fd;
	}
	if (fstatat(dir, leaf, &pre, AT_SYMLINK_NOFOLLOW) < 0)
		return cb_error_set(errno, "base file %s: %s", path, strerror(errno));
	if (!S_ISREG(pre.st_mode))
		return cb_error_set(EINVAL, "base file %s: not a regular file", path);
	fd = openat(dir, leaf, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "base file %s: %s", path, strerror(errno));
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_ino != pre.st_ino ||
	    st->st_dev != pre.st_dev) {
		close(fd);
		return cb_error_set(EAGAIN, "base file %s: replaced while it was opened", path);
	}
	return fd;
}

/* The source of e's content (st: its stat): for the base (base_first) the base file, else
 * its blob (bytes a turn kept); the other one when the first is not there. Whichever it is,
 * its bytes are checked against e's SHA-256 as they are written, unless the base cache
 * vouches for a base file (base_trusted). */
static int content_open(struct exp *x, const struct cb_entry *e, int base_first, const char **what,
			struct stat *st)
{
	char hex[2 * CB_XXH128_LEN + 1];
	int src;

	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (base_first && x->t->base_fd >= 0) {
		*what = "the base file";
		if ((src = base_open(x, e->path, st)) >= 0)
			return src;
		cb_error_clear();
	}
	if (cb_ws_blob_has(x->t->blob_fd, e->xxh3)) {
		*what = "its blob";
		if ((src = cb_ws_blob_open(x->t->blob_fd, e->xxh3)) >= 0 && fstat(src, st) < 0) {
			close(src);
			return cb_error_set(errno, "blob %s: %s", hex, strerror(errno));
		}
		return src;
	}
	/* A turn's bytes whose blob went (a prune while the export ran): the base file may
	 * hold them still, which its hash says; if not, the error names the blob. */
	if (!base_first && x->t->base_fd >= 0) {
		snprintf(x->what, sizeof(x->what), "the base file (its blob %s is gone)", hex);
		*what = x->what;
		if ((src = base_open(x, e->path, st)) >= 0)
			return src;
	}
	return cb_error_set(ENOENT,
			    "%s: its blob %s is gone and no base file holds its content (a prune "
			    "removed it while the export ran?)",
			    e->path, hex);
}

/* 1 if the base cache says the base file e's bytes came from (st, fstat of the open file)
 * still holds e's content: its row's stat is st (the same inode, size, mtime and ctime: a
 * file rewritten behind our back has a new ctime) and its row's SHA-256 is e's. The rows
 * come in the base map's order, so one cursor walks them along with the base's entries. */
static int base_trusted(struct exp *x, const struct cb_entry *e, const struct stat *st)
{
	struct cb_basecache_key k;
	const struct trust_row *r;
	int c = 1;

	while (x->trust_at < x->ntrust && (c = strcmp(x->trust[x->trust_at].path, e->path)) < 0)
		x->trust_at++;
	if (c)
		return 0;
	r = &x->trust[x->trust_at];
	cb_basecache_key_of(st, &k);
	return r->size == k.size && r->mtime_ns == k.mtime_ns && r->ctime_ns == k.ctime_ns &&
	       r->ino == k.ino && r->size == e->size &&
	       !memcmp(r->sha256, e->sha256, CB_SHA256_LEN);
}

static int trust_add(const struct cb_db_cache_row *row, void *arg)
{
	struct exp *x = arg;
	struct trust_row *r;
	int ret = cb_grow(&x->trust, &x->trust_cap, x->ntrust, sizeof(*x->trust), 4096,
			  "export: base cache");

	if (ret)
		return ret;
	r = &x->trust[x->ntrust];
	if (!(r->path = strdup(row->path)))
		return cb_error_set(ENOMEM, "export: base cache: out of memory");
	r->size = row->size;
	r->mtime_ns = row->mtime_ns;
	r->ctime_ns = row->ctime_ns;
	r->ino = row->ino;
	memcpy(r->sha256, row->sha256, CB_SHA256_LEN);
	x->ntrust++;
	return 0;
}

static void trust_free(struct exp *x)
{
	for (size_t i = 0; i < x->ntrust; i++)
		free(x->trust[i].path);
	free(x->trust);
	x->trust = NULL;
	x->ntrust = x->trust_cap = x->trust_at = 0;
}

/* 1 if fd's stat still has before's inode, size, mtime and ctime. */
static int same_stat(int fd, const struct stat *before)
{
	struct stat now;

	return fstat(fd, &now) == 0 && now.st_ino == before->st_ino &&
	       now.st_size == before->st_size && now.st_mtim.tv_sec == before->st_mtim.tv_sec &&
	       now.st_mtim.tv_nsec == before->st_mtim.tv_nsec &&
	       now.st_ctim.tv_sec == before->st_ctim.tv_sec &&
	       now.st_ctim.tv_nsec == before->st_ctim.tv_nsec;
}

/* One entry of a layer; mtime_ns < 0: a file's own (the base file's, when the turn kept
 * none). */
static int layer_entry(struct exp *x, struct layer_out *lo, const struct cb_entry *e,
		       long long mtime_ns, int base_first)
{
	unsigned uid = e->has_owner ? e->uid : 0, gid = e->has_owner ? e->gid : 0;
	const char *what = NULL;
	struct stat st;
	int src, ret, trusted = 0;

	switch (e->type) {
	case CB_ENTRY_DIR:
		return layer_header(lo, e->path, AE_IFDIR, e->mode, 0, mtime_ns, 0, 0, NULL);
	case CB_ENTRY_SYMLINK:
		return layer_header(lo, e->path, AE_IFLNK, 0777, 0, mtime_ns, 0, 0, e->target);
	case CB_ENTRY_FILE:
		if ((src = content_open(x, e, base_first, &what, &st)) < 0)
			return src;
		if (e->has_mtime)
			mtime_ns = e->mtime_ns;
		else if (mtime_ns < 0)
			mtime_ns = st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
		/* Blobs are few and named by their content's xxh3 only: their bytes are hashed */
		if (base_first && x->ntrust && !strcmp(what, "the base file"))
			trusted = base_trusted(x, e, &st);
		x->st->files_trusted += trusted;
		x->st->files_hashed += !trusted;
		ret = layer_header(lo, e->path, AE_IFREG, e->mode, e->size,
				   mtime_ns < 0 ? 0 : mtime_ns, uid, gid, NULL);
		if (!ret)
			ret = layer_content(x, lo, e, src, what, trusted);
		/* trusted by its stat before the read: the same stat after it, or it changed
		 * while read (its bytes unchecked) */
		if (!ret && trusted && !same_stat(src, &st))
			ret = cb_error_set(
			    EAGAIN, "%s: the base file changed while it was exported", e->path);
		close(src);
		return ret;
	case CB_ENTRY_ABSENT:
		break;
	}
	return 0;
}

/* The layout holds key's layer already (the cache knows its digest): its descriptor. */
static json_t *cached_layer(struct exp *x, const char *key)
{
	json_t *c = json_object_get(x->cache, key);
	const char *digest = json_string_value(json_object_get(c, "digest"));

	if (!digest || !json_is_integer(json_object_get(c, "size")) ||
	    !oci_blob_has(x->layout_fd, digest))
		return NULL;
	return json_pack("{s:s, s:s, s:O}", "mediaType", OCI_LAYER, "digest", digest, "size",
			 json_object_get(c, "size"));
}

/* Add the layer (desc, with its annotations) to the manifest, config and cache. */
static int add_layer(struct exp *x, const char *key, json_t *desc, json_t *annotations,
		     const char *created_by, double time)
{
	char when[64];
	time_t secs = (time_t)time;
	struct tm tm;

	gmtime_r(&secs, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	json_object_set_new(x->cache, key,
			    json_pack("{s:O, s:O}", "digest", json_object_get(desc, "digest"),
				      "size", json_object_get(desc, "size")));
	json_array_append(x->diff_ids, json_object_get(desc, "digest"));
	json_object_set_new(desc, "annotations", annotations);
	json_array_append_new(x->layers, desc);
	json_array_append_new(x->history,
			      json_pack("{s:s, s:s}", "created", when, "created_by", created_by));
	return 0;
}

static int finish_layer(struct exp *x, struct layer_out *lo, json_t **desc)
{
	char digest[OCI_DIGEST_LEN];
	int ret = 0;

	if (archive_write_close(lo->a) != ARCHIVE_OK)
		ret = layer_fail(lo, "close");
	if (!ret)
		ret = oci_stream_finish(&lo->s, digest);
	if (!ret) {
		x->st->bytes_written += lo->s.size;
		x->st->layers_written++;
		*desc = json_pack("{s:s, s:s, s:I}", "mediaType", OCI_LAYER, "digest", digest,
				  "size", (json_int_t)lo->s.size);
	}
	layer_abort(lo);
	return ret;
}

/* ---- the base ---- */

struct base_pass {
	struct exp *x;
	struct oci_sum sum;
	long long n;
	int summing;	      /* the map digest is summed in this pass */
	struct layer_out *lo; /* NULL: the digest pass alone */
};

static int base_one(const struct cb_entry *e, long long from, long long until, void *arg)
{
	struct base_pass *b = arg;
	struct stat st;
	long long mtime = 0;

	(void)from;
	(void)until;
	if (b->summing) {
		oci_sum_entry(&b->sum, e, 1);
		b->n++;
	}
	if (!b->lo)
		return 0;
	/* a file's time comes from the fd its bytes are read from */
	if (e->type == CB_ENTRY_FILE)
		mtime = -1;
	else if (b->x->t->base_fd >= 0 && cb_beneath_stat(b->x->t->base_fd, e->path, &st) == 0)
		mtime = st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
	cb_error_clear();
	return layer_entry(b->x, b->lo, e, mtime, 1);
}

/* The base layer, written in one pass over the base map (summing its digest too when
 * b->summing). */
static int base_layer(struct exp *x, struct base_pass *b, json_t **desc)
{
	struct layer_out lo = {0};
	int ret;

	b->lo = &lo;
	ret = cb_db_turns_base_cache_list(x->t->db, trust_add, x);
	if (!ret)
		ret = layer_begin(x, &lo);
	if (!ret)
		ret = layer_header(&lo, "", AE_IFDIR, 0755, 0, 0, 0, 0, NULL);
	if (!ret)
		ret = cb_db_turns_base_entries(x->t->db, base_one, b);
	if (!ret)
		ret = finish_layer(x, &lo, desc);
	layer_abort(&lo);
	trust_free(x);
	b->lo = NULL;
	return ret ? cb_error_wrap(ret, "export the base") : 0;
}

static int export_base(struct exp *x, json_t *meta, struct oci_sum *sum, char hex[65])
{
	struct base_pass b = {.x = x};
	char key[80], idkey[64];
	json_t *desc = NULL, *known;
	int ret;

	/* Turn 0's map is frozen once recorded, and map_id names this database: its digest is
	 * computed once, then taken from the cache, so that a later export costs what changed.
	 * Without it in the cache, the cache knows no base layer either (both are written
	 * together): the layer is written in the same pass that sums the digest. */
	snprintf(idkey, sizeof(idkey), "basemap:%lld", x->map_id);
	known = json_object_get(x->cache, idkey);
	if (json_is_integer(json_object_get(known, "entries")) &&
	    !oci_sum_parse(&b.sum, json_string_value(json_object_get(known, "map")))) {
		b.n = json_integer_value(json_object_get(known, "entries"));
	} else {
		cb_error_clear();
		b.summing = 1;
		if ((ret = base_layer(x, &b, &desc)))
			return ret;
	}
	oci_sum_hex(&b.sum, hex);
	json_object_set_new(x->cache, idkey,
			    json_pack("{s:s, s:I}", "map", hex, "entries", (json_int_t)b.n));
	*sum = b.sum;
	json_object_set_new(meta, "base",
			    json_pack("{s:s, s:I, s:b}", "map", hex, "entries", (json_int_t)b.n,
				      "empty", x->t->base_fd < 0));
	snprintf(key, sizeof(key), "base:%s", hex);
	if (!desc && (desc = cached_layer(x, key)))
		x->st->layers_reused++;
	else if (!desc && (ret = base_layer(x, &b, &desc)))
		return ret;
	return add_layer(x, key, desc,
			 json_pack("{s:s, s:s}", OCI_LAYER_KIND, "base", OCI_LAYER_MAP, hex),
			 "cowbox base", 0);
}

/* ---- the turns ---- */

static int collect(const char *path, void *arg)
{
	return ws_pathset_add(arg, path, 0, NULL);
}

/* 1 if path's parent is a directory at turn (a top-level path's always is). */
static int parent_is_dir(struct cb_turns *t, const char *path, long long turn, int *yes)
{
	const char *slash = strrchr(path, '/');
	struct cb_entry p = {0};
	char *parent;
	int ret;

	*yes = 1;
	if (!slash)
		return 0;
	if (!(parent = strndup(path, (size_t)(slash - path))))
		return cb_error_set(ENOMEM, "out of memory");
	ret = ws_entry_at(t, parent, turn, &p);
	*yes = p.type == CB_ENTRY_DIR;
	cb_entry_clear(&p);
	free(parent);
	return ret;
}

/* A whiteout (a.wh. name, or the opaque marker when name is NULL) below dir. */
static int layer_whiteout(struct layer_out *lo, const char *path, int opaque, long long mtime)
{
	const char *slash = strrchr(path, '/');
	char *rel = NULL;
	int ret;

	if (opaque)
		ret = asprintf(&rel, "%s/.wh..wh..opq", path);
	else if (slash)
		ret = asprintf(&rel, "%.*s/.wh.%s", (int)(slash - path), path, slash + 1);
	else
		ret = asprintf(&rel, ".wh.%s", path);
	if (ret < 0)
		return cb_error_set(ENOMEM, "out of memory");
	ret = layer_header(lo, rel, AE_IFREG, 0, 0, mtime, 0, 0, NULL);
	free(rel);
	return ret;
}

/* The tar of one turn: what changed in (prev, turn], whiteouts for what went. */
static int turn_tar(struct exp *x, struct layer_out *lo, const struct ws_pathset *paths,
		    long long prev, long long turn, long long mtime)
{
	struct cb_entry old = {0}, cur = {0};
	int ret = 0;

	for (size_t i = 0; i < paths->n && !ret; i++) {
		const char *path = paths->p[i].path;
		int parent;

		/* Below a directory that is gone or is no directory at the turn: that entry
		 * already replaces all of it. */
		if ((ret = parent_is_dir(x->t, path, turn, &parent)) || !parent)
			continue;
		if ((ret = ws_entry_at(x->t, path, prev, &old)) ||
		    (ret = ws_entry_at(x->t, path, turn, &cur)))
			break;
		if (cur.type == CB_ENTRY_ABSENT && old.type != CB_ENTRY_ABSENT)
			ret = layer_whiteout(lo, path, 0, mtime);
		else if (cur.type != CB_ENTRY_ABSENT)
			ret = layer_entry(x, lo, &cur, mtime, 0);
		/* A directory where there was none: nothing of a lower layer shows through. */
		if (!ret && cur.type == CB_ENTRY_DIR && old.type != CB_ENTRY_DIR)
			ret = layer_whiteout(lo, path, 1, mtime);
	}
	cb_entry_clear(&old);
	cb_entry_clear(&cur);
	return ret;
}

static int export_turn(struct exp *x, json_t *tj, long long prev, struct oci_sum *sum,
		       char prev_hex[65])
{
	long long turn = json_integer_value(json_object_get(tj, "turn"));
	double time = json_real_value(json_object_get(tj, "time"));
	struct ws_pathset paths = {0};
	struct cb_entry old = {0}, cur = {0};
	struct layer_out lo = {0};
	json_t *entries = json_array(), *desc = NULL;
	char hex[65], key[200], by[64];
	int ret;

	ret = cb_db_turns_delta_paths(x->t->db, prev, turn, collect, &paths);
	if (!ret)
		ws_pathset_sort(&paths);
	for (size_t i = 0; i < paths.n && !ret; i++) {
		if ((ret = ws_entry_at(x->t, paths.p[i].path, prev, &old)) ||
		    (ret = ws_entry_at(x->t, paths.p[i].path, turn, &cur)))
			break;
		oci_sum_entry(sum, &old, -1);
		oci_sum_entry(sum, &cur, 1);
		json_array_append_new(entries, oci_entry_json(&cur));
	}
	if (ret)
		goto out;
	oci_sum_hex(sum, hex);
	json_object_set_new(tj, "map", json_string(hex));
	json_object_set(tj, "entries", entries);
	snprintf(key, sizeof(key), "turn:%lld:%s:%s", turn, prev_hex, hex);
	if ((desc = cached_layer(x, key))) {
		x->st->layers_reused++;
	} else {
		ret = layer_begin(x, &lo);
		if (!ret)
			ret = turn_tar(x, &lo, &paths, prev, turn,
				       (long long)(time * 1e9) / 1000 * 1000);
		if (!ret)
			ret = finish_layer(x, &lo, &desc);
		if (ret)
			goto out;
	}
	snprintf(by, sizeof(by), "cowbox turn %lld", turn);
	ret = add_layer(x, key, desc,
			json_pack("{s:s, s:s, s:s}", OCI_LAYER_KIND, "turn", OCI_LAYER_TURN,
				  by + strlen("cowbox turn "), OCI_LAYER_MAP, hex),
			by, time);
	memcpy(prev_hex, hex, 65);
out:
	layer_abort(&lo);
	cb_entry_clear(&old);
	cb_entry_clear(&cur);
	ws_pathset_free(&paths);
	json_decref(entries);
	return ret ? cb_error_wrap(ret, "export turn %lld", turn) : 0;
}

static int list_turn(const struct cb_turn_info *ti, void *arg)
{
	if (ti->turn < 1)
		return 0;
	return json_array_append_new(arg, json_pack("{s:I, s:f, s:s?, s:I}", "turn",
						    (json_int_t)ti->turn, "time", ti->time, "label",
						    ti->label, "changes", (json_int_t)ti->changes));
}

/* Tests only (COWBOX_TEST_EXPORT_GATE=PATH): between the base layer and the turns' layers,
 * make PATH.ready and wait (at most 2 minutes) for PATH to appear, a window in which a test
 * prunes the workspace under a running export. */
static void test_gate(void)
{
	const char *gate = getenv("COWBOX_TEST_EXPORT_GATE");
	char *ready = NULL;
	int fd;

	if (!gate || !*gate || asprintf(&ready, "%s.ready", gate) < 0)
		return;
	if ((fd = open(ready, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	free(ready);
	for (int i = 0; i < 12000 && access(gate, F_OK) < 0; i++)
		usleep(10000);
}

/* ---- config, manifest, index ---- */

static const char *host_arch(void)
{
#if defined(__x86_64__)
	return "amd64";
#elif defined(__aarch64__)
	return "arm64";
#else
	return "unknown";
#endif
}

/* The runtime image's manifest and config (runtime_tag in the layout), or fresh ones. */
static int base_image(struct exp *x, const char *runtime_tag, json_t **manifest, json_t **config)
{
	json_t *index = NULL, *m;
	char *data = NULL;
	size_t len, i;
	int ret;

	*manifest = *config = NULL;
	if (!runtime_tag) {
		*manifest = json_pack("{s:i, s:s, s:[]}", "schemaVersion", 2, "mediaType",
				      OCI_MANIFEST, "layers");
		*config = json_pack("{s:s, s:s, s:{}, s:{s:s, s:[]}, s:[]}", "architecture",
				    host_arch(), "os", "linux", "config", "rootfs", "type",
				    "layers", "diff_ids", "history");
		return 0;
	}
	if ((ret = oci_index_load(x->layout_fd, &index)))
		return ret;
	ret = cb_error_set(ENOENT, "no image tagged %s in the layout", runtime_tag);
	json_array_foreach(json_object_get(index, "manifests"), i, m)
	{
		json_t *a = json_object_get(m, "annotations");
		const char *d = json_string_value(json_object_get(m, "digest"));

		if (strcmp(json_string_value(json_object_get(a, OCI_REF_NAME)) ?: "", runtime_tag))
			continue;
		if ((ret = oci_blob_read(x->layout_fd, d, -1, &data, &len)))
			break;
		*manifest = json_loads(data, 0, NULL);
		free(data);
		d = json_string_value(
		    json_object_get(json_object_get(*manifest, "config"), "digest"));
		if (!d || (ret = oci_blob_read(x->layout_fd, d, -1, &data, &len)))
			break;
		*config = json_loads(data, 0, NULL);
		free(data);
		ret = 0;
		break;
	}
	json_decref(index);
	if (!ret &&
	    (!json_is_array(json_object_get(*manifest, "layers")) ||
	     !json_is_array(json_object_get(json_object_get(*config, "rootfs"), "diff_ids"))))
		ret = cb_error_set(EBADMSG, "the image tagged %s is not an OCI image", runtime_tag);
	if (ret) {
		json_decref(*manifest);
		json_decref(*config);
		*manifest = *config = NULL;
	}
	return ret;
}

static int write_image(struct exp *x, const struct cb_oci_export_args *args, json_t *meta)
{
	json_t *manifest = NULL, *config = NULL, *cfg, *index = NULL, *m, *keep;
	char digest[OCI_DIGEST_LEN], *text = NULL;
	size_t i;
	int ret = base_image(x, args->runtime_tag, &manifest, &config);

	if (ret)
		return ret;
	json_array_extend(json_object_get(manifest, "layers"), x->layers);
	json_array_extend(json_object_get(json_object_get(config, "rootfs"), "diff_ids"),
			  x->diff_ids);
	if (!json_is_array(json_object_get(config, "history")))
		json_object_set_new(config, "history", json_array());
	json_array_extend(json_object_get(config, "history"), x->history);
	if (!json_is_object(cfg = json_object_get(config, "config")))
		json_object_set_new(config, "config", cfg = json_object());
	json_object_set_new(cfg, "WorkingDir", json_string("/" OCI_ROOT));
	/* Which layer is which, by position: a registry keeps the order and the config (its
	 * digest is the image's ID) but not always the layers' annotations (skopeo drops them
	 * when it compresses a layer on the way). */
	{
		size_t at = json_array_size(json_object_get(manifest, "layers")) -
			    json_array_size(x->layers);
		json_t *tj;

		json_object_set_new(json_object_get(meta, "base"), "layer",
				    json_integer((json_int_t)at));
		json_array_foreach(json_object_get(meta, "turns"), i, tj)
		    json_object_set_new(tj, "layer", json_integer((json_int_t)(at + 1 + i)));
	}
	json_object_set(config, "cowbox", meta);
	if (!(text = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS)) ||
	    (ret = oci_blob_put(x->layout_fd, text, strlen(text), digest)))
		goto out;
	json_object_set_new(manifest, "config",
			    json_pack("{s:s, s:s, s:I}", "mediaType", OCI_CONFIG, "digest", digest,
				      "size", (json_int_t)strlen(text)));
	json_object_set_new(manifest, "mediaType", json_string(OCI_MANIFEST));
	json_object_set_new(
	    manifest, "annotations",
	    json_pack("{s:s, s:s}", CB_OCI_EXPORT_ANNOTATION, "1", "dev.cowbox.turn",
		      json_string_value(json_object_get(
			  json_object_get(json_array_get(x->layers, json_array_size(x->layers) - 1),
					  "annotations"),
			  OCI_LAYER_TURN))
			  ?: "0"));
	free(text);
	if (!(text = json_dumps(manifest, JSON_COMPACT | JSON_SORT_KEYS)) ||
	    (ret = oci_blob_put(x->layout_fd, text, strlen(text), digest)))
		goto out;
	memcpy(x->st->manifest_digest, digest, sizeof(digest));
	if ((ret = oci_index_load(x->layout_fd, &index)))
		goto out;
	keep = json_array();
	json_array_foreach(json_object_get(index, "manifests"), i, m)
	{
		const char *tag = json_string_value(
		    json_object_get(json_object_get(m, "annotations"), OCI_REF_NAME));

		if (!tag || strcmp(tag, args->tag))
			json_array_append(keep, m);
	}
	json_array_append_new(keep, json_pack("{s:s, s:s, s:I, s:{s:s}}", "mediaType", OCI_MANIFEST,
					      "digest", digest, "size", (json_int_t)strlen(text),
					      "annotations", OCI_REF_NAME, args->tag));
	json_object_set_new(index, "manifests", keep);
	ret = oci_index_store(x->layout_fd, index);
out:
	if (!text && !ret)
		ret = cb_error_set(ENOMEM, "out of memory");
	free(text);
	json_decref(index);
	json_decref(manifest);
	json_decref(config);
	return ret;
}

static int open_ws(const char *ref, struct exp *x)
{
	char *db = NULL, *blobs = NULL;
	struct cb_ws_info info = {0};
	int ret;

	if ((ret = cb_ws_info(ref, &info)))
		return ret;
	if (info.in_place) {
		ret = cb_error_set(EINVAL, "an in-place workspace's base is its live folder: "
					   "export a fork of it");
		goto out;
	}
	if ((ret = ws_pathf(&x->ws_dir, "%s", info.dir)) ||
	    (ret = ws_pathf(&db, "%s/meta.db", info.dir)) ||
	    (ret = ws_pathf(&blobs, "%s/blobs", info.dir)))
		goto out;
	{
		struct cb_turns_config cfg = {
		    .db_path = db, .blob_dir = blobs, .base_dir = info.base, .root = NULL};

		ret = cb_turns_open(&cfg, &x->t);
	}
	/* turn 0 is the base map: recorded by the first snapshot, else by this walk */
	if (!ret && !cb_db_turns_base_map_built(x->t->db))
		ret = ws_map_ensure(x->t);
	if (!ret)
		ret = cb_db_turns_map_id(x->t->db, &x->map_id);
	/* The rest only reads, in one transaction: a snapshot or prune the daemon runs meanwhile
	 * never mixes its turns into this image; a blob a prune removes fails the export naming
	 * it (content_open), never a layer of other bytes. */
	if (!ret)
		ret = cb_db_turns_begin_read(x->t->db);
out:
	cb_ws_info_free(&info);
	free(db);
	free(blobs);
	return ret;
}

int cb_oci_export(const struct cb_oci_export_args *args, struct cb_oci_export_stats *stats)
{
	struct exp x = {.layout_fd = -1, .dir_fd = -1, .st = stats};
	json_t *turns = json_array(), *meta = NULL, *tj, *chosen = json_array();
	struct oci_sum sum;
	json_error_t jerr;
	char *cache_path = NULL, *cache_text = NULL, prev_hex[65];
	long long prev = 0, last;
	size_t i;
	int ret;

	memset(stats, 0, sizeof(*stats));
	if ((ret = oci_la_load()))
		return cb_error_wrap(ret, "export %s", args->ref);
	x.layers = json_array();
	x.diff_ids = json_array();
	x.history = json_array();
	if (!(x.buf = malloc(EXP_BUF)) || !turns || !chosen) {
		ret = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	if ((ret = open_ws(args->ref, &x)))
		goto out;
	if ((ret = ws_pathf(&cache_path, "%s/oci-layers.json", x.ws_dir)))
		goto out;
	x.cache = json_load_file(cache_path, 0, &jerr);
	if (!json_is_object(x.cache)) {
		json_decref(x.cache);
		x.cache = json_object();
	}
	if ((ret = cb_db_turns_list(x.t->db, list_turn, turns)))
		goto out;
	last = cb_db_turns_latest(x.t->db);
	if (args->turn >= 0) {
		if (args->turn > last ||
		    (args->turn > 0 && !cb_db_turns_exists(x.t->db, args->turn))) {
			ret = cb_error_set(ENOENT, "no turn %lld (the latest is %lld)", args->turn,
					   last);
			goto out;
		}
		last = args->turn;
	}
	stats->turn = last;
	if ((x.layout_fd = oci_layout_open(args->layout, 1)) < 0) {
		ret = x.layout_fd;
		goto out;
	}
	meta = json_pack("{s:i, s:s}", "version", 1, "source", args->ref);
	/* the turns' digests start from the base's */
	if ((ret = export_base(&x, meta, &sum, prev_hex)))
		goto out;
	test_gate();
	json_array_foreach(turns, i, tj)
	{
		long long turn = json_integer_value(json_object_get(tj, "turn"));

		if (turn > last)
			break;
		if ((ret = export_turn(&x, tj, prev, &sum, prev_hex)))
			goto out;
		json_array_append(chosen, tj);
		prev = turn;
	}
	json_object_set(meta, "turns", chosen);
	if ((ret = write_image(&x, args, meta)))
		goto out;
	if (!(cache_text = json_dumps(x.cache, JSON_COMPACT | JSON_SORT_KEYS)))
		ret = cb_error_set(ENOMEM, "out of memory");
	else
		ret = cb_smallfile_write(x.ws_dir, "oci-layers.json", cache_text, 0600);
out:
	if (x.t)
		cb_db_turns_rollback(x.t->db);
	trust_free(&x);
	if (x.dir_fd >= 0)
		close(x.dir_fd);
	free(x.dir_path);
	cb_turns_close(x.t);
	if (x.layout_fd >= 0)
		close(x.layout_fd);
	json_decref(turns);
	json_decref(chosen);
	json_decref(meta);
	json_decref(x.cache);
	json_decref(x.layers);
	json_decref(x.diff_ids);
	json_decref(x.history);
	free(x.buf);
	free(x.ws_dir);
	free(cache_path);
	free(cache_text);
	return ret ? cb_error_wrap(ret, "export %s", args->ref) : 0;
}
