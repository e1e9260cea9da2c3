/* Where the overlay's time goes: per FUSE opcode, how many requests the daemon served and how
 * long it spent on them, and how many came over io_uring. Wraps the operation table. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "ov.h"

#define OV_STAT_OPS(X)                                                                             \
	X(lookup, "LOOKUP")                                                                        \
	X(forget, "FORGET")                                                                        \
	X(forget_multi, "BATCH_FORGET")                                                            \
	X(getattr, "GETATTR")                                                                      \
	X(setattr, "SETATTR")                                                                      \
	X(readlink, "READLINK")                                                                    \
	X(mknod, "MKNOD")                                                                          \
	X(mkdir, "MKDIR")                                                                          \
	X(unlink, "UNLINK")                                                                        \
	X(rmdir, "RMDIR")                                                                          \
	X(symlink, "SYMLINK")                                                                      \
	X(rename, "RENAME")                                                                        \
	X(link, "LINK")                                                                            \
	X(open, "OPEN")                                                                            \
	X(read, "READ")                                                                            \
	X(write_buf, "WRITE")                                                                      \
	X(release, "RELEASE")                                                                      \
	X(fsync, "FSYNC")                                                                          \
	X(opendir, "OPENDIR")                                                                      \
	X(readdir, "READDIR")                                                                      \
	X(readdirplus, "READDIRPLUS")                                                              \
	X(releasedir, "RELEASEDIR")                                                                \
	X(fsyncdir, "FSYNCDIR")                                                                    \
	X(statfs, "STATFS")                                                                        \
	X(setxattr, "SETXATTR")                                                                    \
	X(getxattr, "GETXATTR")                                                                    \
	X(listxattr, "LISTXATTR")                                                                  \
	X(removexattr, "REMOVEXATTR")                                                              \
	X(create, "CREATE")                                                                        \
	X(fallocate, "FALLOCATE")                                                                  \
	X(copy_file_range, "COPY_FILE_RANGE")                                                      \
	X(lseek, "LSEEK")

enum ov_op {
#define OV_ENUM(op, name) OV_OP_##op,
	OV_STAT_OPS(OV_ENUM)
#undef OV_ENUM
	    OV_OP_COUNT
};

static const char *const ov_op_names[OV_OP_COUNT] = {
#define OV_NAME(op, name) name,
    OV_STAT_OPS(OV_NAME)
#undef OV_NAME
};

struct ov_stats {
	_Atomic uint64_t count[OV_OP_COUNT];
	_Atomic uint64_t ns[OV_OP_COUNT];
	_Atomic uint64_t uring; /* requests that came over io_uring */
};

/* The real handlers, called by the counting ones; filled once, like the table itself. */
static struct fuse_lowlevel_ops ov_real;

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
 * done. So every handler runs with cancellation off; the thread ends at its next wait. */
#define OV_WRAP(op, params, args)                                                                  \
	static void ov_count_##op params                                                           \
	{                                                                                          \
		struct ov_clock c;                                                                 \
		int cancel;                                                                        \
                                                                                                   \
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);                           \
		c = ov_clock_start(req);                                                           \
		ov_real.op args;                                                                   \
		ov_clock_stop(&c, OV_OP_##op);                                                     \
		pthread_setcancelstate(cancel, NULL);                                              \
	}

OV_WRAP(lookup, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
OV_WRAP(forget, (fuse_req_t req, fuse_ino_t i, uint64_t n), (req, i, n))
OV_WRAP(forget_multi, (fuse_req_t req, size_t n, struct fuse_forget_data *f), (req, n, f))
OV_WRAP(getattr, (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))
OV_WRAP(setattr, (fuse_req_t req, fuse_ino_t i, struct stat *a, int s, struct fuse_file_info *fi),
	(req, i, a, s, fi))
OV_WRAP(readlink, (fuse_req_t req, fuse_ino_t i), (req, i))
OV_WRAP(mknod, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d), (req, p, n, m, d))
OV_WRAP(mkdir, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m), (req, p, n, m))
OV_WRAP(unlink, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
OV_WRAP(rmdir, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))
OV_WRAP(symlink, (fuse_req_t req, const char *l, fuse_ino_t p, const char *n), (req, l, p, n))
OV_WRAP(rename,
	(fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np, const char *nn,
	 unsigned int f),
	(req, p, n, np, nn, f))
OV_WRAP(link, (fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn), (req, i, np, nn))
OV_WRAP(open, (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))
OV_WRAP(read, (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
	(req, i, s, o, fi))
OV_WRAP(write_buf,
	(fuse_req_t req, fuse_ino_t i, struct fuse_bufvec *b, off_t o, struct fuse_file_info *fi),
	(req, i, b, o, fi))
OV_WRAP(release, (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))
OV_WRAP(fsync, (fuse_req_t req, fuse_ino_t i, int d, struct fuse_file_info *fi), (req, i, d, fi))
OV_WRAP(opendir, (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))
OV_WRAP(readdir, (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
	(req, i, s, o, fi))
OV_WRAP(readdirplus, (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
	(req, i, s, o, fi))
OV_WRAP(releasedir, (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))
OV_WRAP(fsyncdir, (fuse_req_t req, fuse_ino_t i, int d, struct fuse_file_info *fi), (req, i, d, fi))
OV_WRAP(statfs, (fuse_req_t req, fuse_ino_t i), (req, i))
OV_WRAP(setxattr, (fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s, int f),
	(req, i, n, v, s, f))
OV_WRAP(getxattr, (fuse_req_t req, fuse_ino_t i, const char *n, size_t s), (req, i, n, s))
OV_WRAP(listxattr, (fuse_req_t req, fuse_ino_t i, size_t s), (req, i, s))
OV_WRAP(removexattr, (fuse_req_t req, fuse_ino_t i, const char *n), (req, i, n))
OV_WRAP(create, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, struct fuse_file_info *fi),
	(req, p, n, m, fi))
OV_WRAP(fallocate,
	(fuse_req_t req, fuse_ino_t i, int m, off_t o, off_t l, struct fuse_file_info *fi),
	(req, i, m, o, l, fi))
OV_WRAP(copy_file_range,
	(fuse_req_t req, fuse_ino_t ii, off_t oi, struct fuse_file_info *fii, fuse_ino_t io,
	 off_t oo, struct fuse_file_info *fio, size_t l, int f),
	(req, ii, oi, fii, io, oo, fio, l, f))
OV_WRAP(lseek, (fuse_req_t req, fuse_ino_t i, off_t o, int w, struct fuse_file_info *fi),
	(req, i, o, w, fi))

/* Routes every handler of ops through its counting twin (missing ones stay missing, so
 * libfuse still answers ENOSYS for them and the kernel stops asking). */
void ov_stats_wrap(struct fuse_lowlevel_ops *ops)
{
	ov_real = *ops;
#define OV_SWAP(op, name)                                                                          \
	if (ops->op)                                                                               \
		ops->op = ov_count_##op;
	OV_STAT_OPS(OV_SWAP)
#undef OV_SWAP
}

/* The counters of a new mount; NULL (nothing counted) when out of memory. */
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
