/* Unit tests of the turn machinery on plain directories (a base and a live tree standing in
 * for the mount), a real meta.db and a real blob store: hash, blobs, snapshot, diff, rollback,
 * prune and fork. */
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <xxhash.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "cowbox/turns.h"

static char top[256], base[300], live[300], blobs[300], dbp[300];
static struct cb_turns *T;

static void sh(const char *fmt, const char *arg)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), fmt, arg, arg, arg);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static void put(const char *dir, const char *path, const char *content)
{
	char p[600];
	FILE *f;

	snprintf(p, sizeof(p), "%s/%s", dir, path);
	f = fopen(p, "w");
	cr_assert(f, "open %s", p);
	fputs(content, f);
	fclose(f);
}

static void setup(void)
{
	struct cb_turns_config cfg;

	snprintf(top, sizeof(top), "/tmp/cb-test-turns.XXXXXX");
	cr_assert(mkdtemp(top));
	snprintf(base, sizeof(base), "%s/base", top);
	snprintf(live, sizeof(live), "%s/live", top);
	snprintf(blobs, sizeof(blobs), "%s/blobs", top);
	snprintf(dbp, sizeof(dbp), "%s/meta.db", top);
	mkdir(base, 0755);
	mkdir(live, 0755);
	mkdir(strcat(strcpy((char[400]){0}, base), "/src"), 0755);
	put(base, "src/a.c", "int a;\n");
	put(base, "src/b.c", "int b;\n");
	put(base, "README", "hello\n");
	mkdir(strcat(strcpy((char[400]){0}, base), "/docs"), 0755);
	put(base, "docs/x.md", "x\n");
	put(base, "docs/y.md", "y\n");
	sh("cp -a %s/. %s/../live", base);
	cfg = (struct cb_turns_config){
	    .db_path = dbp, .blob_dir = blobs, .base_dir = base, .root = live};
	cr_assert_eq(cb_turns_open(&cfg, &T), 0, "%s", cb_error_message());
}

static void teardown(void)
{
	cb_turns_close(T);
	T = NULL;
	sh("rm -rf %s", top);
}

/* sha256sum-like map of a directory, for comparison: "path hash\n" lines in byte order. */
static void tree_map(const char *dir, char *out, size_t len)
{
	char cmd[700];
	FILE *p;
	size_t n;

	snprintf(cmd, sizeof(cmd),
		 "cd %s && find . -type f | sed 's|^\\./||' | LC_ALL=C sort | "
		 "while read -r f; do sha256sum \"$f\"; done",
		 dir);
	p = popen(cmd, "r");
	cr_assert(p);
	n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	pclose(p);
}

struct map_buf {
	char *out;
	size_t len, used;
};

static int map_line(const struct cb_entry *e, void *arg)
{
	struct map_buf *m = arg;
	char hex[65];

	if (e->type != CB_ENTRY_FILE)
		return 0;
	cb_hex(e->sha256, CB_SHA256_LEN, hex);
	m->used += (size_t)snprintf(m->out + m->used, m->len - m->used, "%s  %s\n", hex, e->path);
	return 0;
}

static void turn_map(char *out, size_t len)
{
	struct map_buf m = {out, len, 0};

	out[0] = '\0';
	cr_assert_eq(cb_ws_map_list(T, map_line, &m), 0, "%s", cb_error_message());
}

static void snap(long long turn, const struct cb_dirty *d, size_t n)
{
	cr_assert_eq(cb_ws_snapshot(T, turn, d, n, NULL, NULL), 0, "%s", cb_error_message());
}

static void assert_live_is_map(void)
{
	static char a[65536], b[65536];

	tree_map(live, a, sizeof(a));
	turn_map(b, sizeof(b));
	cr_assert_str_eq(a, b);
}

Test(hash, sha256_and_xxh3_in_one_pass, .init = setup, .fini = teardown)
{
	struct cb_hash h;
	struct stat st;
	char hex[65];
	XXH128_canonical_t c;

	put(top, "abc", "abc");
	cr_assert_eq(
	    cb_ws_hash_file_at(AT_FDCWD, strcat(strcpy((char[400]){0}, top), "/abc"), -1, &h, &st),
	    0);
	cb_hex(h.sha256, 32, hex);
	cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	XXH128_canonicalFromHash(&c, XXH3_128bits("abc", 3));
	cr_assert_eq(memcmp(c.digest, h.xxh3, 16), 0);
	cr_assert_eq(st.st_size, 3);
	cr_assert_lt(cb_ws_hash_file_at(AT_FDCWD, "/nonexistent/x", -1, &h, &st), 0);
	cr_assert(strstr(cb_error_message(), "/nonexistent/x"));
}

static int need_none(const unsigned char *x, void *a)
{
	(void)x;
	(void)a;
	return 0;
}

Test(blobs, put_dedup_usage_gc, .init = setup, .fini = teardown)
{
	int bfd = open(blobs, O_RDONLY | O_DIRECTORY), src;
	struct cb_hash h;
	long long count, bytes, removed, freed;
	char p[400];

	put(top, "data", "some content\n");
	snprintf(p, sizeof(p), "%s/data", top);
	cr_assert_eq(cb_ws_hash_file_at(AT_FDCWD, p, -1, &h, NULL), 0);
	src = open(p, O_RDONLY);
	cr_assert_eq(cb_ws_blob_put_fd(bfd, src, h.xxh3), 0, "%s", cb_error_message());
	cr_assert_eq(cb_ws_blob_put_fd(bfd, src, h.xxh3), 0);
	cr_assert(cb_ws_blob_has(bfd, h.xxh3));
	cr_assert_eq(cb_ws_blob_usage(bfd, &count, &bytes), 0);
	cr_assert_eq(count, 1);
	cr_assert_gt(bytes, 0);
	close(src);
	src = cb_ws_blob_open(bfd, h.xxh3);
	cr_assert_geq(src, 0);
	{
		struct cb_hash h2;

		cr_assert_eq(cb_ws_hash_fd(src, -1, &h2, NULL), 0);
		cr_assert_eq(memcmp(h.sha256, h2.sha256, 32), 0);
	}
	close(src);
	cr_assert_eq(cb_ws_blob_gc(bfd, need_none, NULL, &removed, &freed), 0);
	cr_assert_eq(removed, 1);
	cr_assert_gt(freed, 0);
	cr_assert_not(cb_ws_blob_has(bfd, h.xxh3));
	close(bfd);
}

Test(snapshot, first_is_base_then_incremental, .init = setup, .fini = teardown)
{
	struct cb_diff ch = {0};
	struct cb_dirty d[] = {{"src/a.c", 0, 42, "vim", 0}, {"new.txt", 0, 43, "touch", 0}};
	struct cb_entry e = {0};

	snap(1, NULL, 0);
	assert_live_is_map();
	put(live, "src/a.c", "int a = 2;\n");
	put(live, "new.txt", "new\n");
	cr_assert_eq(cb_ws_snapshot(T, 2, d, 2, "two", &ch), 0, "%s", cb_error_message());
	assert_live_is_map();
	cr_assert_eq(ch.n, 2);
	cr_assert_str_eq(ch.ev[0].new.path, "new.txt");
	cr_assert_eq(ch.ev[0].kind, CB_DIFF_CREATED);
	cr_assert_eq(ch.ev[1].kind, CB_DIFF_MODIFIED);
	cr_assert_eq(ch.ev[1].new.pid, 42);
	cb_ws_diff_free(&ch);
	/* the old content is the base's; the new content was kept as a blob */
	cr_assert_eq(cb_ws_entry_at(T, "src/a.c", 2, &e), 0);
	{
		int bfd = open(blobs, O_RDONLY | O_DIRECTORY);

		cr_assert(cb_ws_blob_has(bfd, e.xxh3));
		close(bfd);
	}
	cb_entry_clear(&e);
	/* a turn that is already recorded is refused with a reason */
	cr_assert_eq(cb_ws_snapshot(T, 2, NULL, 0, NULL, NULL), -EINVAL);
	cr_assert(strstr(cb_error_message(), "already recorded"));
}

Test(snapshot, base_cache_notices_change_behind_our_back, .init = setup, .fini = teardown)
{
	struct cb_entry was = {0}, e = {0};
	struct cb_turns_config cfg = {
	    .db_path = dbp, .blob_dir = blobs, .base_dir = base, .root = live};
	struct cb_hash h;
	char p[400];

	snap(1, NULL, 0);
	cr_assert_eq(cb_ws_entry_at(T, "README", 0, &was), 0);
	cr_assert_eq(cb_ws_base_holds(T, "README", was.xxh3), 1);
	cb_turns_close(T);
	/* same size, other bytes, new mtime: the cache must not be trusted across a reopen */
	put(base, "README", "HELLO\n");
	snprintf(p, sizeof(p), "%s/README", base);
	cr_assert_eq(cb_ws_hash_file_at(AT_FDCWD, p, -1, &h, NULL), 0);
	cr_assert_eq(cb_turns_open(&cfg, &T), 0);
	cr_assert_eq(cb_ws_base_holds(T, "README", was.xxh3), 0);
	cr_assert_eq(cb_ws_base_holds(T, "README", h.xxh3), 1);
	/* and turn 0 is still what the first snapshot saw: history is not rewritten */
	cr_assert_eq(cb_ws_entry_at(T, "README", 0, &e), 0);
	cr_assert_eq(memcmp(e.sha256, was.sha256, 32), 0);
	cb_entry_clear(&e);
	cb_entry_clear(&was);
}

struct progress_seen {
	int calls;
	long long done, total, bytes_done, bytes_total;
};

static void progress_cb(void *arg, long long done, long long total, long long bytes_done,
			long long bytes_total)
{
	struct progress_seen *p = arg;

	p->calls++;
	p->done = done;
	p->total = total;
	p->bytes_done = bytes_done;
	p->bytes_total = bytes_total;
}

Test(snapshot, first_hash_reports_progress, .init = setup, .fini = teardown)
{
	struct progress_seen seen = {0};
	struct cb_turns_config cfg = {.db_path = dbp,
				      .blob_dir = blobs,
				      .base_dir = base,
				      .root = live,
				      .progress = progress_cb,
				      .progress_arg = &seen};

	cb_turns_close(T);
	cr_assert_eq(cb_turns_open(&cfg, &T), 0);
	snap(1, NULL, 0);
	/* a start and an end at least, and the end is the whole base (5 files, 24 bytes) */
	cr_assert_geq(seen.calls, 2);
	cr_assert_eq(seen.done, 5);
	cr_assert_eq(seen.total, 5);
	cr_assert_eq(seen.bytes_done, 24);
	cr_assert_eq(seen.bytes_total, 24);
	/* the base is cached now: the next map build hashes nothing and says nothing */
	seen.calls = 0;
	cr_assert_eq(cb_db_turns_map_set_turn(cb_turns_db(T), -1), 0);
	assert_live_is_map();
	cr_assert_eq(seen.calls, 0);
}

Test(rollback, refuses_base_content_that_changed, .init = setup, .fini = teardown)
{
	struct cb_dirty d[] = {{"README", 0, 0, NULL, 0}};
	long long touched;

	snap(1, NULL, 0);
	put(live, "README", "edited\n");
	snap(2, d, 1);
	/* turn 1's README lives only in the base (no blob), and the base changes behind our
	 * back: the rollback must say so, not restore other bytes */
	put(base, "README", "tampered, longer\n");
	{
		int rr = cb_ws_rollback(T, 1, NULL, 0, &touched);

		cr_assert_eq(rr, -ENOENT, "%d %s", rr, cb_error_message());
	}
	cr_assert(strstr(cb_error_message(), "README at turn 1"), "%s", cb_error_message());
	cr_assert(strstr(cb_error_message(), "neither in the base"), "%s", cb_error_message());
	{
		static char now[4096];
		FILE *f;
		char p[600];

		snprintf(p, sizeof(p), "%s/README", live);
		f = fopen(p, "r");
		cr_assert(f);
		now[fread(now, 1, sizeof(now) - 1, f)] = '\0';
		fclose(f);
		cr_assert_str_eq(now, "edited\n");
	}
}

/* A directory swapped for a symlink to outside the tree: neither the snapshot nor the
 * rollback may follow it (the daemon is root and the link is the sandboxed program's). */
Test(rollback, never_follows_a_planted_symlink, .init = setup, .fini = teardown)
{
	struct cb_dirty d[] = {{"esc", 0, 0, NULL, 0}, {"esc/s.txt", 0, 0, NULL, 0}};
	char p[600], outside[400];
	static char map[65536], now[65536];
	long long touched;
	struct stat st;

	snprintf(outside, sizeof(outside), "%s/outside", top);
	cr_assert_eq(mkdir(outside, 0700), 0);
	put(outside, "s.txt", "secret\n");
	snprintf(p, sizeof(p), "%s/esc", live);
	cr_assert_eq(mkdir(p, 0755), 0);
	put(live, "esc/s.txt", "mine\n");
	snap(1, d, 2);
	turn_map(map, sizeof(map));
	cr_assert(strstr(map, "esc/s.txt"));
	put(live, "esc/s.txt", "gone\n");
	snprintf(p, sizeof(p), "%s/esc/s.txt", live);
	cr_assert_eq(unlink(p), 0);
	snprintf(p, sizeof(p), "%s/esc", live);
	cr_assert_eq(rmdir(p), 0);
	cr_assert_eq(symlink(outside, p), 0);
	snap(2, d, 2);
	turn_map(now, sizeof(now));
	cr_assert_null(strstr(now, "esc/s.txt"), "followed the link: %s", now);
	{
		struct cb_entry e = {0};

		cr_assert_eq(cb_ws_entry_at(T, "esc", 2, &e), 0);
		cr_assert_eq(e.type, CB_ENTRY_SYMLINK);
		cb_entry_clear(&e);
	}
	/* back to turn 1: the link goes, a real directory comes back, outside is untouched */
	cr_assert_eq(cb_ws_rollback(T, 1, NULL, 0, &touched), 0, "%s", cb_error_message());
	snprintf(p, sizeof(p), "%s/esc", live);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISDIR(st.st_mode));
	tree_map(live, now, sizeof(now));
	cr_assert_str_eq(now, map);
	tree_map(outside, now, sizeof(now));
	cr_assert(strstr(now, "s.txt") && !strstr(now, "6a4b"), "%s", now);
	{
		FILE *f;
		char buf[64] = "";

		snprintf(p, sizeof(p), "%s/s.txt", outside);
		f = fopen(p, "r");
		cr_assert(f);
		cr_assert(fgets(buf, sizeof(buf), f));
		fclose(f);
		cr_assert_str_eq(buf, "secret\n");
	}
}

static struct cb_dirty all_dirty[] = {
    {"src", 1, 1, "mv", 0},	     {"lib", 1, 1, "mv", 0},  {"README", 0, 2, "rm", 0},
    {"docs/x.md", 0, 3, "chmod", 0}, {"link", 0, 4, "ln", 0}, {"docs/y.md", 0, 5, "sh", 0},
    {"empty", 0, 6, "mkdir", 0},
};

/* A turn with every kind of change: dir rename, delete, chmod, symlink, type change. */
static void change_everything(void)
{
	char p[600], q[600];

	snprintf(p, sizeof(p), "%s/src", live);
	snprintf(q, sizeof(q), "%s/lib", live);
	cr_assert_eq(rename(p, q), 0);
	snprintf(p, sizeof(p), "%s/README", live);
	cr_assert_eq(unlink(p), 0);
	snprintf(p, sizeof(p), "%s/docs/x.md", live);
	cr_assert_eq(chmod(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/link", live);
	cr_assert_eq(symlink("docs/x.md", p), 0);
	snprintf(p, sizeof(p), "%s/docs/y.md", live);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkdir(p, 0750), 0);
	snprintf(p, sizeof(p), "%s/empty", live);
	cr_assert_eq(mkdir(p, 0700), 0);
	put(live, "lib/a.c", "changed in lib\n");
}

Test(rollback, back_and_forth, .init = setup, .fini = teardown)
{
	static char t1[65536], t2[65536], now[65536];
	struct cb_diff d = {0};
	long long touched;
	struct stat st;
	char p[600];

	snap(1, NULL, 0);
	turn_map(t1, sizeof(t1));
	change_everything();
	snap(2, all_dirty, sizeof(all_dirty) / sizeof(all_dirty[0]));
	assert_live_is_map();
	turn_map(t2, sizeof(t2));
	cr_assert_eq(cb_ws_diff(T, 1, 2, NULL, 0, &d), 0, "%s", cb_error_message());
	{
		int seen_type = 0, seen_mode = 0, seen_del = 0;

		for (size_t i = 0; i < d.n; i++) {
			seen_type |= d.ev[i].kind == CB_DIFF_TYPE_CHANGED &&
				     !strcmp(d.ev[i].new.path, "docs/y.md");
			seen_mode |= d.ev[i].kind == CB_DIFF_MODE_CHANGED &&
				     !strcmp(d.ev[i].new.path, "docs/x.md");
			seen_del |= d.ev[i].kind == CB_DIFF_DELETED &&
				    !strcmp(d.ev[i].old.path, "src/b.c") && d.ev[i].new.pid == 1;
		}
		cr_assert(seen_type && seen_mode && seen_del);
	}
	cb_ws_diff_free(&d);
	/* back to turn 1 */
	cr_assert_eq(cb_ws_rollback(T, 1, NULL, 0, &touched), 0, "%s", cb_error_message());
	cr_assert_gt(touched, 5);
	tree_map(live, now, sizeof(now));
	cr_assert_str_eq(now, t1);
	snprintf(p, sizeof(p), "%s/docs/x.md", live);
	cr_assert_eq(stat(p, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0644);
	snprintf(p, sizeof(p), "%s/link", live);
	cr_assert_neq(lstat(p, &st), 0);
	/* the rollback is a turn of its own; then forward to 2 again */
	{
		struct cb_dirty rd[] = {{"src", 1, 0, NULL, 0},	   {"lib", 1, 0, NULL, 0},
					{"README", 0, 0, NULL, 0}, {"docs", 1, 0, NULL, 0},
					{"link", 0, 0, NULL, 0},   {"empty", 0, 0, NULL, 0}};

		cr_assert_eq(cb_ws_snapshot(T, 3, rd, 6, "rollback to 1", NULL), 0, "%s",
			     cb_error_message());
	}
	assert_live_is_map();
	cr_assert_eq(cb_ws_rollback(T, 2, NULL, 0, &touched), 0, "%s", cb_error_message());
	tree_map(live, now, sizeof(now));
	cr_assert_str_eq(now, t2);
	snprintf(p, sizeof(p), "%s/link", live);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISLNK(st.st_mode));
	snprintf(p, sizeof(p), "%s/docs/y.md", live);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISDIR(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0750);
}

Test(prune, folds_and_frees, .init = setup, .fini = teardown)
{
	struct cb_dirty d[] = {{"src/a.c", 0, 0, NULL, 0}};
	struct cb_diff diff = {0};
	long long dropped, freed, count, bytes, touched;
	int bfd = open(blobs, O_RDONLY | O_DIRECTORY);
	static char t4[65536], now[65536];

	snap(1, NULL, 0);
	put(live, "src/a.c", "version 2, a longer one\n");
	snap(2, d, 1);
	put(live, "src/a.c", "version 3, longer still....\n");
	snap(3, d, 1);
	put(live, "src/a.c", "v4\n");
	snap(4, d, 1);
	turn_map(t4, sizeof(t4));
	cr_assert_eq(cb_ws_blob_usage(bfd, &count, &bytes), 0);
	cr_assert_eq(count, 3);
	cr_assert_eq(cb_ws_prune(T, 1, &dropped, &freed), 0, "%s", cb_error_message());
	cr_assert_eq(dropped, 3);
	cr_assert_gt(freed, 0);
	cr_assert_eq(cb_ws_blob_usage(bfd, &count, &bytes), 0);
	cr_assert_eq(count, 1);
	cr_assert_lt(cb_ws_diff(T, 2, 4, NULL, 0, &diff), 0);
	cr_assert(strstr(cb_error_message(), "pruned"), "%s", cb_error_message());
	/* the base and the kept turn are whole: 0 -> 4 still diffs, rollback to 0 and back */
	cr_assert_eq(cb_ws_diff(T, 0, 4, NULL, 0, &diff), 0);
	cr_assert_eq(diff.n, 1);
	cb_ws_diff_free(&diff);
	cr_assert_eq(cb_ws_rollback(T, 0, NULL, 0, &touched), 0, "%s", cb_error_message());
	cr_assert_eq(touched, 1);
	snap(5, d, 1);
	cr_assert_eq(cb_ws_rollback(T, 4, NULL, 0, &touched), 0, "%s", cb_error_message());
	tree_map(live, now, sizeof(now));
	cr_assert_str_eq(now, t4);
	close(bfd);
}

static int ignore_entry(const struct cb_entry *e, void *arg)
{
	(void)e;
	(void)arg;
	return 0;
}

Test(fork, upper_holds_only_the_difference, .init = setup, .fini = teardown)
{
	char up[400], fdb[400], fblobs[400], p[600];
	struct cb_db_turns *db;
	struct stat st;
	struct cb_entry e = {0};

	snap(1, NULL, 0);
	change_everything();
	snap(2, all_dirty, sizeof(all_dirty) / sizeof(all_dirty[0]));
	snprintf(up, sizeof(up), "%s/fork-upper", top);
	snprintf(fdb, sizeof(fdb), "%s/fork.db", top);
	snprintf(fblobs, sizeof(fblobs), "%s/fork-blobs", top);
	mkdir(up, 0755);
	cr_assert_eq(cb_ws_fork(T, 2, up, fdb, fblobs, NULL, NULL), 0, "%s", cb_error_message());
	/* deleted base entries are whiteouts (0/0 char devices) */
	snprintf(p, sizeof(p), "%s/README", up);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
	snprintf(p, sizeof(p), "%s/src", up);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISCHR(st.st_mode));
	/* nothing is written below a whited-out dir; unchanged base files are not copied */
	snprintf(p, sizeof(p), "%s/src/a.c", up);
	cr_assert_neq(lstat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/lib/b.c", up);
	cr_assert_eq(lstat(p, &st), 0);
	snprintf(p, sizeof(p), "%s/docs/x.md", up);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0600);
	snprintf(p, sizeof(p), "%s/link", up);
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISLNK(st.st_mode));
	/* the fork's db has turn 1, and its blob store holds what turn 1 needs */
	cr_assert_eq(cb_db_turns_open(fdb, &db), 0);
	cr_assert_eq(cb_db_turns_latest(db), 1);
	cr_assert_eq(cb_db_turns_delta_at(db, "lib/a.c", 1, &e), 1);
	{
		int fb = open(fblobs, O_RDONLY | O_DIRECTORY);

		cr_assert(cb_ws_blob_has(fb, e.xxh3));
		close(fb);
	}
	cb_entry_clear(&e);
	cb_db_turns_close(db);
	/* The fork's first map build imports the base cache instead of hashing the base again:
	 * a row planted in the source's cache under the file's exact current key (inode, size,
	 * mtime, ctime) shows up as the fork's turn 0 hash, so it was not rehashed. */
	{
		struct cb_turns_config cfg = {
		    .db_path = fdb, .blob_dir = fblobs, .base_dir = base, .root = up};
		struct cb_entry old = {0}, now = {0};
		struct cb_turns *ft;
		struct stat bst;
		unsigned char fake_sha[32], fake_xxh[16];

		snprintf(p, sizeof(p), "%s/docs/y.md", base);
		cr_assert_eq(stat(p, &bst), 0);
		cr_assert_eq(cb_ws_entry_at(T, "docs/y.md", 0, &old), 0);
		memset(fake_sha, 0xab, sizeof(fake_sha));
		memset(fake_xxh, 0xcd, sizeof(fake_xxh));
		cr_assert_eq(cb_db_turns_base_cache_put(
				 cb_turns_db(T), "docs/y.md", bst.st_size,
				 (long long)bst.st_mtim.tv_sec * 1000000000LL + bst.st_mtim.tv_nsec,
				 (long long)bst.st_ctim.tv_sec * 1000000000LL + bst.st_ctim.tv_nsec,
				 (long long)bst.st_ino, fake_sha, fake_xxh),
			     0);
		cr_assert_eq(cb_turns_open(&cfg, &ft), 0, "%s", cb_error_message());
		cr_assert_eq(cb_ws_map_list(ft, ignore_entry, NULL), 0, "%s", cb_error_message());
		cr_assert_eq(cb_ws_entry_at(ft, "docs/y.md", 0, &now), 0);
		cr_assert_eq(memcmp(now.sha256, fake_sha, 32), 0);
		cb_entry_clear(&old);
		cb_entry_clear(&now);
		cb_turns_close(ft);
	}
}

/* Turn 1 recorded with its map deferred, and that map answered from the walk into m. */
static void first_map_answer(struct map_buf *m, struct cb_ws_first_map **p, long long *id)
{
	cb_ws_snapshot_defer_map(T);
	snap(1, NULL, 0);
	cr_assert_eq(cb_ws_map_first(T, map_line, m, p, id), 0, "%s", cb_error_message());
	cr_assert(*p, "a map never built is answered from the walk");
}

/* The first map of a turn that changed nothing, answered from the walk: the same map as the
 * tree, and the id given with it is the database's only once its rows are written. */
Test(snapshot, first_map_answered_from_the_walk_then_written, .init = setup, .fini = teardown)
{
	static char want[65536], got[65536];
	struct map_buf m = {got, sizeof(got), 0};
	struct cb_ws_first_map *p = NULL;
	long long id = 0, db_id = 0;

	first_map_answer(&m, &p, &id);
	tree_map(base, want, sizeof(want));
	cr_assert_str_eq(got, want);
	cr_assert_eq(cb_db_turns_map_id(cb_turns_db(T), &db_id), 0);
	cr_assert_neq(db_id, id, "the id is not the database's before the rows are");
	cr_assert_eq(cb_ws_map_first_write(T, p), 0, "%s", cb_error_message());
	cb_ws_map_first_free(p);
	cr_assert_eq(cb_db_turns_map_id(cb_turns_db(T), &db_id), 0);
	cr_assert_eq(db_id, id);
	assert_live_is_map();
	/* built now: read from the rows, under the same id */
	m.used = 0;
	cr_assert_eq(cb_ws_map_first(T, map_line, &m, &p, &db_id), 0, "%s", cb_error_message());
	cr_assert_null(p);
	cr_assert_eq(db_id, id);
	cr_assert_str_eq(got, want);
}

/* A map built by someone else between the answer and the write stands; the id given with the
 * answer is never adopted, so its holder gets the whole map next time. */
Test(snapshot, first_map_write_yields_to_a_map_built_meanwhile, .init = setup, .fini = teardown)
{
	static char got[65536];
	struct map_buf m = {got, sizeof(got), 0};
	struct cb_ws_first_map *p = NULL;
	long long id = 0, db_id = 0;

	first_map_answer(&m, &p, &id);
	assert_live_is_map(); /* builds the map from its own walk */
	cr_assert_eq(cb_ws_map_first_write(T, p), 0, "%s", cb_error_message());
	cb_ws_map_first_free(p);
	cr_assert_eq(cb_db_turns_map_id(cb_turns_db(T), &db_id), 0);
	cr_assert_neq(db_id, id);
	assert_live_is_map();
}
