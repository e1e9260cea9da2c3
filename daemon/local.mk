# daemon layer: `cowbox serve` (lock, mount, control socket, op tables) and its client.
noinst_LTLIBRARIES += daemon/libcb_daemon.la
daemon_libcb_daemon_la_SOURCES = daemon/daemon.h daemon/daemon.c daemon/conn.c \
	daemon/reaper.c daemon/ops.c daemon/ops_core.c daemon/client.c daemon/errcode.h daemon/errcode.c \
	daemon/worker.c daemon/workproc.c
daemon_libcb_daemon_la_SOURCES += daemon/basehash.c daemon/basewatch.c daemon/access.c \
	daemon/idle.c daemon/ops_apply.c daemon/sched.c
COWBOX_LAYERS += daemon/libcb_daemon.la
noinst_HEADERS += include/cowbox/client_served.h
# The daemon's unit tests use its internals, which libcowbox.so does not export: they link
# the layers' convenience libraries, highest first.
DAEMON_TEST_LIBS = daemon/libcb_daemon.la backends/libcb_backends.la net/libcb_net.la \
	exec/libcb_exec.la ws/libcb_ws.la fs/libcb_fs.la db/libcb_db.la util/libcb_util.la \
	$(DEPS_LIBS) $(CRITERION_TEST_LIBS)

check_PROGRAMS += daemon/test_reaper
TESTS += daemon/test_reaper
daemon_test_reaper_SOURCES = daemon/test_reaper.c
daemon_test_reaper_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_reaper_LDADD = $(DAEMON_TEST_LIBS)

check_PROGRAMS += daemon/test_conn
TESTS += daemon/test_conn
daemon_test_conn_SOURCES = daemon/test_conn.c daemon/conn.c daemon/errcode.c
daemon_test_conn_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_conn_LDADD = util/libcb_util.la $(JANSSON_LIBS) $(CRITERION_TEST_LIBS)
# turns: snapshot, diff, rollback, prune, fork ops
daemon_libcb_daemon_la_SOURCES += daemon/ops_turns.c daemon/map_frames.h daemon/map_frames.c \
	daemon/ops_fsck.c daemon/ops_net.c \
	daemon/netlog_queue.c
# api: exec/run/stdin/kill, read/write/which/host_url, configure/destroy
daemon_libcb_daemon_la_SOURCES += daemon/api.h daemon/api_util.c daemon/ops_api.c \
	daemon/ops_files.c
# box: libcowbox's high-level C API (include/cowbox/box.h) over the client
daemon_libcb_daemon_la_SOURCES += daemon/box_private.h daemon/box.c daemon/box_run.c \
	daemon/box_ops.c daemon/box_proc.c daemon/box_direct.c daemon/box_net.c
check_PROGRAMS += daemon/test_box
TESTS += daemon/test_box
daemon_test_box_SOURCES = daemon/test_box.c daemon/test_box_home.h daemon/test_box_home.c
daemon_test_box_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_box_LDADD = $(DAEMON_TEST_LIBS)
check_PROGRAMS += daemon/test_box_lifecycle
TESTS += daemon/test_box_lifecycle
daemon_test_box_lifecycle_SOURCES = daemon/test_box_lifecycle.c daemon/test_box_home.h daemon/test_box_home.c
daemon_test_box_lifecycle_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_box_lifecycle_LDADD = $(DAEMON_TEST_LIBS)
check_PROGRAMS += daemon/test_box_net
TESTS += daemon/test_box_net
daemon_test_box_net_SOURCES = daemon/test_box_net.c daemon/test_box_home.h daemon/test_box_home.c
daemon_test_box_net_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_box_net_LDADD = $(DAEMON_TEST_LIBS)

# merge: a fork's changes brought back into the live tree (ws/merge.c)
daemon_libcb_daemon_la_SOURCES += daemon/ops_merge.c daemon/box_merge.c
check_PROGRAMS += daemon/test_box_merge
TESTS += daemon/test_box_merge
daemon_test_box_merge_SOURCES = daemon/test_box_merge.c daemon/test_box_home.h daemon/test_box_home.c
daemon_test_box_merge_CFLAGS = $(CRITERION_TEST_CFLAGS)
daemon_test_box_merge_LDADD = $(DAEMON_TEST_LIBS)
