/* Hard links between the files of a turn: a snapshot gives the names of one inode a shared
 * group id (cb_entry.link), and rollback, fork and apply find a group's names to link them. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"

/* A kept entry of the snapshot that is, or was, one of several names of an inode. */
struct lk_row {
	struct cb_entry e;
	char *o_link;
};

struct lk_rows {
	struct lk_row *r;
	size_t n, cap;
};

static int lk_collect(const struct cb_entry *now, const char *o_link, void *arg)
{
	struct lk_rows *rows = arg;
	struct lk_row *r;
	int ret = cb_grow(&rows->r, &rows->cap, rows->n, sizeof(*rows->r), 16, "link groups");

	if (ret)
		return ret;
	r = &rows->r[rows->n];
	memset(r, 0, sizeof(*r));
	if ((ret = cb_entry_copy(&r->e, now)))
		return ret;
	rows->n++;
	if (o_link && !(r->o_link = strdup(o_link)))
		return cb_error_set(ENOMEM, "link groups: out of memory");
	return 0;
}

/* What the map says of the other names of an inode, being looked for. */
struct lk_find {
	struct cb_turns *t;
	struct cb_db_scratch *s;
	const struct cb_entry *of; /* the examined name */
	char *key;		   /* the group id the unexamined names already share */
	struct cb_entry *stale;	   /* unexamined names of the inode without that id */
	size_t nstale, cap;
};

/* A map entry that may be another name of the examined inode: one the snapshot did not
 * examine, still a name of that very inode now (a stat through the live tree), says which
 * group the inode is in; checked by its inode, never trusted from the record. */
static int lk_candidate(const struct cb_entry *c, void *arg)
{
	struct lk_find *f = arg;
	struct stat st;
	int ret;

	if (c->type != CB_ENTRY_FILE || !strcmp(c->path, f->of->path))
		return 0;
	if ((ret = cb_db_scratch_path_has(f->s, c->path)))
		return ret < 0 ? ret : 0; /* examined: its own row says */
	if (cb_beneath_stat(f->t->root_fd, c->path, &st) < 0 || !S_ISREG(st.st_mode) ||
	    (long long)st.st_ino != f->of->ino) {
		cb_error_clear();
		return 0;
	}
	for (size_t i = 0; i < f->nstale; i++)
		if (!strcmp(f->stale[i].path, c->path))
			return 0;
	if (c->link && !f->key)
		return (f->key = strdup(c->link))
			   ? 0
			   : cb_error_set(ENOMEM, "link groups: out of memory");
	if (c->link && !strcmp(c->link, f->key))
		return 0;
	if ((ret = cb_grow(&f->stale, &f->cap, f->nstale, sizeof(*f->stale), 4, "link groups")))
		return ret;
	memset(&f->stale[f->nstale], 0, sizeof(*f->stale));
	if ((ret = cb_entry_copy(&f->stale[f->nstale], c)))
		return ret;
	f->nstale++;
	return 0;
}

/* The group id of the inode of examined entry r: that of its other names the snapshot did
 * not examine (found by r's group before and by r's inode), else a new one (the turn and
 * the inode: no other group has it). Unexamined names without it get it, as rows of the
 * turn. */
static int lk_decide(struct cb_turns *t, struct cb_db_scratch *s, long long turn,
		     const struct lk_row *r, char **key)
{
	struct lk_find f = {.t = t, .s = s, .of = &r->e};
	int ret = 0;

	if (r->o_link)
		ret = cb_db_turns_map_by_link(t->db, r->o_link, lk_candidate, &f);
	if (!ret)
		ret = cb_db_turns_map_by_ino(t->db, r->e.ino, lk_candidate, &f);
	if (!ret && !f.key && asprintf(&f.key, "%lld.%lld", turn, r->e.ino) < 0) {
		f.key = NULL;
		ret = cb_error_set(ENOMEM, "link groups: out of memory");
	}
	for (size_t i = 0; i < f.nstale && !ret; i++) {
		struct cb_entry now = {0};

		ret = cb_entry_copy(&now, &f.stale[i]);
		if (!ret) {
			free(now.link);
			now.link = strdup(f.key);
			now.ino = r->e.ino;
			ret = now.link ? cb_db_scratch_res_put(s, &f.stale[i], &now, 2)
				       : cb_error_set(ENOMEM, "link groups: out of memory");
		}
		cb_entry_clear(&now);
	}
	for (size_t i = 0; i < f.nstale; i++)
		cb_entry_clear(&f.stale[i]);
	free(f.stale);
	if (ret)
		free(f.key);
	else
		*key = f.key;
	return ret;
}

int ws_snap_links(struct cb_turns *t, struct cb_db_scratch *s, long long turn)
{
	struct lk_rows rows = {0};
	int ret = cb_db_scratch_linked(s, lk_collect, &rows);

	/* read first, written after: the scratch is not changed under its own query */
	if (!ret && rows.n)
		ret = cb_db_scratch_begin(s);
	for (size_t i = 0; i < rows.n && !ret; i++) {
		struct lk_row *r = &rows.r[i];
		char *key = NULL;

		if (r->e.type == CB_ENTRY_FILE && r->e.ino) {
			/* an earlier name of the same inode decided already */
			for (size_t j = 0; j < i && !key; j++)
				if (rows.r[j].e.type == CB_ENTRY_FILE &&
				    rows.r[j].e.ino == r->e.ino && rows.r[j].e.link &&
				    !(key = strdup(rows.r[j].e.link)))
					ret = cb_error_set(ENOMEM, "link groups: out of memory");
			if (!ret && !key)
				ret = lk_decide(t, s, turn, r, &key);
		}
		if (!ret)
			ret = cb_db_scratch_set_link(s, r->e.path, key);
		free(r->e.link);
		r->e.link = key;
	}
	if (rows.n && !ret)
		ret = cb_db_scratch_commit(s);
	else if (rows.n)
		cb_db_turns_rollback(t->db);
	for (size_t i = 0; i < rows.n; i++) {
		cb_entry_clear(&rows.r[i].e);
		free(rows.r[i].o_link);
	}
	free(rows.r);
	return ret;
}

struct lk_group {
	struct cb_turns *t;
	long long turn;
	const char *key;
	struct ws_pathset *out;
};

static int lk_member(const char *path, void *arg)
{
	struct lk_group *g = arg;
	struct cb_entry e = {0};
	int ret = ws_entry_at(g->t, path, g->turn, &e);

	if (!ret && e.type == CB_ENTRY_FILE && e.link && !strcmp(e.link, g->key))
		ret = ws_pathset_add(g->out, path, 0, NULL);
	cb_entry_clear(&e);
	return ret;
}

int ws_link_group(struct cb_turns *t, long long turn, const char *key, struct ws_pathset *out)
{
	struct lk_group g = {t, turn, key, out};
	int ret = cb_db_turns_link_paths(t->db, key, turn, lk_member, &g);

	ws_pathset_sort(out);
	return ret;
}

int ws_link_at(int root, const char *from, const char *to)
{
	const char *fname, *tname;
	int fpd = cb_beneath_parent(root, from, &fname), tpd = -1, ret = 0;

	if (fpd < 0)
		return cb_error_wrap(fpd, "link %s", to);
	tpd = cb_beneath_parent(root, to, &tname);
	if (tpd < 0)
		ret = cb_error_wrap(tpd, "link %s", to);
	else if (linkat(fpd, fname, tpd, tname, 0) < 0)
		ret = cb_error_set(errno, "link %s to %s: %s", to, from, strerror(errno));
	close(fpd);
	if (tpd >= 0)
		close(tpd);
	return ret;
}

int ws_same_inode(int root, const char *a, const char *b)
{
	struct stat sa, sb;

	if (cb_beneath_stat(root, a, &sa) < 0 || cb_beneath_stat(root, b, &sb) < 0) {
		cb_error_clear();
		return 0;
	}
	return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}
