# util: the lowest layer (error messages, path rules); everything may use it.
noinst_LTLIBRARIES += util/libcb_util.la
util_libcb_util_la_SOURCES = util/error.c util/grow.c util/beneath.h util/beneath.c util/beneath_tree.c \
	util/smallfile.h util/smallfile.c util/fdio.h util/fdio.c \
	util/lock.h util/lock.c util/loopfs.h util/loopfs.c util/clock.h util/clock.c
COWBOX_LAYERS += util/libcb_util.la
noinst_HEADERS += include/cowbox/grow.h

check_PROGRAMS += util/test_error
TESTS += util/test_error
util_test_error_SOURCES = util/test_error.c
util_test_error_CFLAGS = $(CRITERION_TEST_CFLAGS)
util_test_error_LDADD = util/libcb_util.la $(CRITERION_TEST_LIBS)

check_PROGRAMS += util/test_grow
TESTS += util/test_grow
util_test_grow_SOURCES = util/test_grow.c
util_test_grow_CFLAGS = $(CRITERION_TEST_CFLAGS)
util_test_grow_LDADD = util/libcb_util.la $(CRITERION_TEST_LIBS)

# beneath: the one path-beneath module; its case table is shared with the Python mirror.
check_PROGRAMS += util/test_beneath
TESTS += util/test_beneath
EXTRA_DIST += util/beneath_cases.json
util_test_beneath_SOURCES = util/test_beneath.c
util_test_beneath_CFLAGS = $(CRITERION_TEST_CFLAGS) -DCB_SRCDIR=\"$(abs_top_srcdir)\"
util_test_beneath_LDADD = util/libcb_util.la $(JANSSON_LIBS) $(CRITERION_TEST_LIBS)
