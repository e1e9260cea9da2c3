/* The vm backend's boot material: the cache setup-vm fills, whether KVM works here, the agent
 * binary and the initrd made of it, and the qemu a crashed daemon left. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "vm.h"

/* See vm.h. */
const char *vm_cache(void)
{
	const char *c = getenv("COWBOX_IMAGE_CACHE");

	return c && *c ? c : "/var/cache/cowbox";
}

/* Where a daemon notes that KVM opened but did not boot the guest (nested virtualisation
 * that runs a test instruction and hangs in the firmware): the host's boot id, so that a
 * reboot probes again. */
static void vm_kvm_marker(char *path, size_t size, char *boot_id, size_t id_size)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

	boot_id[0] = 0;
	if (f) {
		if (fgets(boot_id, (int)id_size, f))
			boot_id[strcspn(boot_id, "\n")] = 0;
		fclose(f);
	}
	snprintf(path, size, "%s/vm/kvm.broken", vm_cache());
}

static int vm_kvm_marked_broken(void)
{
	char path[4200], id[64], seen[64] = "";
	FILE *f;

	vm_kvm_marker(path, sizeof(path), id, sizeof(id));
	if (!(f = fopen(path, "re")))
		return 0;
	if (fgets(seen, sizeof(seen), f))
		seen[strcspn(seen, "\n")] = 0;
	fclose(f);
	return *id && !strcmp(id, seen);
}

void vm_kvm_mark_broken(void)
{
	char path[4200], id[64];
	FILE *f;

	vm_kvm_marker(path, sizeof(path), id, sizeof(id));
	if ((f = fopen(path, "we"))) {
		fprintf(f, "%s\n", id);
		fclose(f);
	}
}

/* MSR_IA32_ARCH_CAPABILITIES: qemu's `-cpu host` copies the value /dev/kvm reports for it
 * into every vCPU and aborts when KVM refuses it ("failed to set MSR 0x10a"), as some nested
 * hosts' KVM does with its own value. */
#define VM_MSR_ARCH_CAPABILITIES 0x10a

/* Whether a vCPU takes what qemu will set on it: a vCPU is made, and the feature MSRs qemu
 * copies from the host are set on it with the values /dev/kvm itself reports. */
static int vm_kvm_vcpu_ok(int kvm, int vm)
{
	struct {
		struct kvm_msrs head;
		struct kvm_msr_entry entry[1];
	} msrs = {.head.nmsrs = 1, .entry[0].index = VM_MSR_ARCH_CAPABILITIES};
	int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0), ok = 0;

	if (vcpu < 0)
		return 0;
	/* a host that has no such feature MSR gives qemu none to set: nothing to refuse */
	if (ioctl(kvm, KVM_GET_MSRS, &msrs) != 1)
		ok = 1;
	else
		ok = ioctl(vcpu, KVM_SET_MSRS, &msrs) == 1;
	close(vcpu);
	return ok;
}

static long vm_tsc_khz = 2000000;

static double vm_mono_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void vm_measure_tsc(void)
{
#if defined(__x86_64__) || defined(__i386__)
	struct timespec nap = {0, 20000000};
	double t0 = vm_mono_seconds();
	unsigned long long c0 = __rdtsc();
	double t1;
	unsigned long long c1;

	while (nanosleep(&nap, &nap) < 0 && errno == EINTR)
		;
	c1 = __rdtsc();
	t1 = vm_mono_seconds();
	/* a result far from any real TSC (a stopped or virtualised-away counter) is no answer */
	if (t1 > t0 && c1 > c0) {
		double khz = (double)(c1 - c0) / (t1 - t0) / 1000.0;

		if (khz > 100000.0 && khz < 10000000.0)
			vm_tsc_khz = (long)(khz + 0.5);
	}
#endif
}

long vm_host_tsc_khz(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, vm_measure_tsc);
	return vm_tsc_khz;
}

/* Whether to boot with KVM: COWBOX_VM_ACCEL=tcg says no, =kvm yes where /dev/kvm makes a VM
 * (qemu then says why it fails); else /dev/kvm must open, make a VM and a vCPU that takes the
 * host's own feature MSRs (a device node alone proves nothing: a container may show one it cannot
 * use, a nested host one whose vCPUs refuse qemu), and no daemon since the host's boot may have
 * seen it fail to boot the guest. */
int vm_kvm_usable(void)
{
	const char *want = getenv("COWBOX_VM_ACCEL");
	int fd, vm = -1, ok = 0, forced = 0;

	if (want && !strcmp(want, "tcg"))
		return 0;
	if (want && !strcmp(want, "kvm"))
		forced = 1;
	else if (vm_kvm_marked_broken())
		return 0;
	fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd >= 0 && ioctl(fd, KVM_GET_API_VERSION, 0) == KVM_API_VERSION &&
	    (vm = ioctl(fd, KVM_CREATE_VM, 0)) >= 0)
		ok = forced || vm_kvm_vcpu_ok(fd, vm);
	if (vm >= 0)
		close(vm);
	if (fd >= 0)
		close(fd);
	return ok;
}

/* The agent binary: COWBOX_VM_AGENT, else beside the cowbox binary (a build tree's
 * backends/, libtool's .libs/.., or libexec). */
int vm_find_agent(char **out)
{
	const char *env = getenv("COWBOX_VM_AGENT");
	char self[4096], *dir;
	const char *tries[] = {"%s/backends/cb-vm-agent", "%s/../backends/cb-vm-agent",
			       "%s/../libexec/cowbox/cb-vm-agent", "%s/cb-vm-agent"};
	ssize_t n;

	*out = NULL;
	if (env && *env)
		return (*out = strdup(env)) ? 0 : cb_error_set(ENOMEM, "vm: out of memory");
	if ((n = readlink("/proc/self/exe", self, sizeof(self) - 1)) < 0)
		return cb_error_set(errno, "vm backend: readlink /proc/self/exe");
	self[n] = 0;
	dir = dirname(self);
	for (size_t i = 0; i < sizeof(tries) / sizeof(*tries); i++) {
		char *p;

		if (asprintf(&p, tries[i], dir) < 0)
			return cb_error_set(ENOMEM, "vm: out of memory");
		if (access(p, X_OK) == 0) {
			*out = p;
			return 0;
		}
		free(p);
	}
	return cb_error_set(ENOENT, "vm backend: no cb-vm-agent beside %s (set COWBOX_VM_AGENT)",
			    dir);
}

static int vm_copy(int to, const char *path)
{
	char buf[65536];
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
	ssize_t n;

	if (fd < 0)
		return cb_error_set(errno, "vm backend: %s (run scripts/setup-vm)", path);
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		if (write(to, buf, (size_t)n) != n) {
			rc = cb_error_set(EIO, "vm backend: writing the initrd");
			break;
		}
	if (n < 0)
		rc = cb_error_set(errno, "vm backend: read %s", path);
	close(fd);
	return rc;
}

/* One newc cpio entry (the header, the name, padding to 4 bytes). */
static int vm_cpio_head(FILE *f, const char *name, unsigned mode, size_t size)
{
	size_t nl = strlen(name) + 1;

	fprintf(f, "070701%08X%08X%08X%08X%08X%08X%08zX%08X%08X%08X%08X%08zX%08X", 1u, mode, 0u, 0u,
		1u, 0u, size, 0u, 0u, 0u, 0u, nl, 0u);
	fwrite(name, 1, nl, f);
	for (size_t i = (110 + nl) % 4; i && i < 4; i++)
		fputc(0, f);
	return 0;
}

/* The initrd: setup-vm's modules cpio (gzip), zero-padded to 512 bytes, then an uncompressed
 * cpio with the agent as /init. Made per boot, so a rebuilt agent is what boots. */
int vm_make_initrd(const char *agent, const char *path)
{
	char mods[4096];
	FILE *f = NULL;
	struct stat st;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), afd = -1, rc;
	off_t end;

	if (fd < 0)
		return cb_error_set(errno, "vm backend: create %s", path);
	snprintf(mods, sizeof(mods), "%s/vm/modules.cpio.gz", vm_cache());
	if ((rc = vm_copy(fd, mods)) < 0)
		goto out;
	end = lseek(fd, 0, SEEK_END);
	if (end % 512 && ftruncate(fd, end + (512 - end % 512)) < 0) {
		rc = cb_error_set(errno, "vm backend: pad the initrd");
		goto out;
	}
	lseek(fd, 0, SEEK_END);
	if ((afd = open(agent, O_RDONLY | O_CLOEXEC)) < 0 || fstat(afd, &st) < 0) {
		rc = cb_error_set(errno, "vm backend: %s", agent);
		goto out;
	}
	if (!(f = fdopen(fd, "w"))) {
		rc = cb_error_set(errno, "vm backend: fdopen");
		goto out;
	}
	fd = -1;
	vm_cpio_head(f, "init", 0100755, (size_t)st.st_size);
	fflush(f);
	if ((rc = vm_copy(fileno(f), agent)) < 0)
		goto out;
	for (off_t i = st.st_size; i % 4; i++)
		fputc(0, f);
	vm_cpio_head(f, "TRAILER!!!", 0, 0);
	if (ferror(f))
		rc = cb_error_set(EIO, "vm backend: writing %s", path);
out:
	if (f && fclose(f) != 0 && !rc)
		rc = cb_error_set(EIO, "vm backend: writing %s", path);
	if (fd >= 0)
		close(fd);
	if (afd >= 0)
		close(afd);
	return rc;
}

/* A qemu a crashed daemon left (its pid file, and its command line naming our directory). */
void vm_kill_leftover(const char *dir)
{
	char path[4200], cmd[8192];
	FILE *f;
	int pid = 0, fd;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/qemu.pid", dir);
	if (!(f = fopen(path, "re")))
		return;
	if (fscanf(f, "%d", &pid) != 1)
		pid = 0;
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	if (pid > 1 && (fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
		n = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		for (ssize_t i = 0; i < n; i++)
			cmd[i] = cmd[i] ? cmd[i] : ' ';
		cmd[n > 0 ? n : 0] = 0;
		if (strstr(cmd, "qemu-system") && strstr(cmd, dir))
			kill(pid, SIGKILL);
	}
	snprintf(path, sizeof(path), "%s/qemu.pid", dir);
	unlink(path);
}

const char *cb_backend_vm_accel(void)
{
	return vm_kvm_usable() ? "kvm" : "tcg";
}
