# backends layer: ns, local and docker, one table of operations each (include/cowbox/backend.h).
noinst_LTLIBRARIES += backends/libcb_backends.la
backends_libcb_backends_la_SOURCES = backends/common.h backends/common.c backends/backend.c \
	backends/options.c backends/env.c backends/home.c \
	backends/pathio.c backends/forward.c backends/egress.c backends/secrets.c backends/image.c backends/ns.c \
	backends/local.c backends/docker.c backends/vm.c backends/vm_boot.c backends/vm.h backends/vm_net.c backends/vm_relay.c \
	backends/vm_frame.c backends/vm_frame.h backends/vm_forward.c backends/vm_stream.c \
	backends/vm_stream.h
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

# The vm backend's guest agent, PID 1 of a workspace's VM: static (the guest has no library of
# ours) and never instrumented (the sanitizers' runtimes do not link statically), so it has
# flags of its own and compiles the runner's sources itself.
noinst_PROGRAMS += backends/cb-vm-agent
backends_cb_vm_agent_SOURCES = backends/vm_agent.c backends/vm_client.c backends/vm.h \
	backends/vm_frame.c backends/vm_frame.h backends/vm_agent_io.c backends/vm_stream.c \
	backends/vm_stream.h \
	$(exec_libcb_exec_la_SOURCES) util/error.c util/grow.c util/beneath.c util/beneath.h \
	util/smallfile.c util/smallfile.h util/fdio.c util/fdio.h
backends_cb_vm_agent_CFLAGS = -std=gnu11 -Wall -Wextra -Werror -pthread -O2 $(JANSSON_CFLAGS)
backends_cb_vm_agent_LDFLAGS = -all-static -pthread
backends_cb_vm_agent_LDADD = -ljansson -lseccomp
