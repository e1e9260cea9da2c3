/* cb_ws_merge: the changes one workspace recorded since a common ancestor brought into
 * another workspace's live tree, three-way per path; text merged by libgit2 (git's xdiff). */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <git2.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cowbox/merge.h"
#include "turns_int.h"
#include "util/smallfile.h"

/* Larger text files are not merged line by line (they are binary conflicts): the three
 * versions and the result are held in memory. */
#define MERGE_TEXT_MAX (64LL << 20)
/* git's rule: a NUL in the first 8000 bytes makes a file binary. */
#define MERGE_BINARY_PROBE 8000

/* libgit2, loaded on first use (see configure.ac: linking it would slow every cowbox start). */
static struct {
	pthread_once_t once;
	void *handle;
	char error[256];
	int (*init)(void);
	int (*shutdown)(void);
	int (*merge_file)(git_merge_file_result *, const git_merge_file_input *,
			  const git_merge_file_input *, const git_merge_file_input *,
			  const git_merge_file_options *);
	void (*result_free)(git_merge_file_result *);
	int (*input_init)(git_merge_file_input *, unsigned int);
	int (*options_init)(git_merge_file_options *, unsigned int);
	const git_error *(*error_last)(void);
} git = {.once = PTHREAD_ONCE_INIT};

static void git_load(void)
{
	void *h = dlopen(CB_LIBGIT2_SONAME, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		snprintf(git.error, sizeof(git.error), "%s", dlerror());
		return;
	}
	*(void **)&git.init = dlsym(h, "git_libgit2_init");
	*(void **)&git.shutdown = dlsym(h, "git_libgit2_shutdown");
	*(void **)&git.merge_file = dlsym(h, "git_merge_file");
	*(void **)&git.result_free = dlsym(h, "git_merge_file_result_free");
	*(void **)&git.input_init = dlsym(h, "git_merge_file_input_init");
	*(void **)&git.options_init = dlsym(h, "git_merge_file_options_init");
	*(void **)&git.error_last = dlsym(h, "git_error_last");
	if (!git.init || !git.shutdown || !git.merge_file || !git.result_free || !git.input_init ||
	    !git.options_init || !git.error_last) {
		snprintf(git.error, sizeof(git.error), "%s lacks a function merge needs",
			 CB_LIBGIT2_SONAME);
		dlclose(h);
		return;
	}
	git.handle = h;
}

/* 0 with libgit2 loaded and initialised (the caller calls git.shutdown), or -errno. */
static int git_start(void)
{
	pthread_once(&git.once, git_load);
	if (!git.handle)
		return cb_error_set(ENOSYS, "merge: cannot load libgit2 (%s): %s",
				    CB_LIBGIT2_SONAME, git.error);
	if (git.init() < 0)
		return cb_error_set(EIO, "merge: libgit2 did not start");
	return 0;
}

enum merge_plan {
	PLAN_NONE = 0, /* target keeps what it has */
	PLAN_TAKE,     /* target gets source's entry */
	PLAN_CONTENT,  /* target gets the bytes in buf, with mode */
};

struct merge_item {
	const struct cb_diff_event *ev; /* old: the ancestor, new: source's */
	struct cb_entry have;		/* target's live entry */
	enum merge_plan plan;
	char *buf; /* PLAN_CONTENT: the merged bytes */
	size_t len;
	unsigned mode;
	int from_base; /* PLAN_TAKE of a file: the base holds its bytes (else source's blob) */
	int written;   /* done by a writing thread */
};

int cb_ws_merge_strategy_parse(const char *s, enum cb_ws_merge_strategy *out)
{
	if (!s || !strcmp(s, "merge"))
		*out = CB_WS_MERGE_MERGE;
	else if (!strcmp(s, "ours"))
		*out = CB_WS_MERGE_OURS;
	else if (!strcmp(s, "theirs"))
		*out = CB_WS_MERGE_THEIRS;
	else
		return cb_error_set(EINVAL, "merge: strategy %s: not merge, ours or theirs", s);
	return 0;
}

void cb_ws_merge_result_free(struct cb_ws_merge_result *res)
{
	for (size_t i = 0; i < res->nmerged; i++)
		free(res->merged[i]);
	for (size_t i = 0; i < res->nconflicts; i++)
		free(res->conflicts[i].path);
	for (size_t i = 0; i < res->nblocked; i++)
		free(res->blocked[i]);
	for (size_t i = 0; i < res->naudit; i++) {
		free(res->audit[i].path);
		free(res->audit[i].comm);
	}
	free(res->audit);
	free(res->merged);
	free(res->conflicts);
	free(res->blocked);
	memset(res, 0, sizeof(*res));
}

static int add_path(char ***arr, size_t *n, size_t *cap, const char *path)
{
	int ret = cb_grow(arr, cap, *n, sizeof(char *), 16, "merge");

	if (ret)
		return ret;
	if (!((*arr)[*n] = strdup(path)))
		return cb_error_set(ENOMEM, "merge: out of memory");
	(*n)++;
	return 0;
}

static int add_conflict(struct cb_ws_merge_result *res, const char *path, const char *kind,
			const char *resolution)
{
	int ret = cb_grow(&res->conflicts, &res->cap_conflicts, res->nconflicts,
			  sizeof(*res->conflicts), 16, "merge");

	if (ret)
		return ret;
	res->conflicts[res->nconflicts] = (struct cb_ws_merge_conflict){
	    .path = strdup(path), .kind = kind, .resolution = resolution};
	if (!res->conflicts[res->nconflicts].path)
		return cb_error_set(ENOMEM, "merge: out of memory");
	res->nconflicts++;
	return 0;
}

/* src's bytes (src is consumed: closed on every path), checked against e's hashes through a
 * memfd so a later change to src cannot slip in, into *buf (malloc'd, *len bytes). what names
 * src in errors. */
static int read_checked(int src, const struct cb_entry *e, const char *what, char **buf,
			size_t *len)
{
	int mem, ret;

	*buf = NULL;
	*len = 0;
	mem = memfd_create("cowbox-merge", MFD_CLOEXEC);
	if (mem < 0) {
		ret = cb_error_set(errno, "merge: memfd: %s", strerror(errno));
		goto out;
	}
	if ((ret = cb_ws_copy_checked(src, mem, e, what)))
		goto out;
	*buf = malloc((size_t)e->size + 1);
	if (!*buf) {
		ret = cb_error_set(ENOMEM, "merge: out of memory reading %s", e->path);
		goto out;
	}
	if (pread(mem, *buf, (size_t)e->size, 0) != e->size) {
		ret = cb_error_set(EIO, "merge: short read of %s", e->path);
		goto out;
	}
	*len = (size_t)e->size;
	ret = 0;
out:
	if (ret) {
		free(*buf);
		*buf = NULL;
	}
	if (mem >= 0)
		close(mem);
	close(src);
	return ret;
}

/* e's bytes (a file recorded in t: its base file when that still holds them, else its blob),
 * checked against e's hashes, into *buf (malloc'd, *len bytes). */
static int read_recorded(struct cb_turns *t, const struct cb_entry *e, char **buf, size_t *len)
{
	char hex[2 * CB_XXH128_LEN + 1], what[256];
	int src = -1;

	*buf = NULL;
	*len = 0;
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (t->base_fd >= 0 && !t->in_place && ws_base_holds(t, e->path, e->xxh3) == 1) {
		src = cb_beneath_open(t->base_fd, e->path, O_RDONLY, 0);
		snprintf(what, sizeof(what), "base file");
	}
	if (src < 0) {
		cb_error_clear();
		src = cb_ws_blob_open(t->blob_fd, e->xxh3);
		snprintf(what, sizeof(what), "blob %s", hex);
	}
	if (src < 0)
		return cb_error_wrap(src, "merge: content of %s", e->path);
	return read_checked(src, e, what, buf, len);
}

/* Target's live file e (just hashed through the mount), read and checked again. */
static int read_live(struct cb_turns *t, const struct cb_entry *e, char **buf, size_t *len)
{
	int src = cb_beneath_open(t->root_fd, e->path, O_RDONLY, 0);

	*buf = NULL;
	*len = 0;
	if (src < 0)
		return cb_error_wrap(src, "merge: %s", e->path);
	/* It changed since it was hashed: the caller's check (target's tree against its latest
	 * turn) would be stale, so the merge stops. */
	return read_checked(src, e, "target file", buf, len);
}

static int is_binary(const char *buf, size_t len)
{
	return memchr(buf, 0, len < MERGE_BINARY_PROBE ? len : MERGE_BINARY_PROBE) != NULL;
}

static int same_content(const struct cb_entry *a, const struct cb_entry *b)
{
	return a->type == CB_ENTRY_FILE && b->type == CB_ENTRY_FILE && a->size == b->size &&
	       !memcmp(a->sha256, b->sha256, CB_SHA256_LEN);
}

/* Three-way of one attribute: the side that changed it wins; both changed differently: -1. */
static int pick3(unsigned anc, unsigned ours, unsigned theirs, unsigned *out)
{
	if (ours == theirs || anc == theirs)
		*out = ours;
	else if (anc == ours)
		*out = theirs;
	else
		return -1;
	return 0;
}

/* Both sides changed a regular file (anc absent: both created it): merge content and mode. */
static int merge_file(struct cb_turns *target, struct cb_turns *source, struct merge_item *it,
		      enum cb_ws_merge_strategy strategy, const char *source_label,
		      struct cb_ws_merge_result *res)
{
	const struct cb_entry *anc = &it->ev->old, *src = &it->ev->new, *tgt = &it->have;
	int anc_file = anc->type == CB_ENTRY_FILE;
	char *ab = NULL, *tb = NULL, *sb = NULL;
	size_t al = 0, tl = 0, sl = 0;
	git_merge_file_result mr = {0};
	unsigned mode;
	int ret = 0, mode_conflict;

	/* Created on both sides with different modes: no side kept the ancestor's. */
	mode_conflict = pick3(anc_file ? anc->mode : ~0u, tgt->mode, src->mode, &mode) < 0;
	if (mode_conflict) {
		mode = strategy == CB_WS_MERGE_THEIRS ? src->mode : tgt->mode;
		if ((ret = add_conflict(res, src->path, "mode",
					strategy == CB_WS_MERGE_THEIRS ? "source" : "target")))
			return ret;
	}
	it->mode = mode;
	/* Content: one side only changed it, or both the same way. */
	if (same_content(tgt, src) || (anc_file && same_content(anc, src))) {
		it->plan = mode == tgt->mode ? PLAN_NONE : PLAN_TAKE;
		if (it->plan == PLAN_TAKE) {
			/* target's bytes with the merged mode: written as a whole file */
			if ((ret = read_live(target, tgt, &it->buf, &it->len)))
				return ret;
			it->plan = PLAN_CONTENT;
		}
		return 0;
	}
	if (anc_file && same_content(anc, tgt)) {
		if ((ret = read_recorded(source, src, &it->buf, &it->len)))
			return ret;
		it->plan = PLAN_CONTENT;
		return 0;
	}
	/* Both changed the bytes. */
	if (tgt->size > MERGE_TEXT_MAX || src->size > MERGE_TEXT_MAX ||
	    (anc_file && anc->size > MERGE_TEXT_MAX))
		goto binary;
	if ((anc_file && (ret = read_recorded(source, anc, &ab, &al))) ||
	    (ret = read_live(target, tgt, &tb, &tl)) ||
	    (ret = read_recorded(source, src, &sb, &sl)))
		goto out;
	if ((ab && is_binary(ab, al)) || is_binary(tb, tl) || is_binary(sb, sl))
		goto binary;
	{
		git_merge_file_input in_anc, in_tgt, in_src;
		git_merge_file_options opts;

		git.input_init(&in_anc, GIT_MERGE_FILE_INPUT_VERSION);
		git.input_init(&in_tgt, GIT_MERGE_FILE_INPUT_VERSION);
		git.input_init(&in_src, GIT_MERGE_FILE_INPUT_VERSION);
		git.options_init(&opts, GIT_MERGE_FILE_OPTIONS_VERSION);

		in_anc.ptr = ab ? ab : "";
		in_anc.size = al;
		in_anc.path = src->path;
		in_anc.mode = 0100644;
		in_tgt.ptr = tb;
		in_tgt.size = tl;
		in_tgt.path = src->path;
		in_tgt.mode = 0100644;
		in_src.ptr = sb;
		in_src.size = sl;
		in_src.path = src->path;
		in_src.mode = 0100644;
		opts.ancestor_label = "ancestor";
		opts.our_label = "TARGET";
		opts.their_label = source_label ? source_label : "SOURCE";
		if (git.merge_file(&mr, &in_anc, &in_tgt, &in_src, &opts) < 0) {
			const git_error *ge = git.error_last();

			ret = cb_error_set(EIO, "merge %s: libgit2: %s", src->path,
					   ge && ge->message ? ge->message : "merge failed");
			goto out;
		}
		if (!mr.automergeable && strategy != CB_WS_MERGE_MERGE) {
			/* Conflicting hunks resolved toward one side, the rest merged (git's -X).
			 */
			git.result_free(&mr);
			memset(&mr, 0, sizeof(mr));
			opts.favor = strategy == CB_WS_MERGE_OURS ? GIT_MERGE_FILE_FAVOR_OURS
								  : GIT_MERGE_FILE_FAVOR_THEIRS;
			if (git.merge_file(&mr, &in_anc, &in_tgt, &in_src, &opts) < 0) {
				ret = cb_error_set(EIO, "merge %s: libgit2 failed", src->path);
				goto out;
			}
			ret = add_conflict(res, src->path, "content",
					   strategy == CB_WS_MERGE_OURS ? "target" : "source");
		} else if (!mr.automergeable) {
			ret = add_conflict(res, src->path, "content", "markers");
		}
		if (ret)
			goto out;
		if (!(it->buf = malloc(mr.len + 1))) {
			ret = cb_error_set(ENOMEM, "merge: out of memory");
			goto out;
		}
		if (mr.len)
			memcpy(it->buf, mr.ptr, mr.len);
		it->len = mr.len;
		/* SOURCE's change is in TARGET already (merged before): nothing to write. */
		it->plan = mr.len == tl && (!tl || !memcmp(mr.ptr, tb, tl)) && mode == tgt->mode
			       ? PLAN_NONE
			       : PLAN_CONTENT;
	}
	goto out;
binary:
	ret = add_conflict(res, src->path, "binary",
			   strategy == CB_WS_MERGE_THEIRS ? "source" : "target");
	if (ret)
		goto out;
	if (strategy == CB_WS_MERGE_THEIRS) {
		it->buf = sb;
		it->len = sl;
		sb = NULL;
		if (!it->buf)
			ret = read_recorded(source, src, &it->buf, &it->len);
		it->plan = PLAN_CONTENT;
	} else if (mode != tgt->mode) {
		it->buf = tb;
		it->len = tl;
		tb = NULL;
		if (!it->buf)
			ret = read_live(target, tgt, &it->buf, &it->len);
		it->plan = PLAN_CONTENT;
	}
out:
	git.result_free(&mr);
	free(ab);
	free(tb);
	free(sb);
	return ret;
}

/* The kind of conflict when both sides changed path and not both to regular files. */
static const char *conflict_kind(const struct cb_entry *anc, const struct cb_entry *tgt,
				 const struct cb_entry *src)
{
	if (src->type == CB_ENTRY_ABSENT)
		return "delete/modify";
	if (tgt->type == CB_ENTRY_ABSENT)
		return "modify/delete";
	if (src->type != tgt->type || (anc->type != CB_ENTRY_ABSENT && anc->type != src->type))
		return "type";
	if (src->type == CB_ENTRY_SYMLINK)
		return "symlink";
	return "mode"; /* two directories */
}

/* Decide what happens to one path source changed. */
static int merge_plan_item(struct cb_turns *target, struct cb_turns *source, long long latest,
			   struct merge_item *it, enum cb_ws_merge_strategy strategy,
			   const char *source_label, struct cb_ws_merge_result *res)
{
	const struct cb_entry *anc = &it->ev->old, *src = &it->ev->new;
	const char *path = src->path ? src->path : anc->path;
	struct cb_entry rec = {0};
	const char *kind;
	int ret;

	if ((ret = ws_live_entry(target, path, 0, &it->have)))
		return cb_error_wrap(ret, "merge: %s in TARGET", path);
	if (!it->have.path && !(it->have.path = strdup(path)))
		return cb_error_set(ENOMEM, "merge: out of memory");
	if (cb_entry_same(&it->have, src))
		return 0; /* already as source has it */
	/* What the merge touches must be what target's latest turn recorded: a change made
	 * since is not in any turn, and the merge (a turn) could not be undone to it. */
	if ((ret = ws_entry_at(target, path, latest, &rec)))
		return cb_error_wrap(ret, "merge: %s at TARGET's turn %lld", path, latest);
	if (!cb_entry_same(&rec, &it->have)) {
		cb_entry_clear(&rec);
		return add_path(&res->blocked, &res->nblocked, &res->cap_blocked, path);
	}
	cb_entry_clear(&rec);
	if (cb_entry_same(&it->have, anc)) {
		it->plan = PLAN_TAKE;
		return 0;
	}
	if (src->type == CB_ENTRY_FILE && it->have.type == CB_ENTRY_FILE &&
	    (anc->type == CB_ENTRY_FILE || anc->type == CB_ENTRY_ABSENT))
		return merge_file(target, source, it, strategy, source_label, res);
	kind = conflict_kind(anc, &it->have, src);
	if (strategy == CB_WS_MERGE_THEIRS)
		it->plan = PLAN_TAKE;
	return add_conflict(res, path, kind, strategy == CB_WS_MERGE_THEIRS ? "source" : "target");
}

/* Source's content of e into the temporary file dst, checked while copied: from the base
 * when from_base (decided on the merge's own thread: it asks the db), else, or when the base
 * changed meanwhile, from source's blob. No db access: it runs on the writing threads. */
static int merge_copy_source(struct cb_turns *source, const struct cb_entry *e, int from_base,
			     int dst)
{
	char hex[2 * CB_XXH128_LEN + 1], what[256];
	int src = -1, ret;

	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (from_base) {
		src = cb_beneath_open(source->base_fd, e->path, O_RDONLY, 0);
		snprintf(what, sizeof(what), "base file %s", e->path);
		if (src >= 0) {
			ret = cb_ws_copy_checked(src, dst, e, what);
			close(src);
			if (ret != -EBADMSG)
				return ret;
			if (ftruncate(dst, 0) < 0 || lseek(dst, 0, SEEK_SET) < 0)
				return cb_error_set(errno, "merge %s: %s", e->path,
						    strerror(errno));
		}
	}
	cb_error_clear();
	if ((src = cb_ws_blob_open(source->blob_fd, e->xxh3)) < 0)
		return cb_error_wrap(src, "merge: content of %s", e->path);
	snprintf(what, sizeof(what), "%s (blob %s)", e->path, hex);
	ret = cb_ws_copy_checked(src, dst, e, what);
	close(src);
	return ret;
}

static int write_all(int fd, const char *buf, size_t len, const char *path)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return cb_error_set(n < 0 ? errno : EIO, "merge: write %s: %s", path,
					    strerror(n < 0 ? errno : EIO));
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* A file (source's entry, or the merged bytes) built under a temporary name in its pinned
 * parent directory and renamed over path: readers see the old or the new file, never a mix,
 * and a kill leaves at most the temporary name (removed at the next start, as rollback's). */
static int merge_write_file(struct cb_turns *target, struct cb_turns *source,
			    const struct merge_item *it, mode_t um)
{
	const struct cb_entry *src = &it->ev->new;
	const char *name;
	char tmp[64];
	static unsigned counter;
	unsigned mode = (it->plan == PLAN_CONTENT ? it->mode : src->mode) & 0777;
	int pfd, dst, ret;

	pfd = cb_beneath_parent(target->root_fd, src->path, &name);
	if (pfd < 0)
		return cb_error_wrap(pfd, "merge %s: its directory", src->path);
	snprintf(tmp, sizeof(tmp), CB_WS_ROLLBACK_TMP "%d.m%u", (int)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	dst = openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
		     mode);
	if (dst < 0) {
		ret = cb_error_set(errno, "merge %s: create: %s", src->path, strerror(errno));
		goto out;
	}
	if (it->plan == PLAN_CONTENT)
		ret = write_all(dst, it->buf, it->len, src->path);
	else
		ret = merge_copy_source(source, src, it->from_base, dst);
	/* The mode without set-id or sticky bits (SOURCE is untrusted); a chmod (one more FUSE
	 * round trip and journal mark) only when the umask took bits away. */
	if (!ret && (mode & um) && fchmod(dst, mode) < 0)
		ret = cb_error_set(errno, "merge %s: chmod: %s", src->path, strerror(errno));
	if (close(dst) < 0 && !ret)
		ret = cb_error_set(errno, "merge %s: close: %s", src->path, strerror(errno));
	if (!ret && renameat(pfd, tmp, pfd, name) < 0)
		ret = cb_error_set(errno, "merge %s: rename: %s", src->path, strerror(errno));
	if (ret)
		unlinkat(pfd, tmp, 0);
out:
	close(pfd);
	return ret;
}

static int merge_write_symlink(struct cb_turns *target, const struct cb_entry *e)
{
	const char *name;
	char tmp[64];
	static unsigned counter;
	int pfd = cb_beneath_parent(target->root_fd, e->path, &name), ret = 0;

	if (pfd < 0)
		return cb_error_wrap(pfd, "merge symlink %s: its directory", e->path);
	snprintf(tmp, sizeof(tmp), CB_WS_ROLLBACK_TMP "%d.s%u", (int)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
	if (symlinkat(e->target ? e->target : "", pfd, tmp) < 0)
		ret = cb_error_set(errno, "merge symlink %s: %s", e->path, strerror(errno));
	else if (renameat(pfd, tmp, pfd, name) < 0) {
		ret = cb_error_set(errno, "merge symlink %s: %s", e->path, strerror(errno));
		unlinkat(pfd, tmp, 0);
	}
	close(pfd);
	return ret;
}

/* Remove what target has at path (a file, symlink or an empty directory). 1 if a directory
 * was not empty (target put something in it): kept, and the caller lists the conflict. */
static int merge_remove(struct cb_turns *target, const struct cb_entry *have)
{
	const char *name;
	int pfd = cb_beneath_parent(target->root_fd, have->path, &name), ret = 0;

	if (pfd < 0)
		return cb_beneath_gone(pfd) ? (cb_error_clear(), 0)
					    : cb_error_wrap(pfd, "merge: remove %s", have->path);
	if (unlinkat(pfd, name, have->type == CB_ENTRY_DIR ? AT_REMOVEDIR : 0) < 0) {
		if (errno == ENOTEMPTY || errno == EEXIST)
			ret = 1;
		else if (errno != ENOENT)
			ret = cb_error_set(errno, "merge: remove %s: %s", have->path,
					   strerror(errno));
	}
	close(pfd);
	return ret;
}

static int item_cmp(const void *key, const void *elem)
{
	const struct merge_item *it = elem;
	const char *p = it->ev->new.path ? it->ev->new.path : it->ev->old.path;

	return strcmp(key, p);
}

/* 1 if path's parent directory is there in target (or the merge makes it), else 0. */
static int parent_present(struct cb_turns *target, const struct merge_item *items, size_t n,
			  const char *path)
{
	const char *slash = strrchr(path, '/');
	const struct merge_item *p;
	struct stat st;
	char *parent;
	int ret;

	if (!slash)
		return 1;
	if (!(parent = strndup(path, (size_t)(slash - path))))
		return cb_error_set(ENOMEM, "merge: out of memory");
	p = bsearch(parent, items, n, sizeof(*items), item_cmp);
	if (p && (p->plan == PLAN_TAKE || p->plan == PLAN_NONE) &&
	    (p->plan == PLAN_TAKE ? p->ev->new.type : p->have.type) == CB_ENTRY_DIR)
		ret = 1;
	else if (p)
		ret = 0;
	else {
		ret = cb_beneath_stat(target->root_fd, parent, &st) == 0 && S_ISDIR(st.st_mode);
		cb_error_clear();
	}
	free(parent);
	return ret;
}

#define MERGE_THREADS 4

/* 1 if the item is a regular file to write (a writing thread's job). */
static int is_file_job(const struct merge_item *it)
{
	return it->plan == PLAN_CONTENT ||
	       (it->plan == PLAN_TAKE && it->ev->new.type == CB_ENTRY_FILE);
}

struct merge_jobs {
	struct cb_turns *target, *source;
	struct merge_item *items;
	size_t n, next;
	mode_t um;
	double stall;
	pthread_mutex_t lock;
	int err;
	char msg[512];
};

static void *merge_writer(void *arg)
{
	struct merge_jobs *j = arg;

	for (;;) {
		struct merge_item *it = NULL;
		int ret;

		pthread_mutex_lock(&j->lock);
		while (!j->err && j->next < j->n && !is_file_job(&j->items[j->next]))
			j->next++;
		if (!j->err && j->next < j->n)
			it = &j->items[j->next++];
		pthread_mutex_unlock(&j->lock);
		if (!it)
			return NULL;
		/* Tests only: a window between two writes, to kill the daemon in. */
		if (j->stall > 0)
			usleep((useconds_t)(j->stall * 1e6));
		ret = merge_write_file(j->target, j->source, it, j->um);
		if (ret) {
			pthread_mutex_lock(&j->lock);
			if (!j->err) {
				j->err = ret;
				snprintf(j->msg, sizeof(j->msg), "%s", cb_error_message());
			}
			pthread_mutex_unlock(&j->lock);
		} else {
			it->written = 1;
		}
	}
}

/* Write the plan: removals deepest first, then everything else parents first; directory
 * modes last, deepest first, so a read-only directory blocks nothing. */
static int merge_apply(struct cb_turns *target, struct cb_turns *source, struct merge_item *items,
		       size_t n, struct cb_ws_merge_result *res)
{
	const char *stall = getenv("COWBOX_TEST_MERGE_STALL");
	int ret = 0;

	for (size_t i = n; i-- > 0 && !ret;) {
		struct merge_item *it = &items[i];

		if (it->plan != PLAN_TAKE || it->have.type == CB_ENTRY_ABSENT ||
		    it->have.type == it->ev->new.type)
			continue;
		ret = merge_remove(target, &it->have);
		if (ret == 1) {
			ret = add_conflict(res, it->have.path, "directory", "target");
			it->plan = PLAN_NONE;
			continue;
		}
		/* A removal is the whole of the item's write when source deleted the path. */
		if (!ret && it->ev->new.type == CB_ENTRY_ABSENT)
			it->written = 1;
		else if (!ret)
			res->written++;
	}
	/* Directories and symlinks in order (parents first), on this thread. */
	for (size_t i = 0; i < n && !ret; i++) {
		struct merge_item *it = &items[i];
		const struct cb_entry *src = &it->ev->new;

		if (it->plan == PLAN_NONE || src->type == CB_ENTRY_ABSENT || is_file_job(it))
			continue;
		if (src->type == CB_ENTRY_SYMLINK)
			ret = merge_write_symlink(target, src);
		else if (it->have.type != CB_ENTRY_DIR) {
			ret = cb_beneath_mkdir(target->root_fd, src->path, 0700);
			if (ret == -EEXIST)
				ret = 0;
		}
		it->written = !ret;
	}
	/* Files on a few threads: each is several FUSE round trips and journal marks, and
	 * concurrent marks share one group commit. Where a file's bytes come from is asked of
	 * the db here first (the threads do not touch it). */
	for (size_t i = 0; i < n && !ret; i++) {
		struct merge_item *it = &items[i];

		if (is_file_job(it) && it->plan == PLAN_TAKE && source->base_fd >= 0 &&
		    !source->in_place)
			it->from_base =
			    ws_base_holds(source, it->ev->new.path, it->ev->new.xxh3) == 1;
	}
	if (!ret) {
		struct merge_jobs j = {.target = target,
				       .source = source,
				       .items = items,
				       .n = n,
				       .um = ws_process_umask(),
				       .stall = stall && *stall ? atof(stall) : 0};
		pthread_t th[MERGE_THREADS];
		size_t started = 0;

		pthread_mutex_init(&j.lock, NULL);
		/* One writer under the test stall, so that a kill finds the merge part-way. */
		for (size_t i = 0; !j.stall && i + 1 < MERGE_THREADS; i++)
			if (pthread_create(&th[started], NULL, merge_writer, &j) == 0)
				started++;
		merge_writer(&j);
		for (size_t i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		pthread_mutex_destroy(&j.lock);
		if (j.err)
			ret = cb_error_set(j.err, "%s", j.msg);
	}
	/* What was written, in path order (even when a later one failed: it is undone), and
	 * who made each change in source (line-merged files too: the merge brings source's). */
	if (n && !(res->audit = calloc(n, sizeof(*res->audit))) && !ret)
		ret = cb_error_set(ENOMEM, "merge: out of memory");
	for (size_t i = 0; i < n; i++) {
		struct merge_item *it = &items[i];
		const struct cb_entry *src = &it->ev->new;
		int r;

		if (!it->written)
			continue;
		res->written++;
		if ((r = add_path(&res->merged, &res->nmerged, &res->cap_merged, it->have.path)) &&
		    !ret)
			ret = r;
		if (res->audit && (src->pid || src->comm)) {
			struct cb_ws_merge_audit *a = &res->audit[res->naudit++];

			a->pid = src->pid;
			a->path = strdup(it->have.path);
			a->comm = src->comm ? strdup(src->comm) : NULL;
			if ((!a->path || (src->comm && !a->comm)) && !ret)
				ret = cb_error_set(ENOMEM, "merge: out of memory");
		}
	}
	for (size_t i = n; i-- > 0 && !ret;) {
		const struct cb_entry *src = &items[i].ev->new;

		if (items[i].plan == PLAN_TAKE && src->type == CB_ENTRY_DIR)
			ret = cb_beneath_chmod(target->root_fd, src->path, src->mode & 0777, NULL);
	}
	return ret;
}

/* The paths the merge is about to write, and the turn they were at, durable before the first
 * write: "cowbox-merge TURN\n" then each path followed by a NUL. */
static int merge_intent_write(const char *intent, long long latest, const struct merge_item *items,
			      size_t n)
{
	char *tmp = NULL;
	FILE *f = NULL;
	int ret = 0;

	if (asprintf(&tmp, "%s.tmp", intent) < 0)
		return cb_error_set(ENOMEM, "merge: out of memory");
	if (!(f = fopen(tmp, "we"))) {
		ret = cb_error_set(errno, "merge: %s: %s", tmp, strerror(errno));
		goto out;
	}
	fprintf(f, "cowbox-merge %lld\n", latest);
	for (size_t i = 0; i < n; i++)
		if (items[i].plan != PLAN_NONE)
			fwrite(items[i].have.path, 1, strlen(items[i].have.path) + 1, f);
	if (fflush(f) || fsync(fileno(f)) < 0)
		ret = cb_error_set(errno, "merge: %s: %s", tmp, strerror(errno));
	if (fclose(f) && !ret)
		ret = cb_error_set(errno, "merge: %s: %s", tmp, strerror(errno));
	if (!ret && rename(tmp, intent) < 0)
		ret = cb_error_set(errno, "merge: %s: %s", intent, strerror(errno));
	if (ret)
		unlink(tmp);
out:
	free(tmp);
	return ret;
}

int cb_ws_merge_undo(struct cb_turns *t, const char *intent, long long *restored)
{
	struct cb_dirty *dirty = NULL;
	char *text = NULL, *p, *end;
	long long turn, latest;
	size_t len = 0, n = 0, cap = 0;
	FILE *f;
	int ret = 0;

	*restored = 0;
	if (!(f = fopen(intent, "re")))
		return errno == ENOENT ? 0 : cb_error_set(errno, "%s: %s", intent, strerror(errno));
	{
		char chunk[65536];
		size_t got;

		while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0) {
			char *bigger = realloc(text, len + got + 1);

			if (!bigger) {
				ret = cb_error_set(ENOMEM, "merge undo: out of memory");
				break;
			}
			text = bigger;
			memcpy(text + len, chunk, got);
			len += got;
		}
	}
	fclose(f);
	if (ret)
		goto out;
	if (!text || (text[len] = 0, sscanf(text, "cowbox-merge %lld", &turn) != 1) ||
	    !(p = memchr(text, '\n', len))) {
		ret = cb_error_set(EINVAL, "%s: not a merge record", intent);
		goto out;
	}
	latest = cb_db_turns_latest(t->db);
	/* Recorded as a turn before the kill: the merge is whole, nothing to undo. */
	if (latest > turn) {
		unlink(intent);
		goto out;
	}
	for (p++, end = text + len; p < end; p += strlen(p) + 1) {
		if (!*p)
			continue;
		if ((ret = cb_grow(&dirty, &cap, n, sizeof(*dirty), 64, "merge undo")))
			goto out;
		dirty[n++] = (struct cb_dirty){.path = p};
	}
	ret = cb_ws_rollback(t, turn, dirty, n, restored);
	if (!ret)
		unlink(intent);
out:
	free(dirty);
	free(text);
	return ret ? cb_error_wrap(ret, "merge undo") : 0;
}

int cb_ws_merge(struct cb_turns *target, struct cb_turns *source, long long from, long long to,
		enum cb_ws_merge_strategy strategy, const char *source_label, int dry_run,
		const char *intent, struct cb_ws_merge_result *res)
{
	struct merge_item *items = NULL;
	struct cb_diff diff = {0};
	long long latest;
	size_t i;
	int ret, git_started = 0;

	memset(res, 0, sizeof(*res));
	if ((ret = cb_ws_turn_check(source, from)) || (ret = cb_ws_turn_check(source, to)))
		return cb_error_wrap(ret, "merge: SOURCE");
	if (to < from)
		return cb_error_set(EINVAL,
				    "merge: SOURCE's turn %lld is before the common ancestor (its "
				    "turn %lld)",
				    to, from);
	latest = cb_db_turns_latest(target->db);
	if (latest < 0)
		latest = 0;
	if ((ret = git_start()))
		return ret;
	git_started = 1;
	/* Only what source changed: a path only target changed keeps target's entry. */
	if ((ret = cb_ws_diff(source, from, to, NULL, 0, &diff)))
		goto out;
	if (diff.n && !(items = calloc(diff.n, sizeof(*items)))) {
		ret = cb_error_set(ENOMEM, "merge: out of memory");
		goto out;
	}
	for (i = 0; i < diff.n && !ret; i++) {
		items[i].ev = &diff.ev[i];
		ret =
		    merge_plan_item(target, source, latest, &items[i], strategy, source_label, res);
	}
	/* A path whose directory target removed (or replaced) is a conflict too: target's
	 * choice stands. */
	for (i = 0; i < diff.n && !ret; i++) {
		struct merge_item *it = &items[i];
		int present;

		/* What target has at the path shows its directory is there. */
		if (it->plan == PLAN_NONE || it->ev->new.type == CB_ENTRY_ABSENT ||
		    it->have.type != CB_ENTRY_ABSENT)
			continue;
		present = parent_present(target, items, diff.n, it->ev->new.path);
		if (present < 0)
			ret = present;
		else if (!present) {
			it->plan = PLAN_NONE;
			ret = add_conflict(res, it->ev->new.path, "parent", "target");
		}
	}
	if (ret)
		goto out;
	if (res->nblocked) {
		ret = cb_error_set(EBUSY,
				   "merge: TARGET has changes not recorded in a turn on %zu path%s "
				   "the merge touches: %s%s (snapshot first)",
				   res->nblocked, res->nblocked == 1 ? "" : "s", res->blocked[0],
				   res->nblocked > 1 ? ", ..." : "");
		goto out;
	}
	for (i = 0; i < diff.n && items[i].plan == PLAN_NONE; i++)
		;
	/* Nothing to write (TARGET has it all, or every path is a conflict kept as TARGET's):
	 * no intent either. */
	if (!dry_run && intent && i < diff.n)
		ret = merge_intent_write(intent, latest, items, diff.n);
	if (!ret && !dry_run)
		ret = merge_apply(target, source, items, diff.n, res);
	else
		for (i = 0; i < diff.n && !ret; i++)
			if (items[i].plan != PLAN_NONE)
				ret = add_path(&res->merged, &res->nmerged, &res->cap_merged,
					       items[i].have.path);
out:
	for (i = 0; items && i < diff.n; i++) {
		cb_entry_clear(&items[i].have);
		free(items[i].buf);
	}
	free(items);
	cb_ws_diff_free(&diff);
	if (git_started)
		git.shutdown();
	return ret;
}

int cb_ws_origin_write(const char *ws_dir, const char *from_ref, long long turn)
{
	char text[128];

	snprintf(text, sizeof(text), "%s %lld\n", from_ref, turn);
	return cb_smallfile_write(ws_dir, "origin", text, 0644);
}

int cb_ws_origin_read(const char *ws_dir, char *from_ref, size_t len, long long *turn)
{
	char text[160], ref[128];
	int n = cb_smallfile_read(ws_dir, "origin", text, sizeof(text));

	if (n < 0)
		return n;
	if (sscanf(text, "%127s %lld", ref, turn) != 2 || strlen(ref) >= len || *turn < 0)
		return cb_error_set(EINVAL, "%s/origin: not a fork record", ws_dir);
	snprintf(from_ref, len, "%s", ref);
	return 0;
}
