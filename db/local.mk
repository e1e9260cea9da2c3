# db layer: SQLite schema, migrations and the change journal (the only SQL in cowbox).
noinst_LTLIBRARIES += db/libcb_db.la
db_libcb_db_la_SOURCES = db/db.h db/db.c db/schema.c db/journal.c db/journal_log.c db/marklog.c db/links.c
COWBOX_LAYERS += db/libcb_db.la
noinst_HEADERS += include/cowbox/journal.h

check_PROGRAMS += db/test_journal
TESTS += db/test_journal
db_test_journal_SOURCES = db/test_journal.c
db_test_journal_CFLAGS = $(CRITERION_TEST_CFLAGS)
db_test_journal_LDADD = db/libcb_db.la util/libcb_util.la $(SQLITE3_LIBS) $(CRITERION_TEST_LIBS)

check_PROGRAMS += db/test_marklog
TESTS += db/test_marklog
db_test_marklog_SOURCES = db/test_marklog.c
db_test_marklog_CFLAGS = $(CRITERION_TEST_CFLAGS)
db_test_marklog_LDADD = db/libcb_db.la util/libcb_util.la $(SQLITE3_LIBS) $(CRITERION_TEST_LIBS)

# turns: the turn store (turns, deltas, the map, the base hash cache)
db_libcb_db_la_SOURCES += db/turns.c db/turns_walk.c db/turn_entry.c db/turn_scratch.c
# the base hash cache shared by the workspaces over one base directory
db_libcb_db_la_SOURCES += db/basecache.c db/turns_read.c db/turns_bulk.c
# the in-place mark
db_libcb_db_la_SOURCES += db/turn_inplace.c
# attribution given after the fact (a merge's rows keep its source's pid and command)
db_libcb_db_la_SOURCES += db/turn_attrib.c
# the network log of the egress proxy
db_libcb_db_la_SOURCES += db/netlog.c
noinst_HEADERS += include/cowbox/netlog.h
noinst_HEADERS += include/cowbox/basecache.h
noinst_HEADERS += include/cowbox/turn_store.h

# scripts/bench/journal builds this on request (make db/bench_journal); not a test.
EXTRA_PROGRAMS = db/bench_journal
db_bench_journal_SOURCES = db/bench_journal.c
db_bench_journal_LDADD = db/libcb_db.la util/libcb_util.la $(SQLITE3_LIBS)
CLEANFILES += db/bench_journal

check_PROGRAMS += db/test_basecache
TESTS += db/test_basecache
db_test_basecache_SOURCES = db/test_basecache.c
db_test_basecache_CFLAGS = $(CRITERION_TEST_CFLAGS)
db_test_basecache_LDADD = db/libcb_db.la util/libcb_util.la $(SQLITE3_LIBS) $(XXHASH_LIBS) \
	$(CRITERION_TEST_LIBS)
# rebuilding a damaged meta.db from its readable rows (fsck --repair)
db_libcb_db_la_SOURCES += db/salvage.c
