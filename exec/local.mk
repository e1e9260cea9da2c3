# exec: the process runner (run*.c, shim.c; tree.c kills a host command's whole tree), the
# namespace sandbox (ns*.c, cgroup.c) and pasta.c (user-mode networking for network all).
noinst_LTLIBRARIES += exec/libcb_exec.la
exec_libcb_exec_la_SOURCES = exec/internal.h exec/run.h exec/run.c exec/run_io.c exec/shim.c \
	exec/env.c exec/ns.c exec/tree.c exec/pasta.c exec/pasta_guard.h exec/pasta_guard.c \
	exec/ns_harden.c exec/ns_user.c exec/cgroup.c exec/keep.c
COWBOX_LAYERS += exec/libcb_exec.la

check_PROGRAMS += exec/test_exec
TESTS += exec/test_exec
exec_test_exec_SOURCES = exec/test_exec.c
exec_test_exec_CFLAGS = $(CRITERION_TEST_CFLAGS)
exec_test_exec_LDADD = exec/libcb_exec.la util/libcb_util.la $(SECCOMP_LIBS) $(CRITERION_TEST_LIBS)

check_PROGRAMS += exec/test_sandbox
TESTS += exec/test_sandbox
exec_test_sandbox_SOURCES = exec/test_sandbox.c
exec_test_sandbox_CFLAGS = $(CRITERION_TEST_CFLAGS)
exec_test_sandbox_LDADD = exec/libcb_exec.la util/libcb_util.la $(SECCOMP_LIBS) $(CRITERION_TEST_LIBS)

# The runner's exec/kill/stdin/close race stress under ThreadSanitizer, in its own build
# (exec/tsan/ under the build tree, made by the script).
TESTS += exec/test_run_tsan.sh
EXTRA_DIST += exec/test_run_tsan.sh exec/stress_run.c
