/* Unit tests for the upper layer's on-disk format: whiteouts (0/0 character devices),
 * opaque directories, atomic whiteout replacement and clearing whiteouts from a directory. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ov.h"

static char dir[64];
static int rootfd = -1;

static void setup(void)
{
	strcpy(dir, "/tmp/cb-test-layer-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	rootfd = open(dir, O_PATH | O_DIRECTORY);
	cr_assert_geq(rootfd, 0);
}

static void teardown(void)
{
	char cmd[128];

	close(rootfd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(layer, .init = setup, .fini = teardown);

Test(layer, whiteout_is_a_0_0_char_device)
{
	struct stat st;
	int fd;

	cr_assert_eq(ov_make_whiteout(rootfd, "gone"), 0);
	cr_assert_eq(ov_lstat(rootfd, "gone", &st), 0);
	cr_assert(S_ISCHR(st.st_mode));
	cr_assert_eq(st.st_rdev, makedev(0, 0));
	cr_assert(ov_is_whiteout(&st));
	cr_assert_eq(ov_make_whiteout(rootfd, "gone"), -EEXIST);
	fd = openat(rootfd, "file", O_CREAT | O_WRONLY, 0644);
	close(fd);
	cr_assert_eq(ov_lstat(rootfd, "file", &st), 0);
	cr_assert_not(ov_is_whiteout(&st));
	cr_assert_eq(ov_lstat(rootfd, "missing", &st), -ENOENT);
}

Test(layer, whiteout_replace_is_atomic_and_leaves_no_temp)
{
	struct stat st;
	int fd = openat(rootfd, "f", O_CREAT | O_WRONLY, 0644);

	close(fd);
	cr_assert_eq(mkdirat(rootfd, "d", 0755), 0);
	fd = openat(rootfd, "d/g", O_CREAT | O_WRONLY, 0644);
	close(fd);
	cr_assert_eq(ov_whiteout_replace(rootfd, "f"), 0);
	cr_assert_eq(ov_whiteout_replace(rootfd, "d/g"), 0);
	cr_assert_eq(ov_lstat(rootfd, "f", &st), 0);
	cr_assert(ov_is_whiteout(&st));
	cr_assert_eq(ov_lstat(rootfd, "d/g", &st), 0);
	cr_assert(ov_is_whiteout(&st));
	/* nothing else was left in the directories */
	cr_assert_eq(ov_clear_whiteouts(rootfd, "d"), 0);
	cr_assert_eq(unlinkat(rootfd, "d", AT_REMOVEDIR), 0);
	cr_assert_eq(ov_clear_whiteouts(rootfd, "."), 0);
}

Test(layer, clear_whiteouts_refuses_real_entries)
{
	int fd;

	cr_assert_eq(mkdirat(rootfd, "d", 0755), 0);
	cr_assert_eq(ov_make_whiteout(rootfd, "d/w"), 0);
	fd = openat(rootfd, "d/real", O_CREAT | O_WRONLY, 0644);
	close(fd);
	cr_assert_eq(ov_clear_whiteouts(rootfd, "d"), -ENOTEMPTY);
	cr_assert_eq(ov_clear_whiteouts(rootfd, "nope"), -ENOENT);
}

Test(layer, opaque_directories)
{
	cr_assert_eq(mkdirat(rootfd, "d", 0755), 0);
	cr_assert_eq(ov_is_opaque(rootfd, "d"), 0);
	cr_assert_eq(ov_set_opaque(rootfd, "d"), 0);
	cr_assert_eq(ov_is_opaque(rootfd, "d"), 1);
	cr_assert_eq(ov_is_opaque(rootfd, "missing"), 0);
}

/* A tree deeper than PATH_MAX: every helper reaches it through a directory fd near the end. */
Test(layer, paths_longer_than_path_max)
{
	char name[201], *path = NULL, *leaf, *sub;
	int fd = dup(rootfd), next, i;
	struct stat st;

	memset(name, 'd', 200);
	name[200] = '\0';
	for (i = 0; i < 30; i++) {
		cr_assert_eq(mkdirat(fd, name, 0755), 0);
		next = openat(fd, name, O_PATH | O_DIRECTORY);
		cr_assert_geq(next, 0);
		close(fd);
		fd = next;
		if (path) {
			char *longer;
			cr_assert_geq(asprintf(&longer, "%s/%s", path, name), 0);
			free(path);
			path = longer;
		} else {
			path = strdup(name);
		}
	}
	close(fd);
	cr_assert_gt(strlen(path), PATH_MAX);
	cr_assert_geq(asprintf(&leaf, "%s/f", path), 0);
	cr_assert_geq(asprintf(&sub, "%s/sub", path), 0);
	fd = ov_openat(rootfd, leaf, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	close(fd);
	cr_assert_eq(ov_lstat(rootfd, leaf, &st), 0);
	cr_assert(S_ISREG(st.st_mode));
	cr_assert_eq(ov_whiteout_replace(rootfd, leaf), 0);
	cr_assert_eq(ov_lstat(rootfd, leaf, &st), 0);
	cr_assert(ov_is_whiteout(&st));
	cr_assert_eq(ov_mkdirat(rootfd, sub, 0755), 0);
	cr_assert_eq(ov_set_opaque(rootfd, sub), 0);
	cr_assert_eq(ov_is_opaque(rootfd, sub), 1);
	cr_assert_eq(ov_clear_whiteouts(rootfd, path), -ENOTEMPTY); /* sub is real */
	cr_assert_eq(ov_unlinkat(rootfd, sub, AT_REMOVEDIR), 0);
	cr_assert_eq(ov_clear_whiteouts(rootfd, path), 0);
	cr_assert_eq(ov_lstat(rootfd, leaf, &st), -ENOENT);
	free(leaf);
	free(sub);
	free(path);
}

Test(layer, private_names_and_basenames)
{
	cr_assert(ov_name_is_private("trusted.overlay.opaque"));
	cr_assert(ov_name_is_private("trusted.overlay.redirect"));
	cr_assert_not(ov_name_is_private("trusted.overlaX"));
	cr_assert_not(ov_name_is_private("user.overlay.opaque"));
	cr_assert_str_eq(ov_base_name("a/b/c"), "c");
	cr_assert_str_eq(ov_base_name("c"), "c");
}
