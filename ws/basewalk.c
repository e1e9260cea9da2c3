/* The walk of the base the first map and the base check make: every entry stat'ed, beside its
 * directory's fd, on two threads that share out the directories, then sorted by path. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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

/* One thread's entries (merged after the walk) and the directories it found in the one it
 * is reading. */
struct walk_thread {
	struct walk_shared *s;
	pthread_t id;
	struct ws_base_file *f;
	size_t n, cap;
	const char **sub;
	size_t nsub, subcap;
};

static int file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ws_base_file *)a)->path,
		      ((const struct ws_base_file *)b)->path);
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
	return ret;
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
	/* Each thread sorts its own share at once; the caller merges the sorted runs. */
	if (!s->err && th->n)
		qsort(th->f, th->n, sizeof(*th->f), file_cmp);
	return NULL;
}

/* Merge the sorted runs of the threads into one array in path order. */
static int walk_merge(struct walk_thread *th, int nth, struct ws_base_file **out, size_t *n)
{
	size_t at[WALK_THREADS] = {0}, total = 0;
	struct ws_base_file *f;

	for (int i = 0; i < nth; i++)
		total += th[i].n;
	if (!(f = malloc((total ? total : 1) * sizeof(*f))))
		return cb_error_set(ENOMEM, "base walk: out of memory");
	for (size_t k = 0; k < total; k++) {
		int best = -1;

		for (int i = 0; i < nth; i++)
			if (at[i] < th[i].n && (best < 0 || strcmp(th[i].f[at[i]].path,
								   th[best].f[at[best]].path) < 0))
				best = i;
		f[k] = th[best].f[at[best]++];
	}
	for (int i = 0; i < nth; i++)
		th[i].n = 0; /* the paths are the merged array's now */
	*out = f;
	*n = total;
	return 0;
}

int ws_base_walk_watched(int base_fd, void (*dir_opened)(void *, int dirfd), void *arg,
			 struct ws_base_file **out, size_t *n)
{
	static const char *const top = "";
	struct walk_shared s = {.base_fd = base_fd, .dir_opened = dir_opened, .hook_arg = arg};
	struct walk_thread th[WALK_THREADS];
	int nth = 1, ret = 0;

	*out = NULL;
	*n = 0;
	memset(th, 0, sizeof(th));
	if ((ret = cb_grow(&s.q, &s.qcap, 0, sizeof(*s.q), 256, "base walk")))
		return ret;
	s.q[s.nq++] = top;
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
		ret = walk_merge(th, nth, out, n);
	for (int i = 0; i < nth; i++) {
		ws_base_files_free(th[i].f, th[i].n);
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
