/* Access levels (none < files < full): how much of a workspace a connection may use, and the
 * widest level a workspace serves at all (kept in its directory as the file "access"). */
#ifndef COWBOX_ACCESS_H
#define COWBOX_ACCESS_H

#ifdef __cplusplus
extern "C" {
#endif

/* none: only what the owner and hooks use (info, snapshot, diff, turns, close, destroy);
 * files: also read, write, rollback, fork, prune; full: also exec, run, which, host_url,
 * configure with options, apply. Ordered: a wider level is a larger number. */
enum cb_access {
	CB_ACCESS_NONE = 0,
	CB_ACCESS_FILES = 1,
	CB_ACCESS_FULL = 2,
};

/* The level named name ("none", "files" or "full"), or -EINVAL with a message naming it. */
int cb_access_parse(const char *name);

/* The name of a level ("full" for anything out of range). */
const char *cb_access_name(int level);

struct cb_box;

/* Lower box to level (its connections, from now on and after a restart of the daemon, ask for
 * it first): what needs more then fails with -EACCES, code access_denied. A level wider than
 * box has, or than the workspace serves, is refused the same way; box keeps its level. */
int cb_box_set_access(struct cb_box *box, const char *level);

#ifdef __cplusplus
}
#endif

#endif
