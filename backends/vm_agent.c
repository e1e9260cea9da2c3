/* The vm backend's guest agent: PID 1 of the workspace's VM. It mounts the root and the
 * workspace the host shares (9p), then runs the daemon's commands with the runner of exec/. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "vm.h"
#include "vm_frame.h"

/* The port the host opens (qemu: virtserialport,name=...). */
#define AGENT_PORT_NAME "org.cowbox.agent"
/* Where the initramfs keeps the modules to load, one file name per line, in order. */
#define AGENT_MODULES "/modules/order"
#define AGENT_ROOT    "/newroot"

struct agent_job {
	uint32_t id;
	struct cb_exec *exec;
	char **argv, **env;
	char *shell, *shell_program, *cwd;
	long long oom_kills;  /* the kernel's oom_kill count when the command started */
	struct vm_pump *pump; /* writes its stdin (vm_agent_io.c); NULL until the first */
	struct agent_job *next;
};

/* The frame stream: one port in the VM, stdin and stdout under --stdio. */
static int agent_rfd = -1, agent_wfd = -1;
static pthread_mutex_t agent_write_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t agent_jobs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct agent_job *agent_jobs;
static struct cb_exec_keep *agent_keep;

static void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void agent_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("cowbox-agent: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int agent_send(uint32_t id, uint8_t type, const void *buf, size_t len)
{
	int rc;

	pthread_mutex_lock(&agent_write_lock);
	rc = cb_vm_frame_write(agent_wfd, id, type, buf, len);
	pthread_mutex_unlock(&agent_write_lock);
	return rc;
}

/* See vm.h. */
int vm_agent_send(uint32_t id, uint8_t type, const void *buf, size_t len)
{
	return agent_send(id, type, buf, len);
}

static int agent_send_json(uint32_t id, uint8_t type, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	int rc = s ? agent_send(id, type, s, strlen(s)) : -ENOMEM;

	free(s);
	json_decref(j);
	return rc;
}

/* --- boot (PID 1 only) --------------------------------------------------------------- */

/* Load the modules the initramfs lists; the shares and the port need virtio and 9p, which
 * Debian's kernel builds as modules. */
static void agent_load_modules(void)
{
	FILE *f = fopen(AGENT_MODULES, "r");
	char line[256];

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char path[300];
		int fd;

		line[strcspn(line, "\n")] = 0;
		if (!line[0])
			continue;
		snprintf(path, sizeof(path), "/modules/%s", line);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 ||
		    (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST))
			agent_log("module %s: %s", line, strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	fclose(f);
}

static int agent_mount(const char *src, const char *dst, const char *type, unsigned long flags,
		       const char *data)
{
	mkdir(dst, 0755);
	if (mount(src, dst, type, flags, data) < 0) {
		agent_log("mount %s on %s: %s", src, dst, strerror(errno));
		return -errno;
	}
	return 0;
}

/* Bring loopback up: with no NIC (network none) it is the only interface. */
static void agent_loopback_up(void)
{
	struct ifreq ifr = {0};
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		return;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
		ifr.ifr_flags |= IFF_UP;
		ioctl(s, SIOCSIFFLAGS, &ifr);
	}
	close(s);
}

static int agent_route(int s, const char *dev, struct in_addr dst, struct in_addr gw)
{
	struct rtentry rt = {0};
	struct sockaddr_in *d = (struct sockaddr_in *)&rt.rt_dst,
			   *g = (struct sockaddr_in *)&rt.rt_gateway,
			   *m = (struct sockaddr_in *)&rt.rt_genmask;

	d->sin_family = g->sin_family = m->sin_family = AF_INET;
	d->sin_addr = dst;
	rt.rt_dev = (char *)dev;
	if (gw.s_addr) {
		g->sin_addr = gw;
		rt.rt_flags = RTF_UP | RTF_GATEWAY;
	} else {
		m->sin_addr.s_addr = 0xffffffff;
		rt.rt_flags = RTF_UP | RTF_HOST;
	}
	return ioctl(s, SIOCADDRT, &rt) < 0 ? -errno : 0;
}

static int agent_ifreq_addr(int s, const char *dev, unsigned long req, in_addr_t a)
{
	struct ifreq ifr = {0};
	struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;

	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", dev);
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = a;
	return ioctl(s, req, &ifr) < 0 ? -errno : 0;
}

/* Network all: the host's passt is behind the one NIC but lo (virtio-net); the host gave the
 * guest's address, prefix and gateway (cowbox.net=A/P,G) and its name servers (cowbox.dns=A,B)
 * on the kernel command line. No DHCP client: the guest is up as soon as the agent is. */
static void agent_network(void)
{
	char cmd[4096] = "", addr[64], gw[64], dns[256] = "", *p;
	struct if_nameindex *ifs = NULL;
	const char *dev = NULL;
	struct in_addr a, g, none = {0};
	struct ifreq ifr = {0};
	int prefix, s = -1, rc;
	FILE *f = fopen("/proc/cmdline", "re");

	if (f) {
		if (!fgets(cmd, sizeof(cmd), f))
			cmd[0] = 0;
		fclose(f);
	}
	if (!(p = strstr(cmd, "cowbox.net=")) ||
	    sscanf(p + 11, "%63[^/]/%d,%63[^ \n]", addr, &prefix, gw) != 3 ||
	    inet_pton(AF_INET, addr, &a) != 1 || inet_pton(AF_INET, gw, &g) != 1 || prefix < 0 ||
	    prefix > 32)
		return; /* network none: no NIC */
	if ((p = strstr(cmd, "cowbox.dns=")))
		sscanf(p + 11, "%255[^ \n]", dns);
	ifs = if_nameindex();
	for (struct if_nameindex *i = ifs; i && i->if_index && !dev; i++)
		if (strcmp(i->if_name, "lo"))
			dev = i->if_name;
	if (!dev) {
		agent_log("network all: no NIC (virtio_net)");
		goto out;
	}
	if ((s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		goto out;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", dev);
	if ((rc = agent_ifreq_addr(s, dev, SIOCSIFADDR, a.s_addr)) < 0 ||
	    (rc = agent_ifreq_addr(s, dev, SIOCSIFNETMASK,
				   prefix ? htonl(~0u << (32 - prefix)) : 0)) < 0 ||
	    (rc = ioctl(s, SIOCGIFFLAGS, &ifr) < 0 ? -errno : 0) < 0) {
		agent_log("network all: %s: %s", dev, strerror(-rc));
		goto out;
	}
	ifr.ifr_flags |= IFF_UP;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		agent_log("network all: %s up: %s", dev, strerror(errno));
	/* a gateway outside the prefix (a /32 address) needs a route to itself first */
	if ((rc = agent_route(s, dev, none, g)) == -ENETUNREACH &&
	    agent_route(s, dev, g, none) == 0)
		rc = agent_route(s, dev, none, g);
	if (rc < 0)
		agent_log("network all: default route via %s: %s", gw, strerror(-rc));
	if (*dns) {
		unlink("/etc/resolv.conf");
		if ((f = fopen("/etc/resolv.conf", "we"))) {
			for (char *save = NULL, *n = strtok_r(dns, ",", &save); n;
			     n = strtok_r(NULL, ",", &save))
				fprintf(f, "nameserver %s\n", n);
			fclose(f);
		}
	}
out:
	if (s >= 0)
		close(s);
	if (ifs)
		if_freenameindex(ifs);
}

/* mkdir -p of path's parents and path itself (the guest's own tree: an overlay on tmpfs). */
static void agent_mkdirs(char *path)
{
	for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = 0;
		mkdir(path, 0755);
		*p = '/';
	}
	mkdir(path, 0755);
}

/* The volumes the host shares (tags volN), each at the path the kernel command line gives
 * (cowbox.vol=N,ro|rw,PATH, %-escaped); read-only ones read-only here too. After the switch
 * of root, so that the guest's own symlinks lead where they lead inside it. */
static void agent_volumes(const char *p9)
{
	char cmd[4096] = "", tag[16], mode[4], enc[2048], path[2048];
	FILE *f = fopen("/proc/cmdline", "re");
	unsigned n;

	if (f) {
		if (!fgets(cmd, sizeof(cmd), f))
			cmd[0] = 0;
		fclose(f);
	}
	for (char *p = strstr(cmd, "cowbox.vol="); p; p = strstr(p + 1, "cowbox.vol=")) {
		size_t o = 0;

		if (sscanf(p + 11, "%u,%3[^,],%2047[^ \n]", &n, mode, enc) != 3)
			continue;
		for (const char *c = enc; *c && o + 1 < sizeof(path); c++) {
			unsigned x;

			if (*c == '%' && sscanf(c + 1, "%2x", &x) == 1) {
				path[o++] = (char)x;
				c += 2;
			} else {
				path[o++] = *c;
			}
		}
		path[o] = 0;
		snprintf(tag, sizeof(tag), "vol%u", n);
		agent_mkdirs(path);
		agent_mount(tag, path, "9p", strcmp(mode, "rw") ? MS_RDONLY : 0, p9);
	}
}

/* The guest's tree: the host's root share read-only under a tmpfs overlay (the guest's own
 * /etc, mount points; gone with the VM, as a container's), the workspace share read-write at
 * /workspace (every write goes through the host's FUSE mount and its journal: no guest cache,
 * so a snapshot on the host sees what the guest wrote), private /tmp and /run. Then the new
 * root replaces the initramfs (switch_root's way: the initramfs cannot be pivoted away). */
static int agent_boot(void)
{
	const char *p9 = "trans=virtio,version=9p2000.L,msize=524288,cache=none";
	int rc = 0;

	agent_mount("proc", "/proc", "proc", 0, NULL);
	agent_mount("dev", "/dev", "devtmpfs", 0, NULL);
	agent_mount("sys", "/sys", "sysfs", 0, NULL);
	agent_load_modules();
	if ((rc = agent_mount("rootfs", "/lower", "9p", MS_RDONLY, p9)) < 0 ||
	    (rc = agent_mount("scratch", "/scratch", "tmpfs", 0, "mode=755")) < 0)
		return rc;
	mkdir("/scratch/upper", 0755);
	mkdir("/scratch/work", 0755);
	if ((rc = agent_mount("root", AGENT_ROOT, "overlay", 0,
			      "lowerdir=/lower,upperdir=/scratch/upper,workdir=/scratch/work")) < 0)
		return rc;
	if ((rc = agent_mount("workspace", AGENT_ROOT "/workspace", "9p", 0, p9)) < 0)
		return rc;
	/* the workspace's persistent home is a share of its own when the host gives one */
	mkdir(AGENT_ROOT "/home", 0755);
	mkdir(AGENT_ROOT "/home/cowbox", 0755);
	mount("home", AGENT_ROOT "/home/cowbox", "9p", 0, p9);
	agent_mount("proc", AGENT_ROOT "/proc", "proc", 0, NULL);
	agent_mount("dev", AGENT_ROOT "/dev", "devtmpfs", 0, NULL);
	agent_mount("devpts", AGENT_ROOT "/dev/pts", "devpts", 0, "newinstance,ptmxmode=0666");
	agent_mount("shm", AGENT_ROOT "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, NULL);
	agent_mount("sys", AGENT_ROOT "/sys", "sysfs", MS_RDONLY, NULL);
	agent_mount("tmp", AGENT_ROOT "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	agent_mount("run", AGENT_ROOT "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755");
	if (chdir(AGENT_ROOT) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
	    chdir("/") < 0) {
		rc = -errno;
		agent_log("switch root: %s", strerror(errno));
		return rc;
	}
	agent_volumes(p9);
	sethostname("cowbox", 6);
	agent_loopback_up();
	agent_network();
	return 0;
}

/* The port the host named AGENT_PORT_NAME: /sys/class/virtio-ports/vportNpM/name. */
static int agent_open_port(void)
{
	DIR *d = opendir("/sys/class/virtio-ports");
	struct dirent *de;
	int fd = -ENOENT;

	if (!d)
		return -errno;
	while ((de = readdir(d)) && fd == -ENOENT) {
		char path[300], name[64] = "";
		FILE *f;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/class/virtio-ports/%s/name", de->d_name);
		if (!(f = fopen(path, "r")))
			continue;
		if (fgets(name, sizeof(name), f))
			name[strcspn(name, "\n")] = 0;
		fclose(f);
		if (strcmp(name, AGENT_PORT_NAME))
			continue;
		snprintf(path, sizeof(path), "/dev/%s", de->d_name);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			fd = -errno;
	}
	closedir(d);
	return fd;
}

/* --- commands ------------------------------------------------------------------------ */

static void agent_job_free(struct agent_job *j)
{
	char **p;

	for (p = j->argv; p && *p; p++)
		free(*p);
	for (p = j->env; p && *p; p++)
		free(*p);
	free(j->argv);
	free(j->env);
	free(j->shell);
	free(j->shell_program);
	free(j->cwd);
	free(j);
}

static struct agent_job *agent_job_find(uint32_t id)
{
	struct agent_job *j;

	for (j = agent_jobs; j && j->id != id; j = j->next)
		;
	return j;
}

static void agent_job_unlink(struct agent_job *job)
{
	struct agent_job **pp;

	pthread_mutex_lock(&agent_jobs_lock);
	for (pp = &agent_jobs; *pp && *pp != job; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = job->next;
	pthread_mutex_unlock(&agent_jobs_lock);
}

static int agent_output(void *arg, int stream, const void *buf, size_t len)
{
	struct agent_job *j = arg;

	while (len > 0) {
		size_t n = len < CB_VM_FRAME_MAX ? len : CB_VM_FRAME_MAX;

		if (agent_send(j->id, stream == 2 ? CB_VM_STDERR : CB_VM_STDOUT, buf, n) < 0)
			return -1; /* the host is gone: stop the command */
		buf = (const char *)buf + n;
		len -= n;
	}
	return 0;
}

/* The kernel's count of OOM kills so far (/proc/vmstat), -1 if unreadable. The guest has
 * no cgroup per command, and its memory is the command's cap: a kill by SIGKILL while this
 * count rose is the cap's (another command's OOM in the same window may be taken for it). */
static long long agent_oom_kills(void)
{
	char line[128];
	long long n = -1;
	FILE *f = fopen("/proc/vmstat", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "oom_kill %lld", &n) == 1)
			break;
	fclose(f);
	return n;
}

/* The wait thread of one command: supervise it, then send its exit frame. */
static void *agent_job_wait(void *arg)
{
	struct agent_job *j = arg;
	struct cb_exec_result res = {0};
	int rc = cb_exec_wait(j->exec, &res);
	long long oom_kills = agent_oom_kills();
	int oom_killed = j->oom_kills >= 0 && oom_kills > j->oom_kills && !res.timed_out &&
			 (res.term_signal == SIGKILL || res.exit_code == 137);

	if (rc < 0)
		agent_send(j->id, CB_VM_FAILED, cb_error_message(), strlen(cb_error_message()));
	else
		agent_send_json(j->id, CB_VM_EXIT,
				json_pack("{s:i,s:i,s:b,s:b,s:b,s:f}", "exit_code", res.exit_code,
					  "term_signal", res.term_signal, "timed_out",
					  res.timed_out, "output_limited", res.output_limited,
					  "oom_killed", oom_killed, "duration", res.duration));
	cb_exec_result_free(&res);
	agent_job_unlink(j);
	/* a pump still in a write (a background job holds stdin) frees the exec as it ends */
	if (!j->pump || vm_pump_release(j->pump))
		cb_exec_free(j->exec);
	agent_job_free(j);
	return NULL;
}

static char **agent_strings(json_t *a)
{
	size_t i, n = json_is_array(a) ? json_array_size(a) : 0;
	char **v = calloc(n + 1, sizeof(*v));

	for (i = 0; v && i < n; i++)
		if (!json_is_string(json_array_get(a, i)) ||
		    !(v[i] = strdup(json_string_value(json_array_get(a, i))))) {
			char **p;

			for (p = v; *p; p++)
				free(*p);
			free(v);
			return NULL;
		}
	return v;
}

static char *agent_dup(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? strdup(s) : NULL;
}

/* A command that cannot start as asked: what went wrong on its stderr, exit 126. */
static void agent_refuse(uint32_t id, const char *why)
{
	char msg[600];
	int n = snprintf(msg, sizeof(msg), "cowbox: %s\n", why);

	agent_send(id, CB_VM_STDERR, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
	agent_send_json(id, CB_VM_EXIT,
			json_pack("{s:i,s:i,s:b,s:b,s:b,s:f}", "exit_code", 126, "term_signal", 0,
				  "timed_out", 0, "output_limited", 0, "oom_killed", 0, "duration",
				  0.0));
}

/* A run frame: start the command now (so stdin frames that follow find it), supervise it on
 * a thread of its own. */
static void agent_run(uint32_t id, const char *payload)
{
	json_error_t jerr;
	json_t *o = json_loads(payload, 0, &jerr);
	struct cb_exec_spec spec = {0};
	struct cb_exec_callbacks cb = {agent_output, NULL};
	struct agent_job *j = calloc(1, sizeof(*j));
	const char *msg = "out of memory";
	struct cb_exec_ids ids;
	gid_t groups[CB_EXEC_MAX_GROUPS];
	pthread_attr_t attr;
	pthread_t t;

	if (!o || !j) {
		msg = o ? msg : jerr.text;
		goto fail;
	}
	j->id = id;
	j->argv = agent_strings(json_object_get(o, "argv"));
	j->env = agent_strings(json_object_get(o, "env"));
	j->shell = agent_dup(o, "shell");
	j->shell_program = agent_dup(o, "shell_program");
	j->cwd = agent_dup(o, "cwd");
	if (!j->env || (!j->shell && (!j->argv || !j->argv[0]))) {
		msg = "a run needs argv or shell, and env";
		goto fail;
	}
	spec.argv = j->shell ? NULL : j->argv;
	spec.shell = j->shell;
	spec.shell_program = j->shell_program;
	spec.env = j->env;
	spec.cwd = j->cwd;
	spec.timeout = json_number_value(json_object_get(o, "timeout"));
	spec.grace = json_number_value(json_object_get(o, "grace"));
	spec.output_limit = (size_t)json_integer_value(json_object_get(o, "output_limit"));
	spec.keep_bytes = (size_t)json_integer_value(json_object_get(o, "keep_bytes"));
	spec.stdin_kind =
	    json_is_true(json_object_get(o, "stdin")) ? CB_EXEC_STDIN_STREAM : CB_EXEC_STDIN_CLOSED;
	spec.keep = json_is_true(json_object_get(o, "keep")) ? agent_keep : NULL;
	cb.arg = j;
	if (json_is_string(json_object_get(o, "user"))) {
		/* resolved in the guest's own /etc (the image's), as docker does: a user it does
		 * not know is the command's failure (126, said on stderr), not the agent's */
		if (cb_exec_ids_resolve(NULL, json_string_value(json_object_get(o, "user")), &ids,
					groups) < 0) {
			agent_refuse(id, cb_error_message());
			goto done;
		}
		spec.ids = &ids;
	}
	pthread_mutex_lock(&agent_jobs_lock);
	j->oom_kills = agent_oom_kills();
	if (agent_job_find(id) || cb_exec_start(&spec, &cb, &j->exec) < 0) {
		pthread_mutex_unlock(&agent_jobs_lock);
		msg = j->exec ? "a command with this id runs" : cb_error_message();
		goto fail;
	}
	j->next = agent_jobs;
	agent_jobs = j;
	pthread_mutex_unlock(&agent_jobs_lock);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, agent_job_wait, j) != 0)
		agent_job_wait(j); /* no thread: supervise it here rather than lose it */
	pthread_attr_destroy(&attr);
	json_decref(o);
	return;
done:
	agent_job_free(j);
	json_decref(o);
	return;
fail:
	agent_send(id, CB_VM_FAILED, msg, strlen(msg));
	if (j) {
		cb_exec_free(j->exec);
		agent_job_free(j);
	}
	json_decref(o);
}

/* Stdin, stdin's end and kill frames act on a running command; one that has ended already
 * is not an error (the frames crossed on the wire). */
static void agent_control(uint32_t id, uint8_t type, const char *buf, size_t len)
{
	struct agent_job *j;

	pthread_mutex_lock(&agent_jobs_lock);
	j = agent_job_find(id);
	/* stdin goes through the job's pump, which acknowledges what it wrote: a full pipe
	 * never blocks this reader (and with it every command's and stream's frames) */
	if (j && !j->pump && (type == CB_VM_STDIN || type == CB_VM_STDIN_END))
		j->pump = vm_pump_new(j->exec, id);
	if (j && type == CB_VM_KILL)
		cb_exec_kill(j->exec, len ? (unsigned char)buf[0] : SIGKILL);
	else if (j && j->pump && type == CB_VM_STDIN)
		vm_pump_push(j->pump, buf, len);
	else if (j && j->pump && type == CB_VM_STDIN_END)
		vm_pump_end(j->pump);
	else if (j && type == CB_VM_STDIN_END)
		cb_exec_stdin_close(j->exec);
	/* no pump (no thread): written here, under the lock, for the job's wait thread may
	 * free it the moment the lock is let go (a write may block while the pipe is full) */
	else if (j && type == CB_VM_STDIN)
		cb_exec_stdin_write(j->exec, buf, len);
	pthread_mutex_unlock(&agent_jobs_lock);
}

static int agent_running(void)
{
	int n;

	pthread_mutex_lock(&agent_jobs_lock);
	n = agent_jobs != NULL;
	pthread_mutex_unlock(&agent_jobs_lock);
	return n;
}

/* Serve frames until the host closes the port or asks for power-off; then end every command
 * and every kept background job. */
static int agent_serve(void)
{
	struct utsname u;
	int rc;

	/* a pipe's SIGPIPE goes to the process, not the thread whose write met the closed
	 * reader: the runner's write_nosigpipe masks it in its own thread only, and another of
	 * ours (a pump, a stream, the reader) would take it and die. The shim resets every
	 * signal before a command's exec, so commands still get SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	if ((rc = cb_exec_keep_new(&agent_keep)) < 0)
		return rc;
	uname(&u);
	agent_send_json(0, CB_VM_HELLO,
			json_pack("{s:s,s:s}", "kernel", u.release, "machine", u.machine));
	for (;;) {
		uint32_t id;
		uint8_t type;
		char *buf;
		size_t len;

		if ((rc = cb_vm_frame_read(agent_rfd, &id, &type, &buf, &len)) < 0)
			break;
		if (type == CB_VM_RUN)
			agent_run(id, buf);
		else if (type == CB_VM_POWEROFF)
			rc = 1;
		else if (type == CB_VM_LISTEN || type == CB_VM_DATA || type == CB_VM_ACK ||
			 type == CB_VM_SHUT || type == CB_VM_CLOSE) {
			vm_agent_io_frame(id, type, buf, len); /* takes buf */
			buf = NULL;
		} else
			agent_control(id, type, buf, len);
		free(buf);
		if (rc == 1)
			break;
	}
	pthread_mutex_lock(&agent_jobs_lock);
	for (struct agent_job *j = agent_jobs; j; j = j->next)
		cb_exec_kill(j->exec, SIGKILL);
	pthread_mutex_unlock(&agent_jobs_lock);
	while (agent_running())
		usleep(10000);
	cb_exec_keep_free(agent_keep);
	return rc == -EPIPE || rc == 1 ? 0 : rc;
}

/* PID 1: every orphan of the guest comes here to be reaped; the agent is our one child, and
 * when it ends the guest powers off (the host sees qemu exit). */
static void agent_init_loop(pid_t agent)
{
	int status;
	pid_t p;

	for (;;) {
		p = waitpid(-1, &status, 0);
		if (p == agent && WIFSIGNALED(status))
			agent_log("the agent died of signal %d", WTERMSIG(status));
		if (p == agent || (p < 0 && errno == ECHILD))
			break;
	}
	sync();
	reboot(RB_POWER_OFF);
}

int main(int argc, char **argv)
{
	pid_t child;
	int rc;

	/* on the host: one command's client process (backends/vm_client.c) */
	if (getpid() != 1 && argc == 4 && !strcmp(argv[1], "--client"))
		return cb_vm_client_main(argv[2], argv[3]);
	/* not PID 1: serve stdin/stdout (the host-side tests drive the agent that way) */
	if (getpid() != 1) {
		if (argc != 2 || strcmp(argv[1], "--stdio")) {
			fprintf(stderr,
				"usage: %s --stdio | --client SOCKET ID (as PID 1 of a cowbox VM: "
				"no arguments)\n",
				argv[0]);
			return 2;
		}
		if ((agent_rfd = fcntl(0, F_DUPFD_CLOEXEC, 3)) < 0 ||
		    (agent_wfd = fcntl(1, F_DUPFD_CLOEXEC, 3)) < 0)
			return 1;
		dup2(2, 1); /* nothing else may write into the frame stream */
		return agent_serve() < 0;
	}
	if (agent_boot() < 0) {
		sync();
		reboot(RB_POWER_OFF);
	}
	if ((agent_rfd = agent_wfd = agent_open_port()) < 0) {
		agent_log("port %s: %s", AGENT_PORT_NAME, strerror(-agent_rfd));
		reboot(RB_POWER_OFF);
	}
	child = fork();
	if (child == 0) {
		rc = agent_serve();
		_exit(rc < 0);
	}
	close(agent_rfd);
	agent_init_loop(child);
	return 0;
}
