/* The per-thread record of read locks held, for util/lock.h's checks (checked builds only;
 * otherwise this file is empty). */
#include "config.h"

#include "util/lock.h"

#ifdef CB_LOCK_CHECKS
__thread const struct cb_rwlock *cb_lock_reads[CB_LOCK_MAX_READS];
__thread int cb_lock_nreads;
#else
/* ISO C wants a translation unit to declare something. */
typedef int cb_lock_unchecked;
#endif
