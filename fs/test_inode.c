/* Unit tests for the overlay's inode table: identity hashing, names of hard-linked inodes,
 * path building from parent pointers, renames and release of unreferenced inodes. */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <string.h>

#include "ov.h"

static struct ov_inode *mk(struct ov_table *t, ino_t ino, mode_t type, struct ov_inode *parent,
			   const char *name)
{
	struct stat st = {.st_dev = 7, .st_ino = ino, .st_mode = type};
	struct ov_inode *in = ov_inode_new(OV_UPPER, &st);

	cr_assert_not_null(in);
	if (parent)
		cr_assert_eq(ov_inode_add_name(t, in, parent, name), 0);
	ov_table_insert(t, in);
	ov_table_track(t, in);
	return in;
}

/* The table the test is on: its functions assert their locks (util/lock.h), so the test holds
 * both, as the only thread, from table_begin to table_end. */
static struct ov_table *cur;

static void table_begin(struct ov_table *t)
{
	cr_assert_eq(ov_table_init(t), 0);
	cb_rwlock_write(&t->ns);
	cb_mutex_lock(&t->lock);
	cur = t;
}

static void table_end(struct ov_table *t)
{
	cb_mutex_unlock(&t->lock);
	cb_rwlock_unlock(&t->ns);
	ov_table_free_all(t);
	cur = NULL;
}

/* ov_path's string, checked for length and freed by the next call (in NULL: just that). */
static const char *path_of(struct ov_inode *in, const char *child)
{
	static char *last;
	int n;

	free(last);
	last = NULL;
	if (!in)
		return NULL;
	n = ov_path(cur, in, child, &last);
	cr_assert_geq(n, 0, "ov_path: %d", n);
	cr_assert_eq((size_t)n, strlen(last));
	return last;
}

Test(inode, paths_follow_parents)
{
	struct ov_table t;
	struct ov_inode *root, *a, *b, *f;

	table_begin(&t);
	root = mk(&t, 2, S_IFDIR, NULL, NULL);
	root->is_root = 1;
	root->nlookup = 1;
	a = mk(&t, 10, S_IFDIR, root, "a");
	b = mk(&t, 11, S_IFDIR, a, "b");
	f = mk(&t, 12, S_IFREG, b, "file.txt");
	cr_assert_str_eq(path_of(root, NULL), ".");
	cr_assert_str_eq(path_of(root, "x"), "x");
	cr_assert_str_eq(path_of(f, NULL), "a/b/file.txt");
	cr_assert_str_eq(path_of(b, "new"), "a/b/new");
	/* moving a directory moves every path under it */
	cr_assert_eq(ov_inode_rename_name(&t, b, a, "b", root, "c"), 0);
	cr_assert_str_eq(path_of(f, NULL), "c/file.txt");
	cr_assert_eq(a->refs, 0);
	cr_assert_eq(root->refs, 2);
	path_of(NULL, NULL);
	table_end(&t);
}

/* A tree deeper than PATH_MAX (made from a deep working directory) has paths too. */
Test(inode, paths_longer_than_path_max)
{
	struct ov_table t;
	struct ov_inode *root, *d;
	char name[201];
	const char *p;
	int i;

	table_begin(&t);
	root = mk(&t, 2, S_IFDIR, NULL, NULL);
	root->is_root = 1;
	d = root;
	memset(name, 'n', 200);
	name[200] = '\0';
	for (i = 0; i < 60; i++)
		d = mk(&t, 100 + i, S_IFDIR, d, name);
	p = path_of(d, "leaf");
	cr_assert_eq(strlen(p), 60 * 201 + 4);
	cr_assert_str_eq(p + 60 * 201, "leaf");
	cr_assert_eq(p[200], '/');
	path_of(NULL, NULL);
	table_end(&t);
}

Test(inode, hard_links_keep_every_name)
{
	struct ov_table t;
	struct ov_inode *root, *d, *f;
	char *buf;

	table_begin(&t);
	root = mk(&t, 2, S_IFDIR, NULL, NULL);
	root->is_root = 1;
	d = mk(&t, 3, S_IFDIR, root, "d");
	f = mk(&t, 4, S_IFREG, root, "one");
	cr_assert_eq(ov_inode_add_name(&t, f, d, "two"), 0);
	cr_assert(ov_inode_has_name(&t, f, d, "two"));
	cr_assert(ov_inode_has_name(&t, f, root, "one"));
	cr_assert_not(ov_inode_has_name(&t, f, d, "one"));
	cr_assert_eq(ov_path_of_name(&t, f->names->next, &buf), 5);
	cr_assert_str_eq(buf, "d/two");
	free(buf);
	/* dropping the first name: paths now use the other one */
	cr_assert_eq(ov_inode_drop_name(&t, f, root, "one"), 0);
	cr_assert_eq(ov_inode_drop_name(&t, f, root, "one"), -ENOENT);
	cr_assert_str_eq(path_of(f, NULL), "d/two");
	cr_assert_eq(d->refs, 1);
	path_of(NULL, NULL);
	table_end(&t);
}

Test(inode, identity_hash_survives_growth)
{
	struct ov_table t;
	struct ov_inode *root;
	ino_t i;

	table_begin(&t);
	root = mk(&t, 1, S_IFDIR, NULL, NULL);
	root->is_root = 1;
	for (i = 100; i < 5100; i++)
		mk(&t, i, S_IFREG, root, "n");
	cr_assert_eq(t.count, 5001);
	for (i = 100; i < 5100; i++) {
		struct ov_inode *in = ov_table_find(&t, 7, i);
		cr_assert_not_null(in);
		cr_assert_eq(in->rino, i);
	}
	cr_assert_null(ov_table_find(&t, 8, 100));
	cr_assert_null(ov_table_find(&t, 7, 99));
	ov_table_remove(&t, ov_table_find(&t, 7, 200));
	cr_assert_null(ov_table_find(&t, 7, 200));
	path_of(NULL, NULL);
	table_end(&t);
}

Test(inode, release_frees_unreferenced_chains)
{
	struct ov_table t;
	struct ov_inode *root, *a, *b, *f;

	table_begin(&t);
	root = mk(&t, 2, S_IFDIR, NULL, NULL);
	root->is_root = 1;
	root->nlookup = 1;
	a = mk(&t, 10, S_IFDIR, root, "a");
	b = mk(&t, 11, S_IFDIR, a, "b");
	f = mk(&t, 12, S_IFREG, b, "f");
	a->nlookup = b->nlookup = f->nlookup = 1;
	/* a directory the kernel forgot stays while a child still names it */
	a->nlookup = 0;
	ov_inode_release(&t, a);
	cr_assert_not_null(ov_table_find(&t, 7, 10));
	b->nlookup = 0;
	ov_inode_release(&t, b);
	cr_assert_not_null(ov_table_find(&t, 7, 11));
	/* the leaf goes, and takes its now unreferenced parents with it */
	f->nlookup = 0;
	ov_inode_release(&t, f);
	cr_assert_null(ov_table_find(&t, 7, 12));
	cr_assert_null(ov_table_find(&t, 7, 11));
	cr_assert_null(ov_table_find(&t, 7, 10));
	cr_assert_not_null(ov_table_find(&t, 7, 2));
	cr_assert_eq(root->refs, 0);
	cr_assert_eq(t.count, 1);
	path_of(NULL, NULL);
	table_end(&t);
}

#ifdef CB_LOCK_CHECKS
/* This build checks locks (the sanitizer build make check runs): a table call without the
 * lock its comment names stops the program instead of racing. */
Test(inode, a_missing_lock_is_caught, .signal = SIGABRT)
{
	struct ov_table t;

	table_begin(&t);
	cb_mutex_unlock(&t.lock);
	ov_table_find(&t, 7, 1);
}
#endif
