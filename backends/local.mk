# backends layer: ns, local and docker, one table of operations each (include/cowbox/backend.h).
noinst_LTLIBRARIES += backends/libcb_backends.la
backends_libcb_backends_la_SOURCES = backends/common.h backends/common.c backends/backend.c \
	backends/options.c backends/env.c \
	backends/pathio.c backends/forward.c backends/egress.c backends/secrets.c backends/image.c backends/ns.c \
	backends/local.c backends/docker.c
# relays (host_url's forwarders, published ports) and published ports
backends_libcb_backends_la_SOURCES += backends/relay.c backends/publish.c
COWBOX_LAYERS += backends/libcb_backends.la
noinst_HEADERS += include/cowbox/backend.h include/cowbox/image.h

check_PROGRAMS += backends/test_backend
TESTS += backends/test_backend
backends_test_backend_SOURCES = backends/test_backend.c
backends_test_backend_CFLAGS = $(CRITERION_TEST_CFLAGS)
backends_test_backend_LDADD = backends/libcb_backends.la net/libcb_net.la ws/libcb_ws.la db/libcb_db.la \
	exec/libcb_exec.la util/libcb_util.la $(DEPS_LIBS) $(CRITERION_TEST_LIBS)
