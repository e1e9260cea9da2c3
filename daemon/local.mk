# daemon layer: `cowbox serve` (lock, mount, control socket, op tables) and its client.
noinst_LTLIBRARIES += daemon/libcb_daemon.la
daemon_libcb_daemon_la_SOURCES = daemon/daemon.h daemon/daemon.c daemon/conn.c \
	daemon/reaper.c daemon/ops.c daemon/ops_core.c daemon/client.c
COWBOX_LAYERS += daemon/libcb_daemon.la
pkginclude_HEADERS += include/cowbox/client.h
# turns: snapshot, diff, rollback, prune, fork ops (issue 3)
daemon_libcb_daemon_la_SOURCES += daemon/ops_turns.c
