/* libarchive for ws/oci_*.c, loaded with dlopen on first use (configure.ac: linked, it and what
 * it pulls in, libxml2 and ICU among them, would cost every cowbox start, `cowbox exec`'s too). */
#ifndef COWBOX_WS_OCI_LA_H
#define COWBOX_WS_OCI_LA_H

#include <archive.h>
#include <archive_entry.h>

/* Every libarchive function ws/oci_*.c calls. */
#define OCI_LA_FUNCS(X)                                                                            \
	X(archive_error_string)                                                                    \
	X(archive_set_error)                                                                       \
	X(archive_write_new)                                                                       \
	X(archive_write_set_format_pax_restricted)                                                 \
	X(archive_write_set_bytes_in_last_block)                                                   \
	X(archive_write_set_bytes_per_block)                                                       \
	X(archive_write_open2)                                                                     \
	X(archive_write_header)                                                                    \
	X(archive_write_data)                                                                      \
	X(archive_write_close)                                                                     \
	X(archive_write_free)                                                                      \
	X(archive_read_new)                                                                        \
	X(archive_read_support_format_tar)                                                         \
	X(archive_read_support_filter_gzip)                                                        \
	X(archive_read_open)                                                                       \
	X(archive_read_next_header)                                                                \
	X(archive_read_data_block)                                                                 \
	X(archive_read_free)                                                                       \
	X(archive_entry_new)                                                                       \
	X(archive_entry_free)                                                                      \
	X(archive_entry_clear)                                                                     \
	X(archive_entry_pathname)                                                                  \
	X(archive_entry_set_pathname)                                                              \
	X(archive_entry_filetype)                                                                  \
	X(archive_entry_set_filetype)                                                              \
	X(archive_entry_perm)                                                                      \
	X(archive_entry_set_perm)                                                                  \
	X(archive_entry_size)                                                                      \
	X(archive_entry_set_size)                                                                  \
	X(archive_entry_mtime)                                                                     \
	X(archive_entry_mtime_nsec)                                                                \
	X(archive_entry_set_mtime)                                                                 \
	X(archive_entry_set_uid)                                                                   \
	X(archive_entry_set_gid)                                                                   \
	X(archive_entry_symlink)                                                                   \
	X(archive_entry_set_symlink)                                                               \
	X(archive_entry_hardlink)

struct oci_la {
#define OCI_LA_MEMBER(f) __typeof__(f) *la_##f;
	OCI_LA_FUNCS(OCI_LA_MEMBER)
#undef OCI_LA_MEMBER
};
extern struct oci_la oci_la;

/* 0 once libarchive is loaded, else -ENOSYS with a message naming what failed. */
int oci_la_load(void);

/* The calls below go through the loaded table (after oci_la_load). */
#ifndef OCI_LA_NO_REDIRECT
#define OCI_LA_REDIRECT(f)   oci_la.la_##f
#define archive_error_string OCI_LA_REDIRECT(archive_error_string)
#define archive_set_error    OCI_LA_REDIRECT(archive_set_error)
#define archive_write_new    OCI_LA_REDIRECT(archive_write_new)
#define archive_write_set_format_pax_restricted                                                    \
	OCI_LA_REDIRECT(archive_write_set_format_pax_restricted)
#define archive_write_set_bytes_in_last_block OCI_LA_REDIRECT(archive_write_set_bytes_in_last_block)
#define archive_write_set_bytes_per_block     OCI_LA_REDIRECT(archive_write_set_bytes_per_block)
#define archive_write_open2		      OCI_LA_REDIRECT(archive_write_open2)
#define archive_write_header		      OCI_LA_REDIRECT(archive_write_header)
#define archive_write_data		      OCI_LA_REDIRECT(archive_write_data)
#define archive_write_close		      OCI_LA_REDIRECT(archive_write_close)
#define archive_write_free		      OCI_LA_REDIRECT(archive_write_free)
#define archive_read_new		      OCI_LA_REDIRECT(archive_read_new)
#define archive_read_support_format_tar	      OCI_LA_REDIRECT(archive_read_support_format_tar)
#define archive_read_support_filter_gzip      OCI_LA_REDIRECT(archive_read_support_filter_gzip)
#define archive_read_open		      OCI_LA_REDIRECT(archive_read_open)
#define archive_read_next_header	      OCI_LA_REDIRECT(archive_read_next_header)
#define archive_read_data_block		      OCI_LA_REDIRECT(archive_read_data_block)
#define archive_read_free		      OCI_LA_REDIRECT(archive_read_free)
#define archive_entry_new		      OCI_LA_REDIRECT(archive_entry_new)
#define archive_entry_free		      OCI_LA_REDIRECT(archive_entry_free)
#define archive_entry_clear		      OCI_LA_REDIRECT(archive_entry_clear)
#define archive_entry_pathname		      OCI_LA_REDIRECT(archive_entry_pathname)
#define archive_entry_set_pathname	      OCI_LA_REDIRECT(archive_entry_set_pathname)
#define archive_entry_filetype		      OCI_LA_REDIRECT(archive_entry_filetype)
#define archive_entry_set_filetype	      OCI_LA_REDIRECT(archive_entry_set_filetype)
#define archive_entry_perm		      OCI_LA_REDIRECT(archive_entry_perm)
#define archive_entry_set_perm		      OCI_LA_REDIRECT(archive_entry_set_perm)
#define archive_entry_size		      OCI_LA_REDIRECT(archive_entry_size)
#define archive_entry_set_size		      OCI_LA_REDIRECT(archive_entry_set_size)
#define archive_entry_mtime		      OCI_LA_REDIRECT(archive_entry_mtime)
#define archive_entry_mtime_nsec	      OCI_LA_REDIRECT(archive_entry_mtime_nsec)
#define archive_entry_set_mtime		      OCI_LA_REDIRECT(archive_entry_set_mtime)
#define archive_entry_set_uid		      OCI_LA_REDIRECT(archive_entry_set_uid)
#define archive_entry_set_gid		      OCI_LA_REDIRECT(archive_entry_set_gid)
#define archive_entry_symlink		      OCI_LA_REDIRECT(archive_entry_symlink)
#define archive_entry_set_symlink	      OCI_LA_REDIRECT(archive_entry_set_symlink)
#define archive_entry_hardlink		      OCI_LA_REDIRECT(archive_entry_hardlink)
#endif

#endif
