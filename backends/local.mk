# backends layer: ns, local and docker, one table of operations each (include/cowbox/backend.h).
noinst_LTLIBRARIES += backends/libcb_backends.la
backends_libcb_backends_la_SOURCES = backends/common.h backends/common.c backends/backend.c \
	backends/pathio.c backends/forward.c backends/ns.c backends/local.c backends/docker.c
COWBOX_LAYERS += backends/libcb_backends.la
pkginclude_HEADERS += include/cowbox/backend.h
