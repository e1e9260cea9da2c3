/* Hardening of the sandbox: its pid 1 gives up every privilege before the command starts
 * (rlimits, no_new_privs, capabilities), the command adds seccomp filters before execve. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/securebits.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "internal.h"

static struct sock_fprog seccomp_prog;
static int seccomp_rc;
static char seccomp_msg[256];
static pthread_once_t seccomp_once = PTHREAD_ONCE_INIT;

/* Syscalls refused with EPERM: mounting, kernel code and keys, tracing other processes,
 * kernel attack surface an agent's command has no use for. */
static const char *const denied[] = {
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "open_by_handle_at",
    "userfaultfd",
    "unshare",
    "setns",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "name_to_handle_at",
    /* io_uring's operations never pass through this filter: it would bypass all of it */
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    /* per-process segment descriptors: old attack surface, no use on x86-64 */
    "modify_ldt",
};

#if defined(__x86_64__)
#define CB_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define CB_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "the seccomp filter knows x86-64 and aarch64"
#endif

/* personality(2) may only query (0xffffffff) or set PER_LINUX (0): flags such as
 * READ_IMPLIES_EXEC or ADDR_NO_RANDOMIZE weaken the process's own memory protections.
 * libseccomp cannot test one argument against two values in one rule, so this is a second,
 * hand-written filter; the kernel takes the low 32 bits (the argument is an unsigned int). */
static struct sock_filter personality_insns[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CB_AUDIT_ARCH, 0, 7),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u), /* x32 numbers too */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 2, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
};
static const struct sock_fprog personality_prog = {
    .len = sizeof personality_insns / sizeof *personality_insns,
    .filter = personality_insns,
};

/* ctx as BPF in *prog; the program lives as long as the process (every sandbox uses it). */
static int export_filter(scmp_filter_ctx ctx, struct sock_fprog *prog)
{
	int fd = memfd_create("cowbox-seccomp", MFD_CLOEXEC), rc = 0;
	char *buf = NULL;
	struct stat st;
	if (fd < 0)
		return -errno;
	if ((rc = seccomp_export_bpf(ctx, fd)) < 0)
		goto out;
	if (fstat(fd, &st) < 0 || st.st_size <= 0 || !(buf = malloc((size_t)st.st_size))) {
		rc = -ENOMEM;
		goto out;
	}
	if (pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
		rc = -EIO;
		goto out;
	}
	prog->len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
	prog->filter = (struct sock_filter *)buf;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

static void build_filter(void)
{
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	int rc = 0;
	if (!ctx) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < sizeof denied / sizeof *denied; i++) {
		int nr = seccomp_syscall_resolve_name(denied[i]);
		if (nr == __NR_SCMP_ERROR)
			continue; /* not on this architecture */
		if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0)) < 0)
			goto out;
	}
	/* TIOCSTI pushes input into a terminal (CVE-2017-5226); TIOCLINUX can too. */
	if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
				   SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI))) < 0 ||
	    (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
				   SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX))) < 0)
		goto out;
	/* No new user namespaces (they would give back capabilities); clone3 hides its flags
	 * in memory, so it reports ENOSYS and libc falls back to clone. */
	if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
				   SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))) <
		0 ||
	    (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0)
		goto out;
	rc = export_filter(ctx, &seccomp_prog);
out:
	if (rc < 0)
		snprintf(seccomp_msg, sizeof seccomp_msg, "sandbox: build the seccomp filter: %s",
			 strerror(-rc));
	seccomp_rc = rc;
	if (ctx)
		seccomp_release(ctx);
}

/* The filter of a sandbox whose workspace keeps the host owner of what it makes (an
 * idmapped directory): no setuid bit, and no setgid bit, in a mode the command passes;
 * openat2 (whose mode hides in a struct) reports ENOSYS, so libc falls back to openat.
 * Written by hand: libseccomp takes milliseconds to compile it, once per `cowbox exec`. */
#ifdef __NR_chmod /* the old calls x86-64 still has, aarch64 not */
#define NR_CHMOD __NR_chmod
#define NR_CREAT __NR_creat
#define NR_MKNOD __NR_mknod
#define NR_OPEN	 __NR_open
#else
#define NR_CHMOD 0xffffffffu /* never a system call number */
#define NR_CREAT 0xffffffffu
#define NR_MKNOD 0xffffffffu
#define NR_OPEN	 0xffffffffu
#endif
#define NR_FCHMODAT2 452 /* Linux 6.6, one number on every architecture */
#define NR_OPENAT2   437

enum {
	S_ARCH,
	S_ARCH_OK,
	S_NR,
	S_X32,
	S_CHMOD,
	S_FCHMOD,
	S_CREAT,
	S_MKNOD,
	S_FCHMODAT,
	S_FCHMODAT2,
	S_OPEN,
	S_MKNODAT,
	S_OPENAT,
	S_OPENAT2,
	S_ARG1,
	S_ARG1_GO,
	S_ARG2,
	S_ARG2_GO,
	S_ARG3,
	S_CHECK,
	S_EPERM,
	S_ALLOW,
	S_ENOSYS,
	S_COUNT
};
#define TO(from, to)	       ((to) - (from)-1)
#define MODE_AT(insn, nr, arg) [insn] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, TO(insn, arg), 0)
#define ARG(n)		       offsetof(struct seccomp_data, args[n]) /* the low half: a mode_t */

static struct sock_filter setid_insns[S_COUNT] = {
    [S_ARCH] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
    [S_ARCH_OK] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CB_AUDIT_ARCH, 0, TO(S_ARCH_OK, S_ALLOW)),
    [S_NR] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
    [S_X32] = BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u),
    MODE_AT(S_CHMOD, NR_CHMOD, S_ARG1),
    MODE_AT(S_FCHMOD, __NR_fchmod, S_ARG1),
    MODE_AT(S_CREAT, NR_CREAT, S_ARG1),
    MODE_AT(S_MKNOD, NR_MKNOD, S_ARG1),
    MODE_AT(S_FCHMODAT, __NR_fchmodat, S_ARG2),
    MODE_AT(S_FCHMODAT2, NR_FCHMODAT2, S_ARG2),
    MODE_AT(S_OPEN, NR_OPEN, S_ARG2),
    MODE_AT(S_MKNODAT, __NR_mknodat, S_ARG2),
    MODE_AT(S_OPENAT, __NR_openat, S_ARG3),
    [S_OPENAT2] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_OPENAT2, TO(S_OPENAT2, S_ENOSYS),
			   TO(S_OPENAT2, S_ALLOW)),
    [S_ARG1] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(1)),
    [S_ARG1_GO] = BPF_STMT(BPF_JMP | BPF_JA, TO(S_ARG1_GO, S_CHECK)),
    [S_ARG2] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(2)),
    [S_ARG2_GO] = BPF_STMT(BPF_JMP | BPF_JA, TO(S_ARG2_GO, S_CHECK)),
    [S_ARG3] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(3)),
    [S_CHECK] = BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, S_ISUID | S_ISGID, TO(S_CHECK, S_EPERM),
			 TO(S_CHECK, S_ALLOW)),
    [S_EPERM] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    [S_ALLOW] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    [S_ENOSYS] = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
};
static struct sock_fprog setid_prog = {.len = S_COUNT, .filter = setid_insns};

int cb_ns_seccomp_prog(void **out)
{
	pthread_once(&seccomp_once, build_filter);
	if (seccomp_rc < 0)
		return cb_error_set(-seccomp_rc, "%s", seccomp_msg);
	*out = &seccomp_prog;
	return 0;
}

int cb_ns_seccomp_setid_prog(void **out)
{
	*out = &setid_prog;
	return 0;
}

/* What the command keeps in a user namespace: root's powers over the ids mapped there (its
 * workspace, its /tmp, its processes), nothing over the host's (whose ids are not mapped).
 * Not CAP_FSETID: a write must clear a set-id bit, also on a host owner's file in --dir. */
static const int userns_caps[] = {CAP_CHOWN,   CAP_DAC_OVERRIDE,     CAP_FOWNER,
				  CAP_KILL,    CAP_SETGID,	     CAP_SETUID,
				  CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT};

int cb_ns_drop_privileges(const struct cb_ns_plan *p, int ctl)
{
	unsigned long long keep = 0;
	for (size_t i = 0; p->userns && i < sizeof userns_caps / sizeof *userns_caps; i++)
		keep |= 1ULL << userns_caps[i];
	struct rlimit rl = {.rlim_cur = p->nofile, .rlim_max = p->nofile};
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
		cb_exec_child_error(ctl, "setrlimit RLIMIT_NOFILE", NULL, errno);
		return -1;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		cb_exec_child_error(ctl, "set no_new_privs", NULL, errno);
		return -1;
	}
	/* The bounding set first: as uid 0 an execve would otherwise regain everything. */
	for (int cap = 0; cap < 64; cap++)
		if (!(keep & (1ULL << cap)) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 &&
		    errno != EINVAL) {
			cb_exec_child_error(ctl, "drop the capability bounding set", NULL, errno);
			return -1;
		}
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	/* Host uid 0 gets nothing back at execve; in a user namespace root keeps the set above
	 * (no_new_privs caps it there) and a switch to another uid drops it, as usual. */
	if (!p->userns && prctl(PR_SET_SECUREBITS,
				SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
				    SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED,
				0, 0, 0) < 0) {
		cb_exec_child_error(ctl, "set securebits", NULL, errno);
		return -1;
	}
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof data);
	data[0].permitted = data[0].effective = (unsigned)keep;
	data[1].permitted = data[1].effective = (unsigned)(keep >> 32);
	if (syscall(SYS_capset, &hdr, data) < 0) {
		cb_exec_child_error(ctl, "drop capabilities", NULL, errno);
		return -1;
	}
	return 0;
}

void cb_ns_shed_privileges(void)
{
	for (int cap = 0; cap < 64; cap++)
		prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof data);
	syscall(SYS_capset, &hdr, data);
}

int cb_ns_harden(const struct cb_ns_plan *p, int ctl)
{
	umask(022);
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, p->seccomp_prog, 0, 0) < 0 ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &personality_prog, 0, 0) < 0 ||
	    (p->setid_prog &&
	     prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, p->setid_prog, 0, 0) < 0)) {
		cb_exec_child_error(ctl, "load the seccomp filter", NULL, errno);
		return -1;
	}
	return 0;
}

/* "/proc/self/fd/N" after out (no stdio: the sandbox's child between clone and exec). */
static char *fd_path(char *out, int fd)
{
	char digits[12];
	size_t n = 0;

	memcpy(out, "/proc/self/fd/", 14);
	out += 14;
	do
		digits[n++] = (char)('0' + fd % 10);
	while ((fd /= 10) > 0);
	while (n)
		*out++ = digits[--n];
	*out = 0;
	return out;
}

/* Why an overlay: mountinfo's fourth field is the path of the mount's root dentry from its
 * superblock's root, whatever mount it was cloned from, so a bind of /srv/data/x shows
 * "/srv/data/x" however it is made (open_tree, move_mount, idmapped or not). Only a
 * filesystem whose own root is the directory shows "/": an overlay, whose options name the
 * layers as given, here by this process's fds. */
int cb_ns_hide_bind(int rootfd, const char *dst)
{
	char opts[96], path[4096] = "/tmp/";
	int fs = -1, empty = -1, ov = -1, lower, rc = 1, err = 0;

	/* the bind as attached here: a layer must be a mount of this namespace (a tree cloned
	 * before clone is another's, and another user namespace's) */
	lower = openat(rootfd, dst, O_PATH | O_DIRECTORY | O_CLOEXEC);
	fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
	if (lower < 0 || fs < 0 ||
	    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "size", "4k", 0) < 0 ||
	    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
	    syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
	    (empty = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY)) < 0)
		goto out;
	close(fs);
	/* an overlay without an upper layer needs two lower ones: the empty one second */
	*fd_path(opts, lower) = ':';
	fd_path(strchr(opts, ':') + 1, empty);
	if ((fs = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC)) < 0 ||
	    syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "lowerdir", opts, 0) < 0 ||
	    syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
	    (ov = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
			       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)) < 0)
		goto out;
	/* the overlay holds a private clone of the layer: the bind itself goes */
	strncat(path, dst, sizeof path - 6);
	rc = -1;
	if (umount2(path, MNT_DETACH) == 0 &&
	    syscall(SYS_move_mount, ov, "", rootfd, dst, MOVE_MOUNT_F_EMPTY_PATH) == 0)
		rc = 0;
	err = errno;
out:
	if (rc > 0)
		err = errno;
	if (lower >= 0)
		close(lower);
	if (fs >= 0)
		close(fs);
	if (empty >= 0)
		close(empty);
	if (ov >= 0)
		close(ov);
	errno = err;
	return rc;
}

int cb_ns_copy_file(int tree, int rootfd, const char *dst)
{
	static const char name[] = ".cowbox-copy";
	char buf[8192], path[4096] = "/tmp/", from[32];
	int in, out = -1, rc = -1, err;
	ssize_t n = 0;

	*fd_path(from, tree) = 0;
	in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0 ||
	    (out = openat(rootfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444)) < 0)
		goto out;
	while ((n = read(in, buf, sizeof buf)) > 0)
		for (char *b = buf; n > 0;) {
			ssize_t w = write(out, b, (size_t)n);
			if (w < 0)
				goto out;
			b += w;
			n -= w;
		}
	if (n < 0)
		goto out;
	strncat(path, dst, sizeof path - 6);
	/* read-only, or the sandbox's root (the copy's owner) could chmod and change it */
	if (mount("/tmp/.cowbox-copy", path, NULL, MS_BIND, NULL) == 0 &&
	    mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
		  NULL) == 0)
		rc = 0;
out:
	err = errno;
	if (in >= 0)
		close(in);
	if (out >= 0) {
		close(out);
		unlinkat(rootfd, name, 0);
	}
	errno = err;
	return rc;
}
