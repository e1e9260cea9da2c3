/* The vm backend's network all: passt (pasta's sibling, Debian's passt) behind qemu's virtio-net
 * over a unix socket, with the ns backend's isolation: the host's loopback stays out of reach. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/route.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "exec/pasta_guard.h"
#include "vm.h"

#define VM_NET_START_SECS 10.0	/* for passt to listen */
#define VM_NET_NOBODY	  65534 /* passt drops to nobody; its socket's directory is nobody's */
#define VM_NET_MAX_DNS	  3

/* The host's default route: its interface and gateway (/proc/net/route). */
static int vm_net_default_route(char *ifname, size_t ifsize, struct in_addr *gw)
{
	char line[512], name[64];
	unsigned long dst, gateway, mask;
	unsigned flags;
	FILE *f = fopen("/proc/net/route", "re");
	int rc = -ENETUNREACH;

	if (!f)
		return cb_error_set(errno, "network all: /proc/net/route");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %lx %lx %x %*d %*d %*d %lx", name, &dst, &gateway, &flags,
			   &mask) == 5 &&
		    dst == 0 && mask == 0 && (flags & RTF_UP) && (flags & RTF_GATEWAY)) {
			snprintf(ifname, ifsize, "%s", name);
			gw->s_addr = (in_addr_t)gateway; /* printed in the kernel's byte order */
			rc = 0;
			break;
		}
	fclose(f);
	if (rc < 0)
		return cb_error_set(ENETUNREACH, "network all: the host has no IPv4 default route");
	return 0;
}

/* The IPv4 address and prefix of ifname. */
static int vm_net_if_addr(const char *ifname, struct in_addr *addr, int *prefix)
{
	struct ifaddrs *ifs, *i;
	int rc = -EADDRNOTAVAIL;

	if (getifaddrs(&ifs) < 0)
		return cb_error_set(errno, "network all: getifaddrs");
	for (i = ifs; i; i = i->ifa_next)
		if (i->ifa_addr && i->ifa_netmask && i->ifa_addr->sa_family == AF_INET &&
		    !strcmp(i->ifa_name, ifname)) {
			*addr = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
			*prefix = __builtin_popcount(
			    ((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr);
			rc = 0;
			break;
		}
	freeifaddrs(ifs);
	if (rc < 0)
		return cb_error_set(EADDRNOTAVAIL, "network all: %s has no IPv4 address", ifname);
	return 0;
}

/* The host's IPv4 name servers but its loopback ones, which the guest cannot reach (a host
 * whose resolver is 127.0.0.53 gives the guest none: names then fail, addresses work). */
static void vm_net_dns(char *out, size_t size)
{
	char line[512], a[64];
	FILE *f = fopen("/etc/resolv.conf", "re");
	struct in_addr in;
	int n = 0;

	out[0] = 0;
	if (!f)
		return;
	while (n < VM_NET_MAX_DNS && fgets(line, sizeof(line), f))
		if (sscanf(line, " nameserver %63s", a) == 1 && inet_pton(AF_INET, a, &in) == 1 &&
		    (ntohl(in.s_addr) >> 24) != 127 && in.s_addr != 0) {
			size_t len = strlen(out);

			snprintf(out + len, size - len, "%s%s", n ? "," : "", a);
			n++;
		}
	fclose(f);
}

/* passt listens on path (its socket in /proc/net/unix with __SO_ACCEPTCON). */
static int vm_net_listening(const char *path)
{
	char line[4400], p[4200];
	unsigned long flags;
	FILE *f = fopen("/proc/net/unix", "re");
	int yes = 0;

	if (!f)
		return 0;
	while (!yes && fgets(line, sizeof(line), f))
		if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %4199s", &flags, p) == 2 &&
		    !strcmp(p, path) && (flags & 0x10000))
			yes = 1;
	fclose(f);
	return yes;
}

/* The process is gone or a zombie (passt failed to start). */
static int vm_net_gone(pid_t pid)
{
	char path[64], buf[256], *c;
	FILE *f;
	int gone = 1;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "re"))) {
		if (fgets(buf, sizeof(buf), f) && (c = strrchr(buf, ')')))
			gone = c[1] && c[2] == 'Z';
		fclose(f);
	}
	return gone;
}

static int vm_net_start_passt(struct vm_state *s, const char *addr, const char *prefix,
			      const char *gw)
{
	static char *env[] = {"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", NULL};
	char *argv[] = {"passt", "--foreground", "--quiet", "--stderr", "--one-off",
			/* IPv4 only: the agent configures the guest statically, no DHCP, NDP or
			 * router advertisements; nothing forwarded in (-t/-u none); the gateway
			 * is the real one, not the host (--no-map-gw) */
			"-4", "--no-map-gw", "-t", "none", "-u", "none", "--no-dhcp", "--no-ndp",
			"--no-dhcpv6", "--no-ra", "-a", (char *)addr, "-n", (char *)prefix, "-g",
			(char *)gw, "--socket", s->net_sock,
			/* as root: nobody, in a group of its own that the host's firewall keeps
			 * from the host's own addresses (exec/pasta_guard.c) */
			"--runas", "65534:" CB_PASTA_GID_TEXT, NULL};
	size_t runas = sizeof argv / sizeof *argv - 3;
	struct cb_exec_spec spec = {.argv = argv, .env = env, .output_limit = 1u << 20};
	double end;
	int rc;

	if (geteuid() != 0)
		argv[runas] = NULL; /* passt drops to nobody itself, in nobody's group */
	else if ((rc = cb_pasta_host_rule()) < 0)
		return rc;
	if ((rc = cb_exec_start(&spec, NULL, &s->passt)) < 0)
		return cb_error_wrap(rc, "network all: start passt (Debian package passt): ");
	for (end = (double)time(NULL) + VM_NET_START_SECS;;) {
		if (vm_net_listening(s->net_sock))
			return 0;
		if (vm_net_gone(cb_exec_pid(s->passt)) || (double)time(NULL) > end)
			break;
		usleep(10000);
	}
	{
		struct cb_exec_result res = {0};

		cb_exec_kill(s->passt, SIGKILL);
		cb_exec_wait(s->passt, &res);
		if (res.err_len)
			res.err[strcspn(res.err, "\n")] = 0;
		rc = cb_error_set(EIO, "network all: passt did not listen: %s",
				  res.err_len ? res.err : "no message");
		cb_exec_result_free(&res);
	}
	cb_exec_free(s->passt);
	s->passt = NULL;
	return rc;
}

int vm_net_start(struct vm_state *s)
{
	char ifname[64], addr[INET_ADDRSTRLEN], gw[INET_ADDRSTRLEN], prefix[8], dns[256];
	struct in_addr a, g;
	int rc, p = 0;

	if ((rc = vm_net_default_route(ifname, sizeof(ifname), &g)) < 0 ||
	    (rc = vm_net_if_addr(ifname, &a, &p)) < 0)
		return rc;
	inet_ntop(AF_INET, &a, addr, sizeof(addr));
	inet_ntop(AF_INET, &g, gw, sizeof(gw));
	snprintf(prefix, sizeof(prefix), "%d", p);
	vm_net_dns(dns, sizeof(dns));
	/* the guest gets the host's address, as pasta gives the ns backend's namespace */
	snprintf(s->net_append, sizeof(s->net_append), " cowbox.net=%s/%d,%s%s%s", addr, p, gw,
		 *dns ? " cowbox.dns=" : "", dns);
	/* passt runs as nobody: its socket goes in a directory of nobody's own, not sockdir */
	snprintf(s->net_dir, sizeof(s->net_dir), "/tmp/cowbox-net-XXXXXX");
	if (!mkdtemp(s->net_dir)) {
		s->net_dir[0] = 0;
		return cb_error_set(errno, "network all: mkdtemp in /tmp");
	}
	if (geteuid() == 0 && chown(s->net_dir, VM_NET_NOBODY, VM_NET_NOBODY) < 0)
		return cb_error_set(errno, "network all: chown %s", s->net_dir);
	snprintf(s->net_sock, sizeof(s->net_sock), "%s/passt.sock", s->net_dir);
	return vm_net_start_passt(s, addr, prefix, gw);
}

void vm_net_stop(struct vm_state *s)
{
	if (s->passt) {
		struct cb_exec_result res = {0};

		/* --one-off: it ends with qemu's connection; a kill for the case qemu never came */
		cb_exec_kill(s->passt, SIGKILL);
		cb_exec_wait(s->passt, &res);
		cb_exec_result_free(&res);
		cb_exec_free(s->passt);
		s->passt = NULL;
	}
	if (s->net_dir[0]) {
		unlink(s->net_sock);
		rmdir(s->net_dir);
		s->net_dir[0] = 0;
	}
}
