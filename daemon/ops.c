/* The registry of control-protocol ops: one line per table. Each group of ops lives in its
 * own daemon/ops_*.c and adds its table here. */
#include "config.h"

#include <string.h>

#include "daemon.h"

extern const struct cb_daemon_op cb_daemon_ops_turns[]; /* daemon/ops_turns.c */
extern const struct cb_daemon_op cb_daemon_ops_api[];	/* daemon/ops_api.c */
extern const struct cb_daemon_op cb_daemon_ops_files[]; /* daemon/ops_files.c */
extern const struct cb_daemon_op cb_daemon_ops_fsck[];	/* daemon/ops_fsck.c */
extern const struct cb_daemon_op cb_daemon_ops_apply[]; /* daemon/ops_apply.c */
extern const struct cb_daemon_op cb_daemon_ops_net[];	/* daemon/ops_net.c */

static const struct cb_daemon_op *const op_tables[] = {
    cb_daemon_ops_core,	  /* hello, ping, info, close (daemon/ops_core.c) */
    cb_daemon_ops_turns,  /* snapshot, diff, rollback, prune, fork, turns (daemon/ops_turns.c) */
    cb_daemon_ops_api,	  /* exec, run, stdin, kill (daemon/ops_api.c) */
    cb_daemon_ops_files,  /* read, write, which, host_url, configure, destroy (ops_files.c) */
    cb_daemon_ops_fsck,	  /* fsck (daemon/ops_fsck.c) */
    cb_daemon_ops_access, /* access (daemon/access.c) */
    cb_daemon_ops_idle,	  /* idle (daemon/idle.c) */
    cb_daemon_ops_apply,  /* apply (daemon/ops_apply.c) */
    cb_daemon_ops_net,	  /* reaches, net_log (daemon/ops_net.c) */
    NULL,
};

const struct cb_daemon_op *cb_daemon_op_find(const char *name)
{
	for (size_t t = 0; op_tables[t]; t++)
		for (const struct cb_daemon_op *op = op_tables[t]; op->name; op++)
			if (!strcmp(op->name, name))
				return op;
	return NULL;
}
