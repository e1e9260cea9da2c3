/* Unit tests for util/beneath.c: the shared case table (util/beneath_cases.json, also run by
 * the Python mirror), every operation with a symlink at every component, the chmod fallback,
 * the setid policy, and a directory swapped for a symlink in a loop while the operations run. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "util/beneath.h"

/* Paths here are built from a short mkdtemp name; the compiler cannot know that. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

#ifndef CB_SRCDIR
#define CB_SRCDIR "."
#endif

static char top[PATH_MAX], rootdir[PATH_MAX], outside[PATH_MAX];
static int root = -1;

static void fresh(void)
{
	char tmpl[] = "/tmp/cb-beneath-XXXXXX";

	cr_assert_not_null(mkdtemp(tmpl));
	snprintf(top, sizeof(top), "%s", tmpl);
	snprintf(rootdir, sizeof(rootdir), "%s/root", top);
	snprintf(outside, sizeof(outside), "%s/outside", top);
	cr_assert_eq(mkdir(rootdir, 0755), 0);
	cr_assert_eq(mkdir(outside, 0755), 0);
	root = open(rootdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(root, 0);
}

static int rm_visit(const char *p, const struct stat *st, int type, struct FTW *f)
{
	(void)st, (void)f;
	return type == FTW_DP ? rmdir(p) : unlink(p);
}

static void cleanup(void)
{
	if (root >= 0)
		close(root);
	root = -1;
	cb_beneath_force_chmod_fallback(0);
	if (top[0])
		nftw(top, rm_visit, 16, FTW_DEPTH | FTW_PHYS);
	top[0] = 0;
}

static void put(const char *dir, const char *path, const char *content, mode_t mode)
{
	char p[PATH_MAX];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, path);
	f = fopen(p, "w");
	cr_assert_not_null(f, "%s", p);
	fputs(content, f);
	fclose(f);
	chmod(p, mode);
}

/* Everything about a tree that an escape could change: names, types, modes, owners, times,
 * sizes and bytes; appended to *out. */
static char *snap_buf;
static size_t snap_len;

static int snap_visit(const char *p, const struct stat *st, int type, struct FTW *f)
{
	char line[PATH_MAX + 256], content[256] = "";
	size_t n;

	(void)type, (void)f;
	if (S_ISREG(st->st_mode)) {
		FILE *fp = fopen(p, "r");

		n = fp ? fread(content, 1, sizeof(content) - 1, fp) : 0;
		content[n] = 0;
		if (fp)
			fclose(fp);
	} else if (S_ISLNK(st->st_mode)) {
		ssize_t r = readlink(p, content, sizeof(content) - 1);

		content[r > 0 ? r : 0] = 0;
	}
	n = (size_t)snprintf(line, sizeof(line), "%s %o %d:%d %lld %lld.%ld %s\n", p, st->st_mode,
			     (int)st->st_uid, (int)st->st_gid, (long long)st->st_size,
			     (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec, content);
	snap_buf = realloc(snap_buf, snap_len + n + 1);
	memcpy(snap_buf + snap_len, line, n + 1);
	snap_len += n;
	return 0;
}

static char *snapshot(const char *dir)
{
	snap_buf = strdup("");
	snap_len = 0;
	nftw(dir, snap_visit, 16, FTW_PHYS);
	return snap_buf;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

/* ---- the shared case table ---- */

static char *subst(const char *s)
{
	const char *at = strstr(s, "@OUTSIDE@");
	char *out;

	if (!at)
		return strdup(s);
	cr_assert_gt(asprintf(&out, "%.*s%s%s", (int)(at - s), s, outside, at + 9), 0);
	return out;
}

static void make_tree(json_t *tree)
{
	size_t i;
	json_t *e;

	json_array_foreach(tree, i, e)
	{
		const char *path = json_string_value(json_array_get(e, 0));
		const char *type = json_string_value(json_array_get(e, 1));
		const char *arg = json_string_value(json_array_get(e, 2));
		char p[PATH_MAX];

		snprintf(p, sizeof(p), "%s/%s", rootdir, path);
		if (!strcmp(type, "dir")) {
			cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
		} else if (!strcmp(type, "file")) {
			put(rootdir, path, arg, 0644);
		} else if (!strcmp(type, "symlink")) {
			char *t = subst(arg);

			cr_assert_eq(symlink(t, p), 0, "%s", p);
			free(t);
		} else if (!strcmp(type, "fifo")) {
			cr_assert_eq(mkfifo(p, 0644), 0, "%s", p);
		} else if (!strcmp(type, "chardev")) {
			/* Not root: a FIFO stands in (refused the same way). */
			if (mknod(p, S_IFCHR | 0666, makedev(1, 3)) < 0)
				cr_assert_eq(mkfifo(p, 0644), 0, "%s", p);
		} else if (!strcmp(type, "socket")) {
			struct sockaddr_un a = {.sun_family = AF_UNIX};
			int s = socket(AF_UNIX, SOCK_STREAM, 0);

			snprintf(a.sun_path, sizeof(a.sun_path), "%s", p);
			cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0, "%s", p);
			close(s);
		} else {
			cr_assert_fail("unknown tree type %s", type);
		}
	}
}

static int expect_errno(const char *what)
{
	static const struct {
		const char *name;
		int err;
	} map[] = {{"ok", 0},
		   {"symlink", ELOOP},
		   {"escape", EXDEV},
		   {"invalid", EINVAL},
		   {"not_regular", EINVAL},
		   {"directory", EISDIR},
		   {"not_found", ENOENT},
		   {"not_dir", ENOTDIR},
		   {"too_long", ENAMETOOLONG}};

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i].name, what))
			return map[i].err;
	cr_assert_fail("unknown outcome %s", what);
	return -1;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(beneath, case_table, .init = fresh, .fini = cleanup, .timeout = 60)
{
	json_error_t jerr;
	json_t *doc = json_load_file(CB_SRCDIR "/util/beneath_cases.json", 0, &jerr), *c;
	char *before;
	size_t i;
	int fds;

	cr_assert_not_null(doc, "%s", jerr.text);
	put(outside, "secret", "SECRET", 0600);
	make_tree(json_object_get(doc, "tree"));
	before = snapshot(outside);
	fds = count_fds();
	json_array_foreach(json_object_get(doc, "cases"), i, c)
	{
		const char *op = json_string_value(json_object_get(c, "op"));
		const char *data = json_string_value(json_object_get(c, "data"));
		char *path = subst(json_string_value(json_object_get(c, "path")));
		int want = expect_errno(json_string_value(json_object_get(c, "expect")));
		void *got = NULL;
		size_t n = 0;
		off_t size;
		double t0 = now();
		int rc;

		if (!strcmp(op, "write")) {
			rc = cb_beneath_write_file(root, path, 0, data ? data : "x",
						   strlen(data ? data : "x"), 1, 0);
			if (!rc)
				rc = cb_beneath_read_file(root, path, 0, SIZE_MAX, &got, &n, &size);
		} else {
			rc = cb_beneath_read_file(root, path, 0, SIZE_MAX, &got, &n, &size);
		}
		cr_expect_eq(rc, -want, "%s %.60s: got %d (%s), want %d", op, path, rc,
			     cb_error_message(), -want);
		if (!want && !rc)
			cr_expect(n == strlen(data) && !memcmp(got, data, n),
				  "%s %s: read back %.*s", op, path, (int)n, (char *)got);
		/* The message names the path (cut to its first bytes when long). */
		if (rc && *path)
			cr_expect(strstr(cb_error_message(), strndupa(path, 48)), "%s %.60s: %s",
				  op, path, cb_error_message());
		cr_expect_lt(now() - t0, 2.0, "%s %s took %.1f s", op, path, now() - t0);
		free(got);
		free(path);
	}
	{
		char *after = snapshot(outside);
		char nope[PATH_MAX];

		cr_expect_str_eq(after, before, "the outside directory changed");
		free(after);
		snprintf(nope, sizeof(nope), "%s/nope", rootdir);
		cr_expect_neq(access(nope, F_OK), 0, "a dangling symlink's target was created");
		cr_expect_neq(access("/tmp/cowbox-pwned", F_OK), 0);
		cr_expect_eq(count_fds(), fds, "fds leaked over the cases");
	}
	free(before);
	json_decref(doc);
}

/* ---- every operation, with a symlink at every component ---- */

#define DEPTH 4 /* c0/c1/c2/leaf */
static const char *comp[DEPTH] = {"cbq0", "cbq1", "cbq2", "cbqleaf"};

/* Real directories cbq0/cbq1/cbq2 with file cbqleaf in root, and the same tree in outside
 * (where a followed symlink would lead). */
static void make_chain(const char *dir)
{
	char p[PATH_MAX];
	int n = snprintf(p, sizeof(p), "%s", dir);

	for (int i = 0; i < DEPTH - 1; i++) {
		n += snprintf(p + n, sizeof(p) - (size_t)n, "/%s", comp[i]);
		mkdir(p, 0755);
	}
	snprintf(p + n, sizeof(p) - (size_t)n, "/%s", comp[DEPTH - 1]);
	put("/", p + 1, "LEAF", 0644);
}

/* The path of component i (0-based) and below, e.g. chain(1) = "cbq0/cbq1". */
static void chain(int upto, char *out, size_t len)
{
	size_t n = 0;

	out[0] = 0;
	for (int i = 0; i <= upto; i++)
		n += (size_t)snprintf(out + n, len - n, "%s%s", i ? "/" : "", comp[i]);
}

enum op {
	OP_OPEN_READ,
	OP_OPEN_CREATE,
	OP_OPEN_DIR,
	OP_STAT,
	OP_MKDIR_BELOW,
	OP_MKDIRS_BELOW,
	OP_MKNOD_BELOW,
	OP_SYMLINK_BELOW,
	OP_READLINK,
	OP_CHMOD,
	OP_CHMOD_FALLBACK,
	OP_CHOWN,
	OP_UTIMENS,
	OP_RENAME_FROM,
	OP_RENAME_TO_BELOW,
	OP_UNLINK,
	OP_RMDIR_BELOW,
	OP_REMOVE_TREE,
	OP_READ_FILE,
	OP_WRITE_FILE,
	OP_WRITE_FILE_BELOW,
	OP_COUNT
};

static const char *op_name[OP_COUNT] = {
    "open_read",   "open_create",   "open_dir",	       "stat",	 "mkdir_below",	   "mkdirs_below",
    "mknod_below", "symlink_below", "readlink",	       "chmod",	 "chmod_fallback", "chown",
    "utimens",	   "rename_from",   "rename_to_below", "unlink", "rmdir_below",	   "remove_tree",
    "read_file",   "write_file",    "write_file_below"};

/* Run op on the leaf path (or a new name below the leaf for *_BELOW); the result. */
static int run_op(enum op op, const char *leaf)
{
	char below[PATH_MAX], buf[256];
	struct stat st;
	void *data = NULL;
	size_t n;
	off_t size;
	int rc;

	snprintf(below, sizeof(below), "%s/new", leaf);
	switch (op) {
	case OP_OPEN_READ:
		rc = cb_beneath_open(root, leaf, O_RDONLY, 0);
		break;
	case OP_OPEN_CREATE:
		rc = cb_beneath_open(root, leaf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		break;
	case OP_OPEN_DIR:
		rc = cb_beneath_open(root, leaf, O_RDONLY | O_DIRECTORY, 0);
		break;
	case OP_STAT:
		return cb_beneath_stat(root, leaf, &st);
	case OP_MKDIR_BELOW:
		return cb_beneath_mkdir(root, below, 0755);
	case OP_MKDIRS_BELOW:
		return cb_beneath_mkdirs(root, below, 0755);
	case OP_MKNOD_BELOW:
		return cb_beneath_mknod(root, below, S_IFIFO | 0644, 0);
	case OP_SYMLINK_BELOW:
		return cb_beneath_symlink(root, "/etc/passwd", below);
	case OP_READLINK:
		return cb_beneath_readlink(root, leaf, buf, sizeof(buf));
	case OP_CHMOD:
		return cb_beneath_chmod(root, leaf, 0600, NULL);
	case OP_CHMOD_FALLBACK:
		cb_beneath_force_chmod_fallback(1);
		rc = cb_beneath_chmod(root, leaf, 0600, NULL);
		cb_beneath_force_chmod_fallback(0);
		return rc;
	case OP_CHOWN:
		return cb_beneath_chown(root, leaf, 12345, 12345);
	case OP_UTIMENS: {
		struct timespec ts[2] = {{1, 0}, {1, 0}};

		return cb_beneath_utimens(root, leaf, ts);
	}
	case OP_RENAME_FROM:
		return cb_beneath_rename(root, leaf, "renamed", 0);
	case OP_RENAME_TO_BELOW:
		put(rootdir, "tomove", "M", 0644);
		return cb_beneath_rename(root, "tomove", below, 0);
	case OP_UNLINK:
		return cb_beneath_unlink(root, leaf, 0);
	case OP_RMDIR_BELOW:
		return cb_beneath_unlink(root, below, AT_REMOVEDIR);
	case OP_REMOVE_TREE:
		return cb_beneath_remove_tree(root, leaf);
	case OP_READ_FILE:
		rc = cb_beneath_read_file(root, leaf, 0, SIZE_MAX, &data, &n, &size);
		free(data);
		return rc;
	case OP_WRITE_FILE:
		return cb_beneath_write_file(root, leaf, 0, "PWNED", 5, 1, 04755);
	case OP_WRITE_FILE_BELOW:
		return cb_beneath_write_file(root, below, 0, "PWNED", 5, 1, 04755);
	default:
		return -EINVAL;
	}
	if (rc >= 0)
		close(rc);
	return rc < 0 ? rc : 0;
}

/* With the symlink in place of the leaf itself, these act on the link (its own entry). */
static int acts_on_final_link(enum op op)
{
	return op == OP_STAT || op == OP_READLINK || op == OP_CHOWN || op == OP_UTIMENS ||
	       op == OP_RENAME_FROM || op == OP_UNLINK || op == OP_REMOVE_TREE;
}

Test(beneath, symlink_at_every_component, .init = fresh, .fini = cleanup)
{
	char abs_target[PATH_MAX], rel_target[PATH_MAX];
	const char *kinds[] = {"absolute-out", "relative-out", "root", "inside"};

	for (int k = 0; k < 4; k++) {
		for (int at = 0; at < DEPTH; at++) {
			for (int op = 0; op < OP_COUNT; op++) {
				char leaf[PATH_MAX], link[PATH_MAX], real[PATH_MAX], path[PATH_MAX];
				char *before, *after;
				int rc, fd;

				/* A fresh root each time: root/cbq0/cbq1/cbq2/cbqleaf, and the
				 * mirror in outside that a followed symlink reaches. */
				cleanup();
				fresh();
				make_chain(rootdir);
				make_chain(outside);
				chain(at, link, sizeof(link));
				chain(DEPTH - 1, leaf, sizeof(leaf));
				snprintf(path, sizeof(path), "%s/%s", rootdir, link);
				snprintf(real, sizeof(real), "%s.real", path);
				cr_assert_eq(rename(path, real), 0);
				snprintf(abs_target, sizeof(abs_target), "%s/%s", outside, link);
				snprintf(rel_target, sizeof(rel_target), "%s", comp[at]);
				if (k == 1) {
					/* ../ as many times as needed to reach top, then outside/.
					 */
					size_t n = 0;

					for (int i = 0; i <= at; i++)
						n += (size_t)snprintf(
						    rel_target + n, sizeof(rel_target) - n, "../");
					snprintf(rel_target + n, sizeof(rel_target) - n,
						 "outside/%s", link);
				} else if (k == 3) {
					snprintf(rel_target, sizeof(rel_target), "%s.real",
						 comp[at]);
				}
				cr_assert_eq(symlink(k == 0   ? abs_target
						     : k == 2 ? "/"
							      : rel_target,
						     path),
					     0);
				before = snapshot(outside);
				rc = run_op((enum op)op, leaf);
				after = snapshot(outside);
				cr_expect_str_eq(after, before,
						 "%s link at %d, %s: outside changed", kinds[k], at,
						 op_name[op]);
				if (op == OP_REMOVE_TREE)
					/* A symlink on the way: no such path here, nothing to do.
					 */
					cr_expect_eq(rc, 0, "%s link at %d, remove_tree: %s",
						     kinds[k], at, cb_error_message());
				else if (at == DEPTH - 1 && acts_on_final_link((enum op)op))
					cr_expect(rc >= 0 || (op == OP_CHOWN && rc == -EPERM),
						  "%s link at leaf, %s: %d %s", kinds[k],
						  op_name[op], rc, cb_error_message());
				else if (at == DEPTH - 1 &&
					 (op == OP_MKDIR_BELOW || op == OP_MKNOD_BELOW ||
					  op == OP_SYMLINK_BELOW || op == OP_RMDIR_BELOW ||
					  op == OP_MKDIRS_BELOW || op == OP_RENAME_TO_BELOW ||
					  op == OP_WRITE_FILE_BELOW || op == OP_OPEN_DIR))
					cr_expect(rc < 0, "%s link at leaf, %s succeeded", kinds[k],
						  op_name[op]);
				else
					cr_expect_eq(rc, -ELOOP, "%s link at %d, %s: %d %s",
						     kinds[k], at, op_name[op], rc,
						     cb_error_message());
				/* Nothing was made at / either. */
				for (int i = 0; i < DEPTH; i++) {
					snprintf(path, sizeof(path), "/%s", comp[i]);
					cr_assert_neq(access(path, F_OK), 0, "%s exists", path);
				}
				fd = open("/new", O_PATH);
				cr_assert_lt(fd, 0, "/new was made");
				free(before);
				free(after);
			}
		}
	}
}

/* ---- chmod: never through a symlink, fchmodat2 or not; the setid policy ---- */

Test(beneath, chmod_fallback_never_follows, .init = fresh, .fini = cleanup)
{
	char p[PATH_MAX];
	struct stat st;

	put(outside, "target", "T", 0600);
	snprintf(p, sizeof(p), "%s/target", outside);
	cr_assert_eq(symlinkat(p, root, "link"), 0);
	put(rootdir, "file", "F", 0600);
	for (int fallback = 0; fallback < 2; fallback++) {
		cb_beneath_force_chmod_fallback(fallback);
		cr_expect_eq(cb_beneath_chmod(root, "link", 04777, NULL), -ELOOP);
		cr_assert_eq(stat(p, &st), 0);
		cr_expect_eq(st.st_mode & 07777, 0600, "fallback %d chmodded the target", fallback);
		cr_expect_eq(cb_beneath_chmod(root, "file", 0751, NULL), 0, "%s",
			     cb_error_message());
		cr_assert_eq(fstatat(root, "file", &st, 0), 0);
		cr_expect_eq(st.st_mode & 07777, 0751);
		cr_expect_eq(cb_beneath_chmod(root, "file", 0600, NULL), 0);
	}
}

Test(beneath, setid_bits_only_for_owners_in_range, .init = fresh, .fini = cleanup)
{
	struct cb_beneath_setid none = {0, 0}, mine = {100000, 65536};
	struct stat st;
	int fd;

	put(rootdir, "root-owned", "x", 0755);
	put(rootdir, "mapped", "x", 0755);
	cr_assert_eq(fchownat(root, "mapped", 100000, 100005, 0), 0);
	for (int fallback = 0; fallback < 2; fallback++) {
		cb_beneath_force_chmod_fallback(fallback);
		cr_assert_eq(cb_beneath_chmod(root, "root-owned", 06755, &mine), 0);
		cr_assert_eq(fstatat(root, "root-owned", &st, 0), 0);
		cr_expect_eq(st.st_mode & 07777, 0755, "root's file kept setid bits");
		cr_assert_eq(cb_beneath_chmod(root, "mapped", 06755, NULL), 0);
		cr_assert_eq(fstatat(root, "mapped", &st, 0), 0);
		cr_expect_eq(st.st_mode & 07777, 0755, "no range: bits kept");
		cr_assert_eq(cb_beneath_chmod(root, "mapped", 06755, &none), 0);
		cr_assert_eq(fstatat(root, "mapped", &st, 0), 0);
		cr_expect_eq(st.st_mode & 07777, 0755);
		cr_assert_eq(cb_beneath_chmod(root, "mapped", 06755, &mine), 0);
		cr_assert_eq(fstatat(root, "mapped", &st, 0), 0);
		cr_expect_eq(st.st_mode & 07777, 06755, "an owner in range keeps them");
	}
	/* Created files never start setid; fchmod follows the same policy. */
	fd = cb_beneath_open(root, "new", O_WRONLY | O_CREAT | O_EXCL, 06755);
	cr_assert_geq(fd, 0, "%s", cb_error_message());
	cr_assert_eq(fstat(fd, &st), 0);
	cr_expect_eq(st.st_mode & 06000, 0);
	cr_assert_eq(cb_beneath_fchmod(fd, "new", 04755, &mine), 0);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_expect_eq(st.st_mode & 07777, 0755);
	close(fd);
	cr_assert_eq(cb_beneath_mkdir(root, "dir", 02755), 0);
	cr_assert_eq(cb_beneath_chmod(root, "dir", 06755, NULL), 0);
	cr_assert_eq(fstatat(root, "dir", &st, 0), 0);
	cr_expect_eq(st.st_mode & 07777, 02755, "a directory keeps setgid, never setuid");
}

/* ---- legal names, rename flags, remove_tree ---- */

Test(beneath, dotted_names_are_names, .init = fresh, .fini = cleanup)
{
	const char *names[] = {"a..b", "build..old", "...", "..x", "x..", ".a", "a."};
	char p[64], q[64];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", names[i], names[i]);
		snprintf(q, sizeof(q), "%s/moved", names[i]);
		cr_expect_eq(cb_beneath_check(names[i]), 0, "%s", names[i]);
		cr_expect_eq(cb_beneath_mkdirs(root, p, 0755), 0, "%s: %s", p, cb_error_message());
		cr_expect_eq(cb_beneath_rename(root, p, q, RENAME_NOREPLACE), 0, "%s", p);
		cr_expect_eq(cb_beneath_remove_tree(root, names[i]), 0, "%s", names[i]);
	}
	cr_expect_eq(cb_beneath_check("a/../b"), -EXDEV);
	cr_expect_eq(cb_beneath_check(".."), -EXDEV);
	cr_expect_eq(cb_beneath_check("a/.."), -EXDEV);
	cr_expect_eq(cb_beneath_check("/a"), -EXDEV);
	cr_expect_eq(cb_beneath_check(""), -EINVAL);
	cr_expect_eq(cb_beneath_check(NULL), -EINVAL);
	cr_expect_eq(cb_beneath_parent(root, "a/", &(const char *){0}), -EINVAL);
}

Test(beneath, rename_flags, .init = fresh, .fini = cleanup)
{
	void *d;
	size_t n;
	off_t size;

	put(rootdir, "a", "A", 0644);
	put(rootdir, "b", "B", 0644);
	cr_expect_eq(cb_beneath_rename(root, "a", "b", RENAME_NOREPLACE), -EEXIST);
	cr_expect_eq(cb_beneath_rename(root, "a", "b", RENAME_EXCHANGE), 0);
	cr_assert_eq(cb_beneath_read_file(root, "a", 0, SIZE_MAX, &d, &n, &size), 0);
	cr_expect_str_eq(d, "B");
	free(d);
}

Test(beneath, remove_tree_never_follows, .init = fresh, .fini = cleanup)
{
	char *before, p[PATH_MAX];

	make_chain(outside);
	put(outside, "cbq0/keep", "K", 0644);
	before = snapshot(outside);
	cr_assert_eq(mkdir(strcat(strcpy(p, rootdir), "/t"), 0755), 0);
	cr_assert_eq(mkdir(strcat(p, "/sub"), 0755), 0);
	cr_assert_eq(symlinkat(outside, root, "t/out"), 0);
	cr_assert_eq(symlinkat(outside, root, "t/sub/out"), 0);
	cr_assert_eq(mkfifoat(root, "t/sub/fifo", 0644), 0);
	put(rootdir, "t/sub/f", "F", 0444);
	cr_expect_eq(cb_beneath_remove_tree(root, "t"), 0, "%s", cb_error_message());
	cr_expect_neq(faccessat(root, "t", F_OK, AT_SYMLINK_NOFOLLOW), 0);
	{
		char *after = snapshot(outside);

		cr_expect_str_eq(after, before);
		free(after);
	}
	cr_expect_eq(cb_beneath_remove_tree(root, "t"), 0, "gone already is fine");
	free(before);
}

/* ---- the race: a directory swapped for a symlink to / (or out) while the ops run ---- */

struct swapper {
	int root;
	volatile int stop;
	long swaps;
};

static void *swap_loop(void *arg)
{
	struct swapper *s = arg;

	while (!s->stop)
		if (renameat2(s->root, "d", s->root, "x", RENAME_EXCHANGE) == 0)
			s->swaps++;
	return NULL;
}

Test(beneath, swap_race, .init = fresh, .fini = cleanup)
{
	const char *targets[2] = {"/", outside};
	const char *race[] = {"/cowbox-race-w", "/cowbox-race-m",  "/cowbox-race-p",
			      "/cowbox-race-s", "/cowbox-race-w2", "/cowbox-race-q",
			      "/cowbox-race-o"};
	int iterations =
	    getenv("COWBOX_RACE_ITERATIONS") ? atoi(getenv("COWBOX_RACE_ITERATIONS")) : 3000;
	long ok_reads = 0, refused = 0;

	for (size_t i = 0; i < sizeof(race) / sizeof(race[0]); i++)
		cr_assert_neq(access(race[i], F_OK), 0, "%s exists before the test", race[i]);
	/* The outside target holds the same names, with other bytes: a followed symlink would
	 * read SECRET, or change these files' bytes, modes or times. */
	put(outside, "cowbox-race-f", "SECRET", 0600);
	put(outside, "cowbox-race-w", "SECRET", 0600);
	int fds = count_fds();

	for (int t = 0; t < 2; t++) {
		struct swapper s = {.root = root};
		pthread_t th;
		char *before;

		cb_beneath_remove_tree(root, "d");
		cb_beneath_remove_tree(root, "x");
		cr_assert_eq(mkdirat(root, "d", 0755), 0);
		put(rootdir, "d/cowbox-race-f", "INSIDE", 0644);
		cr_assert_eq(symlinkat(targets[t], root, "x"), 0);
		before = snapshot(outside);
		cr_assert_eq(pthread_create(&th, NULL, swap_loop, &s), 0);
		for (int i = 0; i < iterations; i++) {
			struct timespec ts[2] = {{i, 0}, {i, 0}};
			char buf[64];
			void *data = NULL;
			size_t n = 0;
			off_t size;
			int rc, fd;

			cb_beneath_force_chmod_fallback(i & 1);
			rc = cb_beneath_read_file(root, "d/cowbox-race-f", 0, SIZE_MAX, &data, &n,
						  &size);
			if (!rc) {
				cr_assert(n == 6 && !memcmp(data, "INSIDE", 6), "read %.*s", (int)n,
					  (char *)data);
				ok_reads++;
			} else {
				cr_assert(rc == -ELOOP || rc == -ENOENT || rc == -ENOTDIR, "%d %s",
					  rc, cb_error_message());
				refused++;
			}
			free(data);
			cb_beneath_write_file(root, "d/cowbox-race-w", 0, "INSIDE", 6, 1, 0644);
			cb_beneath_mkdir(root, "d/cowbox-race-m", 0755);
			cb_beneath_unlink(root, "d/cowbox-race-m", AT_REMOVEDIR);
			cb_beneath_mknod(root, "d/cowbox-race-p", S_IFIFO | 0644, 0);
			cb_beneath_unlink(root, "d/cowbox-race-p", 0);
			cb_beneath_symlink(root, "/etc/shadow", "d/cowbox-race-s");
			cb_beneath_readlink(root, "d/cowbox-race-s", buf, sizeof(buf));
			cb_beneath_unlink(root, "d/cowbox-race-s", 0);
			cb_beneath_chmod(root, "d/cowbox-race-f", 04777, NULL);
			cb_beneath_chmod(root, "d/cowbox-race-w", 0666, NULL);
			cb_beneath_chown(root, "d/cowbox-race-w", 0, 0);
			cb_beneath_utimens(root, "d/cowbox-race-w", ts);
			cb_beneath_utimens(root, "d/cowbox-race-f", ts);
			cb_beneath_rename(root, "d/cowbox-race-w", "d/cowbox-race-w2", 0);
			cb_beneath_rename(root, "d/cowbox-race-w2", "d/cowbox-race-w", 0);
			cb_beneath_mkdirs(root, "d/cowbox-race-q/r", 0755);
			cb_beneath_remove_tree(root, "d/cowbox-race-q");
			fd = cb_beneath_open(root, "d/cowbox-race-o", O_RDWR | O_CREAT, 0644);
			if (fd >= 0)
				close(fd);
			cb_beneath_unlink(root, "d/cowbox-race-o", 0);
		}
		s.stop = 1;
		pthread_join(th, NULL);
		fprintf(stderr, "swap_race: target %s: %ld swaps, %ld reads ok, %ld refused\n",
			targets[t], s.swaps, ok_reads, refused);
		cr_expect_gt(s.swaps, 100, "the swapper hardly ran");
		{
			char *after = snapshot(outside);

			cr_expect_str_eq(after, before, "outside changed (target %s)", targets[t]);
			free(after);
		}
		for (size_t i = 0; i < sizeof(race) / sizeof(race[0]); i++)
			cr_expect_neq(access(race[i], F_OK), 0, "%s was made", race[i]);
		free(before);
	}
	cr_expect_eq(count_fds(), fds, "fds leaked over the race");
	cr_expect_gt(ok_reads, 0, "no read ever got through");
	cr_expect_gt(refused, 0, "no read ever met the symlink");
}
