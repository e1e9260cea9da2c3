/* ws/ internals shared by its files: path formatting, tree deletion, name lookup and the
 * completeness check of a workspace. Only ws/ includes this header. */
#ifndef COWBOX_WS_INTERNAL_H
#define COWBOX_WS_INTERNAL_H

#include "cowbox/workspace.h"

/* asprintf into *out with an error message on failure. */
int ws_pathf(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* mkdir -p of $COWBOX_HOME (home) and its workspaces/ and names/. */
int ws_mkdir_home(const char *home);

/* rm -rf that never crosses into another mount (a live mount point is left alone). */
int ws_delete_tree(const char *dir);

/* The ref a name points at, or -ENOENT with "no workspace named ...". */
int ws_name_lookup(const char *home, const char *name, char ref[CB_WS_REF_LEN + 1]);

/* 0 if meta.db exists and says creation finished; -EUCLEAN if creation never finished (no
 * file, or no "created" mark); another -errno with the database's message if the file cannot
 * be read (corrupt, unreadable). */
int ws_check_complete(const char *db_path);

/* ws_check_complete that keeps the database open in *out on success (NULL otherwise). */
struct cb_db;
int ws_open_complete(const char *db_path, struct cb_db **out);

/* The mount point a dead daemon recorded in the lock, when a mount of this workspace is still
 * there (malloc'd), else NULL. */
char *ws_dead_mountpoint(const char *ref);

/* 0 if folder (a real path) may be an in-place workspace's folder: not /, not inside home
 * ($COWBOX_HOME) and not holding it (-EINVAL), not another in-place workspace's (-EBUSY);
 * else the error saying why. */
int ws_in_place_check(const char *folder, const char *home);

/* Record folder as turn 0 of the in-place workspace in dir (meta.db made): the turn store
 * marked in place, the base map frozen from a walk of folder, and every file's bytes kept as
 * a blob, so that a rollback never needs the folder to still hold them. A file that changes
 * while it is read fails it. */
int ws_in_place_record(const char *dir, const char *folder);

/* The file dir/in_place, beside base.path: what says so when meta.db is lost (fsck --repair
 * then records the folder as turn 0 again). ws_in_place_marked: 1 if dir has it, else 0. */
int ws_in_place_mark(const char *dir);
int ws_in_place_marked(const char *dir);

#endif
