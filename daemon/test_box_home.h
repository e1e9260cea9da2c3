/* What the libcowbox tests share (daemon/test_box*.c): a $COWBOX_HOME of their own, and at the
 * end every workspace stopped and removed, a daemon's sanitizer report named. */
#ifndef COWBOX_TEST_BOX_HOME_H
#define COWBOX_TEST_BOX_HOME_H

#include <stddef.h>

/* Make home (a mkdtemp template) and point COWBOX_HOME and COWBOX_BIN (from $COWBOX, which
 * make check sets) at it and the built binary; asserts on failure. */
void box_home_setup(char *home);

/* Stop and remove every workspace of home, then its files. Daemons run detached, so their
 * ASan/UBSan findings reach only their daemon.log: the first one found is copied to report
 * ("" if none), for the caller to assert on. */
void box_home_teardown(const char *home, char *report, size_t size);

/* rm -rf of dir (no symlink followed); a missing dir is fine. */
void box_tree_remove(const char *dir);

#endif
