/* fs/ internals shared by the overlay's files: the mount state, the inode table, the layer
 * helpers (whiteouts, opaque dirs, copy-up) and the journal hooks. Not a public header.
 *
 * THE JOURNAL RULE. Every request that can change what the mount shows (the OV_CHANGES
 * operations of OV_OPS below, and an open for writing or truncating):
 *   1. runs inside the turn fence's shared side (fence.c), from before its first mark to
 *      after its reply; fs/ops.c enters and leaves it around the handler, so a handler
 *      never does. A turn advance takes the exclusive side: no change straddles two turns.
 *   2. marks every path whose bytes, metadata or existence it changes (ov_mark_child,
 *      ov_mark_inode; journal.c) before it changes anything the mount shows, holding tab.ns
 *      (either side) while it marks, so the paths marked are the inode's names at that
 *      moment; whatever changes a name later marks that name itself, under tab.ns write.
 *      Only a copy-up may come first (upper's copy shows the same bytes and metadata).
 *   3. makes no change when a mark fails, and answers the mark's error (ENOSPC, EDQUOT
 *      or EIO): a change that could not be recorded does not happen.
 * A mark is durable (cb_journal_mark) when it returns; a path already marked in this turn
 * costs an atomic compare (write_gen, meta_gen against gen). Outside a request only the
 * turn advance marks (req NULL, after the fence): files open for writing in passthrough
 * mode, whose writes never reach us.
 *
 * LOCKS, outermost first: fence (shared: a change in flight) > tab.ns (names and parents;
 * write to remove or move a name, read for everything else) > a listing lock or handles_lock >
 * an inode's lock (copy-up, open modes, size under quota) > tab.lock (the identity hash,
 * nlookup, refs, appending a name). A mark takes the journal's locks (db/journal.c) holding
 * tab.ns (and at most handles_lock), never an inode's lock or tab.lock. quota_lock and
 * carry_lock are leaves. In a checked build (util/lock.h) the locks know their holders, and
 * inode.c, journal.c and copyup.c assert what their callers must hold. */
#ifndef COWBOX_FS_OV_H
#define COWBOX_FS_OV_H

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cowbox/journal.h"
#include "cowbox/overlay.h"
#include "util/lock.h"

enum ov_layer {
	OV_UPPER = 0,
	OV_BASE = 1,
};

#define OV_OPAQUE_XATTR	  "trusted.overlay.opaque"
#define OV_PRIVATE_PREFIX "trusted.overlay."
#define OV_CAPS_XATTR	  "security.capability"
#define OV_TIMEOUT	  86400.0

struct ov_inode;
struct ov_listing;
/* ops_readdir.c: frees a directory's listings (its inode is going). */
void ov_listing_free(struct ov_listing *l);
#define OV_LISTING_LOCKS 64

/* One name of an inode: the directory it is in and its name there. An inode has one name
 * (directories, most files) or several (hard links); an unlinked, still-open inode has none. */
struct ov_name {
	struct ov_inode *parent;
	char *name;
	struct ov_name *next;
};

struct ov_inode {
	struct ov_inode *hnext; /* identity hash chain */
	struct ov_inode *all_prev, *all_next;
	uint64_t nlookup;  /* kernel references; under tab.lock */
	uint64_t refs;	   /* names of other inodes whose parent this is; under tab.lock */
	_Atomic int layer; /* where the bytes live now: OV_UPPER or OV_BASE */
	dev_t dev;	   /* identity in that layer (the hash key) */
	ino_t rino;
	ino_t st_ino; /* what stat reports: the origin's inode number, stable across copy-up */
	mode_t type;  /* S_IFMT bits */
	int merged;   /* directories: the base contributes entries here */
	int hashed;   /* in the identity hash (it still has a name) */
	int is_root;
	int keep_fd; /* O_PATH fd of an unlinked but referenced inode, else -1 */
	struct ov_name *names;
	_Atomic uint64_t write_gen; /* turn generation whose content change is journaled */
	_Atomic uint64_t meta_gen;  /* same for metadata changes */
	_Atomic int no_caps;	/* known to have no security.capability (asked on every write) */
	_Atomic unsigned nlink; /* upper regular files: links at the last lookup (more than 1:
				   the other names are looked for in the journal's link_names) */
	struct cb_mutex lock;	/* serializes copy-up and fd upgrades of this inode */
	/* The kernel lets an inode's opens be all passthrough (one backing file) or all cached:
	 * counted here under lock, so each open takes the mode the others allow. */
	int backing_id;		/* kernel backing file id while passthrough opens exist, else 0 */
	unsigned backing_opens; /* opens in passthrough mode */
	unsigned cached_opens;	/* opens in cached (page cache) mode */
	int quota_deferred;	/* unlinked while open: its bytes leave the quota when the
				   last reference (keep_fd) goes */
	struct ov_listing *listing; /* directories: the listings of passes being read
				       (ops_readdir.c), under the overlay's listing lock */
};

struct ov_table {
	struct cb_mutex lock; /* the identity hash, nlookup, refs, appending a name */
	struct cb_rwlock ns;  /* names and parents: read to build paths, write to change */
	struct ov_inode **buckets;
	size_t nbuckets;
	size_t count;
	struct ov_inode *all; /* every inode, hashed or not */
};

/* Open files and directories are on a list, so that unmount frees the ones the kernel never
 * released (an aborted connection). */
struct ov_handle {
	struct ov_handle *prev, *next;
	void (*free)(struct ov_handle *h);
};

struct cb_overlay {
	_Atomic long long space_checked_ms; /* when ov_space_low last asked statfs */
	_Atomic int space_low;
	int upper_fd; /* O_PATH|O_DIRECTORY roots of the layers; base_fd -1 if none */
	int base_fd;
	dev_t base_dev; /* the base root's device: a base listing's entries are (base_dev, d_ino) */
	struct ov_inode *root;
	struct ov_table tab;
	mode_t umask; /* the process umask, so created files get their exact mode */
	_Atomic unsigned long id_base; /* see cb_overlay_config; 0: no translation */
	int owner_squash;	       /* cb_overlay_config.owner_squash: the ids below */
	uid_t owner_uid;	       /* the upper directory's owner, as the sandbox's root */
	gid_t owner_gid;
	_Atomic uint64_t gen;	/* turn generation; starts at 1 */
	struct cb_rwlock fence; /* shared: a change in flight; exclusive: a turn advance */
	long stall_us;		/* tests: hold each change this long after its mark */
	_Atomic int advancing;	/* a turn advance waits for the fence */
	pthread_mutex_t carry_lock;
	struct cb_change *carry; /* marks of changes in flight at the advance */
	size_t ncarry, capcarry;
	struct cb_db *db;
	struct fuse_session *se;
	char *mountpoint;
	unsigned max_threads;
	_Atomic int mounted; /* cleared by cb_overlay_unmount from another thread */
	dev_t under_dev;     /* the mount point's device before we mounted over it */
	int debug;
	pthread_t run_thread;
	_Atomic int running;
	struct ov_handle *handles;
	pthread_mutex_t handles_lock;
	/* a directory's listings (ov_inode.listing): one of these, by the inode's address */
	pthread_mutex_t listing_locks[OV_LISTING_LOCKS];
	_Atomic int no_opendir;	 /* the kernel opens directories itself (OPENDIR answered ENOSYS) */
	int want_passthrough;	 /* not turned off by COWBOX_FUSE_PASSTHROUGH=0 */
	int want_uring;		 /* not turned off by COWBOX_FUSE_URING=0, and the kernel allows */
	int want_no_opendir;	 /* not turned off by COWBOX_FUSE_NO_OPENDIR=0 */
	int layers_stacked;	 /* upper or base is on overlayfs */
	_Atomic int passthrough; /* the kernel granted passthrough at init */
	_Atomic int killpriv_v2; /* the kernel granted FUSE_HANDLE_KILLPRIV_V2 */
	_Atomic int writeback;	 /* the writeback cache is on (not with passthrough) */
	struct ov_stats *stats;	 /* request counters (ops.c); NULL counts nothing */
	/* the upper layer's quota (quota.c): limits (0: none) and what upper/ holds */
	_Atomic unsigned long long quota_bytes, quota_inodes;
	_Atomic int quota_on; /* counting (some limit is set) */
	pthread_mutex_t quota_lock;
	unsigned long long used_bytes, used_inodes; /* under quota_lock */
	/* a rollback is giving paths back to the base (revert.c): entries answered meanwhile
	 * are not cached by the kernel (timeout 0), so that one a request races in with the
	 * old state is looked up again at its next use */
	_Atomic int reverting;
	/* the upper filesystem's largest file size (probed when the quota starts counting):
	 * a resize past it is EFBIG, as the filesystem says, never the quota's ENOSPC */
	long long upper_max_size;
};

/* An open file: the fd and the layer it was opened in (a read-only base fd is reopened in
 * upper when the inode is copied up meanwhile). */
struct ov_file {
	struct ov_handle h; /* first: a file is its handle */
	int fd;
	_Atomic int layer;
	int flags;
	int mode; /* OV_OPEN_BACKING or OV_OPEN_CACHED: which of the inode's counts it holds */
	struct ov_inode *inode;
	struct cb_overlay *overlay;
};

void ov_handle_add(struct cb_overlay *ov, struct ov_handle *h, void (*fn)(struct ov_handle *));
void ov_handle_del(struct cb_overlay *ov, struct ov_handle *h);
void ov_file_free(struct ov_handle *h);

enum { OV_OPEN_CACHED = 1, OV_OPEN_BACKING = 2 };
#ifdef HAVE_FUSE_KILLPRIV_V2
#define OV_KILL_SUIDGID(fi) ((fi)->kill_suidgid)
#else
#define OV_KILL_SUIDGID(fi) 0
#endif
/* ops_file.c: chooses passthrough or cached mode for a new open of f (fd set, in upper or
 * base) and fills fi; ov_file_drop gives the mode back (release, failed reply). */
void ov_file_choose_mode(fuse_req_t req, struct ov_file *f, struct fuse_file_info *fi);
void ov_file_drop_mode(fuse_req_t req, struct ov_file *f);
int ov_file_writable(const struct ov_file *f);

/* inode.c: the table. Each function asserts the locks its comment names (util/lock.h). */
int ov_table_init(struct ov_table *t);
struct ov_inode *ov_table_find(struct ov_table *t, dev_t dev, ino_t rino);
void ov_table_insert(struct ov_table *t, struct ov_inode *in);
void ov_table_remove(struct ov_table *t, struct ov_inode *in);
struct ov_inode *ov_inode_new(int layer, const struct stat *st);
int ov_inode_add_name(struct ov_table *t, struct ov_inode *in, struct ov_inode *parent,
		      const char *name);
int ov_inode_has_name(struct ov_table *t, const struct ov_inode *in, const struct ov_inode *parent,
		      const char *name);
int ov_inode_drop_name(struct ov_table *t, struct ov_inode *in, const struct ov_inode *parent,
		       const char *name);
int ov_inode_rename_name(struct ov_table *t, struct ov_inode *in, struct ov_inode *oldparent,
			 const char *oldname, struct ov_inode *newparent, const char *newname);
int ov_path(struct ov_table *t, const struct ov_inode *in, const char *child, char **out);
int ov_path_of_name(struct ov_table *t, const struct ov_name *n, char **out);
void ov_inode_release(struct ov_table *t, struct ov_inode *in);
void ov_table_free_all(struct ov_table *t);
void ov_table_track(struct ov_table *t, struct ov_inode *in);

/* at.c: layer-relative paths of any length (paths are heap strings: a tree can be deeper
 * than PATH_MAX). ov_near gives a directory fd to use with *rest in place of rootfd with
 * path: rootfd itself when path is short, else an O_PATH fd of a directory near its end;
 * -1 with errno. ov_near_put gives it back (errno kept). */
int ov_near(int rootfd, const char *path, const char **rest);
void ov_near_put(int rootfd, int fd);
/* The *at() calls of fs/ for any path length: results and errno as libc's. */
int ov_fstatat(int rootfd, const char *path, struct stat *st, int flags);
int ov_openat(int rootfd, const char *path, int flags, mode_t mode);
int ov_unlinkat(int rootfd, const char *path, int flags);
int ov_mkdirat(int rootfd, const char *path, mode_t mode);
int ov_mknodat(int rootfd, const char *path, mode_t mode, dev_t dev);
int ov_symlinkat(const char *target, int rootfd, const char *path);
ssize_t ov_readlinkat(int rootfd, const char *path, char *buf, size_t size);
int ov_fchownat(int rootfd, const char *path, uid_t uid, gid_t gid, int flags);
int ov_fchmodat(int rootfd, const char *path, mode_t mode, int flags);
int ov_utimensat(int rootfd, const char *path, const struct timespec ts[2], int flags);
int ov_linkat(int oldroot, const char *oldpath, int newroot, const char *newpath, int flags);
int ov_renameat(int rootfd, const char *oldpath, const char *newpath, unsigned flags);
/* A "/proc/self/fd/N/rest" name of path beneath rootfd for the path-only calls (xattrs):
 * *out malloc'd, *held an fd to close with it (-1: none); 0 or -errno. */
int ov_proc_path(int rootfd, const char *path, char **out, int *held);
void ov_proc_path_free(char *path, int held);

/* layer.c: whiteouts, opaque directories, existence in a layer. */
int ov_is_whiteout(const struct stat *st);

/* Whether a node of this mode and device number would be a whiteout (a 0/0 character
 * device): the upper layer cannot hold one as a real entry. */
int ov_node_is_whiteout(mode_t mode, dev_t rdev);
int ov_lstat(int rootfd, const char *path, struct stat *st);
int ov_is_opaque(int rootfd, const char *path);
int ov_set_opaque(int rootfd, const char *path);
int ov_make_whiteout(int rootfd, const char *path);
int ov_whiteout_replace(int rootfd, const char *path);
int ov_clear_whiteouts(int rootfd, const char *path);
int ov_name_is_private(const char *xattr_name);
const char *ov_base_name(const char *path);

/* ids.c: the sandbox's id range (cb_overlay_config.id_base). */
uid_t ov_id_store(const struct cb_overlay *ov, uid_t id);
/* The host ids a new owner (a creation's caller, a chown) is stored as: ov_id_store, and with
 * owner_squash the sandbox's root becomes the upper directory's owner. */
uid_t ov_uid_disk(const struct cb_overlay *ov, uid_t id);
gid_t ov_gid_disk(const struct cb_overlay *ov, gid_t id);
void ov_ids_present(const struct cb_overlay *ov, struct stat *st);
mode_t ov_mode_allowed(const struct cb_overlay *ov, mode_t mode, uid_t uid, gid_t gid);
int ov_acl_xattr(const char *name);
int ov_acl_shift(const struct cb_overlay *ov, void *value, size_t size, int refuse);

/* copyup.c */
int ov_copy_up(struct cb_overlay *ov, struct ov_inode *in, int with_data);
/* ov_copy_up, and when this call copied a regular file up, *fdp is the new upper file's
 * O_RDWR|O_CLOEXEC fd (the caller's to close), else -1: an open for writing needs no second
 * path walk. */
int ov_copy_up_open(struct cb_overlay *ov, struct ov_inode *in, int with_data, int *fdp);
int ov_copy_up_tree(struct cb_overlay *ov, struct ov_inode *dir);
int ov_ensure_upper_dir(struct cb_overlay *ov, struct ov_inode *dir);

/* quota.c: the upper layer's quota. What an entry costs: 4 KiB per non-regular entry, the
 * apparent size rounded up to 4 KiB for a regular file. */
unsigned long long ov_quota_cost(mode_t mode, off_t size);

/* What the extended attributes of the file at path (a /proc/self/fd path, not followed) cost
 * the quota: the bytes of every name and value but the overlay's own. */
unsigned long long ov_quota_xattr_cost(const char *path);
/* What the xattrs of upper/'s entry at path (st its lstat) give back when that entry goes
 * (read before it goes; 0 when another name keeps them): for ov_quota_give after. */
long long ov_quota_xattr_gone(struct cb_overlay *ov, const char *path, const struct stat *st);
/* What the xattrs of base/'s entry at path (st its lstat) will cost once a copy-up copied
 * them into upper/ (as the mount's walk of upper/ counts them): 0 with no quota on. */
long long ov_quota_xattr_copied(struct cb_overlay *ov, const char *path, const struct stat *st);
/* Reserve bytes and inodes before a change: -ENOSPC past a limit (nothing taken). */
int ov_quota_take(struct cb_overlay *ov, long long bytes, long long inodes);
/* Give them back (a change that failed, or a removal). Never fails. */
void ov_quota_give(struct cb_overlay *ov, long long bytes, long long inodes);
/* An entry with this stat left upper/ (its last name: hard links count once). */
void ov_quota_gone(struct cb_overlay *ov, const struct stat *st);
/* A change of size of the open file fd of in up to new_end (write, truncate, fallocate,
 * copy_file_range): begin takes in->lock and reserves the growth (-ENOSPC), end counts what
 * the file became and unlocks. No-op without a byte quota. */
struct ov_quota_resize {
	struct ov_inode *in; /* NULL: nothing to end */
	int fd;
	unsigned long long before;
	long long taken;
};
int ov_quota_resize_begin(struct cb_overlay *ov, struct ov_inode *in, int fd, off_t new_end,
			  struct ov_quota_resize *q);
void ov_quota_resize_end(struct cb_overlay *ov, struct ov_quota_resize *q);
/* 1 when less than max(64 MiB, 2% of the byte quota) is left. */
int ov_quota_low(struct cb_overlay *ov);

/* ops_dir.c and rename.c */
int ov_open_flags(int flags);
/* 1 when the upper layer's filesystem is nearly full (less than 256 MiB or 1/16 of it free)
 * or its quota nearly used (ov_quota_low): a file opened for writing then bypasses the
 * writeback cache (direct_io), so that write(2) itself reports ENOSPC instead of a later
 * fsync or close. The disk is looked at at most every 100 ms. */
int ov_space_low(struct cb_overlay *ov);
void ov_locate(struct cb_overlay *ov, struct ov_inode *parent, const char *path, int *in_upper,
	       struct stat *ust, int *in_base, struct stat *bst);
int ov_dir_empty(struct cb_overlay *ov, const char *path, int in_upper, int merged);
struct ov_inode *ov_known(struct cb_overlay *ov, int in_upper, const struct stat *ust,
			  const struct stat *bst);
void ov_name_gone(struct cb_overlay *ov, struct ov_inode *in, struct ov_inode *parent,
		  const char *name, int keep_fd);
int ov_keep_fd_for(struct cb_overlay *ov, struct ov_inode *in, const char *path);
void ov_upper_name_gone(struct cb_overlay *ov, struct ov_inode *in, const struct stat *ust,
			int keep_fd);
int ov_rename_locked(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *parent,
		     const char *name, struct ov_inode *newparent, const char *newname,
		     unsigned flags);

/* journal.c */
int ov_mark_path(struct cb_overlay *ov, fuse_req_t req, const char *path, enum cb_change_kind kind,
		 int subtree);
int ov_mark_inode(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *in,
		  enum cb_change_kind kind);
int ov_mark_child(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *parent, const char *name,
		  enum cb_change_kind kind, int subtree);
void ov_journal_sync(struct cb_overlay *ov);
void ov_mark_open_writers(struct cb_overlay *ov);

/* fence.c: the turn fence around every changing operation (see cb_overlay_turn_advance). */
void ov_fence_setup(struct cb_overlay *ov);
/* The shared side, around one changing request (ops.c only): leave keeps or drops the
 * request's marks (ov_marks_leave) and unlocks. */
void ov_fence_enter(struct cb_overlay *ov);
void ov_fence_leave(struct cb_overlay *ov);
/* Sleeps COWBOX_TEST_FS_STALL_US (0 outside tests) between a change's mark and the change. */
void ov_fence_stall(struct cb_overlay *ov);
/* journal.c: the marks of the current operation leave the fence with it: kept for the next
 * turn when carry is set (an advance waited for this operation), else dropped. */
void ov_marks_leave(struct cb_overlay *ov, int carry);
/* Journal the kept marks in the (new) open turn. */
void ov_marks_carry(struct cb_overlay *ov);

/* ops_*.c: helpers the handlers share. */
struct ov_inode *ov_inode_get(struct cb_overlay *ov, fuse_ino_t ino);
int ov_lookup_child(struct cb_overlay *ov, struct ov_inode *parent, const char *name,
		    struct fuse_entry_param *e);
/* ov_lookup_child's second half, for a name whose stat st (raw, from layer) the caller has
 * (a creation): its inode, found or made, with one more kernel reference in e; st is turned
 * into what the mount shows. 0 or -ENOMEM. Caller holds ns read. */
int ov_child_found(struct cb_overlay *ov, struct ov_inode *parent, const char *name,
		   struct stat *st, int layer, int merged, struct fuse_entry_param *e);
void ov_forget_one(struct cb_overlay *ov, struct ov_inode *in, uint64_t n);
int ov_stat_inode(struct cb_overlay *ov, struct ov_inode *in, struct stat *st);
int ov_layer_fd(struct cb_overlay *ov, int layer);

/* Every FUSE operation the overlay serves, once: its field of struct fuse_lowlevel_ops (the
 * handler is ov_op_FIELD, in ops_*.c: never a plain ov_open or ov_read, libvorbisfile's names,
 * in a link that may hold both), its opcode's name (cb_overlay_op_stats), whether it runs
 * inside the turn fence (OV_READS: never; OV_CHANGES: always; an expression: when true), and
 * its parameters. fs/ops.c builds the one table the kernel's requests go through from this
 * list. An operation missing here is one libfuse answers ENOSYS for, and the kernel then stops
 * asking (FLUSH: nothing to do on close(2); the kernel keeps posix locks itself and writes
 * dirty pages before it asks). Adding one: docs/hacking.md. */
/* clang-format off */
#define OV_READS   0
#define OV_CHANGES 1
#define OV_OPS(X)                                                                                  \
	X(lookup, "LOOKUP", OV_READS, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))  \
	X(forget, "FORGET", OV_READS, (fuse_req_t req, fuse_ino_t i, uint64_t n), (req, i, n))     \
	X(forget_multi, "BATCH_FORGET", OV_READS,                                                  \
	  (fuse_req_t req, size_t n, struct fuse_forget_data *f), (req, n, f))                     \
	X(getattr, "GETATTR", OV_READS,                                                            \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))                 \
	X(setattr, "SETATTR", OV_CHANGES,                                                          \
	  (fuse_req_t req, fuse_ino_t i, struct stat *a, int s, struct fuse_file_info *fi),        \
	  (req, i, a, s, fi))                                                                      \
	X(readlink, "READLINK", OV_READS, (fuse_req_t req, fuse_ino_t i), (req, i))                \
	X(mknod, "MKNOD", OV_CHANGES,                                                              \
	  (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, dev_t d), (req, p, n, m, d))     \
	X(mkdir, "MKDIR", OV_CHANGES, (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m),     \
	  (req, p, n, m))                                                                          \
	X(unlink, "UNLINK", OV_CHANGES, (fuse_req_t req, fuse_ino_t p, const char *n),             \
	  (req, p, n))                                                                             \
	X(rmdir, "RMDIR", OV_CHANGES, (fuse_req_t req, fuse_ino_t p, const char *n), (req, p, n))  \
	X(symlink, "SYMLINK", OV_CHANGES,                                                          \
	  (fuse_req_t req, const char *l, fuse_ino_t p, const char *n), (req, l, p, n))            \
	X(rename, "RENAME", OV_CHANGES,                                                            \
	  (fuse_req_t req, fuse_ino_t p, const char *n, fuse_ino_t np, const char *nn,             \
	   unsigned int f),                                                                        \
	  (req, p, n, np, nn, f))                                                                  \
	X(link, "LINK", OV_CHANGES, (fuse_req_t req, fuse_ino_t i, fuse_ino_t np, const char *nn), \
	  (req, i, np, nn))                                                                        \
	X(open, "OPEN", ov_open_changes(fi),                                                       \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))                 \
	X(read, "READ", OV_READS,                                                                  \
	  (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),            \
	  (req, i, s, o, fi))                                                                      \
	X(write_buf, "WRITE", OV_CHANGES,                                                          \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_bufvec *b, off_t o,                           \
	   struct fuse_file_info *fi),                                                             \
	  (req, i, b, o, fi))                                                                      \
	X(release, "RELEASE", OV_READS,                                                            \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))                 \
	X(fsync, "FSYNC", OV_READS,                                                                \
	  (fuse_req_t req, fuse_ino_t i, int d, struct fuse_file_info *fi), (req, i, d, fi))       \
	X(opendir, "OPENDIR", OV_READS,                                                            \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))                 \
	X(readdir, "READDIR", OV_READS,                                                            \
	  (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),            \
	  (req, i, s, o, fi))                                                                      \
	X(readdirplus, "READDIRPLUS", OV_READS,                                                    \
	  (fuse_req_t req, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),            \
	  (req, i, s, o, fi))                                                                      \
	X(releasedir, "RELEASEDIR", OV_READS,                                                      \
	  (fuse_req_t req, fuse_ino_t i, struct fuse_file_info *fi), (req, i, fi))                 \
	X(fsyncdir, "FSYNCDIR", OV_READS,                                                          \
	  (fuse_req_t req, fuse_ino_t i, int d, struct fuse_file_info *fi), (req, i, d, fi))       \
	X(statfs, "STATFS", OV_READS, (fuse_req_t req, fuse_ino_t i), (req, i))                    \
	X(setxattr, "SETXATTR", OV_CHANGES,                                                        \
	  (fuse_req_t req, fuse_ino_t i, const char *n, const char *v, size_t s, int f),           \
	  (req, i, n, v, s, f))                                                                    \
	X(getxattr, "GETXATTR", OV_READS, (fuse_req_t req, fuse_ino_t i, const char *n, size_t s), \
	  (req, i, n, s))                                                                          \
	X(listxattr, "LISTXATTR", OV_READS, (fuse_req_t req, fuse_ino_t i, size_t s), (req, i, s)) \
	X(removexattr, "REMOVEXATTR", OV_CHANGES, (fuse_req_t req, fuse_ino_t i, const char *n),   \
	  (req, i, n))                                                                             \
	X(create, "CREATE", OV_CHANGES,                                                            \
	  (fuse_req_t req, fuse_ino_t p, const char *n, mode_t m, struct fuse_file_info *fi),      \
	  (req, p, n, m, fi))                                                                      \
	X(fallocate, "FALLOCATE", OV_CHANGES,                                                      \
	  (fuse_req_t req, fuse_ino_t i, int m, off_t o, off_t l, struct fuse_file_info *fi),      \
	  (req, i, m, o, l, fi))                                                                   \
	X(copy_file_range, "COPY_FILE_RANGE", OV_CHANGES,                                          \
	  (fuse_req_t req, fuse_ino_t ii, off_t oi, struct fuse_file_info *fii, fuse_ino_t io,     \
	   off_t oo, struct fuse_file_info *fio, size_t l, int f),                                 \
	  (req, ii, oi, fii, io, oo, fio, l, f))                                                   \
	X(lseek, "LSEEK", OV_READS,                                                                \
	  (fuse_req_t req, fuse_ino_t i, off_t o, int w, struct fuse_file_info *fi),               \
	  (req, i, o, w, fi))
/* clang-format on */

/* The handlers, one per OV_OPS entry: each answers its request exactly once. Only the table
 * of ops.c calls them (with thread cancellation off, counted, fenced as the list says). */
#define OV_HANDLER_DECL(op, name, fenced, params, args) void ov_op_##op params;
OV_OPS(OV_HANDLER_DECL)
#undef OV_HANDLER_DECL

/* Only an open for writing or truncating changes anything (copy-up, truncation): a read-only
 * open of a large base file never holds up a turn advance. */
static inline int ov_open_changes(const struct fuse_file_info *fi)
{
	return (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
}

/* ops.c: the FUSE session of ov over the one operation table (NULL: see libfuse's stderr). */
struct fuse_session *ov_session_new(struct fuse_args *args, struct cb_overlay *ov);
/* ops.c: the request counters of a new mount; NULL (nothing counted) when out of memory. */
struct ov_stats;
struct ov_stats *ov_stats_new(void);
/* mount.c: INIT, the kernel's offer of capabilities and ours of what we want. */
void ov_op_init(void *userdata, struct fuse_conn_info *conn);

/* How long the kernel may keep an entry or its attributes: a day (we are the tree's only
 * writer), none while a rollback changes the tree behind the kernel's back (revert.c). */
static inline double ov_entry_timeout(struct cb_overlay *ov)
{
	return atomic_load(&ov->reverting) ? 0.0 : OV_TIMEOUT;
}

static inline struct cb_overlay *ov_of(fuse_req_t req)
{
	return (struct cb_overlay *)fuse_req_userdata(req);
}

#endif
