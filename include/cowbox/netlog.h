/* The network log (db/netlog.c): one row per connection attempt through a workspace's egress
 * proxy, with its turn, kept in meta.db beside the journal. */
#ifndef COWBOX_NETLOG_H
#define COWBOX_NETLOG_H

#include <stddef.h>

#include "cowbox/journal.h"

struct cb_netlog_row {
	long long id, turn;
	double time;	     /* Unix seconds, when it was asked for */
	const char *proto;   /* "connect", "http", "socks5" */
	const char *name;    /* the destination as asked */
	const char *address; /* the address connected to or refused; "" when none */
	int port;
	int allowed;
	const char *rule; /* the rule that decided, or why it failed */
	long long bytes_up, bytes_down;
	double duration; /* seconds */
	int secret;	 /* a header secret was injected */
};

/* The SQL of migration 3 (db/schema.c). */
extern const char cb_db_netlog_schema_sql[];

/* Append a row (id ignored): 0 or -errno with a message naming the database. */
int cb_db_netlog_add(struct cb_db *db, const struct cb_netlog_row *row);
/* Append n rows in one transaction (all or none). */
int cb_db_netlog_add_many(struct cb_db *db, const struct cb_netlog_row *rows, size_t n);

/* Each row of turn (< 0: every turn), oldest first, to fn; fn's non-zero return stops the walk
 * and is returned. The row's strings live until fn returns. */
int cb_db_netlog_list(struct cb_db *db, long long turn,
		      int (*fn)(const struct cb_netlog_row *row, void *arg), void *arg);

/* The same for the turns after < turn <= upto (upto < 0: no upper bound): the network activity
 * a diff from turn after to turn upto (or the live tree) spans. */
int cb_db_netlog_range(struct cb_db *db, long long after, long long upto,
		       int (*fn)(const struct cb_netlog_row *row, void *arg), void *arg);

#endif
