/* The schema of meta.db as an ordered list of migrations, applied on open (PRAGMA
 * user_version counts how many have run). Append new migrations; never edit a shipped one. */
#include "config.h"

#include "cowbox/netlog.h"
#include "cowbox/turn_store.h"
#include "db.h"

const char *const cb_db_migrations[] = {
    /* 1: key/value metadata (the open turn, the base, the name) and the change journal. */
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
    "INSERT INTO meta (key, value) VALUES ('turn', '1');"
    "CREATE TABLE journal ("
    "  id INTEGER PRIMARY KEY,"
    "  turn INTEGER NOT NULL,"
    "  path TEXT NOT NULL,"
    "  kind INTEGER NOT NULL,"
    "  subtree INTEGER NOT NULL DEFAULT 0,"
    "  time REAL NOT NULL,"
    "  pid INTEGER NOT NULL DEFAULT 0,"
    "  comm TEXT,"
    "  UNIQUE (turn, path, kind));",

    /* 2: the turns tables (turns, deltas, the map, base_cache): db/turns.c owns the SQL. */
    cb_db_turns_schema_sql,

    /* 3: the network log of the egress proxy: db/netlog.c owns the SQL. */
    cb_db_netlog_schema_sql,

    /* 4: the names of multiply-linked upper files by inode number (db/links.c). */
    "CREATE TABLE link_names (ino INTEGER NOT NULL, path TEXT NOT NULL,"
    "  PRIMARY KEY (ino, path)) WITHOUT ROWID;"
    "CREATE INDEX link_names_by_path ON link_names(path);",
};

const size_t cb_db_migration_count = sizeof(cb_db_migrations) / sizeof(cb_db_migrations[0]);
