/* The overlay's journal hooks: the first change to a path in a turn is recorded durably
 * (cb_journal_mark) before the operation is answered; later ones cost an atomic compare.
 *
 * INVARIANTS (the journal rule itself is stated once, in ov.h; asserted in a checked build):
 *   - a mark is made holding tab.ns (either side) and not tab.lock, and, for a request,
 *     inside the fence's shared side; the only marks without a request are the turn
 *     advance's own (ov_mark_open_writers), made after it has left the fence.
 *   - an inode's write_gen or meta_gen equals ov->gen only after every name of it that has a
 *     path (a name under a removed directory has none) was marked in that turn: the names
 *     looked up, and for a multiply-linked upper file those the journal's link_names has
 *     that still name it (the others of a name made by link or rename are on record before
 *     the name exists); a failed mark leaves it unchanged, so the next change tries again.
 *   - the marks of the request a thread serves (op_marks) live until it leaves the fence:
 *     dropped, or moved to ov->carry (under carry_lock) when an advance waited for it, and
 *     journaled again in the new turn by ov_marks_carry. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"
#include "util/beneath.h"

/* The last few callers' /proc/PID/comm, kept open so that a mark costs one pread and no
 * open/close: the name is read anew each time, so it follows an exec or a rename; a pid that
 * was reused reads ESRCH through the old process's fd, which is then reopened by path. At
 * most COMM_FDS fds, shared by every mount of the process. */
#define COMM_FDS 4
static struct {
	pid_t pid; /* 0: empty */
	int fd;
} comm_fds[COMM_FDS];
static unsigned comm_next;
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

/* One read of an open comm file into buf: its length, or -1. */
static ssize_t comm_pread(int fd, char *buf, size_t size)
{
	ssize_t n;

	do
		n = pread(fd, buf, size - 1, 0);
	while (n < 0 && errno == EINTR);
	return n > 0 ? n : -1;
}

/* The command name of pid into buf (empty when it is gone). */
static void ov_comm(pid_t pid, char *buf, size_t size)
{
	char path[64];
	ssize_t n = -1;
	unsigned i;
	int fd;

	buf[0] = '\0';
	if (pid <= 0)
		return;
	pthread_mutex_lock(&comm_lock);
	for (i = 0; i < COMM_FDS && comm_fds[i].pid != pid; i++)
		;
	if (i < COMM_FDS) {
		n = comm_pread(comm_fds[i].fd, buf, size);
		if (n < 0) { /* gone, or the pid is another process's now */
			close(comm_fds[i].fd);
			comm_fds[i].pid = 0;
		}
	}
	if (n < 0) {
		snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0 && (n = comm_pread(fd, buf, size)) > 0) {
			i = comm_next++ % COMM_FDS;
			if (comm_fds[i].pid)
				close(comm_fds[i].fd);
			comm_fds[i].pid = pid;
			comm_fds[i].fd = fd;
		} else if (fd >= 0) {
			close(fd);
		}
	}
	pthread_mutex_unlock(&comm_lock);
	if (n <= 0) {
		buf[0] = '\0';
		return;
	}
	if (buf[n - 1] == '\n')
		n--;
	buf[n] = '\0';
}

/* The marks of the operation this thread is serving, kept until it leaves the fence. */
static __thread struct ov_marks {
	struct cb_change *c;
	size_t n, cap;
} op_marks;

static void marks_free(struct ov_marks *m)
{
	for (size_t i = 0; i < m->n; i++) {
		free((char *)m->c[i].path);
		free((char *)m->c[i].comm);
	}
	free(m->c);
	memset(m, 0, sizeof(*m));
}

/* Memory pressure only loses the carry of a mark to the next turn (see ov_marks_leave). */
static void marks_keep(const struct cb_change *c, size_t n)
{
	struct ov_marks *m = &op_marks;

	for (size_t i = 0; i < n; i++) {
		if (m->n == m->cap) {
			size_t cap = m->cap ? m->cap * 2 : 4;
			struct cb_change *grown = realloc(m->c, cap * sizeof(*grown));

			if (!grown)
				return;
			m->c = grown;
			m->cap = cap;
		}
		m->c[m->n] = c[i];
		m->c[m->n].path = strdup(c[i].path);
		m->c[m->n].comm = c[i].comm ? strdup(c[i].comm) : NULL;
		if (!m->c[m->n].path) {
			free((char *)m->c[m->n].comm);
			return;
		}
		m->n++;
	}
}

/* See ov.h. */
void ov_marks_leave(struct cb_overlay *ov, int carry)
{
	struct ov_marks *m = &op_marks;

	if (m->n == 0)
		return;
	if (!carry) {
		marks_free(m);
		return;
	}
	pthread_mutex_lock(&ov->carry_lock);
	for (size_t i = 0; i < m->n; i++) {
		if (ov->ncarry == ov->capcarry) {
			size_t cap = ov->capcarry ? ov->capcarry * 2 : 16;
			struct cb_change *grown = realloc(ov->carry, cap * sizeof(*grown));

			if (!grown)
				break;
			ov->carry = grown;
			ov->capcarry = cap;
		}
		ov->carry[ov->ncarry++] = m->c[i];
		m->c[i].path = m->c[i].comm = NULL;
	}
	pthread_mutex_unlock(&ov->carry_lock);
	marks_free(m);
}

/* See ov.h. */
void ov_marks_carry(struct cb_overlay *ov)
{
	struct ov_marks m;

	pthread_mutex_lock(&ov->carry_lock);
	m = (struct ov_marks){ov->carry, ov->ncarry, ov->capcarry};
	ov->carry = NULL;
	ov->ncarry = ov->capcarry = 0;
	pthread_mutex_unlock(&ov->carry_lock);
	if (m.n && ov->db && cb_journal_mark(ov->db, m.c, m.n) < 0)
		fprintf(stderr, "cowbox fs: journal %s (carried to the next turn): %s\n",
			m.c[0].path, cb_error_message());
	marks_free(&m);
}

static int ov_mark(struct cb_overlay *ov, fuse_req_t req, struct cb_change *c, size_t n)
{
	char comm[32];
	pid_t pid = req ? fuse_req_ctx(req)->pid : 0;
	size_t i;
	int r;

	CB_ASSERT_READING(&ov->tab.ns);
	CB_ASSERT_NOT_HELD(&ov->tab.lock);
#ifdef CB_LOCK_CHECKS
	assert(!req || cb_rwlock_held(&ov->fence));
#endif
	if (!ov->db || n == 0)
		return 0;
	ov_comm(pid, comm, sizeof(comm));
	for (i = 0; i < n; i++) {
		c[i].pid = pid;
		c[i].comm = comm[0] ? comm : NULL;
	}
	r = cb_journal_mark(ov->db, c, n);
	if (r < 0) {
		fprintf(stderr, "cowbox fs: journal %s: %s\n", c[0].path, cb_error_message());
		/* The change cannot be recorded, so it must not happen; a full disk (or quota) is
		 * said as such, anything else is an I/O error. */
		return r == -ENOSPC || r == -EDQUOT ? r : -EIO;
	}
	marks_keep(c, n);
	ov_fence_stall(ov);
	return 0;
}

/* Records one change to path. Returns 0, or -ENOSPC/-EDQUOT (no room to record it) or -EIO
 * (the journal failed): the caller must not make the change. */
int ov_mark_path(struct cb_overlay *ov, fuse_req_t req, const char *path, enum cb_change_kind kind,
		 int subtree)
{
	struct cb_change c = {.path = path, .kind = kind, .subtree = subtree};

	return ov_mark(ov, req, &c, 1);
}

/* Records a change to parent/name. Caller holds ns (read or write). */
int ov_mark_child(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *parent, const char *name,
		  enum cb_change_kind kind, int subtree)
{
	char *path;
	int r;

	CB_ASSERT_READING(&ov->tab.ns);
	if (!ov->db)
		return 0;
	r = ov_path(&ov->tab, parent, name, &path);
	if (r < 0)
		return r;
	r = ov_mark_path(ov, req, path, kind, subtree);
	free(path);
	return r;
}

/* A growing list of owned paths. */
struct ov_paths {
	char **p;
	size_t n, cap;
};

/* Appends path (owned: freed if it cannot be kept). */
static int ov_paths_push(struct ov_paths *ps, char *path)
{
	if (!path)
		return -ENOMEM;
	if (ps->n == ps->cap) {
		size_t cap = ps->cap ? ps->cap * 2 : 4;
		char **grown = realloc(ps->p, cap * sizeof(*grown));

		if (!grown) {
			free(path);
			return -ENOMEM;
		}
		ps->p = grown;
		ps->cap = cap;
	}
	ps->p[ps->n++] = path;
	return 0;
}

static void ov_paths_free(struct ov_paths *ps)
{
	for (size_t i = 0; i < ps->n; i++)
		free(ps->p[i]);
	free(ps->p);
	memset(ps, 0, sizeof(*ps));
}

static int ov_paths_has(const struct ov_paths *ps, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(ps->p[i], path))
			return 1;
	return 0;
}

static int ov_link_row(unsigned long long ino, const char *path, void *arg)
{
	(void)ino;
	return ov_paths_push(arg, strdup(path));
}

/* Adds to ps the names of in's upper inode that the journal's link_names records and the
 * mount has not looked up (the first `known` paths of ps): a passthrough or mmap write,
 * a truncate through one name changes them all, while the mount knows only the names
 * looked up since it was mounted. A row counts only if its path, resolved beneath upper
 * with no symlink followed, is still that inode; stale rows are dropped, known names missing
 * from the table added. O(names of the inode). */
static int ov_mark_link_names(struct cb_overlay *ov, struct ov_inode *in, struct ov_paths *ps,
			      size_t known)
{
	unsigned long long ino = in->rino;
	struct ov_paths rows = {0};
	struct stat st;
	int r = cb_links_names(ov->db, ino, ov_link_row, &rows);

	if (r < 0 && r != -ENOMEM) { /* as a failed mark: refused, said as such */
		fprintf(stderr, "cowbox fs: link names: %s\n", cb_error_message());
		r = r == -ENOSPC || r == -EDQUOT ? r : -EIO;
	}
	for (size_t i = 0; r == 0 && i < rows.n; i++) {
		if (ov_paths_has(ps, known, rows.p[i]))
			continue;
		if (cb_beneath_stat(ov->upper_fd, rows.p[i], &st) == 0 && st.st_dev == in->dev &&
		    st.st_ino == ino) {
			r = ov_paths_push(ps, strdup(rows.p[i]));
		} else if (cb_links_forget(ov->db, ino, rows.p[i]) < 0) {
			fprintf(stderr, "cowbox fs: link names: %s\n", cb_error_message());
		}
	}
	for (size_t i = 0; r == 0 && i < known; i++)
		if (!ov_paths_has(&rows, rows.n, ps->p[i]) &&
		    cb_links_add(ov->db, ino, ps->p[i]) < 0)
			fprintf(stderr, "cowbox fs: link names: %s\n", cb_error_message());
	for (size_t i = 0; i < rows.n; i++)
		free(rows.p[i]);
	free(rows.p);
	return r;
}

/* Records a content (CB_CHANGE_WRITE) or metadata (CB_CHANGE_META) change of in under every
 * name it has (a file may have any number of hard links: each name's hash changes), unless
 * already done in this turn. Caller holds ns (read or write). */
int ov_mark_inode(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *in,
		  enum cb_change_kind kind)
{
	_Atomic uint64_t *gen = kind == CB_CHANGE_META ? &in->meta_gen : &in->write_gen;
	uint64_t g = atomic_load(&ov->gen);
	struct ov_paths ps = {0};
	struct cb_change *c = NULL;
	struct ov_name *nm;
	int r = 0;

	CB_ASSERT_READING(&ov->tab.ns);
	if (atomic_load(gen) == g)
		return 0;
	if (ov->db) {
		cb_mutex_lock(&ov->tab.lock);
		for (nm = in->names; nm && !r; nm = nm->next) {
			char *path = NULL;
			int len = ov_path_of_name(&ov->tab, nm, &path);

			/* A name under a directory removed meanwhile has no path to mark; without
			 * memory a name would go unmarked, so the change is refused instead. */
			if (len != -ENOENT)
				r = len < 0 ? len : ov_paths_push(&ps, path);
		}
		cb_mutex_unlock(&ov->tab.lock);
		if (!r && atomic_load(&in->nlink) > 1 && atomic_load(&in->layer) == OV_UPPER)
			r = ov_mark_link_names(ov, in, &ps, ps.n);
		if (!r && !(c = calloc(ps.n ? ps.n : 1, sizeof(*c))))
			r = -ENOMEM;
		for (size_t i = 0; !r && i < ps.n; i++)
			c[i] = (struct cb_change){.path = ps.p[i], .kind = kind};
		if (!r)
			r = ov_mark(ov, req, c, ps.n);
		ov_paths_free(&ps);
		free(c);
		if (r < 0)
			return r == -ENOMEM ? -EIO : r;
	}
	atomic_store(gen, g);
	return 0;
}

/* Makes the journal durable against power loss (fsync, unmount). */
void ov_journal_sync(struct cb_overlay *ov)
{
	if (ov->db && cb_journal_sync(ov->db) < 0)
		fprintf(stderr, "cowbox fs: journal sync: %s\n", cb_error_message());
}
