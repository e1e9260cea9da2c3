/* cgroup limits of a sandbox (cpus, memory, pids): one group per command under a cowbox/
 * child of this process's own group in each v1 hierarchy, removed when the command is done. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
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
	char *dir[CG_N]; /* NULL: that limit was not asked for */
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
	unsigned id = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
	for (int c = 0; c < CG_N; c++) {
		char base[2048], dir[2300], value[64];
		if ((c == CG_MEMORY && !sb->memory_mb) || (c == CG_CPU && !(sb->cpus > 0)) ||
		    (c == CG_PIDS && !sb->pids))
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
		if (mkdir(dir, 0755) < 0) {
			rc = cb_error_set(errno, "cgroup: mkdir %s: %s", dir, strerror(errno));
			goto out;
		}
		if (!(cg->dir[c] = strdup(dir))) {
			rmdir(dir);
			rc = cb_error_set(ENOMEM, "cgroup: out of memory");
			goto out;
		}
		if (c == CG_MEMORY) {
			snprintf(value, sizeof value, "%lu", sb->memory_mb << 20);
			if ((rc = write_value(dir, "memory.limit_in_bytes", value)) < 0)
				goto out;
			char sw[2400];
			snprintf(sw, sizeof sw, "%s/memory.memsw.limit_in_bytes", dir);
			if (access(sw, F_OK) == 0) /* only with swap accounting */
				write_value(dir, "memory.memsw.limit_in_bytes", value);
		} else if (c == CG_CPU) {
			snprintf(value, sizeof value, "%ld", (long)(sb->cpus * 100000));
			if ((rc = write_value(dir, "cpu.cfs_period_us", "100000")) < 0 ||
			    (rc = write_value(dir, "cpu.cfs_quota_us", value)) < 0)
				goto out;
		} else {
			snprintf(value, sizeof value, "%lu", sb->pids);
			if ((rc = write_value(dir, "pids.max", value)) < 0)
				goto out;
		}
	}
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
	if (!cg || !cg->dir[CG_MEMORY])
		return 0;
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

void cb_cgroup_destroy(struct cb_cgroup *cg)
{
	if (!cg)
		return;
	for (int c = 0; c < CG_N; c++) {
		if (!cg->dir[c])
			continue;
		/* the last processes may take a moment to leave after the namespace died */
		for (int i = 0; i < 200 && rmdir(cg->dir[c]) < 0 && errno == EBUSY; i++) {
			struct timespec ts = {0, 5000000};
			nanosleep(&ts, NULL);
		}
		free(cg->dir[c]);
	}
	free(cg);
}
