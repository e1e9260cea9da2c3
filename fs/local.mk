# fs layer: the FUSE low-level copy-on-write overlay (fs/libcb_fs.la), its test mount tool
# and its unit tests.
noinst_LTLIBRARIES += fs/libcb_fs.la
fs_libcb_fs_la_SOURCES = fs/ov.h fs/at.c fs/inode.c fs/layer.c fs/copyup.c fs/journal.c \
	fs/ops_entry.c fs/ops_dir.c fs/rename.c fs/ops_file.c fs/ops_readdir.c fs/ops_xattr.c \
	fs/fence.c fs/mount.c fs/ops.c fs/ids.c fs/quota.c fs/base_changed.c \
	fs/revert.c
COWBOX_LAYERS += fs/libcb_fs.la
noinst_HEADERS += include/cowbox/overlay.h

FS_LIBS = fs/libcb_fs.la db/libcb_db.la util/libcb_util.la $(FUSE3_LIBS) $(SQLITE3_LIBS)

# Mounts an overlay in the foreground; the fs integration tests and scripts/bench/fs use it.
noinst_PROGRAMS = fs/cb-overlay-mount
fs_cb_overlay_mount_SOURCES = fs/cb-overlay-mount.c
fs_cb_overlay_mount_LDADD = $(FS_LIBS)

check_PROGRAMS += fs/test_inode fs/test_layer
TESTS += fs/test_inode fs/test_layer
fs_test_inode_SOURCES = fs/test_inode.c
fs_test_inode_CFLAGS = $(CRITERION_TEST_CFLAGS)
fs_test_inode_LDADD = $(FS_LIBS) $(CRITERION_TEST_LIBS)
fs_test_layer_SOURCES = fs/test_layer.c
fs_test_layer_CFLAGS = $(CRITERION_TEST_CFLAGS)
fs_test_layer_LDADD = $(FS_LIBS) $(CRITERION_TEST_LIBS)
