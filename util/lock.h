/* Locks that know who holds them: in a checked build (CB_LOCK_CHECKS, configure's
 * --enable-lock-checks, on with --enable-sanitizers) a function asserts the lock it needs. */
#ifndef COWBOX_UTIL_LOCK_H
#define COWBOX_UTIL_LOCK_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>

/* A mutex with its owner. The owner is written only by the thread that holds the mutex, so
 * "do I hold it" needs no other lock: only this thread can make the answer yes. */
struct cb_mutex {
	pthread_mutex_t m;
#ifdef CB_LOCK_CHECKS
	_Atomic unsigned long owner; /* pthread_self() of the holder, 0 when free */
#endif
};

/* A read-write lock with its writer; readers are known per thread (cb_lock_reading). */
struct cb_rwlock {
	pthread_rwlock_t rw;
#ifdef CB_LOCK_CHECKS
	_Atomic unsigned long writer;
#endif
};

#ifdef CB_LOCK_CHECKS
/* The read locks this thread holds, innermost last (util/lock.c); a thread holds a few at
 * most (the turn fence, the overlay's names). */
#define CB_LOCK_MAX_READS 8
extern __thread const struct cb_rwlock *cb_lock_reads[CB_LOCK_MAX_READS];
extern __thread int cb_lock_nreads;
#endif

static inline unsigned long cb_lock_self(void)
{
	return (unsigned long)pthread_self();
}

/* Initializes l (unlocked); attr may be NULL. */
static inline void cb_mutex_init(struct cb_mutex *l, const pthread_mutexattr_t *attr)
{
	pthread_mutex_init(&l->m, attr);
#ifdef CB_LOCK_CHECKS
	atomic_init(&l->owner, 0);
#endif
}

/* Destroys an unlocked l. */
static inline void cb_mutex_destroy(struct cb_mutex *l)
{
	pthread_mutex_destroy(&l->m);
}

/* Locks l (never recursively: asserted). */
static inline void cb_mutex_lock(struct cb_mutex *l)
{
#ifdef CB_LOCK_CHECKS
	assert(atomic_load(&l->owner) != cb_lock_self());
#endif
	pthread_mutex_lock(&l->m);
#ifdef CB_LOCK_CHECKS
	atomic_store(&l->owner, cb_lock_self());
#endif
}

/* Unlocks l, which this thread holds (asserted). */
static inline void cb_mutex_unlock(struct cb_mutex *l)
{
#ifdef CB_LOCK_CHECKS
	assert(atomic_load(&l->owner) == cb_lock_self());
	atomic_store(&l->owner, 0);
#endif
	pthread_mutex_unlock(&l->m);
}

/* Initializes l (unlocked); attr may be NULL. */
static inline void cb_rwlock_init(struct cb_rwlock *l, const pthread_rwlockattr_t *attr)
{
	pthread_rwlock_init(&l->rw, attr);
#ifdef CB_LOCK_CHECKS
	atomic_init(&l->writer, 0);
#endif
}

/* Destroys an unlocked l. */
static inline void cb_rwlock_destroy(struct cb_rwlock *l)
{
	pthread_rwlock_destroy(&l->rw);
}

/* Takes the shared side of l. */
static inline void cb_rwlock_read(struct cb_rwlock *l)
{
#ifdef CB_LOCK_CHECKS
	assert(atomic_load(&l->writer) != cb_lock_self());
	assert(cb_lock_nreads < CB_LOCK_MAX_READS);
#endif
	pthread_rwlock_rdlock(&l->rw);
#ifdef CB_LOCK_CHECKS
	cb_lock_reads[cb_lock_nreads++] = l;
#endif
}

/* Takes the exclusive side of l (not while this thread holds it either way: asserted). */
static inline void cb_rwlock_write(struct cb_rwlock *l)
{
#ifdef CB_LOCK_CHECKS
	for (int i = 0; i < cb_lock_nreads; i++)
		assert(cb_lock_reads[i] != l);
	assert(atomic_load(&l->writer) != cb_lock_self());
#endif
	pthread_rwlock_wrlock(&l->rw);
#ifdef CB_LOCK_CHECKS
	atomic_store(&l->writer, cb_lock_self());
#endif
}

/* Gives back the side of l this thread holds (asserted). */
static inline void cb_rwlock_unlock(struct cb_rwlock *l)
{
#ifdef CB_LOCK_CHECKS
	if (atomic_load(&l->writer) == cb_lock_self()) {
		atomic_store(&l->writer, 0);
	} else {
		int i = cb_lock_nreads - 1;

		while (i >= 0 && cb_lock_reads[i] != l)
			i--;
		assert(i >= 0);
		for (; i + 1 < cb_lock_nreads; i++)
			cb_lock_reads[i] = cb_lock_reads[i + 1];
		cb_lock_nreads--;
	}
#endif
	pthread_rwlock_unlock(&l->rw);
}

#ifdef CB_LOCK_CHECKS
/* Whether this thread holds l. */
static inline int cb_mutex_held(const struct cb_mutex *l)
{
	return atomic_load(&l->owner) == cb_lock_self();
}

/* Whether this thread holds the exclusive side of l. */
static inline int cb_rwlock_writing(const struct cb_rwlock *l)
{
	return atomic_load(&l->writer) == cb_lock_self();
}

/* Whether this thread holds l, either side. */
static inline int cb_rwlock_held(const struct cb_rwlock *l)
{
	for (int i = 0; i < cb_lock_nreads; i++)
		if (cb_lock_reads[i] == l)
			return 1;
	return cb_rwlock_writing(l);
}

#define CB_ASSERT_HELD(l)     assert(cb_mutex_held(l))
#define CB_ASSERT_NOT_HELD(l) assert(!cb_mutex_held(l))
#define CB_ASSERT_READING(l)  assert(cb_rwlock_held(l))
#define CB_ASSERT_WRITING(l)  assert(cb_rwlock_writing(l))
#define CB_ASSERT_OUTSIDE(l)  assert(!cb_rwlock_held(l))
#else
#define CB_ASSERT_HELD(l)     ((void)(l))
#define CB_ASSERT_NOT_HELD(l) ((void)(l))
#define CB_ASSERT_READING(l)  ((void)(l))
#define CB_ASSERT_WRITING(l)  ((void)(l))
#define CB_ASSERT_OUTSIDE(l)  ((void)(l))
#endif

#endif
