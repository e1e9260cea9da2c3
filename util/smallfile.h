/* Small state files of a workspace directory (ids, access, idle_timeout): read whole, and
 * written whole through a temporary name and a rename, so a reader sees the old or the new. */
#ifndef CB_UTIL_SMALLFILE_H
#define CB_UTIL_SMALLFILE_H

#include <stddef.h>
#include <sys/types.h>

/* Reads dir/name (no symlink followed) into buf, NUL-terminated, at most size - 1 bytes.
 * Returns the length read, -ENOENT without a message when there is no such file, or -errno
 * with a message naming the file. */
int cb_smallfile_read(const char *dir, const char *name, char *buf, size_t size);

/* Replaces dir/name with text (mode for a new file), fsynced before the rename so that a
 * crash leaves the old text or the new. Returns 0 or -errno with a message. */
int cb_smallfile_write(const char *dir, const char *name, const char *text, mode_t mode);

#endif
