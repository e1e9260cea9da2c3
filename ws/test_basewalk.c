/* Unit tests of ws/basewalk.c: the walk gives every entry of the base once, in strcmp order of
 * its path, whatever the names (bytes below and above '/', nesting that interleaves them). */
#include "config.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "turns_int.h"

static char dir[64];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/cb-walktest-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(basewalk, .init = setup, .fini = teardown);

static void make(const char *rel, int is_dir)
{
	char p[4096];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	if (is_dir) {
		cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
		return;
	}
	cr_assert_geq(fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644), 0, "%s", p);
	close(fd);
}

static size_t counted;

static int count_entry(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
	(void)p;
	(void)st;
	(void)type;
	counted += ftw->level > 0;
	return 0;
}

/* Walk dir: every entry once (as many as nftw counts), each path after the one before. */
static void assert_walk_in_order(void)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	struct ws_base_file *f = NULL;
	size_t n = 0;

	cr_assert_geq(fd, 0);
	cr_assert_eq(ws_base_walk(fd, &f, &n), 0, "%s", cb_error_message());
	counted = 0;
	cr_assert_eq(nftw(dir, count_entry, 16, FTW_PHYS), 0);
	cr_assert_eq(n, counted);
	for (size_t i = 1; i < n; i++)
		cr_assert_lt(strcmp(f[i - 1].path, f[i].path), 0, "%s before %s", f[i - 1].path,
			     f[i].path);
	ws_base_files_free(f, n);
	close(fd);
}

Test(basewalk, names_around_the_slash_come_in_strcmp_order)
{
	/* "a" < "a b" < "a-c" < "a.b" < "a.c" < "a/..." < "a0": the subtree of a directory
	 * goes where "name/" sorts, after its siblings that extend its name with a byte
	 * below '/', and nested that way too ("a.b/" before "a/") */
	static const char *const dirs[] = {"a",	       "a.b",	"a b",	 "a-c",	  "a-c/x",
					   "a/b",      "a/b/c", "a.b/c", "a/b c", "a0",
					   "\xc3\xa9", "\x01",	"z",	 "z/z",	  "z/z/z"};
	static const char *const files[] = {"a.c",     "a.b.c", "a/x",	      "a/b.c",	"a/b/c/d",
					    "a/b c/e", "a0/f",	"\xc3\xa9/g", "\x01/h", "z/z/z/q",
					    "z/z.txt", "z/z/a", "a/b/c.d"};

	for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++)
		make(dirs[i], 1);
	for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++)
		make(files[i], 0);
	assert_walk_in_order();
}

Test(basewalk, random_trees_come_in_strcmp_order)
{
	static const char alpha[] = "-. 0ab!~\x7f\xff";
	unsigned seed = (unsigned)getpid();
	char dirs[300][64]; /* the directories made so far, relative */
	size_t nd = 0;

	cr_log_info("seed %u", seed);
	srand(seed);
	for (int i = 0; i < 300; i++) {
		int len = 1 + rand() % 3, parent = rand() % (int)(nd + 1) - 1, is_dir;
		char name[4], rel[64], full[160];
		struct stat st;

		for (int k = 0; k < len; k++)
			name[k] = alpha[rand() % (int)(sizeof(alpha) - 1)];
		name[len] = '\0';
		is_dir = rand() % 5 < 2;
		if (!strcmp(name, ".") || !strcmp(name, "..") ||
		    (parent >= 0 && strlen(dirs[parent]) + (size_t)len + 2 > sizeof(rel)))
			continue;
		snprintf(rel, sizeof(rel), "%s%s%s", parent >= 0 ? dirs[parent] : "",
			 parent >= 0 ? "/" : "", name);
		snprintf(full, sizeof(full), "%s/%s", dir, rel);
		if (lstat(full, &st) == 0)
			continue;
		make(rel, is_dir);
		if (is_dir)
			snprintf(dirs[nd++], sizeof(dirs[0]), "%s", rel);
	}
	assert_walk_in_order();
}
