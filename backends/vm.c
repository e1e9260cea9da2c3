/* The vm backend: a qemu micro-VM per workspace, booted on first use with Debian's kernel and
 * our agent as PID 1; the workspace's FUSE mount is its 9p share, commands go through the relay. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "cowbox/error.h"
#include "cowbox/image.h"
#include "cowbox/workspace.h"
#include "vm.h"
#include "vm_frame.h"

#define VM_PORT_NAME	     "org.cowbox.agent"
#define VM_DEFAULT_BOOT_SECS 300.0 /* TCG on a loaded host: tens of seconds */
#define VM_KVM_BOOT_SECS     20.0  /* KVM boots in about one: longer is KVM that does not work */
#define VM_DEFAULT_MEMORY_MB 2048  /* memory_mb set to none: the guest needs some */

static char vm_rootfs[4200];

static void vm_rootfs_init(void)
{
	snprintf(vm_rootfs, sizeof(vm_rootfs), "%s/rootfs-bookworm", vm_cache());
}

/* The debootstrap tree scripts/setup-podman makes, what vm_create boots without an image. */
static const char *vm_default_image(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, vm_rootfs_init);
	return vm_rootfs;
}

static void *vm_qemu_wait(void *arg)
{
	struct vm_state *s = arg;

	cb_exec_wait(s->qemu, &s->qemu_res);
	pthread_mutex_lock(&s->lock);
	s->dead = 1;
	pthread_mutex_unlock(&s->lock);
	if (s->relay_started)
		vm_relay_wake(s);
	return NULL;
}

#define ARG(x) (argv[n++] = (x))

/* The volumes' shares, and where the agent mounts them (cowbox.vol=N,ro|rw,PATH on the
 * kernel command line, PATH %-escaped past [A-Za-z0-9/._-]: the command line splits on
 * spaces). A read-only one is read-only in qemu too; a writable one keeps the guest's owners
 * and modes in xattrs (mapped-xattr), so that the guest's root makes no setuid or root-owned
 * file on the host: what it makes is qemu's user's, 0644 or 0755. */
struct vm_volumes {
	char fsdev[CB_BACKEND_MAX_VOLUMES][4400];
	char device[CB_BACKEND_MAX_VOLUMES][96];
};

static int vm_volume_args(struct cb_backend *b, int mmio, struct vm_volumes *v, char *append,
			  size_t size)
{
	size_t len = strlen(append);

	for (size_t i = 0; i < b->opt.n_volumes; i++) {
		const struct cb_backend_volume *vol = &b->opt.volumes[i];
		/* qemu opens it by path: checked here (no symlink on the way, the directory it
		 * named when given), the window until qemu opens it remains */
		int vfd = cb_backend_volume_open(vol);

		if (vfd < 0)
			return vfd;
		close(vfd);

		snprintf(v->fsdev[i], sizeof(v->fsdev[i]), "local,id=fsv%zu,path=%s,%s", i,
			 vol->src,
			 vol->writable ? "security_model=mapped-xattr,fmode=0644,dmode=0755"
				       : "security_model=none,readonly=on");
		snprintf(v->device[i], sizeof(v->device[i]), "%s,fsdev=fsv%zu,mount_tag=vol%zu",
			 mmio ? "virtio-9p-device" : "virtio-9p-pci", i, i);
		len += (size_t)snprintf(append + len, len < size ? size - len : 0,
					" cowbox.vol=%zu,%s,", i, vol->writable ? "rw" : "ro");
		for (const unsigned char *c = (const unsigned char *)vol->dst; *c && len < size;
		     c++)
			len += (size_t)snprintf(
			    append + len, size - len,
			    strchr("/._-", *c) || (*c < 128 && isalnum(*c)) ? "%c" : "%%%02x", *c);
		if (len >= size)
			return cb_error_set(EINVAL, "backend option volumes: the guest paths are "
						    "longer than the kernel command line takes");
	}
	return 0;
}

/* Start qemu under the runner (its own session; a tree the runner can end). */
static int vm_start_qemu(struct cb_backend *b, struct vm_state *s, const char *rootfs)
{
	struct cb_backend_limits lim;
	struct cb_exec_spec spec = {0};
	char smp[32], mem[32], kernel[4200], initrd[4200], serial[4200], pidf[4200], chardev[4300];
	char fsroot[4300], fsws[4300], fshome[4300], home[4200], append[2048], netdev[160];
	const char *machine = getenv("COWBOX_VM_MACHINE");
	struct vm_volumes *vols = NULL;
	char *argv[72 + 4 * CB_BACKEND_MAX_VOLUMES];
	int n = 0, mmio, rc;
	static char *env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", NULL};

	if (!machine || !*machine)
		machine = s->kvm ? "microvm" : "q35";
	mmio = !strncmp(machine, "microvm", 7);
	cb_backend_limits_of(&b->opt, &lim);
	snprintf(smp, sizeof(smp), "%d", b->opt.cpus > 0 ? (int)ceil(b->opt.cpus) : 1);
	snprintf(mem, sizeof(mem), "%lu", lim.memory_mb ? lim.memory_mb : VM_DEFAULT_MEMORY_MB);
	/* the unpacked kernel when setup-vm made it: qemu enters it at its PVH entry, and the
	 * bzImage's decompression is gone (under TCG most of a boot: 17 s to 8) */
	snprintf(kernel, sizeof(kernel), "%s/vm/vmlinux", vm_cache());
	if (access(kernel, R_OK) < 0)
		snprintf(kernel, sizeof(kernel), "%s/vm/vmlinuz", vm_cache());
	snprintf(initrd, sizeof(initrd), "%s/initrd", s->dir);
	snprintf(serial, sizeof(serial), "file:%s/console.log", s->dir);
	snprintf(pidf, sizeof(pidf), "%s/qemu.pid", s->dir);
	snprintf(chardev, sizeof(chardev), "socket,id=agent,path=%s/agent.sock,server=on,wait=off",
		 s->sockdir);
	/* The root tree is read-only to the guest (an overlay on tmpfs above it); the
	 * workspace and home keep the guest's owners and modes as the host's (passthrough). */
	snprintf(fsroot, sizeof(fsroot), "local,id=fsroot,path=%s,security_model=none,readonly=on",
		 rootfs);
	snprintf(fsws, sizeof(fsws), "local,id=fsws,path=%s,security_model=passthrough", b->root);
	snprintf(home, sizeof(home), "%s/home", b->dir);
	mkdir(home, 0755);
	snprintf(fshome, sizeof(fshome), "local,id=fshome,path=%s,security_model=passthrough",
		 home);
	/* quiet and no calibration: Debian's kernel otherwise spends seconds (TCG: minutes) on
	 * the TSC and the console (its rate is the host's, measured: vm_host_tsc_khz); network all
	 * adds the guest's address for the agent */
	snprintf(append, sizeof(append),
		 "console=ttyS0 quiet panic=-1 rdinit=/init tsc_early_khz=%ld tsc=reliable "
		 "lpj=4000000 i8042.noaux i8042.nokbd i8042.nopnp%s",
		 vm_host_tsc_khz(), s->passt ? s->net_append : "");
	if (!(vols = calloc(1, sizeof(*vols))))
		return cb_error_set(ENOMEM, "vm backend: out of memory");
	if ((rc = vm_volume_args(b, mmio, vols, append, sizeof(append))) < 0)
		goto out;
	snprintf(netdev, sizeof(netdev), "stream,id=n0,server=off,addr.type=unix,addr.path=%s",
		 s->net_sock);
	/* qemu in a mount namespace of its own: it holds the share's copy of the mount there, so
	 * that the daemon's idle stop (which unmounts only what no host process holds) is not
	 * kept from unmounting by the VM it ends */
	ARG("unshare");
	ARG("--mount");
	ARG("--propagation");
	ARG("private");
	ARG("qemu-system-x86_64");
	ARG("-nodefaults");
	ARG("-no-user-config");
	ARG("-nographic");
	ARG("-no-reboot");
	ARG("-machine");
	ARG(!strcmp(machine, "microvm") ? "microvm,pit=on,pic=on,rtc=on" : (char *)machine);
	ARG("-accel");
	ARG(s->kvm ? "kvm" : "tcg");
	ARG("-cpu");
	ARG(s->kvm ? "host" : "max");
	ARG("-smp");
	ARG(smp);
	ARG("-m");
	ARG(mem);
	ARG("-kernel");
	ARG(kernel);
	ARG("-initrd");
	ARG(initrd);
	ARG("-append");
	ARG(append);
	ARG("-serial");
	ARG(serial);
	ARG("-pidfile");
	ARG(pidf);
	/* qemu's own seccomp filter: no new privileges, no processes, no old syscalls */
	ARG("-sandbox");
	ARG("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
	ARG("-fsdev");
	ARG(fsroot);
	ARG("-device");
	ARG(mmio ? "virtio-9p-device,fsdev=fsroot,mount_tag=rootfs"
		 : "virtio-9p-pci,fsdev=fsroot,mount_tag=rootfs");
	ARG("-fsdev");
	ARG(fsws);
	ARG("-device");
	ARG(mmio ? "virtio-9p-device,fsdev=fsws,mount_tag=workspace"
		 : "virtio-9p-pci,fsdev=fsws,mount_tag=workspace");
	ARG("-fsdev");
	ARG(fshome);
	ARG("-device");
	ARG(mmio ? "virtio-9p-device,fsdev=fshome,mount_tag=home"
		 : "virtio-9p-pci,fsdev=fshome,mount_tag=home");
	for (size_t i = 0; i < b->opt.n_volumes; i++) {
		ARG("-fsdev");
		ARG(vols->fsdev[i]);
		ARG("-device");
		ARG(vols->device[i]);
	}
	ARG("-chardev");
	ARG(chardev);
	ARG("-device");
	ARG(mmio ? "virtio-serial-device,id=vser" : "virtio-serial-pci,id=vser");
	ARG("-device");
	ARG("virtserialport,bus=vser.0,chardev=agent,name=" VM_PORT_NAME);
	/* network none: no NIC at all; all: virtio-net to passt's socket */
	if (s->passt) {
		ARG("-netdev");
		ARG(netdev);
		ARG("-device");
		ARG(mmio ? "virtio-net-device,netdev=n0" : "virtio-net-pci,netdev=n0");
	}
	argv[n] = NULL;
	spec.argv = argv;
	spec.env = env;
	spec.output_limit = 1u << 30; /* its warnings only: the console goes to a file */
	if ((rc = cb_exec_start(&spec, NULL, &s->qemu)) < 0) {
		cb_error_wrap(rc, "vm backend: start qemu: ");
		goto out;
	}
	if (pthread_create(&s->qemu_thread, NULL, vm_qemu_wait, s) != 0) {
		cb_exec_free(s->qemu);
		s->qemu = NULL;
		rc = cb_error_set(EAGAIN, "vm backend: cannot start a thread");
		goto out;
	}
	s->qemu_started = 1;
out:
	free(vols);
	return rc;
}

static double vm_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Why the boot failed: qemu's own words, else the console's last line. */
static int vm_boot_error(struct vm_state *s, int err, const char *what)
{
	char path[4200], line[512] = "", last[512] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s/console.log", s->dir);
	if ((f = fopen(path, "re"))) {
		while (fgets(line, sizeof(line), f))
			if (line[strspn(line, " \r\n")])
				snprintf(last, sizeof(last), "%s", line);
		fclose(f);
	}
	last[strcspn(last, "\r\n")] = 0;
	if (s->dead && s->qemu_res.err_len) {
		s->qemu_res.err[strcspn(s->qemu_res.err, "\n")] = 0;
		return cb_error_set(err, "vm backend: %s: qemu: %s", what, s->qemu_res.err);
	}
	return cb_error_set(err, "vm backend: %s (console: %s; %s/console.log)", what,
			    *last ? last : "nothing", s->dir);
}

/* Connect to qemu's chardev socket and wait for the agent's hello. */
static int vm_wait_hello(struct vm_state *s)
{
	const char *t = getenv("COWBOX_VM_BOOT_TIMEOUT");
	double limit = t && atof(t) > 0 ? atof(t) : VM_DEFAULT_BOOT_SECS, end;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	uint32_t id;
	uint8_t type;
	char *buf = NULL;
	size_t len;
	int rc;

	if (s->kvm && limit > VM_KVM_BOOT_SECS)
		limit = VM_KVM_BOOT_SECS;
	end = vm_now() + limit;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/agent.sock", s->sockdir);
	for (;;) {
		int dead;

		pthread_mutex_lock(&s->lock);
		dead = s->dead;
		pthread_mutex_unlock(&s->lock);
		if (dead) {
			pthread_join(s->qemu_thread, NULL);
			s->qemu_started = 0;
			return vm_boot_error(s, EIO, "qemu exited while booting");
		}
		if (vm_now() > end)
			return vm_boot_error(s, ETIMEDOUT, "the guest did not boot in time");
		if (s->agent_fd < 0) {
			int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

			if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
				s->agent_fd = fd;
			else if (fd >= 0)
				close(fd);
		}
		if (s->agent_fd >= 0) {
			struct pollfd p = {.fd = s->agent_fd, .events = POLLIN};

			if (poll(&p, 1, 200) > 0)
				break;
		} else {
			usleep(50000);
		}
	}
	if ((rc = cb_vm_frame_read(s->agent_fd, &id, &type, &buf, &len)) < 0)
		return vm_boot_error(s, EIO, "the agent's port closed");
	if (type != CB_VM_HELLO) {
		free(buf);
		return vm_boot_error(s, EPROTO, "the agent did not say hello");
	}
	{
		json_t *o = json_loads(buf, 0, NULL);

		snprintf(s->kernel, sizeof(s->kernel), "%s",
			 json_string_value(json_object_get(o, "kernel")) ?: "?");
		json_decref(o);
	}
	free(buf);
	return 0;
}

static int vm_listen(struct vm_state *s)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/run.sock", s->sockdir);
	unlink(sa.sun_path);
	if ((s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(s->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(s->listen_fd, 64) < 0)
		return cb_error_set(errno, "vm backend: listen on %s", sa.sun_path);
	return 0;
}

/* Stop the VM: the agent ends every command and powers off; qemu is killed if it has not
 * gone within a few seconds. */
static void vm_stop(struct vm_state *s)
{
	if (s->agent_fd >= 0 && !s->dead)
		vm_relay_send(s, 0, CB_VM_POWEROFF, NULL, 0);
	if (s->qemu_started) {
		double end = vm_now() + 5;
		int dead = 0;

		while (!dead && vm_now() < end) {
			pthread_mutex_lock(&s->lock);
			dead = s->dead;
			pthread_mutex_unlock(&s->lock);
			if (!dead)
				usleep(20000);
		}
		if (!dead)
			cb_exec_kill(s->qemu, SIGKILL);
		pthread_join(s->qemu_thread, NULL);
		s->qemu_started = 0;
	}
	vm_relay_stop(s);
}

static void vm_state_free(struct vm_state *s)
{
	char path[4200];

	if (!s)
		return;
	vm_stop(s);
	vm_net_stop(s);
	cb_exec_free(s->qemu);
	cb_exec_result_free(&s->qemu_res);
	for (size_t i = 0; i < VM_MAX_RUNNING; i++) {
		if (s->cmds[i].fd >= 0)
			close(s->cmds[i].fd);
		free(s->cmds[i].run);
	}
	if (s->agent_fd >= 0)
		close(s->agent_fd);
	if (s->listen_fd >= 0)
		close(s->listen_fd);
	if (s->wake[0] >= 0)
		close(s->wake[0]);
	if (s->wake[1] >= 0)
		close(s->wake[1]);
	if (s->sockdir[0]) {
		snprintf(path, sizeof(path), "%s/run.sock", s->sockdir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/agent.sock", s->sockdir);
		unlink(path);
		rmdir(s->sockdir);
	}
	snprintf(path, sizeof(path), "%s/qemu.pid", s->dir);
	unlink(path);
	vm_forward_free(s);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->wlock);
	cb_backend_image_config_free(&s->image);
	free(s->agent);
	free(s);
}

static int vm_create(struct cb_backend *b)
{
	struct vm_state *s = calloc(1, sizeof(*s));
	char *rootfs = NULL, initrd[4200];
	int rc = 0;

	if (!s)
		return cb_error_set(ENOMEM, "vm backend: out of memory");
	s->agent_fd = s->listen_fd = s->wake[0] = s->wake[1] = -1;
	for (size_t i = 0; i < VM_MAX_RUNNING; i++)
		s->cmds[i].fd = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->wlock, NULL);
	vm_forward_init(s);
	snprintf(s->dir, sizeof(s->dir), "%s/vm", b->dir);
	if (mkdir(s->dir, 0700) < 0 && errno != EEXIST) {
		rc = cb_error_set(errno, "vm backend: mkdir %s", s->dir);
		goto out;
	}
	vm_kill_leftover(s->dir);
	/* the sockets' paths must fit sun_path: a private directory of their own in /tmp */
	snprintf(s->sockdir, sizeof(s->sockdir), "/tmp/cowbox-vm-XXXXXX");
	if (!mkdtemp(s->sockdir)) {
		s->sockdir[0] = 0;
		rc = cb_error_set(errno, "vm backend: mkdtemp in /tmp");
		goto out;
	}
	if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = cb_error_set(errno, "vm backend: pipe");
		goto out;
	}
	if (b->opt.image) {
		struct cb_backend_image_cap cap;

		cb_backend_phase(b, "booting the vm: unpacking the image %s", b->opt.image);
		cb_backend_image_cap_of(&b->opt, &cap);
		rc = cb_backend_image_root_capped(b->opt.image, &cap, &rootfs, &s->image, NULL);
		/* its User runs the commands that name none, as on ns and docker */
		if (rc == 0 && s->image.user &&
		    (rc = cb_backend_user_check("its User", s->image.user)) < 0)
			cb_error_wrap(rc, "image %s: ", b->opt.image);
	} else if (!(rootfs = strdup(vm_default_image())))
		rc = cb_error_set(ENOMEM, "vm backend: out of memory");
	else if (access(rootfs, F_OK) < 0)
		rc = cb_error_set(ENOENT,
				  "vm backend: no root tree %s (run scripts/setup-podman "
				  "and scripts/setup-vm, or set the image option)",
				  rootfs);
	if (rc < 0)
		goto out;
	snprintf(initrd, sizeof(initrd), "%s/initrd", s->dir);
	cb_backend_phase(b, "booting the vm: the agent's initrd");
	s->kvm = vm_kvm_usable();
	if ((rc = vm_find_agent(&s->agent)) < 0 || (rc = vm_make_initrd(s->agent, initrd)) < 0 ||
	    (rc = vm_listen(s)) < 0 ||
	    (b->opt.net == CB_BACKEND_NET_ALL && (rc = vm_net_start(s)) < 0))
		goto out;
	/* the guest's own boot is the long part (minutes under TCG on a loaded host) */
	cb_backend_phase(b, "booting the vm: starting qemu (%s)",
			 s->kvm ? "KVM" : "TCG, no KVM here: slower");
	if ((rc = vm_start_qemu(b, s, rootfs)) < 0)
		goto out;
	cb_backend_phase(b, "booting the vm: waiting for the guest's agent (%s)",
			 s->kvm ? "KVM" : "TCG");
	rc = vm_wait_hello(s);
	/* KVM that did not boot the guest (hung in the firmware: a timeout; or qemu refused by
	 * it: "failed to set MSR ..."): TCG once, and noted for the host's other daemons, in
	 * daemon.log; a qemu that fails under TCG too failed for its own reasons, and KVM is
	 * not blamed for it. */
	if ((rc == -ETIMEDOUT || rc == -EIO) && s->kvm && !getenv("COWBOX_VM_ACCEL")) {
		char why[512];
		int hung = rc == -ETIMEDOUT;

		snprintf(why, sizeof(why), "%s", cb_error_message());
		vm_stop(s);
		cb_exec_free(s->qemu);
		s->qemu = NULL;
		cb_exec_result_free(&s->qemu_res);
		if (s->agent_fd >= 0)
			close(s->agent_fd);
		s->agent_fd = -1;
		s->dead = 0;
		s->kvm = 0;
		cb_error_clear();
		/* passt served its one connection (the qemu that did not boot): a new one */
		if (s->passt) {
			vm_net_stop(s);
			if ((rc = vm_net_start(s)) < 0)
				goto out;
		}
		cb_backend_phase(b, "booting the vm: KVM did not boot it, booting again under TCG");
		if ((rc = vm_start_qemu(b, s, rootfs)) == 0)
			rc = vm_wait_hello(s);
		if (rc == 0 || hung) {
			vm_kvm_mark_broken();
			fprintf(
			    stderr,
			    "cowbox: vm backend: KVM did not boot the guest (%s); KVM is marked "
			    "broken until the host reboots (%s/vm/kvm.broken), and the VM %s\n",
			    why, vm_cache(), rc == 0 ? "booted under TCG" : "failed under TCG too");
		}
	}
	if (rc < 0)
		goto out;
	cb_backend_phase(b, "booting the vm: the guest is up (kernel %s)", s->kernel);
	if ((rc = vm_relay_start(s)) < 0)
		goto out;
	/* public, allow: no NIC; the egress proxy is the guest's one way out */
	if (cb_backend_net_proxied(&b->opt) && (rc = vm_forward_proxy(b, s)) < 0)
		goto out;
	b->image_env = s->image.env;
	b->priv = s;
	s = NULL;
out:
	free(rootfs);
	vm_state_free(s);
	return rc;
}

/* The run frame's JSON for a command (malloc'd in *out). */
static int vm_run_json(struct cb_backend *b, const struct cb_backend_cmd *cmd, char **out)
{
	struct vm_state *s = b->priv;
	const char *user = cb_backend_user(b, cmd) ?: s->image.user;
	json_t *o = json_object(), *a;
	char **env = NULL, *rel = NULL, cwd[4200];
	size_t limit = cmd->output_limit ? cmd->output_limit : CB_EXEC_DEFAULT_OUTPUT_LIMIT;
	int rc;

	*out = NULL;
	if ((rc = cb_backend_env(b, cmd->env, &env)) < 0 ||
	    (rc = cb_backend_cwd(b, cmd->cwd, 1, &rel)) < 0)
		goto out;
	snprintf(cwd, sizeof(cwd), "%s%s", rel[0] == '/' ? "" : "/workspace/", rel);
	if (cmd->shell) {
		json_object_set_new(o, "shell", json_string(cmd->shell));
		if (cb_backend_shell_program(b))
			json_object_set_new(o, "shell_program",
					    json_string(cb_backend_shell_program(b)));
	} else {
		json_object_set_new(o, "argv", a = json_array());
		for (size_t i = 0; cmd->argv && cmd->argv[i]; i++)
			json_array_append_new(a, json_string(cmd->argv[i]));
	}
	json_object_set_new(o, "env", a = json_array());
	for (size_t i = 0; env[i]; i++)
		json_array_append_new(a, json_string(env[i]));
	json_object_set_new(o, "cwd", json_string(cwd));
	/* the user option's (or the command's), else the image's User; the agent resolves it
	 * in the guest's /etc */
	if (user)
		json_object_set_new(o, "user", json_string(user));
	json_object_set_new(o, "timeout", json_real(cb_backend_timeout(b, cmd)));
	/* the host's runner caps the client's output first (and the guest's command goes
	 * with its client), so that the host keeps the cap's semantics */
	json_object_set_new(o, "output_limit", json_integer((json_int_t)limit + (1 << 20)));
	json_object_set_new(o, "stdin", json_true());
	json_object_set_new(o, "keep", json_boolean(cb_backend_keep(b, cmd) != NULL));
	if (!(*out = json_dumps(o, JSON_COMPACT)))
		rc = cb_error_set(ENOMEM, "vm backend: out of memory");
out:
	json_decref(o);
	cb_exec_env_free(env);
	free(rel);
	return rc;
}

static int vm_exec(struct cb_backend *b, const struct cb_backend_cmd *cmd,
		   const struct cb_exec_callbacks *cb, struct cb_exec **out)
{
	struct vm_state *s = b->priv;
	struct cb_exec_spec spec = {0};
	double timeout = cb_backend_timeout(b, cmd);
	char *run = NULL, sock[4200], idstr[16];
	char *argv[] = {s->agent, "--client", sock, idstr, NULL};
	uint32_t id;
	int rc;

	*out = NULL;
	if (cmd->tty)
		return cb_error_set(EOPNOTSUPP, "vm backend: no terminal yet (run without tty)");
	if ((rc = vm_run_json(b, cmd, &run)) < 0 || (rc = vm_relay_reserve(s, run, &id)) < 0)
		return rc;
	snprintf(sock, sizeof(sock), "%s/run.sock", s->sockdir);
	snprintf(idstr, sizeof(idstr), "%u", id);
	spec.argv = argv;
	/* inside, the agent's runner ends the tree at the timeout; out here only a client
	 * that hangs is cut short */
	spec.timeout = timeout > 0 ? timeout + 30 : 0;
	spec.output_limit = cmd->output_limit;
	spec.stdin_kind = cmd->stdin_kind;
	spec.stdin_data = cmd->stdin_data;
	spec.stdin_len = cmd->stdin_len;
	spec.stdin_fd = cmd->stdin_fd;
	rc = cb_exec_start(&spec, cb, out);
	vm_relay_started(s, id, rc ? NULL : *out);
	return rc;
}

static int vm_wait(struct cb_backend *b, struct cb_exec *h, struct cb_exec_result *res)
{
	struct vm_state *s = b->priv;
	struct vm_cmd c;
	int rc = cb_exec_wait(h, res);

	if (rc < 0 || vm_relay_finish(s, h, &c) < 0)
		return rc;
	if (c.killed)
		res->killed = 1;
	if (c.exited) {
		res->exit_code = c.exit_code;
		res->term_signal = c.term_signal;
		res->timed_out |= c.timed_out;
		res->output_limited |= c.output_limited;
		res->oom_killed |= c.oom_killed;
	} else if (c.failed) {
		rc = cb_error_set(EIO, "vm backend: %s", c.msg);
	} else if (!res->killed && !res->output_limited && !res->timed_out) {
		rc = cb_error_set(ENXIO, "vm backend: the VM stopped while the command ran; the "
					 "daemon stops, the next use boots a new one");
	}
	return rc;
}

static void vm_kill(struct cb_backend *b, struct cb_exec *h, int sig)
{
	vm_relay_kill(b->priv, h, sig);
}

/* Looked up inside the guest, whose root differs from the host's. */
static int vm_which(struct cb_backend *b, const char *binary, char **path)
{
	char *argv[] = {"/bin/sh", "-c", CB_BACKEND_WHICH_SCRIPT, "sh", (char *)binary, NULL};
	struct cb_backend_cmd cmd = {.argv = argv, .timeout = 30};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;
	int rc;

	*path = NULL;
	if ((rc = vm_exec(b, &cmd, NULL, &h)) < 0)
		return rc;
	rc = vm_wait(b, h, &res);
	cb_exec_free(h);
	if (rc < 0) {
		cb_exec_result_free(&res);
		return rc;
	}
	return cb_backend_which_result(&res, binary, "VM", path);
}

/* The guest's 127.0.0.1:port, relayed over the agent's port to the host's (vm_forward.c):
 * the same URL as ns gives, under any network, no NIC needed. */
static int vm_host_url(struct cb_backend *b, int port, char **url)
{
	int rc;

	*url = NULL;
	if ((rc = vm_forward_listen(b->priv, port)) < 0)
		return rc;
	if (asprintf(url, "http://127.0.0.1:%d", port) < 0) {
		*url = NULL;
		return cb_error_set(ENOMEM, "host_url: out of memory");
	}
	return 0;
}

static void vm_close(struct cb_backend *b)
{
	b->image_env = NULL;
	vm_state_free(b->priv);
	b->priv = NULL;
}

/* Nothing outlives the VM but the workspace's own disk. */
static int vm_destroy(struct cb_backend *b)
{
	(void)b;
	return 0;
}

/* The qemu of a daemon that crashed. */
static int vm_remove_leftovers(const char *ref)
{
	char *dir = NULL, *vmdir = NULL;

	if (cb_ws_path(ref, NULL, &dir) == 0 && asprintf(&vmdir, "%s/vm", dir) >= 0)
		vm_kill_leftover(vmdir);
	cb_error_clear();
	free(dir);
	free(vmdir);
	return 0;
}

/* What the VM cannot enforce yet is refused, naming the option. */
static int vm_validate(struct cb_backend_options *o, json_t *j)
{
	(void)j;
	/* public and allow: no NIC, the proxy over the agent's port (vm_forward.c) */
	if (o->net != CB_BACKEND_NET_NONE && o->net != CB_BACKEND_NET_ALL &&
	    !cb_backend_net_proxied(o))
		return cb_error_set(
		    EINVAL,
		    "network %s: the vm backend has network none (no NIC), all "
		    "(passt, the host's loopback out of reach), public or allow (the "
		    "egress proxy, no NIC); use ns or docker",
		    cb_backend_net_name(o->net));
	/* the guest's TLS clients would need the workspace's CA in the guest's bundle, which
	 * the read-only root share does not carry yet */
	if (o->n_secrets)
		return cb_error_set(EINVAL, "backend option secrets: the vm backend cannot give "
					    "its guest the workspace's CA yet; use ns or docker");
	if (o->privileged)
		return cb_error_set(EINVAL, "backend option privileged: only the ns backend has a "
					    "user namespace to leave out");
	if (o->pids && o->pids != CB_BACKEND_NO_LIMIT && o->pids != CB_BACKEND_DEFAULT_PIDS)
		return cb_error_set(EINVAL, "backend option pids: the vm backend caps memory and "
					    "cpus, not processes; use ns or docker");
	return o->image ? cb_backend_image_check(o->image) : 0;
}

static const char *vm_workdir(const char *mountpoint)
{
	(void)mountpoint;
	return "/workspace";
}

const struct cb_backend_ops cb_backend_vm = {
    .name = "vm",
    .confined = 1,
    .image_root = 1,
    .validate = vm_validate,
    .workdir = vm_workdir,
    .default_image = vm_default_image,
    .remove_leftovers = vm_remove_leftovers,
    .create = vm_create,
    .exec = vm_exec,
    .wait = vm_wait,
    .kill = vm_kill,
    .which = vm_which,
    .host_url = vm_host_url,
    .close = vm_close,
    .destroy = vm_destroy,
};
