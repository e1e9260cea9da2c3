/* The walk of the base the first map and the base check make: every entry stat'ed, beside its
 * directory's fd, on two threads that share out the directories, then put in path order. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"
#include "util/beneath.h"

#define WALK_THREADS 2

/* The base's own queue entry: its run is found by this pointer. */
static const char top_dir[] = "";

/* What the threads share: the directories still to read. */
struct walk_shared {
	int base_fd;
	void (*dir_opened)(void *, int); /* told of each directory before it is read */
	void *hook_arg;
	pthread_mutex_t lock;
	pthread_cond_t more;
	/* Names of directories to read, borrowed from their entries' paths (which stay put
	 * while the arrays holding the entries grow); "" is the base itself. */
	const char **q;
	size_t nq, qcap;
	int reading; /* threads reading a directory (which may add more) */
	int err;     /* the first failure, whose message is msg */
	char msg[512];
};

/* One directory as a thread read it: its entries, sorted by name, are f[start, start + n) of
 * that thread's array. dir is the pointer the queue gave (its entry's path, or "" for the
 * base): the key its parent's entry finds it by. */
struct walk_run {
	const char *dir;
	struct walk_thread *th;
	size_t start, n;
	size_t name_at; /* where the names start in the entries' paths */
};

/* One thread's entries and directories (put in order after the walk), and the directories it
 * found in the one it is reading. */
struct walk_thread {
	struct walk_shared *s;
	pthread_t id;
	struct ws_base_file *f;
	size_t n, cap;
	struct walk_run *runs;
	size_t nruns, runcap;
	const char **sub;
	size_t nsub, subcap;
};

/* Entries of one directory by name: strcmp of the names is strcmp of the paths, without the
 * directory's path that they share (a global sort of whole paths spent most of its time
 * comparing those prefixes). */
static int name_cmp(const void *a, const void *b, void *name_at)
{
	size_t at = *(const size_t *)name_at;

	return strcmp(((const struct ws_base_file *)a)->path + at,
		      ((const struct ws_base_file *)b)->path + at);
}

/* path + "/" + name (or name alone at the top), without printf's parsing. */
static char *join(const char *path, const char *name)
{
	size_t lp = strlen(path), ln = strlen(name);
	char *p = malloc(lp + ln + 2);

	if (!p)
		return NULL;
	if (lp) {
		memcpy(p, path, lp);
		p[lp++] = '/';
	}
	memcpy(p + lp, name, ln + 1);
	return p;
}

/* Read one directory: its entries go to th's array, its subdirectories to th->sub. Holds one
 * fd at a time, whatever the depth or the width of the tree (no recursion while it is open). */
static int walk_dir(struct walk_thread *th, const char *path)
{
	int fd = cb_beneath_open(th->s->base_fd, path[0] ? path : ".", O_RDONLY | O_DIRECTORY, 0);
	size_t start = th->n, name_at = path[0] ? strlen(path) + 1 : 0;
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	if (fd < 0)
		return cb_error_wrap(fd, "base");
	if (th->s->dir_opened)
		th->s->dir_opened(th->s->hook_arg, fd);
	if (!(dir = fdopendir(fd))) {
		ret = cb_error_set(errno, "base %s: %s", path, strerror(errno));
		close(fd);
		return ret;
	}
	while (!ret && (de = readdir(dir))) {
		struct ws_base_file *f;
		struct stat st;
		char *child;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!(child = join(path, de->d_name))) {
			ret = cb_error_set(ENOMEM, "base walk: out of memory");
			break;
		}
		/* Beside its directory's fd: the name is looked up in the directory just read. */
		if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			ret = cb_error_set(errno, "base %s: %s", child, strerror(errno));
			free(child);
			break;
		}
		if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode) && !S_ISLNK(st.st_mode)) {
			free(child);
			continue;
		}
		if ((ret = cb_grow(&th->f, &th->cap, th->n, sizeof(*th->f), 1024, "base walk")) ||
		    (S_ISDIR(st.st_mode) && (ret = cb_grow(&th->sub, &th->subcap, th->nsub,
							   sizeof(*th->sub), 64, "base walk")))) {
			free(child);
			break;
		}
		f = &th->f[th->n++];
		memset(f, 0, sizeof(*f));
		f->path = child;
		f->st = st;
		if (S_ISDIR(st.st_mode))
			th->sub[th->nsub++] = child;
	}
	closedir(dir);
	if (!ret)
		ret =
		    cb_grow(&th->runs, &th->runcap, th->nruns, sizeof(*th->runs), 64, "base walk");
	if (ret)
		return ret;
	if (th->n - start > 1) /* (an empty directory may have no array yet) */
		qsort_r(th->f + start, th->n - start, sizeof(*th->f), name_cmp, &name_at);
	th->runs[th->nruns++] = (struct walk_run){
	    .dir = path, .th = th, .start = start, .n = th->n - start, .name_at = name_at};
	return 0;
}

static void *walk_thread(void *arg)
{
	struct walk_thread *th = arg;
	struct walk_shared *s = th->s;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		const char *path;
		int ret;

		while (!s->nq && s->reading && !s->err)
			pthread_cond_wait(&s->more, &s->lock);
		if (!s->nq || s->err)
			break;
		path = s->q[--s->nq];
		s->reading++;
		pthread_mutex_unlock(&s->lock);
		th->nsub = 0;
		ret = walk_dir(th, path);
		pthread_mutex_lock(&s->lock);
		s->reading--;
		for (size_t i = 0; i < th->nsub && !ret; i++)
			if (!(ret =
				  cb_grow(&s->q, &s->qcap, s->nq, sizeof(*s->q), 256, "base walk")))
				s->q[s->nq++] = th->sub[i];
		if (ret && !s->err) {
			/* the message is this thread's: carried to the caller's */
			s->err = ret;
			snprintf(s->msg, sizeof(s->msg), "%s", cb_error_message());
		}
		pthread_cond_broadcast(&s->more);
	}
	pthread_cond_broadcast(&s->more);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Runs by the address of their directory's queued path: the key run_of finds them by. */
static int run_cmp(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)((const struct walk_run *)a)->dir,
		  y = (uintptr_t)((const struct walk_run *)b)->dir;

	return x < y ? -1 : x > y;
}

/* The run of the directory whose queued path is dir, among runs sorted by that pointer. */
static const struct walk_run *run_of(const struct walk_run *runs, size_t n, const char *dir)
{
	struct walk_run key = {.dir = dir};

	return bsearch(&key, runs, n, sizeof(*runs), run_cmp);
}

/* Whether the subtree of directory d (every path "d/...") comes before entry e, d and e being
 * names in one directory: strcmp of "d/" with e, as no name holds a '/'. */
static int subtree_first(const char *d, const char *e)
{
	size_t ld = strlen(d);
	int c = strncmp(d, e, ld);

	return c ? c < 0 : (unsigned char)'/' < (unsigned char)e[ld];
}

/* Where the walk of one directory is: its run, the next entry, and how deep the stack of
 * its directory entries whose subtrees are still to come was when it began. */
struct walk_frame {
	const struct walk_run *run;
	size_t next, pending_at;
};

/* The entries of every thread in path order (strcmp's): from the base's run down, each
 * directory's entries in name order, with the subtree of each directory entry put where
 * "name/" sorts among its siblings ("a", then "a.c", then "a/x": '.' < '/'). A directory
 * entry waits on a stack until the first sibling its subtree sorts before; subtrees on that
 * stack sort in reverse order of their entries, as "a.b/" < "a/". */
static int walk_order(struct walk_thread *th, int nth, struct ws_base_file **out, size_t *n)
{
	struct walk_run *runs = NULL;
	struct walk_frame *frames = NULL;
	const struct ws_base_file **pending = NULL;
	size_t nruns = 0, total = 0, k = 0, nframes = 0, fcap = 0, npending = 0, pcap = 0;
	struct ws_base_file *f = NULL;
	int ret = 0;

	for (int i = 0; i < nth; i++) {
		total += th[i].n;
		nruns += th[i].nruns;
	}
	if (!(f = malloc((total ? total : 1) * sizeof(*f))) ||
	    !(runs = malloc((nruns ? nruns : 1) * sizeof(*runs)))) {
		ret = cb_error_set(ENOMEM, "base walk: out of memory");
		goto out;
	}
	nruns = 0;
	for (int i = 0; i < nth; i++)
		for (size_t r = 0; r < th[i].nruns; r++)
			runs[nruns++] = th[i].runs[r];
	qsort(runs, nruns, sizeof(*runs), run_cmp);
	if ((ret = cb_grow(&frames, &fcap, 0, sizeof(*frames), 16, "base walk")))
		goto out;
	frames[nframes++] = (struct walk_frame){.run = run_of(runs, nruns, top_dir)};
	while (nframes && !ret) {
		struct walk_frame *fr = &frames[nframes - 1];
		const struct walk_run *run = fr->run;
		const struct ws_base_file *e =
		    run && fr->next < run->n ? &run->th->f[run->start + fr->next] : NULL;
		const struct ws_base_file *d = NULL;

		if (npending > fr->pending_at &&
		    (!e || subtree_first(pending[npending - 1]->path + run->name_at,
					 e->path + run->name_at)))
			d = pending[--npending];
		if (d) {
			/* Its subtree now: the directory's own run, below this one. */
			const struct walk_run *sub = run_of(runs, nruns, d->path);

			if (!sub) {
				ret = cb_error_set(EIO, "base walk: %s was not read", d->path);
				break;
			}
			if (!(ret = cb_grow(&frames, &fcap, nframes, sizeof(*frames), 16,
					    "base walk")))
				frames[nframes++] =
				    (struct walk_frame){.run = sub, .pending_at = npending};
			continue;
		}
		if (!e) {
			nframes--;
			continue;
		}
		f[k++] = *e;
		fr->next++;
		if (S_ISDIR(e->st.st_mode) &&
		    !(ret = cb_grow(&pending, &pcap, npending, sizeof(*pending), 16, "base walk")))
			pending[npending++] = e;
	}
	if (!ret && k != total)
		ret = cb_error_set(EIO, "base walk: %zu of %zu entries put in order", k, total);
out:
	free(runs);
	free(frames);
	free(pending);
	if (ret) {
		free(f);
		return ret;
	}
	for (int i = 0; i < nth; i++)
		th[i].n = 0; /* the paths are the ordered array's now */
	*out = f;
	*n = total;
	return 0;
}

int ws_base_walk_watched(int base_fd, void (*dir_opened)(void *, int dirfd), void *arg,
			 struct ws_base_file **out, size_t *n)
{
	struct walk_shared s = {.base_fd = base_fd, .dir_opened = dir_opened, .hook_arg = arg};
	struct walk_thread th[WALK_THREADS];
	int nth = 1, ret = 0;

	*out = NULL;
	*n = 0;
	memset(th, 0, sizeof(th));
	if ((ret = cb_grow(&s.q, &s.qcap, 0, sizeof(*s.q), 256, "base walk")))
		return ret;
	s.q[s.nq++] = top_dir;
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.more, NULL);
	for (int i = 0; i < WALK_THREADS; i++)
		th[i].s = &s;
	/* Without a second thread (none could start) the caller's walks alone. */
	for (int i = 1; i < WALK_THREADS; i++)
		if (pthread_create(&th[i].id, NULL, walk_thread, &th[i]) == 0)
			nth = i + 1;
		else
			break;
	walk_thread(&th[0]);
	for (int i = 1; i < nth; i++)
		pthread_join(th[i].id, NULL);
	if (s.err)
		ret = cb_error_set(s.err, "%s", s.msg);
	else
		ret = walk_order(th, nth, out, n);
	for (int i = 0; i < nth; i++) {
		ws_base_files_free(th[i].f, th[i].n);
		free(th[i].runs);
		free(th[i].sub);
	}
	pthread_cond_destroy(&s.more);
	pthread_mutex_destroy(&s.lock);
	free(s.q);
	return ret;
}

int ws_base_walk(int base_fd, struct ws_base_file **out, size_t *n)
{
	return ws_base_walk_watched(base_fd, NULL, NULL, out, n);
}

void ws_base_files_free(struct ws_base_file *f, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(f[i].path);
	free(f);
}
