/* Paths beneath a root directory fd, for code that runs as root over trees the sandbox can
 * change: no component is ever a symlink, ".." or absolute, and nothing blocks on a FIFO.
 *
 * Private to libcowbox (not under include/cowbox/): it is how the library keeps its own
 * promise that workspace paths stay inside the workspace, not a service for embedders, and
 * its policy arguments are expected to grow with the sandbox's user namespace.
 *
 * The rule, for every function here: path is relative to root (refused: empty, absolute,
 * any ".." component or a component longer than NAME_MAX; a path longer than PATH_MAX is
 * resolved in pieces, as a tree can be deeper than one syscall's path); every
 * directory on the way is reached with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS), and the last component is acted on through an O_PATH fd of its
 * directory with the *at() call's no-follow form, so a symlink anywhere (planted or swapped
 * in meanwhile) is never followed. Names that merely contain ".." ("build..old") are legal.
 * Each function returns 0 (or an fd, or a count) or -errno with a message naming the path
 * (cb_error_set). A symlink on the way gives -ELOOP, a way out of root -EXDEV, a refused path
 * -EXDEV/-EINVAL/-ENAMETOOLONG, and a FIFO, socket or device where a file is wanted -EINVAL. */
#ifndef COWBOX_UTIL_BENEATH_H
#define COWBOX_UTIL_BENEATH_H

#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

/* Whose files may keep S_ISUID (uid in first..first+count-1) and S_ISGID (gid in the same
 * range): the sandbox's own ids. count 0 (or a NULL pointer): nobody's; the bits are always
 * stripped. The daemon passes the workspace's user-namespace range where it has one. */
struct cb_beneath_setid {
	uid_t first;
	uid_t count;
};

/* 0 if path obeys the rule above, else -EINVAL (empty), -EXDEV (absolute or ".."),
 * -ENAMETOOLONG, with a message naming it. "." alone names root itself. */
int cb_beneath_check(const char *path);

/* Open root/path. O_PATH: as asked (the entry itself, even a FIFO). Otherwise the result is a
 * regular file, or a directory when O_DIRECTORY is given; anything else is refused before a
 * blocking open could happen (checked on an O_PATH fd, then opened O_NONBLOCK and checked
 * again; O_NONBLOCK is cleared after unless the caller asked for it). O_CREAT makes the last
 * component (no setuid/setgid bits in mode). O_CLOEXEC always. Returns the fd. */
int cb_beneath_open(int root, const char *path, int flags, mode_t mode);

/* The directory holding path, as an O_PATH fd, and in *name path's last component (pointing
 * into path; a last component of "." or a trailing "/" is refused). */
int cb_beneath_parent(int root, const char *path, const char **name);

/* lstat of path (a symlink is reported, not followed). "." is root itself. */
int cb_beneath_stat(int root, const char *path, struct stat *st);

/* mkdir of path (setuid/setgid bits dropped from mode); an existing entry is -EEXIST. */
int cb_beneath_mkdir(int root, const char *path, mode_t mode);

/* mkdir -p: path and each missing parent with mode; existing directories are fine, an
 * existing non-directory (or symlink) on the way is an error. */
int cb_beneath_mkdirs(int root, const char *path, mode_t mode);

/* mknod of path (setuid/setgid bits dropped). */
int cb_beneath_mknod(int root, const char *path, mode_t mode, dev_t dev);

/* A symlink at path holding target (any text: it is stored, never followed here). */
int cb_beneath_symlink(int root, const char *target, const char *path);

/* The target of the symlink at path, NUL-terminated, truncated to size - 1 bytes; returns
 * its length. Not a symlink: -EINVAL. */
int cb_beneath_readlink(int root, const char *path, char *buf, size_t size);

/* chmod of path itself: a symlink there is refused (-ELOOP), never followed, also on kernels
 * without fchmodat2 (the inode is pinned by an O_PATH fd, checked, and changed through that
 * fd). S_ISUID/S_ISGID are kept only for owners inside setid (see above). */
int cb_beneath_chmod(int root, const char *path, mode_t mode, const struct cb_beneath_setid *setid);

/* fchmod of an open (non-O_PATH) fd under the same setid policy; path is for the message. */
int cb_beneath_fchmod(int fd, const char *path, mode_t mode, const struct cb_beneath_setid *setid);

/* lchown of path (a symlink's own owner; -1 keeps one). */
int cb_beneath_chown(int root, const char *path, uid_t uid, gid_t gid);

/* utimensat of path itself (a symlink's own times). */
int cb_beneath_utimens(int root, const char *path, const struct timespec ts[2]);

/* renameat2 of from to to, both beneath root; flags as renameat2 (RENAME_NOREPLACE,
 * RENAME_EXCHANGE, ...). */
int cb_beneath_rename(int root, const char *from, const char *to, unsigned flags);

/* Sets the message for op on path failing with err (in words for ELOOP, a symlink on the
 * way, and EXDEV, leaving the root) and returns -err: the module's files share it. */
int cb_beneath_fail(const char *op, const char *path, int err);

/* unlinkat of path (AT_REMOVEDIR in flags for a directory). */
int cb_beneath_unlink(int root, const char *path, int flags);

/* rm -rf of path: gone already is fine; a symlink is removed, never followed, at any depth;
 * other mounts below it are not entered (their mount point cannot be removed: -EBUSY). */
int cb_beneath_remove_tree(int root, const char *path);

/* For a path of max bytes or more (longer than one syscall takes: a tree can be deeper than
 * PATH_MAX): walks it in pieces of under max bytes, each a directory opened by open_dir
 * (an fd or -errno) beneath the last, and returns the last one's fd (the caller closes it)
 * with what is left of path, under max bytes, in *rest. -errno (-ENAMETOOLONG for a name
 * of max bytes) on failure. The resolve rules are open_dir's. */
int cb_beneath_near(int root, const char *path, size_t max,
		    int (*open_dir)(int dirfd, const char *piece), const char **rest);

/* Calls visit for every entry below the directory fd root (not root itself), a directory
 * before what it holds, at any depth: no symlink is followed and no other mount entered
 * (nftw cannot: it works on whole paths, which a deep tree makes longer than PATH_MAX).
 * dirfd is the entry's directory (for *at() calls with AT_SYMLINK_NOFOLLOW on name), path
 * its path from root, st its lstat. visit returns 0 to go on, or a negative errno to stop;
 * that (or the walk's own -errno with a message) is the result. */
int cb_beneath_walk(int root,
		    int (*visit)(int dirfd, const char *name, const char *path,
				 const struct stat *st, void *arg),
		    void *arg);

/* Read regular file path from offset off: up to max bytes (until end of file), into a
 * malloc'd buffer NUL-terminated one past *n (free() it); *size is the file's size when it was
 * opened. A FIFO, device, socket or directory is refused at once, never waited on. */
int cb_beneath_read_file(int root, const char *path, off_t off, size_t max, void **data, size_t *n,
			 off_t *size);

/* Write len bytes of data at off in regular file path, making it (with mode, 0644 if 0) and
 * its missing parent directories (0755); truncate: cut it to empty first. Refused like
 * cb_beneath_read_file. */
int cb_beneath_write_file(int root, const char *path, off_t off, const void *data, size_t len,
			  int truncate, mode_t mode);

/* 1 for the errors that mean "no such path in this tree": ENOENT, ENOTDIR, and the
 * ELOOP/EXDEV of a symlink on the way (the tree has no entry there that it reaches). */
int cb_beneath_gone(int err);

/* Tests: make chmod take the path kernels without fchmodat2 take (on: 1), or not (0). The
 * environment variable COWBOX_BENEATH_NO_FCHMODAT2=1 does the same for a whole process. */
void cb_beneath_force_chmod_fallback(int on);

#endif
