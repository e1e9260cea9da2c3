/* Mounting and serving the overlay: checks the layers, opens one root fd per layer, sets the
 * kernel up for speed (writeback cache, splice, long timeouts) and runs the worker threads. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

/* Puts h on the list of open handles with its destructor. */
void ov_handle_add(struct cb_overlay *ov, struct ov_handle *h, void (*fn)(struct ov_handle *))
{
	h->free = fn;
	h->prev = NULL;
	pthread_mutex_lock(&ov->handles_lock);
	h->next = ov->handles;
	if (ov->handles)
		ov->handles->prev = h;
	ov->handles = h;
	pthread_mutex_unlock(&ov->handles_lock);
}

/* Takes h off the list (before it is freed). */
void ov_handle_del(struct cb_overlay *ov, struct ov_handle *h)
{
	pthread_mutex_lock(&ov->handles_lock);
	if (h->prev)
		h->prev->next = h->next;
	else
		ov->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	pthread_mutex_unlock(&ov->handles_lock);
}

/* FUSE mounts get a strict 1% share of the dirty page budget, so random writes stall on
 * writeback one page per request; we are a local filesystem, so lift that (root only;
 * failures just keep the kernel default). The bdi is named by the mount's device. */
static void ov_tune_bdi(const char *mountpoint)
{
	char real[PATH_MAX], line[4096], dev[64] = "", path[128], *save, *f;
	const char *knobs[][2] = {{"strict_limit", "0"}, {"max_ratio", "50"}};
	FILE *mi;
	size_t i;
	int fd;

	if (!realpath(mountpoint, real) || !(mi = fopen("/proc/self/mountinfo", "re")))
		return;
	while (!dev[0] && fgets(line, sizeof(line), mi)) {
		char *id = NULL, *mp = NULL;
		for (i = 0, f = strtok_r(line, " ", &save); f && i < 5; i++) {
			if (i == 2)
				id = f;
			if (i == 4)
				mp = f;
			f = strtok_r(NULL, " ", &save);
		}
		if (id && mp && strcmp(mp, real) == 0)
			snprintf(dev, sizeof(dev), "%s", id);
	}
	fclose(mi);
	for (i = 0; dev[0] && i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		snprintf(path, sizeof(path), "/sys/class/bdi/%s/%s", dev, knobs[i][0]);
		fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			if (write(fd, knobs[i][1], strlen(knobs[i][1])) < 0)
				fprintf(stderr, "cowbox fs: %s: %s\n", path, strerror(errno));
			close(fd);
		}
	}
}

/* Whether the environment variable name turns a fast path off ("0", "off", "no"). */
static int ov_env_off(const char *name)
{
	const char *v = getenv(name);

	return v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no"));
}

#ifdef HAVE_FUSE_URING
/* Whether the kernel lets FUSE servers use io_uring (root turns it on: scripts/setup). */
static int ov_uring_allowed(void)
{
	char c = 'N';
	int fd = open("/sys/module/fuse/parameters/enable_uring", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (read(fd, &c, 1) != 1)
		c = 'N';
	close(fd);
	return c == 'Y' || c == '1';
}
#endif

/* Whether fd is on overlayfs (its files as backing files add a stacking level). */
static int ov_on_overlayfs(int fd)
{
	struct statfs sf;

	return fd >= 0 && fstatfs(fd, &sf) == 0 && sf.f_type == OVERLAYFS_SUPER_MAGIC;
}

/* See ov.h: what we ask of the kernel, given what it can do. */
void ov_op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct cb_overlay *ov = userdata;
	int passthrough = 0;

#ifdef HAVE_FUSE_PASSTHROUGH
	/* file I/O straight to the upper file; the kernel refuses it beside the writeback
	 * cache (connection-wide), and passthrough saves more: writes and reads of upper files
	 * never reach us, where the writeback cache still sends each dirty page */
	if (ov->want_passthrough && (conn->capable & FUSE_CAP_PASSTHROUGH)) {
		conn->want |= FUSE_CAP_PASSTHROUGH;
		/* backing files on overlayfs need one level more, which in turn keeps overlayfs
		 * from stacking on this mount: ask for it only when a layer is there */
		conn->max_backing_stack_depth = ov->layers_stacked;
		passthrough = 1;
	}
#endif
#ifdef HAVE_FUSE_KILLPRIV_V2
	/* we clear set-id bits ourselves (ops_file.c), so a write needs no getxattr first */
	if (conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2)
		conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
	atomic_store(&ov->killpriv_v2, (conn->want & FUSE_CAP_HANDLE_KILLPRIV_V2) != 0);
#endif
#ifdef HAVE_FUSE_URING
	if (!ov->want_uring)
		conn->want &= ~FUSE_CAP_OVER_IO_URING;
#endif
#ifdef HAVE_FUSE_NO_INTERRUPT
	/* No handler looks at an interrupt, and libfuse keeps an INTERRUPT that came after its
	 * request was answered until the session ends, then loses it (a leak per killed waiter):
	 * the kernel stops sending them once told no_interrupt. */
	conn->no_interrupt = 1;
#endif
	if (!passthrough && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_READ)
		conn->want |= FUSE_CAP_SPLICE_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	if (conn->capable & FUSE_CAP_ASYNC_DIO)
		conn->want |= FUSE_CAP_ASYNC_DIO;
#ifdef FUSE_CAP_DIRECT_IO_ALLOW_MMAP
	/* a file opened direct_io on a nearly full disk (ov_space_low) can still be mapped */
	if (conn->capable & FUSE_CAP_DIRECT_IO_ALLOW_MMAP)
		conn->want |= FUSE_CAP_DIRECT_IO_ALLOW_MMAP;
#endif
#ifdef FUSE_CAP_NO_OPENDIR_SUPPORT
	/* the kernel opens directories without asking (and caches their listings as we would
	 * ask it to): OPENDIR and RELEASEDIR cost two round trips per directory walked */
	if (ov->want_no_opendir && (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT)) {
		conn->want |= FUSE_CAP_NO_OPENDIR_SUPPORT;
		atomic_store(&ov->no_opendir, 1);
	}
#endif
	/* a file's data changes only through us: no invalidation on mtime changes */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	atomic_store(&ov->passthrough, passthrough);
	atomic_store(&ov->writeback, (conn->want & FUSE_CAP_WRITEBACK_CACHE) != 0);
}

static int ov_open_root(const char *what, const char *dir, int *fd, struct stat *st)
{
	*fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (*fd < 0)
		return cb_error_set(errno, "%s %s: %s", what, dir, strerror(errno));
	if (fstat(*fd, st) < 0)
		return cb_error_set(errno, "%s %s: %s", what, dir, strerror(errno));
	return 0;
}

static int ov_check_mountpoint(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int r = 0;

	if (!d)
		return cb_error_set(errno, "mount point %s: %s", dir, strerror(errno));
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			r = cb_error_set(ENOTEMPTY, "mount point %s: not empty", dir);
	closedir(d);
	return r;
}

static int ov_setup(const struct cb_overlay_config *cfg, struct cb_overlay *ov)
{
	struct stat ust, bst;
	mode_t m;
	int r;

	if (!cfg->upper_dir || !cfg->mountpoint)
		return cb_error_set(EINVAL,
				    "overlay: an upper directory and a mount point are needed");
	r = ov_open_root("upper directory", cfg->upper_dir, &ov->upper_fd, &ust);
	if (r < 0)
		return r;
	if (cfg->base_dir) {
		r = ov_open_root("base directory", cfg->base_dir, &ov->base_fd, &bst);
		if (r < 0)
			return r;
		if (bst.st_dev == ust.st_dev && bst.st_ino == ust.st_ino)
			return cb_error_set(EINVAL, "base and upper are the same directory %s",
					    cfg->upper_dir);
		ov->base_dev = bst.st_dev;
	}
	r = ov_check_mountpoint(cfg->mountpoint);
	if (r < 0)
		return r;
	ov->root = ov_inode_new(OV_UPPER, &ust);
	if (!ov->root)
		return cb_error_set(ENOMEM, "overlay: out of memory");
	ov->root->is_root = 1;
	ov->root->nlookup = 1;
	ov->root->merged = ov->base_fd >= 0;
	cb_mutex_lock(&ov->tab.lock);
	ov_table_insert(&ov->tab, ov->root);
	ov_table_track(&ov->tab, ov->root);
	cb_mutex_unlock(&ov->tab.lock);
	m = umask(0);
	umask(m);
	ov->umask = m;
	atomic_init(&ov->gen, 1);
	ov->db = cfg->db;
	ov->debug = cfg->debug;
	atomic_init(&ov->id_base, cfg->id_base);
	ov->owner_squash = cfg->owner_squash;
	ov->owner_uid = ust.st_uid;
	ov->owner_gid = ust.st_gid;
	ov->max_threads = cfg->max_threads ? cfg->max_threads : 8;
	ov->stats = ov_stats_new();
	ov->mountpoint = strdup(cfg->mountpoint);
	return ov->mountpoint ? 0 : cb_error_set(ENOMEM, "overlay: out of memory");
}

/* See overlay.h. */
int cb_overlay_mount(const struct cb_overlay_config *cfg, struct cb_overlay **out)
{
	struct cb_overlay *ov = calloc(1, sizeof(*ov));
	char opts[PATH_MAX + 128];
	char *argv[4] = {"cowbox", "-o", opts, NULL};
	struct fuse_args args;
	struct stat under;
	int r;

	*out = NULL;
	if (!ov)
		return cb_error_set(ENOMEM, "overlay: out of memory");
	ov->upper_fd = ov->base_fd = -1;
	if (ov_table_init(&ov->tab) < 0) {
		free(ov);
		return cb_error_set(ENOMEM, "overlay: out of memory");
	}
	pthread_mutex_init(&ov->handles_lock, NULL);
	for (size_t i = 0; i < OV_LISTING_LOCKS; i++)
		pthread_mutex_init(&ov->listing_locks[i], NULL);
	pthread_mutex_init(&ov->carry_lock, NULL);
	pthread_mutex_init(&ov->quota_lock, NULL);
	ov_fence_setup(ov);
	r = ov_setup(cfg, ov);
	if (r < 0)
		goto fail;
	/* passthrough writes never reach us, so a byte quota could not hold them back */
	ov->want_passthrough = !ov_env_off("COWBOX_FUSE_PASSTHROUGH") && !cfg->quota_bytes;
	r = cb_overlay_set_quota(ov, cfg->quota_bytes, cfg->quota_inodes);
	if (r < 0)
		goto fail;
	ov->want_no_opendir = !ov_env_off("COWBOX_FUSE_NO_OPENDIR");
	ov->layers_stacked = ov_on_overlayfs(ov->upper_fd) || ov_on_overlayfs(ov->base_fd);
#ifdef HAVE_FUSE_URING
	ov->want_uring = !ov_env_off("COWBOX_FUSE_URING") && ov_uring_allowed();
#endif
	snprintf(opts, sizeof(opts), "default_permissions,allow_other,fsname=%s,subtype=cowbox%s%s",
		 cfg->fsname ? cfg->fsname : "cowbox", cfg->debug ? ",debug" : "",
		 ov->want_uring ? ",io_uring" : "");
	if (strchr(cfg->fsname ? cfg->fsname : "", ',')) {
		r = cb_error_set(EINVAL, "fsname %s: no commas allowed", cfg->fsname);
		goto fail;
	}
	args = (struct fuse_args)FUSE_ARGS_INIT(3, argv);
	ov->se = ov_session_new(&args, ov);
	fuse_opt_free_args(&args);
	if (!ov->se) {
		r = cb_error_set(EINVAL, "fuse session for %s could not be created",
				 cfg->mountpoint);
		goto fail;
	}
	/* read before the mount exists: afterwards a stat would be a request nobody serves yet */
	if (lstat(cfg->mountpoint, &under) < 0) {
		r = cb_error_set(errno, "mount %s: %s", cfg->mountpoint, strerror(errno));
		goto fail;
	}
	ov->under_dev = under.st_dev;
	if (fuse_session_mount(ov->se, cfg->mountpoint) != 0) {
		r = cb_error_set(EIO, "mount %s: the kernel refused the FUSE mount (see stderr)",
				 cfg->mountpoint);
		goto fail;
	}
	ov->mounted = 1;
	ov_tune_bdi(cfg->mountpoint);
	*out = ov;
	return 0;
fail:
	cb_overlay_destroy(ov);
	return r;
}

static void ov_wake(int sig)
{
	(void)sig;
}

/* See overlay.h. */
int cb_overlay_run(struct cb_overlay *ov)
{
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();
	struct sigaction sa = {.sa_handler = ov_wake};
	int r;

	if (!cfg)
		return cb_error_set(ENOMEM, "overlay: out of memory");
	/* cb_overlay_stop interrupts the main loop's wait with SIGUSR2 */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
	fuse_loop_cfg_set_max_threads(cfg, ov->max_threads);
	/* No worker leaves on its own when idle: libfuse detaches such a thread, and one still
	 * exiting when fuse_session_destroy deletes the key of its splice pipe never runs that
	 * key's destructor (a 24-byte leak seen once at an aborted connection's teardown). Kept,
	 * every worker is joined by the loop before the session goes. */
	fuse_loop_cfg_set_idle_threads(cfg, ov->max_threads);
	fuse_loop_cfg_set_clone_fd(cfg, 0);
	ov->run_thread = pthread_self();
	atomic_store(&ov->running, 1);
	r = fuse_session_loop_mt(ov->se, cfg);
	atomic_store(&ov->running, 0);
	fuse_loop_cfg_destroy(cfg);
	if (r < 0)
		return cb_error_set(-r, "serving %s: %s", ov->mountpoint, strerror(-r));
	return 0;
}

/* See overlay.h. */
void cb_overlay_sync(struct cb_overlay *ov)
{
	struct stat st;
	int fd;

	/* Dirty pages of the writeback cache must reach us while workers still serve. Once
	 * unmounted (by us, or by anyone: `mounted` only knows of our umount) the mount point is
	 * the directory below, whose syncfs would flush the host's disk for nothing. */
	if (!ov || !ov->se || !atomic_load(&ov->running) || !atomic_load(&ov->mounted))
		return;
	fd = open(ov->mountpoint, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &st) == 0 && st.st_dev != ov->under_dev)
		syncfs(fd);
	close(fd);
}

/* See overlay.h. */
void cb_overlay_end(struct cb_overlay *ov)
{
	if (!ov || !ov->se)
		return;
	fuse_session_exit(ov->se);
	if (atomic_load(&ov->running))
		pthread_kill(ov->run_thread, SIGUSR2);
}

/* See overlay.h. */
void cb_overlay_stop(struct cb_overlay *ov)
{
	cb_overlay_sync(ov);
	cb_overlay_end(ov);
}

/* See overlay.h. */
int cb_overlay_unmount(struct cb_overlay *ov)
{
	if (!atomic_load(&ov->mounted))
		return 0; /* an earlier call unmounted it */
	cb_overlay_sync(ov);
	if (umount2(ov->mountpoint, UMOUNT_NOFOLLOW) < 0)
		return cb_error_set(errno, "umount %s: %s", ov->mountpoint, strerror(errno));
	atomic_store(&ov->mounted, 0); /* libfuse would try again, and fail, at destroy */
	return 0;
}

/* See overlay.h. */
void cb_overlay_destroy(struct cb_overlay *ov)
{
	if (!ov)
		return;
	if (ov->se) {
		/* quiet when already unmounted; also frees libfuse's copy of the mount point */
		if (atomic_load(&ov->mounted))
			fuse_session_unmount(ov->se);
		fuse_session_destroy(ov->se);
	}
	while (ov->handles)
		ov->handles->free(ov->handles);
	ov_journal_sync(ov);
	ov_table_free_all(&ov->tab);
	if (ov->upper_fd >= 0)
		close(ov->upper_fd);
	if (ov->base_fd >= 0)
		close(ov->base_fd);
	cb_rwlock_destroy(&ov->fence);
	pthread_mutex_destroy(&ov->carry_lock);
	for (size_t i = 0; i < ov->ncarry; i++) {
		free((char *)ov->carry[i].path);
		free((char *)ov->carry[i].comm);
	}
	free(ov->carry);
	pthread_mutex_destroy(&ov->handles_lock);
	for (size_t i = 0; i < OV_LISTING_LOCKS; i++)
		pthread_mutex_destroy(&ov->listing_locks[i]);
	pthread_mutex_destroy(&ov->quota_lock);
	free(ov->stats);
	free(ov->mountpoint);
	free(ov);
}

/* See overlay.h. */
int cb_overlay_upper_check(struct cb_overlay *ov, const char *upper_dir)
{
	struct stat held, now;

	if (fstat(ov->upper_fd, &held) < 0)
		return cb_error_set(errno, "upper layer %s: %s", upper_dir, strerror(errno));
	if (held.st_nlink == 0 || stat(upper_dir, &now) < 0 || now.st_dev != held.st_dev ||
	    now.st_ino != held.st_ino)
		return cb_error_set(ENOENT,
				    "upper layer %s was deleted or replaced while the workspace "
				    "was mounted: the files the workspace showed are gone from "
				    "disk, so nothing true can be recorded",
				    upper_dir);
	return 0;
}

/* See ov.h. */
int ov_space_low(struct cb_overlay *ov)
{
	struct timespec now;
	struct statfs sfs;
	long long ms;

	if (ov_quota_low(ov))
		return 1;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
	ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	if (ms - atomic_load(&ov->space_checked_ms) < 100)
		return atomic_load(&ov->space_low);
	atomic_store(&ov->space_checked_ms, ms);
	if (fstatfs(ov->upper_fd, &sfs) == 0) {
		unsigned long long avail = (unsigned long long)sfs.f_bavail * sfs.f_bsize;
		unsigned long long total = (unsigned long long)sfs.f_blocks * sfs.f_bsize;

		atomic_store(&ov->space_low, avail < (256ULL << 20) || avail < total / 16);
	}
	return atomic_load(&ov->space_low);
}
