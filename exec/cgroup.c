/* cgroups of a command: a sandbox's limits (cpus, memory, pids) in v2 or v1, and the plain v2
 * group a host command lives in so its whole tree can be frozen and killed at once. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "internal.h"

enum { CG_MEMORY, CG_CPU, CG_PIDS, CG_N };
static const char *const cg_names[CG_N] = {"memory", "cpu", "pids"};

struct cb_cgroup {
	char *dir[CG_N]; /* v1: NULL when that limit was not asked for */
	char *v2dir;	 /* v2 (delegated controllers, or a host command's group), else NULL */
	int dirfd;	 /* host command group: its directory, for the shim; else -1 */
};

/* Where this process's group of a controller is: the hierarchy's mount point (from
 * mountinfo) joined with our path in it (from /proc/self/cgroup). */
static int controller_dir(const char *ctrl, char *out, size_t cap)
{
	char line[4096], mnt[1024] = "", self[2048] = "";
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof line, f)) {
		char *dash = strstr(line, " - cgroup ");
		if (!dash)
			continue;
		char *opts = strrchr(dash, ' ');
		char want[64];
		snprintf(want, sizeof want, ",%s,", ctrl);
		char optbuf[1024];
		snprintf(optbuf, sizeof optbuf, ",%s", opts ? opts + 1 : "");
		optbuf[strcspn(optbuf, "\n")] = 0;
		strncat(optbuf, ",", sizeof optbuf - strlen(optbuf) - 1);
		if (!strstr(optbuf, want))
			continue;
		/* field 5 is the mount point */
		char *s = line;
		for (int i = 0; i < 4 && s; i++)
			s = strchr(s + 1, ' ');
		if (s && sscanf(s + 1, "%1023s", mnt) == 1)
			break;
	}
	fclose(f);
	if (!mnt[0])
		return -ENOENT;
	f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof line, f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = 0;
		char list[512];
		snprintf(list, sizeof list, ",%s,", c1 + 1);
		char want[64];
		snprintf(want, sizeof want, ",%s,", ctrl);
		if (strstr(list, want)) {
			snprintf(self, sizeof self, "%s", c2 + 1);
			self[strcspn(self, "\n")] = 0;
			break;
		}
	}
	fclose(f);
	snprintf(out, cap, "%s%s", mnt, strcmp(self, "/") ? self : "");
	return 0;
}

static int write_value(const char *dir, const char *file, const char *value)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return cb_error_set(errno, "cgroup: open %s: %s", path, strerror(errno));
	ssize_t n = write(fd, value, strlen(value));
	int err = errno;
	close(fd);
	if (n < 0)
		return cb_error_set(err, "cgroup: write %s to %s: %s", value, path, strerror(err));
	return 0;
}

static int wanted(const struct cb_sandbox *sb, int c)
{
	return c == CG_MEMORY ? sb->memory_mb > 0 : c == CG_CPU ? sb->cpus > 0 : sb->pids > 0;
}

/* Our group in the unified (v2) hierarchy when every wanted controller is delegated to its
 * children (listed in its cgroup.subtree_control); -ENOENT otherwise. */
static int v2_group(char *out, size_t cap)
{
	char line[4096], mnt[1024] = "", self[2048] = "";
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	while (!mnt[0] && fgets(line, sizeof line, f)) {
		char *s = line;
		if (!strstr(line, " - cgroup2 "))
			continue;
		for (int i = 0; i < 4 && s; i++)
			s = strchr(s + 1, ' ');
		if (!s || sscanf(s + 1, "%1023s", mnt) != 1)
			mnt[0] = 0;
	}
	fclose(f);
	if (!mnt[0] || !(f = fopen("/proc/self/cgroup", "re")))
		return -ENOENT;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "0::", 3)) {
			line[strcspn(line, "\n")] = 0;
			if (strlen(line + 3) < sizeof self)
				strcpy(self, line + 3);
		}
	fclose(f);
	snprintf(out, cap, "%s%s", mnt, strcmp(self, "/") ? self : "");
	return 0;
}

static int v2_base(const struct cb_sandbox *sb, char *out, size_t cap)
{
	char line[4096], ctl[512] = "";
	FILE *f;
	int rc = v2_group(out, cap);
	if (rc < 0)
		return rc;
	snprintf(line, sizeof line, "%s/cgroup.subtree_control", out);
	if (!(f = fopen(line, "re")))
		return -ENOENT;
	if (!fgets(ctl, sizeof ctl, f))
		ctl[0] = 0;
	fclose(f);
	ctl[strcspn(ctl, "\n")] = 0;
	for (int c = 0; c < CG_N; c++) {
		char want[32], list[600];
		snprintf(want, sizeof want, " %s ", cg_names[c]);
		snprintf(list, sizeof list, " %s ", ctl);
		if (wanted(sb, c) && !strstr(list, want))
			return -ENOENT;
	}
	return 0;
}

/* Set controller c's limit in dir, in the v1 or v2 spelling. */
static int write_limit(const struct cb_sandbox *sb, int c, const char *dir, int v2)
{
	char value[64], path[2400];
	int rc;
	if (c == CG_MEMORY) {
		snprintf(value, sizeof value, "%lu", sb->memory_mb << 20);
		if ((rc = write_value(dir, v2 ? "memory.max" : "memory.limit_in_bytes", value)) < 0)
			return rc;
		/* no swapping around the cap, where swap is accounted */
		snprintf(path, sizeof path, "%s/%s", dir,
			 v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes");
		if (access(path, F_OK) == 0)
			write_value(dir, v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes",
				    v2 ? "0" : value);
		return 0;
	}
	if (c == CG_CPU) {
		long quota = (long)(sb->cpus * 100000);
		if (v2) {
			snprintf(value, sizeof value, "%ld 100000", quota);
			return write_value(dir, "cpu.max", value);
		}
		snprintf(value, sizeof value, "%ld", quota);
		if ((rc = write_value(dir, "cpu.cfs_period_us", "100000")) < 0)
			return rc;
		return write_value(dir, "cpu.cfs_quota_us", value);
	}
	snprintf(value, sizeof value, "%lu", sb->pids);
	return write_value(dir, "pids.max", value);
}

/* Makes the group DIR (a name under cowbox/ with our pid and a per-process counter in it).
 * A group of that name can only be left by a dead process whose pid we now have: such a
 * group is removed when empty, and skipped for a suffixed name when its processes linger, so
 * a recycled pid never fails a command. Returns 0 with DIR holding the name made, or -errno. */
static int claim_group(char *dir, size_t cap)
{
	size_t len = strlen(dir);
	for (int attempt = 0; attempt < 8; attempt++) {
		if (attempt)
			snprintf(dir + len, cap - len, ".%d", attempt);
		if (mkdir(dir, 0755) == 0)
			return 0;
		if (errno != EEXIST)
			break;
		if (rmdir(dir) == 0 && mkdir(dir, 0755) == 0)
			return 0;
	}
	return -errno;
}

/* v2: one group for all controllers, under a cowbox/ that delegates them. */
static int create_v2(const struct cb_sandbox *sb, const char *base, unsigned id,
		     struct cb_cgroup *cg)
{
	char dir[2300], enable[64] = "";
	int rc;
	snprintf(dir, sizeof dir, "%s/cowbox", base);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return cb_error_set(errno, "cgroup: mkdir %s: %s", dir, strerror(errno));
	for (int c = 0; c < CG_N; c++)
		if (wanted(sb, c)) {
			strcat(enable, enable[0] ? " +" : "+");
			strcat(enable, cg_names[c]);
		}
	if ((rc = write_value(dir, "cgroup.subtree_control", enable)) < 0)
		return rc;
	snprintf(dir, sizeof dir, "%s/cowbox/%d-%u", base, (int)getpid(), id);
	if ((rc = claim_group(dir, sizeof dir)) < 0)
		return cb_error_set(-rc, "cgroup: mkdir %s: %s", dir, strerror(-rc));
	if (!(cg->v2dir = strdup(dir))) {
		rmdir(dir);
		return cb_error_set(ENOMEM, "cgroup: out of memory");
	}
	for (int c = 0; c < CG_N; c++)
		if (wanted(sb, c) && (rc = write_limit(sb, c, dir, 1)) < 0)
			return rc;
	return 0;
}

int cb_cgroup_create(const struct cb_sandbox *sb, struct cb_cgroup **out)
{
	static unsigned counter;
	int rc = 0;
	*out = NULL;
	if (!(sb->cpus > 0) && !sb->memory_mb && !sb->pids)
		return 0;
	struct cb_cgroup *cg = calloc(1, sizeof *cg);
	if (!cg)
		return cb_error_set(ENOMEM, "cgroup: out of memory");
	cg->dirfd = -1;
	unsigned id = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
	char base[2048];
	if (v2_base(sb, base, sizeof base) == 0) {
		if ((rc = create_v2(sb, base, id, cg)) < 0)
			goto out;
		goto done;
	}
	for (int c = 0; c < CG_N; c++) {
		char dir[2300];
		if (!wanted(sb, c))
			continue;
		if ((rc = controller_dir(cg_names[c], base, sizeof base)) < 0) {
			rc = cb_error_set(-rc, "cgroup: no %s hierarchy to put the limit in: %s",
					  cg_names[c], strerror(-rc));
			goto out;
		}
		snprintf(dir, sizeof dir, "%s/cowbox", base);
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			rc = cb_error_set(errno, "cgroup: mkdir %s: %s", dir, strerror(errno));
			goto out;
		}
		snprintf(dir, sizeof dir, "%s/cowbox/%d-%u", base, (int)getpid(), id);
		if ((rc = claim_group(dir, sizeof dir)) < 0) {
			rc = cb_error_set(-rc, "cgroup: mkdir %s: %s", dir, strerror(-rc));
			goto out;
		}
		if (!(cg->dir[c] = strdup(dir))) {
			rmdir(dir);
			rc = cb_error_set(ENOMEM, "cgroup: out of memory");
			goto out;
		}
		if ((rc = write_limit(sb, c, dir, 0)) < 0)
			goto out;
	}
done:
	*out = cg;
	cg = NULL;
out:
	cb_cgroup_destroy(cg);
	return rc;
}

int cb_cgroup_attach(struct cb_cgroup *cg, pid_t pid)
{
	char value[32];
	snprintf(value, sizeof value, "%d", (int)pid);
	if (cg->v2dir)
		return write_value(cg->v2dir, "cgroup.procs", value);
	for (int c = 0; c < CG_N; c++) {
		int rc;
		if (cg->dir[c] && (rc = write_value(cg->dir[c], "cgroup.procs", value)) < 0)
			return rc;
	}
	return 0;
}

int cb_cgroup_oom_killed(struct cb_cgroup *cg)
{
	char path[2400], line[128];
	long long kills = 0;
	if (!cg || (!cg->dir[CG_MEMORY] && !cg->v2dir))
		return 0;
	if (cg->v2dir)
		snprintf(path, sizeof path, "%s/memory.events", cg->v2dir);
	else
		snprintf(path, sizeof path, "%s/memory.oom_control", cg->dir[CG_MEMORY]);
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "oom_kill %lld", &kills) == 1)
			break;
	fclose(f);
	return kills > 0;
}

static void remove_group(char *dir)
{
	if (!dir)
		return;
	/* the last processes may take a moment to leave after the namespace died */
	for (int i = 0; i < 200 && rmdir(dir) < 0 && errno == EBUSY; i++) {
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
	free(dir);
}

void cb_cgroup_destroy(struct cb_cgroup *cg)
{
	if (!cg)
		return;
	if (cg->dirfd >= 0)
		close(cg->dirfd);
	for (int c = 0; c < CG_N; c++)
		remove_group(cg->dir[c]);
	remove_group(cg->v2dir);
	free(cg);
}

/* Where host groups go: cowbox/ under our own v2 group, found once per process (a walk of
 * mountinfo per command would cost more than the group itself). Empty: no usable v2. */
static char host_base[2300];

static void find_host_base(void)
{
	char own[2048];
	if (v2_group(own, sizeof own) < 0)
		return;
	char dir[2300];
	snprintf(dir, sizeof dir, "%s/cowbox", own);
	if (mkdir(dir, 0755) < 0 && errno != EEXIST)
		return;
	snprintf(host_base, sizeof host_base, "%s", dir);
}

int cb_cgroup_host_create(struct cb_cgroup **out)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	static unsigned counter;
	char dir[2400];
	*out = NULL;
	/* COWBOX_EXEC_CGROUP=0 keeps host commands out of cgroups (the tests exercise the
	 * /proc-walk kill with it, as on hosts without a writable v2 hierarchy) */
	const char *use = getenv("COWBOX_EXEC_CGROUP");
	if (use && !strcmp(use, "0"))
		return 0;
	pthread_once(&once, find_host_base);
	if (!host_base[0])
		return 0;
	unsigned id = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
	snprintf(dir, sizeof dir, "%s/host-%d-%u", host_base, (int)getpid(), id);
	if (claim_group(dir, sizeof dir) < 0)
		return 0; /* not ours to manage (read-only, no permission): the /proc walk serves */
	struct cb_cgroup *cg = calloc(1, sizeof *cg);
	if (!cg || !(cg->v2dir = strdup(dir))) {
		free(cg);
		rmdir(dir);
		return cb_error_set(ENOMEM, "cgroup: out of memory");
	}
	cg->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cg->dirfd < 0) {
		int err = errno;
		cb_cgroup_destroy(cg);
		return cb_error_set(err, "cgroup: open %s: %s", dir, strerror(err));
	}
	*out = cg;
	return 0;
}

int cb_cgroup_dirfd(const struct cb_cgroup *cg)
{
	return cg ? cg->dirfd : -1;
}
