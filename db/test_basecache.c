/* Unit tests of db/basecache.c: a row is a hit only for its exact key, a row changed on disk
 * is a miss, a file that is not a cache of this version is refused, two handles share rows,
 * the whole list and its ranges come in strcmp order without damaged rows, a reader beside a
 * handle reads the same rows, and the pack gives its rows or, damaged or missing, none. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"

static char dir[64];
static char path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/cb-bctest-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	/* a directory the open must make */
	snprintf(path, sizeof(path), "%s/basecache/k.db", dir);
}

static void teardown(void)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(basecache, .init = setup, .fini = teardown);

static const struct cb_basecache_key key = {1, 2, 3, 4, 5};
static unsigned char sha[CB_SHA256_LEN], xxh[CB_XXH128_LEN];

static struct cb_db_basecache *open_with_row(void)
{
	struct cb_db_basecache *c;

	memset(sha, 0xab, sizeof(sha));
	memset(xxh, 0xcd, sizeof(xxh));
	cr_assert_eq(cb_db_basecache_open(path, &c), 0, "%s", cb_error_message());
	cr_assert_eq(cb_db_basecache_begin(c), 0);
	cr_assert_eq(cb_db_basecache_put(c, "a/b", &key, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_commit(c), 0);
	return c;
}

/* Change the cache's file behind its back, as a damaged disk or another program would. */
static void raw_exec(const char *sql)
{
	sqlite3 *db;

	cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK, "%s", sql);
	sqlite3_close(db);
}

Test(basecache, hit_only_for_the_exact_key)
{
	struct cb_db_basecache *c = open_with_row(), *c2;
	unsigned char s[CB_SHA256_LEN], x[CB_XXH128_LEN];

	cr_assert_eq(cb_db_basecache_get(c, "a/b", &key, s, x), 1);
	cr_assert_eq(memcmp(s, sha, sizeof(s)), 0);
	cr_assert_eq(memcmp(x, xxh, sizeof(x)), 0);
	cr_assert_eq(cb_db_basecache_get(c, "a/c", &key, s, x), 0);
	for (int f = 0; f < 5; f++) {
		struct cb_basecache_key k = key;
		long long *v = &k.dev;

		v[f]++;
		cr_assert_eq(cb_db_basecache_get(c, "a/b", &k, s, x), 0, "field %d", f);
	}
	/* another handle (another daemon) sees the committed row */
	cr_assert_eq(cb_db_basecache_open(path, &c2), 0);
	cr_assert_eq(cb_db_basecache_get(c2, "a/b", &key, s, x), 1);
	cb_db_basecache_close(c2);
	cb_db_basecache_close(c);
}

Test(basecache, a_row_changed_on_disk_is_a_miss)
{
	struct cb_db_basecache *c = open_with_row();
	unsigned char s[CB_SHA256_LEN], x[CB_XXH128_LEN];

	cb_db_basecache_close(c);
	raw_exec("UPDATE base_hash SET sha256 = zeroblob(32)");
	cr_assert_eq(cb_db_basecache_open(path, &c), 0);
	cr_assert_eq(cb_db_basecache_get(c, "a/b", &key, s, x), 0);
	cb_db_basecache_close(c);
}

Test(basecache, a_foreign_file_is_refused_and_left_alone)
{
	struct cb_db_basecache *c = open_with_row();
	sqlite3 *db;
	FILE *f;

	cb_db_basecache_close(c);
	cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 7", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	cr_assert_eq(cb_db_basecache_open(path, &c), -EPROTO);
	cr_assert_not_null(strstr(cb_error_message(), "not a cache of this version"));
	cr_assert_null(c);
	cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(db, "SELECT 1 FROM base_hash", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	/* garbage */
	unlink(path);
	cr_assert_not_null(f = fopen(path, "w"));
	for (int i = 0; i < 4096; i++)
		fputc(i * 7 + 3, f);
	fclose(f);
	cr_assert_lt(cb_db_basecache_open(path, &c), 0);
	cr_assert_null(c);
}

struct listed {
	char paths[8][16];
	struct cb_basecache_key keys[8];
	int n;
};

/* l holds exactly the n paths given, in that order. */
static void assert_paths(const struct listed *l, int n, const char *const *paths)
{
	cr_assert_eq(l->n, n);
	for (int i = 0; i < n; i++)
		cr_assert_str_eq(l->paths[i], paths[i]);
}

static int list_row(const struct cb_db_basecache_row *row, void *arg)
{
	struct listed *l = arg;

	cr_assert_lt(l->n, 8);
	snprintf(l->paths[l->n], sizeof(l->paths[l->n]), "%s", row->path);
	l->keys[l->n++] = row->key;
	cr_assert_eq(memcmp(row->sha256, sha, sizeof(sha)), 0);
	cr_assert_eq(memcmp(row->xxh3, xxh, sizeof(xxh)), 0);
	return 0;
}

Test(basecache, the_list_is_in_strcmp_order_without_damaged_rows)
{
	struct cb_db_basecache *c = open_with_row();
	struct listed l = {0};
	struct cb_basecache_key k2 = key;

	k2.ino = 99;
	cr_assert_eq(cb_db_basecache_begin(c), 0);
	/* '-' (0x2d) sorts before '/' (0x2f): "a-z" comes before "a/b", as strcmp says */
	cr_assert_eq(cb_db_basecache_put(c, "a-z", &k2, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_put(c, "a/a", &key, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_put(c, "b", &key, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_commit(c), 0);
	cb_db_basecache_close(c);
	/* a row whose bytes changed on disk is left out, as a lookup misses it */
	raw_exec("UPDATE base_hash SET size = 7 WHERE path = 'b'");
	cr_assert_eq(cb_db_basecache_open(path, &c), 0);
	cr_assert_eq(cb_db_basecache_list(c, list_row, &l), 0, "%s", cb_error_message());
	assert_paths(&l, 3, (const char *const[]){"a-z", "a/a", "a/b"});
	cr_assert_eq(l.keys[0].ino, 99);
	cr_assert_eq(memcmp(&l.keys[2], &key, sizeof(key)), 0);
	cb_db_basecache_close(c);
}

/* The rows of [from, until) of a cache holding "a-z", "a/a", "a/b", "b", "c". */
static struct listed list_range(struct cb_db_basecache *c, const char *from, const char *until)
{
	struct listed l = {0};

	cr_assert_eq(cb_db_basecache_list_range(c, from, until, list_row, &l), 0, "%s",
		     cb_error_message());
	return l;
}

Test(basecache, a_range_lists_its_rows_only_and_two_ranges_make_the_whole)
{
	struct cb_db_basecache *c = open_with_row();
	const char *names[] = {"a-z", "a/a", "b", "c"};
	struct listed l;

	cr_assert_eq(cb_db_basecache_begin(c), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(cb_db_basecache_put(c, names[i], &key, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_commit(c), 0);
	/* from is in the range, until is not; both sides in strcmp order */
	l = list_range(c, "a/a", "b");
	cr_assert_eq(l.n, 2);
	cr_assert_str_eq(l.paths[0], "a/a");
	cr_assert_str_eq(l.paths[1], "a/b");
	l = list_range(c, NULL, "a/a");
	cr_assert_eq(l.n, 1);
	cr_assert_str_eq(l.paths[0], "a-z");
	l = list_range(c, "a/b", NULL);
	cr_assert_eq(l.n, 3);
	cr_assert_str_eq(l.paths[0], "a/b");
	cr_assert_str_eq(l.paths[2], "c");
	/* a bound between rows, and an empty range */
	l = list_range(c, "a0", "bb");
	cr_assert_eq(l.n, 1);
	cr_assert_str_eq(l.paths[0], "b");
	cr_assert_eq(list_range(c, "b", "b").n, 0);
	cr_assert_eq(list_range(c, NULL, NULL).n, 5);
	/* the bounds are not left bound to the statements: the whole list after a range */
	l = (struct listed){0};
	cr_assert_eq(cb_db_basecache_list(c, list_row, &l), 0);
	cr_assert_eq(l.n, 5);
	cb_db_basecache_close(c);
}

Test(basecache, a_reader_reads_beside_its_handle_and_never_creates)
{
	struct cb_db_basecache *c = open_with_row(), *r = NULL;
	unsigned char s[CB_SHA256_LEN], x[CB_XXH128_LEN];
	struct listed l;

	cr_assert_eq(cb_db_basecache_open_reader(c, &r), 0, "%s", cb_error_message());
	/* the handle's open read (a lookup's) does not keep the reader from reading */
	cr_assert_eq(cb_db_basecache_get(c, "a/b", &key, s, x), 1);
	l = list_range(r, "a", NULL);
	cr_assert_eq(l.n, 1);
	cr_assert_str_eq(l.paths[0], "a/b");
	cr_assert_eq(cb_db_basecache_get(r, "a/b", &key, s, x), 1);
	cb_db_basecache_close(r);
	cb_db_basecache_close(c);
	/* a file gone since the handle opened: the reader is refused, nothing is made */
	cr_assert_eq(cb_db_basecache_open(path, &c), 0);
	cr_assert_eq(unlink(path), 0);
	r = NULL;
	cr_assert_lt(cb_db_basecache_open_reader(c, &r), 0);
	cr_assert_null(r);
	cr_assert_eq(access(path, F_OK), -1);
	cb_db_basecache_close(c);
}

/* Store in c the pack of "a-z" (ino 99), "a/a" and "b", in that order. */
static void store_pack(struct cb_db_basecache *c)
{
	struct cb_basecache_key k2 = key;
	struct cb_basecache_pack *p;

	k2.ino = 99;
	cr_assert_eq(cb_basecache_pack_new(&p), 0);
	cr_assert_eq(cb_basecache_pack_add(p, "a-z", &k2, sha, xxh), 0);
	cr_assert_eq(cb_basecache_pack_add(p, "a/a", &key, sha, xxh), 0);
	cr_assert_eq(cb_basecache_pack_add(p, "b", &key, sha, xxh), 0);
	cr_assert_eq(cb_db_basecache_pack_store(c, p), 0, "%s", cb_error_message());
	cb_basecache_pack_free(p);
}

static struct cb_db_basecache *open_with_pack(void)
{
	struct cb_db_basecache *c = open_with_row();

	store_pack(c);
	return c;
}

Test(basecache, the_pack_gives_its_rows_in_the_order_they_were_added)
{
	struct cb_db_basecache *c = open_with_pack(), *r = NULL;
	struct listed l = {0};

	cr_assert_eq(cb_db_basecache_pack_list(c, list_row, &l), 1, "%s", cb_error_message());
	assert_paths(&l, 3, (const char *const[]){"a-z", "a/a", "b"});
	cr_assert_eq(l.keys[0].ino, 99);
	cr_assert_eq(memcmp(&l.keys[2], &key, sizeof(key)), 0);
	/* the rows are left as they were: the pack is beside them, not instead */
	l = (struct listed){0};
	cr_assert_eq(cb_db_basecache_list(c, list_row, &l), 0);
	cr_assert_eq(l.n, 1);
	/* a reader's handle reads the same pack */
	cr_assert_eq(cb_db_basecache_open_reader(c, &r), 0, "%s", cb_error_message());
	l = (struct listed){0};
	cr_assert_eq(cb_db_basecache_pack_list(r, list_row, &l), 1);
	cr_assert_eq(l.n, 3);
	cb_db_basecache_close(r);
	cb_db_basecache_close(c);
}

Test(basecache, a_damaged_pack_is_no_pack)
{
	struct cb_db_basecache *c = open_with_pack();
	struct listed l = {0};

	cb_db_basecache_close(c);
	/* one byte of a hash flipped on disk: the checksum no longer holds, no row is given */
	raw_exec("UPDATE base_pack SET data = substr(data, 1, length(data) - 1) || x'00'");
	cr_assert_eq(cb_db_basecache_open(path, &c), 0);
	cr_assert_eq(cb_db_basecache_pack_list(c, list_row, &l), 0);
	cr_assert_eq(l.n, 0);
	/* the same pack stored again is written anew (its checksum column alone still matched) */
	store_pack(c);
	cr_assert_eq(cb_db_basecache_pack_list(c, list_row, &l), 1);
	cr_assert_eq(l.n, 3);
	cb_db_basecache_close(c);
	l = (struct listed){0};
	/* a file without the pack table (made by an older cowbox): no pack, no error; a handle
	 * that may write adds the table */
	raw_exec("DROP TABLE base_pack");
	cr_assert_eq(cb_db_basecache_open(path, &c), 0);
	cr_assert_eq(cb_db_basecache_pack_list(c, list_row, &l), 0);
	cb_db_basecache_close(c);
	c = open_with_pack();
	cr_assert_eq(cb_db_basecache_pack_list(c, list_row, &l), 1);
	cr_assert_eq(l.n, 3);
	cb_db_basecache_close(c);
}

Test(basecache, a_pack_of_a_path_too_long_is_refused)
{
	struct cb_basecache_pack *p;
	char longp[5000];

	memset(longp, 'x', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	cr_assert_eq(cb_basecache_pack_new(&p), 0);
	cr_assert_eq(cb_basecache_pack_add(p, longp, &key, sha, xxh), -ENAMETOOLONG);
	cr_assert_eq(cb_basecache_pack_add(p, "", &key, sha, xxh), -ENAMETOOLONG);
	cb_basecache_pack_free(p);
}
