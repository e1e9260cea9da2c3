# net layer: the network policy and the egress proxy of workspaces under network public or
# allow (include/cowbox/net.h); between exec and backends.
noinst_LTLIBRARIES += net/libcb_net.la
net_libcb_net_la_SOURCES = net/policy.c net/proxy_util.h net/proxy_util.c net/proxy.c \
	net/proxy_conn.h net/relay.c net/intercept.h net/intercept.c net/rewrite.c net/ca.c \
	net/tunnel.h net/tunnel.c net/hostaddr.c
net_libcb_net_la_CFLAGS = $(AM_CFLAGS)
COWBOX_LAYERS += net/libcb_net.la
noinst_HEADERS += include/cowbox/net.h

check_PROGRAMS += net/test_policy
TESTS += net/test_policy
net_test_policy_SOURCES = net/test_policy.c
net_test_policy_CFLAGS = $(CRITERION_TEST_CFLAGS)
net_test_policy_LDADD = net/libcb_net.la util/libcb_util.la $(CRITERION_TEST_LIBS)

check_PROGRAMS += net/test_intercept
TESTS += net/test_intercept
net_test_intercept_SOURCES = net/test_intercept.c
net_test_intercept_CFLAGS = $(CRITERION_TEST_CFLAGS)
net_test_intercept_LDADD = net/libcb_net.la util/libcb_util.la $(DEPS_LIBS) $(CRITERION_TEST_LIBS)

check_PROGRAMS += net/test_proxy
TESTS += net/test_proxy
net_test_proxy_SOURCES = net/test_proxy.c
net_test_proxy_CFLAGS = $(CRITERION_TEST_CFLAGS)
net_test_proxy_LDADD = net/libcb_net.la util/libcb_util.la $(DEPS_LIBS) $(CRITERION_TEST_LIBS)
