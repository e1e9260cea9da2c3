/* What the libcowbox tests share (daemon/test_box*.c): a $COWBOX_HOME of their own, and at the
 * end every workspace stopped and removed, a daemon's sanitizer report named. */
#ifndef COWBOX_TEST_BOX_HOME_H
#define COWBOX_TEST_BOX_HOME_H

#include <stddef.h>

/* Make home (a mkdtemp template) and point COWBOX_HOME and COWBOX_BIN (from $COWBOX, which
 * make check sets) at it and the built binary; asserts on failure. */
void box_home_setup(char *home);

/* Stop and remove every workspace of home, then its files; asserts that no daemon's log holds
 * an ASan/UBSan report (daemons run detached, so their findings reach only daemon.log). */
void box_home_teardown(const char *home);

struct cb_box;
/* cb_box_close(box), asserting that it worked; if not, the failure carries the end of the
 * workspace's daemon.log (gone with the home once the test ends). */
void box_close_checked(struct cb_box *box);

/* rm -rf of dir (no symlink followed); a missing dir is fine. */
void box_tree_remove(const char *dir);

#endif
