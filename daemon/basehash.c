/* The base hashed in the background from the mount on, at idle priority, so the first
 * snapshot finds the hashes of the base ready; its progress for the info op. */
#include "config.h"

#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "daemon.h"

struct cb_daemon_basehash {
	pthread_t thread;
	struct cb_daemon *d;
	struct cb_ws_prehash p;
	double started, seconds; /* seconds: set when the pass ended */
	long long events;	 /* the base watch's count before the walk (-1: blind) */
};

#define IOPRIO_WHO_PROCESS 1
#define IOPRIO_CLASS_IDLE  3
#define IOPRIO_CLASS_SHIFT 13

static double mono_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int bh_stopping(void *arg)
{
	struct cb_daemon_basehash *bh = arg;

	return __atomic_load_n(&bh->d->stopping, __ATOMIC_ACQUIRE);
}

/* A turn op holds the turn lock: it may be the first snapshot, which wants the base now. */
static int bh_busy(void *arg)
{
	struct cb_daemon_basehash *bh = arg;

	if (pthread_mutex_trylock(&bh->d->turn_lock))
		return 1;
	pthread_mutex_unlock(&bh->d->turn_lock);
	return 0;
}

static int bh_wait(void *arg)
{
	struct cb_daemon_basehash *bh = arg;

	pthread_mutex_lock(&bh->d->turn_lock);
	pthread_mutex_unlock(&bh->d->turn_lock);
	return bh_stopping(arg);
}

/* The shared caches of a home live beside its workspaces: <home>/basecache. */
static char *bh_cache_dir(const char *ws_dir)
{
	char *tmp = strdup(ws_dir), *out = NULL;

	if (tmp && asprintf(&out, "%s/basecache", dirname(dirname(tmp))) < 0)
		out = NULL;
	free(tmp);
	return out;
}

int cb_daemon_basecache_attach(const char *ws_dir, struct cb_turns *t, const char *base)
{
	char *dir = base ? bh_cache_dir(ws_dir) : NULL;
	int ret = 0;

	if (dir && cb_ws_basecache_attach(t, dir, base)) {
		cb_daemon_log("shared base cache: %s", cb_error_message());
		cb_error_clear();
		ret = -1;
	}
	free(dir);
	return ret;
}

void cb_daemon_base_stats_log(struct cb_turns *t, const char *what)
{
	struct cb_ws_basecache_counts s;

	cb_ws_basecache_stats(t, &s);
	if (s.damage[0])
		cb_daemon_log("shared base cache: %s; hashing the base without it", s.damage);
	if (s.from_own || s.from_shared || s.hashed)
		cb_daemon_log("%s: base files: %lld from meta.db's cache, %lld from the shared "
			      "cache, %lld hashed (%lld added to the shared cache)",
			      what, s.from_own, s.from_shared, s.hashed, s.shared_added);
}

static int turns_stopping(void *arg)
{
	struct cb_daemon *d = arg;

	return __atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE);
}

/* A turns handle on the workspace's base, the home's shared cache attached; its hashing of
 * the base gives up when the daemon stops. */
int cb_daemon_turns_open(struct cb_daemon *d, const char *root, int shared, struct cb_turns **t)
{
	char blobs[4096];
	struct cb_turns_config cfg = {.db_path = d->db_path,
				      .blob_dir = blobs,
				      .base_dir = d->base,
				      .root = root,
				      .stopping = turns_stopping,
				      .stopping_arg = d};
	int ret;

	snprintf(blobs, sizeof(blobs), "%s/blobs", d->dir);
	ret = cb_turns_open(&cfg, t);
	if (!ret && shared)
		cb_daemon_basecache_attach(d->dir, *t, d->base);
	return ret;
}

/* The most base entries a read ahead is kept for (about 60 MB): the background pass holds a
 * walk of its own meanwhile, and a base larger than this takes seconds to snapshot first
 * anyway. */
#define SCAN_AHEAD_MAX 250000

int cb_daemon_base_scan_ahead(struct cb_daemon *d)
{
	/* Taken before the walk: a change during it is counted, and the scan is then dropped. */
	long long events = cb_daemon_basewatch_events(d);
	struct cb_ws_base_scan *s = NULL;
	struct cb_turns *t = NULL;
	double t0 = mono_seconds();
	int ret;

	/* In place the base is the live folder: no map is ever built from a walk of it. */
	if (events < 0 || !d->base || d->in_place)
		return 0;
	ret = cb_daemon_turns_open(d, NULL, 1, &t);
	if (!ret)
		ret = cb_ws_base_scan_ahead(t, cb_daemon_basewatch_dir, d, &s);
	cb_turns_close(t);
	if (ret) {
		cb_daemon_log("base: %s; the first snapshot reads it itself", cb_error_message());
		cb_error_clear();
		return 0;
	}
	if (!s)
		return 0;
	if (cb_ws_base_scan_entries(s) > SCAN_AHEAD_MAX) {
		cb_daemon_log("base read ahead: %zu entries, more than kept for the first snapshot",
			      cb_ws_base_scan_entries(s));
		cb_ws_base_scan_free(s);
		return 1; /* every directory is watched all the same */
	}
	cb_ws_base_scan_free(d->scan_ahead);
	d->scan_ahead = s;
	d->scan_ahead_events = events;
	cb_daemon_log("base read ahead for the first snapshot in %.3f s", mono_seconds() - t0);
	return 1;
}

void cb_daemon_base_scan_take(struct cb_daemon *d, struct cb_turns *t)
{
	struct cb_ws_base_scan *s = d->scan_ahead;

	d->scan_ahead = NULL;
	if (s && cb_daemon_basewatch_events(d) == d->scan_ahead_events)
		cb_ws_base_scan_use(t, s);
	else
		cb_ws_base_scan_free(s);
}

void cb_daemon_base_scan_drop(struct cb_daemon *d)
{
	cb_ws_base_scan_free(d->scan_ahead);
	d->scan_ahead = NULL;
}

void cb_daemon_drift_note(struct cb_daemon *d, struct cb_turns *t)
{
	long long events = cb_daemon_basewatch_events(d);

	if (!t || cb_db_turns_base_map_built(cb_turns_db(t)))
		return;
	cb_daemon_drift_forget(d);
	d->drift_events = events;
	d->drift_known = events >= 0;
}

int cb_daemon_drift_get(struct cb_daemon *d, struct cb_turns *t, const struct cb_ws_drift **out,
			int *looked)
{
	/* Taken before the look: a change during it is counted, and the next fork looks again.
	 * Settled first: events still queued would leave what the look finds unkept. */
	long long events = cb_daemon_basewatch_settled(d);
	int ret;

	*looked = 0;
	*out = NULL;
	/* No base (an empty workspace's): nothing can drift. */
	if (!d->base || (d->drift_known && events >= 0 && events == d->drift_events)) {
		*out = &d->drift;
		return 0;
	}
	/* Rare (the base moved, or a restart): say why, for whoever wonders at a slow fork. */
	cb_daemon_log("fork: looking at the whole base (%s)",
		      !d->drift_known ? "nothing known of its drift from turn 0"
		      : events < 0    ? "the base watch cannot tell"
				      : "the base watch saw it move");
	cb_daemon_drift_forget(d);
	*looked = 1;
	ret = cb_ws_base_drift(t, &d->drift);
	if (ret)
		return ret;
	d->drift_events = events;
	d->drift_known = events >= 0;
	*out = &d->drift;
	return 0;
}

void cb_daemon_drift_forget(struct cb_daemon *d)
{
	cb_ws_drift_free(&d->drift);
	d->drift_known = 0;
	d->drift_events = -1;
}

static void *bh_thread(void *arg)
{
	struct cb_daemon_basehash *bh = arg;
	struct cb_daemon *d = bh->d;
	struct cb_turns *t = NULL;
	pid_t tid = (pid_t)syscall(SYS_gettid);
	int ret;

	/* This thread only: the snapshot and the FUSE threads keep their priority. */
	if (setpriority(PRIO_PROCESS, (id_t)tid, 19) < 0 ||
	    syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid,
		    IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) < 0)
		cb_daemon_log("base hash: lower priority: %s", strerror(errno));
	/* The watch is set up under the turn lock by the start's look at the base: the count
	 * before the walk, so that any change during or after it is an event after this count. */
	pthread_mutex_lock(&d->turn_lock);
	bh->events = cb_daemon_basewatch_events(d);
	pthread_mutex_unlock(&d->turn_lock);
	ret = cb_daemon_turns_open(d, NULL, 1, &t);
	if (!ret)
		ret = cb_ws_base_prehash(t, &bh->p);
	bh->seconds = mono_seconds() - bh->started;
	/* The prepared map serves the first snapshot now: the scan read ahead is not needed. */
	if (__atomic_load_n(&bh->p.state, __ATOMIC_ACQUIRE) == CB_PREHASH_DONE) {
		pthread_mutex_lock(&d->turn_lock);
		cb_daemon_base_scan_drop(d);
		pthread_mutex_unlock(&d->turn_lock);
	}
	if (ret)
		cb_daemon_log("base hash: %s", cb_error_message());
	else if (bh->p.state != CB_PREHASH_TAKEN || bh->p.files_done)
		cb_daemon_log("base hash %s after %.2f s: %lld of %lld files (%lld bytes), %lld "
			      "from the shared cache, %lld hashed",
			      cb_ws_prehash_state_name(bh->p.state), bh->seconds, bh->p.files_done,
			      bh->p.files_total, bh->p.bytes_done, bh->p.from_shared, bh->p.hashed);
	if (t) {
		struct cb_ws_basecache_counts s;

		cb_ws_basecache_stats(t, &s);
		if (s.damage[0])
			cb_daemon_log("shared base cache: %s; hashing the base without it",
				      s.damage);
	}
	cb_turns_close(t);
	cb_error_clear();
	return NULL;
}

int cb_daemon_basehash_start(struct cb_daemon *d)
{
	struct cb_daemon_basehash *bh;
	int rc;

	/* COWBOX_BACKGROUND_HASH=0: no base I/O before the first snapshot asks for it. */
	if (!d->base || !strcmp(getenv("COWBOX_BACKGROUND_HASH") ?: "", "0"))
		return 0;
	if (!(bh = calloc(1, sizeof(*bh))))
		return cb_error_set(ENOMEM, "base hash: out of memory");
	bh->d = d;
	bh->p.busy = bh_busy;
	bh->p.wait = bh_wait;
	bh->p.stopping = bh_stopping;
	bh->p.arg = bh;
	bh->started = mono_seconds();
	if ((rc = pthread_create(&bh->thread, NULL, bh_thread, bh))) {
		free(bh);
		return cb_error_set(rc, "base hash thread: %s", strerror(rc));
	}
	d->basehash = bh;
	return 0;
}

void cb_daemon_basehash_stop(struct cb_daemon *d)
{
	if (!d->basehash)
		return;
	pthread_join(d->basehash->thread, NULL);
	free(d->basehash);
	d->basehash = NULL;
}

int cb_daemon_basehash_prepared(struct cb_daemon *d)
{
	struct cb_daemon_basehash *bh = d->basehash;

	return bh && __atomic_load_n(&bh->p.state, __ATOMIC_ACQUIRE) == CB_PREHASH_DONE &&
	       bh->events >= 0 && cb_daemon_basewatch_events(d) == bh->events;
}

void cb_daemon_basehash_info(struct cb_daemon *d, json_t *r)
{
	struct cb_daemon_basehash *bh = d->basehash;
	struct cb_ws_prehash *p;
	int state;

	if (!bh)
		return;
	p = &bh->p;
	state = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
	json_object_set_new(
	    r, "base_hash",
	    json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I}", "state",
		      cb_ws_prehash_state_name(state), "files_done",
		      (json_int_t)__atomic_load_n(&p->files_done, __ATOMIC_RELAXED), "files_total",
		      (json_int_t)__atomic_load_n(&p->files_total, __ATOMIC_RELAXED), "bytes_done",
		      (json_int_t)__atomic_load_n(&p->bytes_done, __ATOMIC_RELAXED), "bytes_total",
		      (json_int_t)__atomic_load_n(&p->bytes_total, __ATOMIC_RELAXED), "from_shared",
		      (json_int_t)__atomic_load_n(&p->from_shared, __ATOMIC_RELAXED), "hashed",
		      (json_int_t)__atomic_load_n(&p->hashed, __ATOMIC_RELAXED)));
}
