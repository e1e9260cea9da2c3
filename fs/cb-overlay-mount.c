/* cb-overlay-mount: mounts the overlay in the foreground for tests and benchmarks, until it
 * is unmounted or gets SIGTERM/SIGINT. Prints "mounted" on stdout once the mount exists, and
 * its FUSE request counters on each SIGUSR1 (scripts/bench/fs reads them). */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/overlay.h"

static void usage(void)
{
	fprintf(stderr, "usage: cb-overlay-mount BASE|- UPPER MOUNTPOINT [--db PATH] [--debug] "
			"[--threads N] [--quota-mb N] [--quota-inodes N]\n");
}

/* "stats OPCODE COUNT NS" per opcode seen so far, then "stats end", on stdout. */
static void print_stats(struct cb_overlay *ov)
{
	struct cb_overlay_op_stat st[64];
	struct cb_overlay_fs_info fi;
	size_t i, n = cb_overlay_op_stats(ov, st, sizeof(st) / sizeof(st[0]));

	cb_overlay_fs_info(ov, &fi);
	printf("stats transport %s passthrough %d writeback %d\n", fi.transport, fi.passthrough,
	       fi.writeback_cache);
	for (i = 0; i < n; i++)
		printf("stats %s %llu %llu\n", st[i].op, st[i].count, st[i].ns);
	printf("stats end\n");
	fflush(stdout);
}

/* Set by main once the loop returned: the signal thread leaves without touching the overlay,
 * which main destroys only after joining it. */
static _Atomic int loop_over;

static void *signal_thread(void *arg)
{
	sigset_t set;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR1);
	while (sigwait(&set, &sig) == 0) {
		if (loop_over)
			break;
		if (sig == SIGUSR1) {
			print_stats(arg);
			continue;
		}
		cb_overlay_stop(arg);
		break;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct cb_overlay_config cfg = {0};
	struct cb_overlay *ov = NULL;
	struct cb_db *db = NULL;
	const char *db_path = NULL;
	pthread_t th;
	sigset_t set;
	int i, r, status = 1, have_thread = 0;

	if (argc < 4) {
		usage();
		return 2;
	}
	cfg.base_dir = strcmp(argv[1], "-") == 0 ? NULL : argv[1];
	cfg.upper_dir = argv[2];
	cfg.mountpoint = argv[3];
	cfg.fsname = "cowbox-test";
	for (i = 4; i < argc; i++) {
		if (strcmp(argv[i], "--db") == 0 && i + 1 < argc)
			db_path = argv[++i];
		else if (strcmp(argv[i], "--debug") == 0)
			cfg.debug = 1;
		else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
			cfg.max_threads = (unsigned)atoi(argv[++i]);
		else if (strcmp(argv[i], "--quota-mb") == 0 && i + 1 < argc)
			cfg.quota_bytes = strtoull(argv[++i], NULL, 10) << 20;
		else if (strcmp(argv[i], "--quota-inodes") == 0 && i + 1 < argc)
			cfg.quota_inodes = strtoull(argv[++i], NULL, 10);
		else {
			usage();
			return 2;
		}
	}
	if (db_path && cb_db_open(db_path, &db) < 0) {
		fprintf(stderr, "cb-overlay-mount: %s\n", cb_error_message());
		return 1;
	}
	cfg.db = db;
	/* signals go to the waiting thread only, so stop runs outside any FUSE request */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	r = cb_overlay_mount(&cfg, &ov);
	if (r < 0) {
		fprintf(stderr, "cb-overlay-mount: %s\n", cb_error_message());
		goto out;
	}
	printf("mounted\n");
	fflush(stdout);
	if (pthread_create(&th, NULL, signal_thread, ov) != 0) {
		fprintf(stderr, "cb-overlay-mount: cannot start the signal thread\n");
		goto out;
	}
	have_thread = 1;
	r = cb_overlay_run(ov);
	if (r < 0)
		fprintf(stderr, "cb-overlay-mount: %s\n", cb_error_message());
	else
		status = 0;
out:
	if (have_thread) {
		/* a SIGTERM may be stopping the loop that already ended: wait for it to finish */
		loop_over = 1;
		pthread_kill(th, SIGHUP);
		pthread_join(th, NULL);
	}
	cb_overlay_destroy(ov);
	cb_db_close(db);
	return status;
}
