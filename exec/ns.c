/* The namespace sandbox's root: planned in the caller, then built in the new mount namespace
 * by the sandbox's pid 1 from detached bind trees on an empty tmpfs, then pivot_root. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "internal.h"

/* What the sandbox gets of the host (or image) root; symlinks (merged /usr) stay symlinks. */
static const char *const root_dirs[] = {"usr", "etc",	"bin",	 "sbin",
					"lib", "lib32", "lib64", "libx32"};
static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
/* The sandbox's uid 0 (without a user namespace) still owns root's files: hide the host's
 * secrets that live in the /etc it sees. */
static const char *const masked[] = {"etc/shadow",	"etc/gshadow",	       "etc/shadow-",
				     "etc/gshadow-",	"etc/sudoers",	       "etc/sudoers.d",
				     "etc/ssl/private", "etc/security/opasswd"};
/* Kernel state the sandbox's own /proc would show whatever its uid: kernel heap layout
 * (slabinfo), physical page data, the scheduler's and timers' views of host tasks. */
static const char *const masked_proc[] = {"proc/slabinfo",    "proc/kpagecount",
					  "proc/kpageflags",  "proc/kpagecgroup",
					  "proc/sched_debug", "proc/timer_list"};

static int add_entry(struct cb_ns_plan *p, enum cb_ns_entry_kind kind, const char *src,
		     const char *dst)
{
	struct cb_ns_entry *e = &p->entries[p->n_entries];
	e->kind = kind;
	e->tree = -1;
	e->src = strdup(src);
	e->dst = strdup(dst);
	if (!e->src || !e->dst) {
		free(e->src);
		free(e->dst);
		return cb_error_set(ENOMEM, "sandbox: out of memory");
	}
	p->n_entries++;
	return 0;
}

static int add_root_dir(struct cb_ns_plan *p, const char *prefix, const char *name)
{
	char path[PATH_MAX], target[PATH_MAX];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", prefix, name);
	if (lstat(path, &st) < 0)
		return 0; /* this root has no such directory: fine, nothing to show */
	if (S_ISLNK(st.st_mode)) {
		ssize_t n = readlink(path, target, sizeof target - 1);
		if (n < 0)
			return cb_error_set(errno, "sandbox: readlink %s: %s", path,
					    strerror(errno));
		target[n] = 0;
		return add_entry(p, CB_NS_SYMLINK, target, name);
	}
	if (!S_ISDIR(st.st_mode))
		return 0;
	int rc = add_entry(p, CB_NS_BIND_RO, path, name);
	/* an image's (under $COWBOX_HOME) would show its host path, and it never changes while
	 * held; the host's /usr is /usr */
	if (rc == 0)
		p->entries[p->n_entries - 1].hide = *prefix != 0;
	return rc;
}

/* The trust bundle over the root's own (a regular file, not a link that could lead the bind
 * elsewhere); a root without one gets none. */
static int add_ca_bundle(struct cb_ns_plan *p, const char *prefix, const char *bundle)
{
	static const char rel[] = "etc/ssl/certs/ca-certificates.crt";
	char path[PATH_MAX];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", prefix, rel);
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return 0;
	int rc = add_entry(p, CB_NS_BIND_RO, bundle, rel);
	if (rc == 0) {
		p->entries[p->n_entries - 1].is_file = 1;
		p->entries[p->n_entries - 1].over = 1;
		/* a copy: a bind would show its path under $COWBOX_HOME in mountinfo */
		p->entries[p->n_entries - 1].hide = 1;
	}
	return rc;
}

static int add_mask(struct cb_ns_plan *p, const char *prefix, const char *rel)
{
	char path[PATH_MAX];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", prefix, rel);
	if (lstat(path, &st) < 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)))
		return 0;
	if (p->n_entries >= CB_NS_MAX_ENTRIES - 16)
		return 0; /* keep room for the workspace and /dev */
	int rc = add_entry(p, CB_NS_MASK, path, rel);
	if (rc == 0)
		p->entries[p->n_entries - 1].is_file = S_ISREG(st.st_mode);
	return rc;
}

static int add_masks(struct cb_ns_plan *p, const char *prefix)
{
	char dir[PATH_MAX];
	int rc = 0;
	for (size_t i = 0; i < sizeof masked_proc / sizeof *masked_proc && !rc; i++)
		rc = add_mask(p, "", masked_proc[i]);
	/* in a user namespace the sandbox's root is an unprivileged host uid: root's files in
	 * /etc are already out of its reach */
	if (p->userns)
		return rc;
	for (size_t i = 0; i < sizeof masked / sizeof *masked && !rc; i++)
		rc = add_mask(p, prefix, masked[i]);
	snprintf(dir, sizeof dir, "%s/etc/ssh", prefix);
	DIR *d = opendir(dir);
	struct dirent *de;
	while (!rc && d && (de = readdir(d))) {
		size_t n = strlen(de->d_name);
		if (!strncmp(de->d_name, "ssh_host_", 9) && n > 4 &&
		    !strcmp(de->d_name + n - 4, "_key")) {
			char rel[300];
			snprintf(rel, sizeof rel, "etc/ssh/%s", de->d_name);
			rc = add_mask(p, prefix, rel);
		}
	}
	if (d)
		closedir(d);
	return rc;
}

/* Validate an extra bind: its source exists, its target is a fresh path under the root. */
static int add_extra_bind(struct cb_ns_plan *p, const struct cb_sandbox_bind *b)
{
	static const char *const reserved[] = {"usr",	    "etc",   "bin",   "sbin",
					       "lib",	    "lib32", "lib64", "libx32",
					       "workspace", "tmp",   "proc",  "dev"};
	struct stat st;
	const char *dst = b->dst ? b->dst : "";
	while (*dst == '/')
		dst++;
	size_t first = strcspn(dst, "/");
	if (!b->src || stat(b->src, &st) < 0)
		return cb_error_set(b->src ? errno : EINVAL, "sandbox: bind source %s: %s",
				    b->src ? b->src : "(none)", strerror(b->src ? errno : EINVAL));
	if (!*dst || strstr(dst, "..") || p->n_entries >= CB_NS_MAX_ENTRIES)
		return cb_error_set(EINVAL, "sandbox: bind target '%s' is not a usable path",
				    b->dst ? b->dst : "");
	for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
		if (first == strlen(reserved[i]) && !strncmp(dst, reserved[i], first))
			return cb_error_set(EINVAL,
					    "sandbox: bind target %s is inside /%s, which "
					    "the sandbox builds itself",
					    b->dst, reserved[i]);
	int rc = add_entry(p, b->writable ? CB_NS_BIND_RW : CB_NS_BIND_RO, b->src, dst);
	/* not hidden (cb_ns_hide_bind): an overlay caches names, and a volume's host directory
	 * may change under a running command */
	if (rc == 0)
		p->entries[p->n_entries - 1].is_file = !S_ISDIR(st.st_mode);
	return rc;
}

static char *cmdline_start;
static size_t cmdline_len;
static pthread_once_t cmdline_once = PTHREAD_ONCE_INIT;

/* Where the kernel reads this process's /proc/PID/cmdline from: fields 48 and 49 of
 * /proc/self/stat (arg_start, arg_end). Unknown (0) leaves the command line as it is. */
static void find_cmdline(void)
{
	char buf[1024];
	unsigned long start = 0, end = 0;
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return;
	buf[n] = 0;
	char *s = strrchr(buf, ')'); /* the comm before it may hold spaces */
	for (int field = 2; s && field < 48; field++)
		s = strchr(s + 1, ' ');
	if (!s || sscanf(s, " %lu %lu", &start, &end) != 2 || end <= start)
		return;
	cmdline_start = (char *)start;
	cmdline_len = end - start;
}

int cb_ns_plan_build(const struct cb_sandbox *sb, struct cb_ns_plan **out)
{
	struct stat st;
	int rc = 0;
	char buf[128];
	const char *prefix = sb->image ? sb->image : "";
	struct cb_ns_plan *p = calloc(1, sizeof *p);
	*out = NULL;
	if (!p)
		return cb_error_set(ENOMEM, "sandbox: out of memory");
	p->entries = calloc(CB_NS_MAX_ENTRIES, sizeof *p->entries);
	if (!p->entries) {
		rc = cb_error_set(ENOMEM, "sandbox: out of memory");
		goto out;
	}
	if (!sb->workspace) {
		rc = cb_error_set(EINVAL, "sandbox: no workspace directory given");
		goto out;
	}
	if (stat(sb->workspace, &st) < 0 || !S_ISDIR(st.st_mode)) {
		int err = errno && !S_ISDIR(st.st_mode) ? errno : ENOTDIR;
		rc = cb_error_set(err, "sandbox: workspace %s: %s", sb->workspace, strerror(err));
		goto out;
	}
	if (sb->image) {
		char usr[PATH_MAX];
		snprintf(usr, sizeof usr, "%s/usr", sb->image);
		if (stat(usr, &st) < 0 || !S_ISDIR(st.st_mode)) {
			rc = cb_error_set(ENOENT, "sandbox: image %s: no usr/ directory in it",
					  sb->image);
			goto out;
		}
	}
	p->privileged_parent = geteuid() == 0;
	p->userns = !p->privileged_parent || !sb->privileged;
	if (!p->privileged_parent) {
		p->map_uid = geteuid();
		p->map_gid = getegid();
		p->map_count = 1;
	} else {
		unsigned long base = sb->id_base ? sb->id_base : CB_SANDBOX_DIR_ID_BASE;
		if (base < 65536 || base > 0xffffffffUL - 65536) {
			rc = cb_error_set(EINVAL, "sandbox: id base %lu is not a usable host range",
					  base);
			goto out;
		}
		p->map_uid = (uid_t)base;
		p->map_gid = (gid_t)base;
		p->map_count = 65536;
		/* a plain directory: shown through an idmapped mount as the sandbox root's */
		p->deny_setid = p->userns && !sb->id_base;
		p->idmap_uid = st.st_uid;
		p->idmap_gid = st.st_gid;
		/* root's directory: the sandbox's own namespace has the very map the mount needs */
		p->idmap_late = p->deny_setid && !st.st_uid && !st.st_gid;
	}
	if ((rc = cb_ns_user_resolve(sb, p)) < 0)
		goto out;
	pthread_once(&cmdline_once, find_cmdline);
	p->arg_start = cmdline_start;
	p->arg_len = cmdline_len;
	p->net_none = sb->net == CB_NET_NONE;
	if (sb->net == CB_NET_JOIN && sb->netns_fd < 0) {
		rc = cb_error_set(EBADF, "sandbox: network join without a namespace fd");
		goto out;
	}
	p->nofile = sb->nofile ? sb->nofile : 1024;
	p->memory_limited = sb->memory_mb > 0;
	if (sb->oom_score_adj > 0 || p->memory_limited)
		snprintf(p->oom_adj, sizeof p->oom_adj, "%d",
			 sb->oom_score_adj < 0	    ? 0
			 : sb->oom_score_adj > 1000 ? 1000
						    : sb->oom_score_adj);
	/* the kernel takes at most 64 bytes (HOST_NAME_MAX) */
	p->hostname = strndup(sb->hostname && *sb->hostname ? sb->hostname : "cowbox", 64);
	snprintf(buf, sizeof buf, "mode=1777,size=%lum", sb->tmp_mb ? sb->tmp_mb : 512);
	p->tmp_opts = strdup(buf);
	if (!p->hostname || !p->tmp_opts) {
		rc = cb_error_set(ENOMEM, "sandbox: out of memory");
		goto out;
	}
	for (size_t i = 0; i < sizeof root_dirs / sizeof *root_dirs; i++)
		if ((rc = add_root_dir(p, prefix, root_dirs[i])) < 0)
			goto out;
	if (sb->ca_bundle && (rc = add_ca_bundle(p, prefix, sb->ca_bundle)) < 0)
		goto out;
	if ((rc = add_masks(p, prefix)) < 0)
		goto out;
	if ((rc = add_entry(p, CB_NS_BIND_RW, sb->workspace, "workspace")) < 0)
		goto out;
	p->entries[p->n_entries - 1].idmap = p->deny_setid;
	for (size_t i = 0; i < sizeof dev_nodes / sizeof *dev_nodes; i++) {
		char src[64], dst[64];
		snprintf(src, sizeof src, "/dev/%s", dev_nodes[i]);
		snprintf(dst, sizeof dst, "dev/%s", dev_nodes[i]);
		if (stat(src, &st) < 0 || !S_ISCHR(st.st_mode))
			continue;
		/* mknod is cheaper than a bind, but a user namespace may not make nodes */
		if ((rc = add_entry(p, p->userns ? CB_NS_BIND_RW : CB_NS_DEV, src, dst)) < 0)
			goto out;
		p->entries[p->n_entries - 1].rdev = st.st_rdev;
		p->entries[p->n_entries - 1].is_file = 1;
	}
	if (sb->n_binds > 16) {
		rc = cb_error_set(E2BIG, "sandbox: %zu extra binds, at most 16", sb->n_binds);
		goto out;
	}
	for (size_t i = 0; i < sb->n_binds; i++)
		if ((rc = add_extra_bind(p, &sb->binds[i])) < 0)
			goto out;
	if ((rc = cb_ns_seccomp_prog(&p->seccomp_prog)) < 0 ||
	    (p->deny_setid && (rc = cb_ns_seccomp_setid_prog(&p->setid_prog)) < 0))
		goto out;
	p->clone_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
	if (p->net_none)
		p->clone_flags |= CLONE_NEWNET;
	if (p->userns)
		p->clone_flags |= CLONE_NEWUSER;
	*out = p;
	p = NULL;
out:
	cb_ns_plan_free(p);
	return rc;
}

void cb_ns_plan_free(struct cb_ns_plan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_entries; i++) {
		if (p->entries[i].tree >= 0)
			close(p->entries[i].tree);
		free(p->entries[i].src);
		free(p->entries[i].dst);
	}
	free(p->entries);
	free(p->hostname);
	free(p->tmp_opts);
	free(p);
}

static int set_attr(int fd, unsigned long long set)
{
	struct mount_attr attr = {.attr_set = set};
	return (int)syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
			    sizeof attr);
}

/* A detached recursive clone of e->src with the entry's flags, its top mount idmapped
 * through userns_fd when the entry asks; -1 and errno on failure. */
static int clone_tree(const struct cb_ns_entry *e, int userns_fd)
{
	int fd = (int)syscall(SYS_open_tree, AT_FDCWD, e->src,
			      OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
	if (fd < 0)
		return -1;
	if (e->idmap && userns_fd >= 0) {
		struct mount_attr idmap = {.attr_set = MOUNT_ATTR_IDMAP,
					   .userns_fd = (unsigned long long)userns_fd};
		if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH, &idmap, sizeof idmap) < 0) {
			int err = errno;
			close(fd);
			errno = err;
			return -1;
		}
	}
	unsigned long long attr = MOUNT_ATTR_NOSUID;
	if (e->kind == CB_NS_BIND_RO)
		attr |= MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV;
	else if (!e->is_file)
		attr |= MOUNT_ATTR_NODEV;
	if (set_attr(fd, attr) < 0) {
		int err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	return fd;
}

static int write_file(const char *path, const char *text);

/* A user namespace whose maps show host id `owner` (every id below 65536 when owner is root)
 * as base: what an idmapped mount of the workspace directory needs. A helper process is
 * born in it, and lives only until the maps are written and the namespace is opened. */
static int make_idmap_userns(unsigned long base, uid_t owner, gid_t group)
{
	char path[64], map[64];
	int pipefd[2], fd = -1, rc = 0;
	if (pipe2(pipefd, O_CLOEXEC) < 0)
		return cb_error_set(errno, "sandbox: pipe: %s", strerror(errno));
	pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0UL, 0UL, 0UL, 0UL);
	if (pid == 0) {
		char c;
		close(pipefd[1]);
		(void)!read(pipefd[0], &c, 1);
		_exit(0);
	}
	close(pipefd[0]);
	if (pid < 0) {
		rc = cb_error_set(errno,
				  "sandbox: clone a user namespace for the idmapped mount: %s",
				  strerror(errno));
		close(pipefd[1]);
		return rc;
	}
	snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
	snprintf(map, sizeof map, "%u %lu %u\n", owner ? (unsigned)owner : 0U, base,
		 owner ? 1U : 65536U);
	if ((rc = write_file(path, map)) == 0) {
		snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
		snprintf(map, sizeof map, "%u %lu %u\n", group ? (unsigned)group : 0U, base,
			 group ? 1U : 65536U);
		rc = write_file(path, map);
	}
	if (rc == 0) {
		snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			rc = -errno;
	}
	if (rc < 0)
		rc = cb_error_set(-rc, "sandbox: %s: %s", path, strerror(-rc));
	close(pipefd[1]);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	return rc < 0 ? rc : fd;
}

/* The message of a workspace directory the kernel would not idmap. */
static int idmap_error(const struct cb_ns_entry *e, int err)
{
	if (err == EINVAL || err == EPERM || err == ENOTSUP)
		return cb_error_set(err,
				    "sandbox: %s: its filesystem cannot be bound through an "
				    "idmapped mount (%s); give a workspace ref, or --privileged to "
				    "run as host root",
				    e->src, strerror(err));
	return cb_error_set(err, "sandbox: bind %s: %s", e->src, strerror(err));
}

int cb_ns_idmap_late(const struct cb_ns_plan *p, pid_t pid)
{
	char path[64];
	int fd, rc = 0;
	if (!p->idmap_late)
		return 0;
	snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return cb_error_set(errno, "sandbox: %s: %s", path, strerror(errno));
	for (size_t i = 0; i < p->n_entries && !rc; i++) {
		const struct cb_ns_entry *e = &p->entries[i];
		struct mount_attr idmap = {.attr_set = MOUNT_ATTR_IDMAP,
					   .userns_fd = (unsigned long long)fd};
		if (e->idmap && e->tree >= 0 &&
		    syscall(SYS_mount_setattr, e->tree, "", AT_EMPTY_PATH, &idmap, sizeof idmap) <
			0)
			rc = idmap_error(e, errno);
	}
	close(fd);
	return rc;
}

int cb_ns_plan_open_trees(struct cb_ns_plan *p)
{
	int userns_fd = -1, rc = 0;
	if (p->deny_setid && !p->idmap_late) {
		userns_fd = make_idmap_userns(p->map_uid, p->idmap_uid, p->idmap_gid);
		if (userns_fd < 0)
			return userns_fd;
	}
	for (size_t i = 0; i < p->n_entries; i++) {
		struct cb_ns_entry *e = &p->entries[i];
		if (e->kind != CB_NS_BIND_RO && e->kind != CB_NS_BIND_RW)
			continue;
		if (e->tree < 0 && (e->tree = clone_tree(e, userns_fd)) < 0) {
			rc = e->idmap ? idmap_error(e, errno)
				      : cb_error_set(errno, "sandbox: bind %s: %s", e->src,
						     strerror(errno));
			goto out;
		}
	}
out:
	if (userns_fd >= 0)
		close(userns_fd); /* the mount keeps what it needs of it */
	return rc;
}

static int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = write(fd, text, strlen(text));
	int rc = n == (ssize_t)strlen(text) ? 0 : -(n < 0 ? errno : EIO);
	close(fd);
	return rc;
}

int cb_ns_write_maps(const struct cb_ns_plan *plan, pid_t pid)
{
	char path[64], map[64];
	int rc;
	snprintf(path, sizeof path, "/proc/%d/setgroups", (int)pid);
	/* unprivileged callers may map gids only with setgroups denied */
	if (!plan->privileged_parent && (rc = write_file(path, "deny")) < 0 && rc != -ENOENT)
		return cb_error_set(-rc, "sandbox: write %s: %s", path, strerror(-rc));
	snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
	snprintf(map, sizeof map, "0 %u %lu\n", (unsigned)plan->map_uid, plan->map_count);
	if ((rc = write_file(path, map)) < 0)
		return cb_error_set(-rc, "sandbox: write %s: %s", path, strerror(-rc));
	snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
	snprintf(map, sizeof map, "0 %u %lu\n", (unsigned)plan->map_gid, plan->map_count);
	if ((rc = write_file(path, map)) < 0)
		return cb_error_set(-rc, "sandbox: write %s: %s", path, strerror(-rc));
	return 0;
}

/* ---- child side: only syscalls from here on ---- */

#define FAIL(what, detail)                                                                         \
	do {                                                                                       \
		int err_ = errno;                                                                  \
		cb_exec_child_error(ctl, what, detail, err_);                                      \
		rc = -err_;                                                                        \
		goto out;                                                                          \
	} while (0)

/* Make a proc subtree read-only: as uid 0 without a user namespace, sysctls and
 * sysrq-trigger check only the file mode, not capabilities. */
static int protect_proc(int rootfd, const char *path)
{
	int t = (int)syscall(SYS_open_tree, rootfd, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
	if (t < 0)
		return errno == ENOENT ? 0 : -1;
	int rc = set_attr(t, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
				 MOUNT_ATTR_NOEXEC);
	if (rc == 0)
		rc = (int)syscall(SYS_move_mount, t, "", rootfd, path, MOVE_MOUNT_F_EMPTY_PATH);
	close(t);
	return rc;
}

/* mkdir -p of path's parent directories under rootfd (no allocation: a stack copy). */
static int make_parents(int rootfd, const char *path)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n >= sizeof buf)
		return errno = ENAMETOOLONG, -1;
	memcpy(buf, path, n + 1);
	for (char *s = buf; (s = strchr(s, '/')); s++) {
		*s = 0;
		if (mkdirat(rootfd, buf, 0755) < 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return 0;
}

/* Bind an empty file (or directory) of the root tmpfs read-only over each masked path (host
 * secrets in /etc, kernel state in /proc), then drop the source names: the binds keep them
 * alive, nothing shows in /. */
static int mask_secrets(const struct cb_ns_plan *p, int rootfd, int ctl)
{
	int made_file = 0, made_dir = 0, rc = 0;
	for (size_t i = 0; i < p->n_entries; i++) {
		const struct cb_ns_entry *e = &p->entries[i];
		char src[64] = "/tmp/", dst[PATH_MAX] = "/tmp/";
		if (e->kind != CB_NS_MASK)
			continue;
		const char *name = e->is_file ? ".cowbox-empty" : ".cowbox-emptydir";
		if (e->is_file && !made_file) {
			int f = openat(rootfd, name, O_CREAT | O_WRONLY | O_CLOEXEC, 0000);
			if (f < 0)
				FAIL("make the mask file", NULL);
			close(f);
			made_file = 1;
		} else if (!e->is_file && !made_dir) {
			if (mkdirat(rootfd, name, 0000) < 0)
				FAIL("make the mask directory", NULL);
			made_dir = 1;
		}
		strncat(src, name, sizeof src - 6);
		strncat(dst, e->dst, sizeof dst - 6);
		/* read-only, or the sandbox's root (the mask's owner) could chmod and fill it */
		if (mount(src, dst, NULL, MS_BIND, NULL) < 0 ||
		    mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
			  NULL) < 0)
			FAIL("hide", e->dst);
	}
out:
	if (made_file)
		unlinkat(rootfd, ".cowbox-empty", 0);
	if (made_dir)
		unlinkat(rootfd, ".cowbox-emptydir", AT_REMOVEDIR);
	return rc;
}

int cb_ns_setup_root(const struct cb_ns_plan *p, int ctl)
{
	int trees[CB_NS_MAX_ENTRIES], rootfd = -1, rc = 0;
	size_t i;
	for (i = 0; i < p->n_entries; i++)
		trees[i] = -1;
	umask(0);
	if (p->userns) {
		/* Clone kept the caller's host ids; become the namespace's root (its mapped uid),
		 * and shed the caller's supplementary groups where the map allows it. */
		/* Raw system calls: glibc's wrappers would broadcast the change to the threads
		 * it believes we have (the caller's, copied at clone), taking locks that one of
		 * them may have held at that moment: a hang. */
		if (p->privileged_parent && syscall(SYS_setgroups, 0, NULL) < 0)
			FAIL("setgroups", NULL);
		if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setresuid, 0, 0, 0) < 0)
			FAIL("become root of the user namespace", NULL);
	}
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		FAIL("make / a slave mount", NULL);
	/* Clone the sources while the host root is still visible. */
	for (i = 0; i < p->n_entries; i++) {
		const struct cb_ns_entry *e = &p->entries[i];
		if ((e->kind != CB_NS_BIND_RO && e->kind != CB_NS_BIND_RW) || e->tree >= 0)
			continue;
		if ((trees[i] = clone_tree(e, -1)) < 0)
			FAIL("bind", e->src);
	}
	if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID, "mode=0755,size=2m") < 0)
		FAIL("mount the root tmpfs", NULL);
	rootfd = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		FAIL("open the new root", NULL);
	if (mkdirat(rootfd, "dev", 0755) < 0 || mkdirat(rootfd, "dev/pts", 0755) < 0 ||
	    mkdirat(rootfd, "proc", 0555) < 0 || mkdirat(rootfd, "tmp", 01777) < 0)
		FAIL("make the root's directories", NULL);
	for (i = 0; i < p->n_entries; i++) {
		const struct cb_ns_entry *e = &p->entries[i];
		switch (e->kind) {
		case CB_NS_SYMLINK:
			if (symlinkat(e->src, rootfd, e->dst) < 0)
				FAIL("symlink", e->dst);
			break;
		case CB_NS_DEV:
			if (mknodat(rootfd, e->dst, S_IFCHR | 0666, e->rdev) < 0)
				FAIL("mknod", e->dst);
			break;
		case CB_NS_MASK:
			break; /* below, once /etc is in place */
		default:
			if (!e->over) { /* else onto the root's own file */
				if (strchr(e->dst, '/') && make_parents(rootfd, e->dst) < 0)
					FAIL("make the parents of", e->dst);
				if (e->is_file) {
					int f = openat(rootfd, e->dst,
						       O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
					if (f < 0)
						FAIL("make the mount point", e->dst);
					close(f);
				} else if (mkdirat(rootfd, e->dst, 0755) < 0) {
					FAIL("make the mount point", e->dst);
				}
			}
			if (e->hide && e->is_file) {
				if (cb_ns_copy_file(e->tree >= 0 ? e->tree : trees[i], rootfd,
						    e->dst) < 0)
					FAIL("copy", e->src);
				break;
			}
			if (syscall(SYS_move_mount, e->tree >= 0 ? e->tree : trees[i], "", rootfd,
				    e->dst, MOVE_MOUNT_F_EMPTY_PATH) < 0)
				FAIL("attach", e->src);
			/* an overlay the kernel cannot make leaves the plain bind (and its
			 * path in mountinfo) */
			if (e->hide && cb_ns_hide_bind(rootfd, e->dst) < 0)
				FAIL("hide the host path of", e->dst);
		}
	}
	if (mount("proc", "/tmp/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		FAIL("mount /proc", NULL);
	if (mask_secrets(p, rootfd, ctl) < 0) {
		rc = -1;
		goto out;
	}
	/* in a user namespace the kernel checks host root for most of these already; read-only
	 * either way */
	static const char *const ro[] = {"proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus"};
	for (i = 0; i < sizeof ro / sizeof *ro; i++)
		if (protect_proc(rootfd, ro[i]) < 0)
			FAIL("make read-only", ro[i]);
	if (mount("devpts", "/tmp/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
		  "newinstance,ptmxmode=0666,mode=0620") < 0)
		FAIL("mount /dev/pts", NULL);
	if (symlinkat("pts/ptmx", rootfd, "dev/ptmx") < 0 ||
	    symlinkat("/proc/self/fd", rootfd, "dev/fd") < 0 ||
	    symlinkat("/proc/self/fd/0", rootfd, "dev/stdin") < 0 ||
	    symlinkat("/proc/self/fd/1", rootfd, "dev/stdout") < 0 ||
	    symlinkat("/proc/self/fd/2", rootfd, "dev/stderr") < 0 ||
	    symlinkat("/tmp", rootfd, "dev/shm") < 0)
		FAIL("make /dev links", NULL);
	if (mount("tmpfs", "/tmp/tmp", "tmpfs", MS_NOSUID | MS_NODEV, p->tmp_opts) < 0)
		FAIL("mount /tmp", p->tmp_opts);
	/* pivot_root(".", "."): the old root ends up on top of the new one, then goes. */
	if (fchdir(rootfd) < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
		FAIL("pivot_root", NULL);
	if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		FAIL("detach the old root", NULL);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID, NULL) < 0)
		FAIL("make / read-only", NULL);
	if (sethostname(p->hostname, strlen(p->hostname)) < 0)
		FAIL("sethostname", p->hostname);
	if (p->net_none) {
		struct ifreq ifr = {0};
		int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		memcpy(ifr.ifr_name, "lo", 3);
		if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0 ||
		    (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr) < 0)) {
			if (s >= 0)
				close(s);
			FAIL("bring up loopback", NULL);
		}
		close(s);
	}
	if (p->memory_limited) {
		/* the OOM killer should pick the command, not the pid 1 that reports on it */
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			(void)!write(fd, "-1000", 5);
			close(fd);
		}
	}
out:
	for (i = 0; i < p->n_entries; i++)
		if (trees[i] >= 0)
			close(trees[i]);
	if (rootfd >= 0)
		close(rootfd);
	return rc;
}

void cb_ns_write_oom(const struct cb_ns_plan *p, pid_t pid)
{
	char path[64];
	int fd;

	if (!p->oom_adj[0])
		return;
	snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)pid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, p->oom_adj, strlen(p->oom_adj));
		close(fd);
	}
}
