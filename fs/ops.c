/* The one operation table the kernel's requests go through, built from OV_OPS (ov.h): each
 * handler runs with cancellation off, counted per opcode, and fenced when it changes the tree. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ov.h"

enum ov_op {
#define OV_ENUM(op, name, fenced, params, args) OV_OP_##op,
	OV_OPS(OV_ENUM)
#undef OV_ENUM
	    OV_OP_COUNT
};

static const char *const ov_op_names[OV_OP_COUNT] = {
#define OV_NAME(op, name, fenced, params, args) name,
    OV_OPS(OV_NAME)
#undef OV_NAME
};

struct ov_stats {
	_Atomic uint64_t count[OV_OP_COUNT];
	_Atomic uint64_t ns[OV_OP_COUNT];
	_Atomic uint64_t uring; /* requests that came over io_uring */
};

struct ov_clock {
	struct ov_stats *stats;
	struct timespec t0;
};

/* Read before the handler runs: it answers, and the answer frees req. */
static inline struct ov_clock ov_clock_start(fuse_req_t req)
{
	struct ov_clock c = {.stats = ov_of(req)->stats};

#ifdef HAVE_FUSE_URING
	if (c.stats && fuse_req_is_uring(req))
		atomic_fetch_add_explicit(&c.stats->uring, 1, memory_order_relaxed);
#endif
	clock_gettime(CLOCK_MONOTONIC, &c.t0);
	return c;
}

static inline void ov_clock_stop(const struct ov_clock *c, enum ov_op op)
{
	struct timespec t1;

	if (!c->stats)
		return;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	atomic_fetch_add_explicit(&c->stats->count[op], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(
	    &c->stats->ns[op],
	    (uint64_t)((t1.tv_sec - c->t0.tv_sec) * 1000000000LL + (t1.tv_nsec - c->t0.tv_nsec)),
	    memory_order_relaxed);
}

/* libfuse ends its io_uring threads with pthread_cancel (3.17, 3.18), and unlike its classic
 * workers it does not block cancellation while a request is served: a handler cancelled in
 * close() or write() would lose its open file, keep a lock or leave a journal write half
 * done. So every handler runs with cancellation off; the thread ends at its next wait. The
 * fence's condition is read before the handler runs, as is ov: the reply frees req. */
#define OV_SERVE(op, name, fenced, params, args)                                                   \
	static void ov_serve_##op params                                                           \
	{                                                                                          \
		struct cb_overlay *ov = ov_of(req);                                                \
		struct ov_clock c;                                                                 \
		int cancel, fence;                                                                 \
                                                                                                   \
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);                           \
		c = ov_clock_start(req);                                                           \
		fence = (fenced);                                                                  \
		if (fence)                                                                         \
			ov_fence_enter(ov);                                                        \
		ov_op_##op args;                                                                   \
		if (fence)                                                                         \
			ov_fence_leave(ov);                                                        \
		ov_clock_stop(&c, OV_OP_##op);                                                     \
		pthread_setcancelstate(cancel, NULL);                                              \
	}
OV_OPS(OV_SERVE)
#undef OV_SERVE

/* The table: INIT (mount.c) and every OV_OPS entry through its serving wrapper. */
static const struct fuse_lowlevel_ops ov_ops = {.init = ov_op_init,
#define OV_SLOT(op, name, fenced, params, args) .op = ov_serve_##op,
						OV_OPS(OV_SLOT)
#undef OV_SLOT
};

/* See ov.h. */
struct fuse_session *ov_session_new(struct fuse_args *args, struct cb_overlay *ov)
{
	return fuse_session_new(args, &ov_ops, sizeof(ov_ops), ov);
}

/* See ov.h. */
struct ov_stats *ov_stats_new(void)
{
	return calloc(1, sizeof(struct ov_stats));
}

/* See overlay.h. */
size_t cb_overlay_op_stats(struct cb_overlay *ov, struct cb_overlay_op_stat *out, size_t max)
{
	size_t i, n = 0;
	uint64_t count;

	if (!ov || !ov->stats)
		return 0;
	for (i = 0; i < OV_OP_COUNT && n < max; i++) {
		count = atomic_load(&ov->stats->count[i]);
		if (!count)
			continue;
		out[n].op = ov_op_names[i];
		out[n].count = count;
		out[n].ns = atomic_load(&ov->stats->ns[i]);
		n++;
	}
	return n;
}

/* See overlay.h. */
void cb_overlay_fs_info(struct cb_overlay *ov, struct cb_overlay_fs_info *out)
{
	uint64_t uring = ov && ov->stats ? atomic_load(&ov->stats->uring) : 0;

	out->libfuse = fuse_pkgversion();
	out->transport = uring ? "io_uring" : "/dev/fuse";
	out->uring_requests = uring;
	out->passthrough = ov ? atomic_load(&ov->passthrough) : 0;
	out->killpriv_v2 = ov ? atomic_load(&ov->killpriv_v2) : 0;
	out->writeback_cache = ov ? atomic_load(&ov->writeback) : 0;
}
