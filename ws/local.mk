# ws layer: workspaces under $COWBOX_HOME (refs, names, create/resolve/info/list/remove).
noinst_LTLIBRARIES += ws/libcb_ws.la
ws_libcb_ws_la_SOURCES = ws/ws.h ws/workspace.c ws/workspace_state.c ws/workspace_mount.c \
	ws/ids.c ws/upper_image.c
COWBOX_LAYERS += ws/libcb_ws.la
noinst_HEADERS += include/cowbox/workspace.h

# turns: snapshot, diff, rollback, prune, fork over the live tree
ws_libcb_ws_la_SOURCES += ws/turns_int.h ws/turns.c ws/hash.c ws/blobs.c ws/basemap.c \
	ws/snapshot.c ws/diff.c ws/rollback.c ws/rollback_base.c ws/prune.c ws/fork.c ws/fsck.c
# what a turn keeps besides contents (owner, xattrs, time; hard links between its files)
ws_libcb_ws_la_SOURCES += ws/meta.c ws/links.c
# in-place workspaces
ws_libcb_ws_la_SOURCES += ws/inplace.c
# workspaces as OCI images: export, create --from
ws_libcb_ws_la_SOURCES += ws/oci_int.h ws/oci_layout.c ws/oci_export.c ws/oci_import.c \
	ws/oci_la.h ws/oci_la.c ws/oci_read.h ws/oci_read.c ws/oci_bases.c
noinst_HEADERS += include/cowbox/oci.h
noinst_HEADERS += include/cowbox/turns.h include/cowbox/fsck.h

check_PROGRAMS += ws/test_turns
TESTS += ws/test_turns
ws_test_turns_SOURCES = ws/test_turns.c ws/test_basewalk.c
ws_test_turns_CFLAGS = $(CRITERION_TEST_CFLAGS)
ws_test_turns_LDADD = ws/libcb_ws.la db/libcb_db.la util/libcb_util.la $(DEPS_LIBS) \
	$(CRITERION_TEST_LIBS)

check_PROGRAMS += ws/test_workspace
TESTS += ws/test_workspace
ws_test_workspace_SOURCES = ws/test_workspace.c ws/test_home.h
ws_test_workspace_CFLAGS = $(CRITERION_TEST_CFLAGS)
ws_test_workspace_LDADD = ws/libcb_ws.la db/libcb_db.la util/libcb_util.la $(DEPS_LIBS) \
	$(CRITERION_TEST_LIBS)

# the exec path's look-up of a served workspace without SQLite
ws_libcb_ws_la_SOURCES += ws/resolve_fast.c
noinst_HEADERS += include/cowbox/workspace_fast.h
check_PROGRAMS += ws/test_resolve_fast
TESTS += ws/test_resolve_fast
ws_test_resolve_fast_SOURCES = ws/test_resolve_fast.c ws/test_home.h
ws_test_resolve_fast_CFLAGS = $(CRITERION_TEST_CFLAGS)
ws_test_resolve_fast_LDADD = ws/libcb_ws.la db/libcb_db.la util/libcb_util.la $(DEPS_LIBS) \
	$(CRITERION_TEST_LIBS)

# the shared base hash cache and the background hash of the base
ws_libcb_ws_la_SOURCES += ws/basecache.c ws/basewalk.c

# access levels: names, and the widest level a workspace serves
ws_libcb_ws_la_SOURCES += ws/access.c

# apply: a turn's changes written onto the base or another folder
ws_libcb_ws_la_SOURCES += ws/apply.c

# merge: a fork's changes brought back into a workspace (three-way, per file)
ws_libcb_ws_la_SOURCES += ws/merge.c
noinst_HEADERS += include/cowbox/merge.h
