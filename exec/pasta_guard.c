/* Network all's guard: the host's own addresses (every interface's) refused in the namespace pasta
 * serves, by that namespace's firewall, rewritten whenever the host gains or loses an address. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "internal.h"

/* pasta connects from the host for the namespace: a destination that is one of the host's own
 * addresses would reach the host's services (pasta has no option to refuse them). The
 * namespace's OUTPUT chain rejects each one unless it leaves through lo (an address the
 * namespace holds too, such as the one pasta copied from the host's interface, is its own).
 * The namespace is the daemon's (the initial user namespace's), so the sandbox, in a user
 * namespace of its own, cannot change its rules. */

struct cb_pasta_guard {
	pthread_t thread;
	int netns_fd; /* ours */
	int events;   /* netlink, subscribed to the host's address changes */
	int stop_fd;  /* an eventfd: the thread returns */
};

/* Text of the rules for one family, in iptables-restore's format; NULL when out of memory. */
struct rules {
	char *text;
	size_t len, cap;
	size_t n;
};

static int rules_add(struct rules *r, const char *s)
{
	size_t n = strlen(s);

	if (r->len + n + 1 > r->cap) {
		size_t cap = (r->cap ? r->cap * 2 : 1024) + n;
		char *t = realloc(r->text, cap);

		if (!t)
			return -1;
		r->text = t;
		r->cap = cap;
	}
	memcpy(r->text + r->len, s, n + 1);
	r->len += n;
	return 0;
}

/* TCP refused at once (ECONNREFUSED), anything else with an ICMP error */
static int rules_add_addr(struct rules *r, const char *addr, int bits)
{
	char line[300];

	snprintf(line, sizeof line,
		 "-A OUTPUT ! -o lo -d %s/%d -p tcp -j REJECT --reject-with tcp-reset\n"
		 "-A OUTPUT ! -o lo -d %s/%d -j REJECT\n",
		 addr, bits, addr, bits);
	r->n++;
	return rules_add(r, line);
}

static const char rules_head[] = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n"
				 ":OUTPUT ACCEPT [0:0]\n";

/* Every address of every interface of this (the host's) namespace, as rules for v4 and v6:
 * 0, or -errno with a message. */
static int host_rules(struct rules *v4, struct rules *v6)
{
	struct {
		struct nlmsghdr n;
		struct ifaddrmsg a;
	} req = {.n = {.nlmsg_len = NLMSG_LENGTH(sizeof(struct ifaddrmsg)),
		       .nlmsg_type = RTM_GETADDR,
		       .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
		       .nlmsg_seq = 1},
		 .a = {.ifa_family = AF_UNSPEC}};
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	char *buf = malloc(32768);
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE), rc = 0, done = 0;

	if (!buf || rules_add(v4, rules_head) < 0 || rules_add(v6, rules_head) < 0) {
		rc = cb_error_set(ENOMEM, "network all: host addresses: out of memory");
		goto out;
	}
	if (fd < 0 ||
	    sendto(fd, &req, req.n.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) {
		rc = cb_error_set(errno, "network all: host addresses: netlink: %s",
				  strerror(errno));
		goto out;
	}
	while (!done && !rc) {
		ssize_t n = recv(fd, buf, 32768, 0);

		if (n < 0) {
			rc = cb_error_set(errno, "network all: host addresses: netlink: %s",
					  strerror(errno));
			break;
		}
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
		     h = NLMSG_NEXT(h, n)) {
			const struct ifaddrmsg *ifa = NLMSG_DATA(h);
			const void *addr = NULL, *local = NULL;
			char txt[INET6_ADDRSTRLEN];
			int len;

			if (h->nlmsg_type == NLMSG_DONE) {
				done = 1;
				break;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);

				rc = cb_error_set(-e->error, "network all: host addresses: %s",
						  strerror(-e->error));
				break;
			}
			if (h->nlmsg_type != RTM_NEWADDR)
				continue;
			len = (int)IFA_PAYLOAD(h);
			for (struct rtattr *a = IFA_RTA(ifa); RTA_OK(a, len); a = RTA_NEXT(a, len))
				if (a->rta_type == IFA_LOCAL)
					local = RTA_DATA(a);
				else if (a->rta_type == IFA_ADDRESS)
					addr = RTA_DATA(a);
			/* IPv4: IFA_LOCAL is the interface's own (IFA_ADDRESS the peer's on a
			 * point-to-point link); IPv6 gives IFA_ADDRESS only */
			if (local)
				addr = local;
			if (!addr || (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) ||
			    !inet_ntop(ifa->ifa_family, addr, txt, sizeof txt))
				continue;
			if (rules_add_addr(ifa->ifa_family == AF_INET ? v4 : v6, txt,
					   ifa->ifa_family == AF_INET ? 32 : 128) < 0) {
				rc = cb_error_set(ENOMEM,
						  "network all: host addresses: out of memory");
				break;
			}
		}
	}
	if (!rc && (rules_add(v4, "COMMIT\n") < 0 || rules_add(v6, "COMMIT\n") < 0))
		rc = cb_error_set(ENOMEM, "network all: host addresses: out of memory");
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* In the forked child (async-signal-safe calls only): argv (argv[0] picks the tool: iptables
 * and its kin are one multi-call binary) run from one of paths, in netns_fd unless it is -1,
 * reading in; its exit status goes to the status pipe (the daemon's reaper may reap this
 * child, not the grandchild it waits for itself). */
static void tool_child(int netns_fd, char *const *argv, const char *const *paths, int in, int err,
		       int status)
{
	char *const envp[] = {(char *)"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
	int st = 127 << 8;
	pid_t pid;

	if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) < 0)
		_exit(126);
	pid = fork();
	if (pid == 0) {
		if (dup2(in, 0) < 0 || dup2(err, 1) < 0 || dup2(err, 2) < 0)
			_exit(126);
		for (size_t i = 0; paths[i]; i++)
			execve(paths[i], argv, envp);
		(void)!write(2, "not installed (Debian package iptables)", 39);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		_exit(126);
	(void)!write(status, &st, sizeof st);
	_exit(0);
}

/* Run argv[0] (found in /usr/sbin or /sbin) in netns_fd (-1: here) with input on its stdin (a
 * memfd: no pipe to fill, no SIGPIPE when the tool is missing): its exit status (0-255), with
 * what it said in words (one line), or -errno with a message when it could not be run. */
static int run_tool(int netns_fd, char *const *argv, const char *input, size_t len, char *words,
		    size_t wsize)
{
	char p1[64], p2[64];
	const char *const paths[] = {p1, p2, NULL};
	int in = memfd_create("cowbox-rules", MFD_CLOEXEC), err[2] = {-1, -1}, status[2] = {-1, -1},
	    st = -1, rc;
	ssize_t n, got = 0;
	pid_t pid;

	snprintf(p1, sizeof p1, "/usr/sbin/%s", argv[0]);
	snprintf(p2, sizeof p2, "/sbin/%s", argv[0]);
	words[0] = 0;
	if (in < 0 || (len && pwrite(in, input, len, 0) != (ssize_t)len) ||
	    pipe2(err, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0) {
		rc = cb_error_set(errno, "network all: %s: %s", argv[0], strerror(errno));
		goto out;
	}
	pid = fork();
	if (pid == 0)
		tool_child(netns_fd, argv, paths, in, err[1], status[1]);
	if (pid < 0) {
		rc = cb_error_set(errno, "network all: %s: fork: %s", argv[0], strerror(errno));
		goto out;
	}
	close(err[1]);
	close(status[1]);
	err[1] = status[1] = -1;
	while (got < (ssize_t)wsize - 1 &&
	       (n = read(err[0], words + got, wsize - 1 - (size_t)got)) > 0)
		got += n;
	words[got] = 0;
	for (char *c = words; *c; c++)
		if (*c == '\n')
			*c = ' ';
	if (read(status[0], &st, sizeof st) != sizeof st)
		st = -1;
	/* the daemon's reaper may have taken the child already: its grandchild's status is in */
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
	rc = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : 126;
out:
	if (in >= 0)
		close(in);
	for (int i = 0; i < 2; i++) {
		if (err[i] >= 0)
			close(err[i]);
		if (status[i] >= 0)
			close(status[i]);
	}
	return rc;
}

/* The rules r into netns_fd's filter table, replacing it whole (atomically): 0, or -errno with
 * a message quoting the tool. */
static int restore(int netns_fd, int v6, const struct rules *r)
{
	char *const argv[] = {v6 ? "ip6tables-restore" : "iptables-restore", NULL};
	char words[300];
	int rc = run_tool(netns_fd, argv, r->text, r->len, words, sizeof words);

	if (rc > 0)
		rc = cb_error_set(EPERM,
				  "network all: cannot keep the host's addresses out of the "
				  "namespace: %s: %s",
				  argv[0], *words ? words : "failed");
	return rc;
}

/* One rule "tool -A chain SPEC..." unless "-C" finds it: 0, 1 when the tool refused to add it
 * (words says why), or -errno. spec is NULL-terminated, at most 20 words. */
static int host_rule_ensure(const char *tool, const char *chain, const char *const *spec,
			    char *words, size_t size)
{
	char *argv[26];
	size_t n = 0;
	int rc;

	argv[n++] = (char *)tool;
	argv[n++] = "-w";
	argv[n++] = "-C";
	argv[n++] = (char *)chain;
	for (size_t i = 0; spec[i] && n < sizeof argv / sizeof *argv - 1; i++)
		argv[n++] = (char *)spec[i];
	argv[n] = NULL;
	if ((rc = run_tool(-1, argv, NULL, 0, words, size)) <= 0)
		return rc;
	argv[2] = "-A";
	return run_tool(-1, argv, NULL, 0, words, size) == 0 ? 0 : 1;
}

/* The jump "tool -I parent 1 -j chain" unless there, the chain made first: as
 * host_rule_ensure. */
static int host_chain_ensure(const char *tool, const char *parent, const char *chain, char *words,
			     size_t size)
{
	char *const mk[] = {(char *)tool, "-w", "-N", (char *)chain, NULL};
	char *const check[] = {(char *)tool, "-w", "-C", (char *)parent, "-j", (char *)chain, NULL};
	char *const ins[] = {(char *)tool, "-w", "-I",		(char *)parent,
			     "1",	   "-j", (char *)chain, NULL};
	int rc;

	if ((rc = run_tool(-1, mk, NULL, 0, words, size)) < 0 ||
	    (rc = run_tool(-1, check, NULL, 0, words, size)) <= 0)
		return rc;
	return run_tool(-1, ins, NULL, 0, words, size) == 0 ? 0 : 1;
}

/* Why INPUT too: OUTPUT's addrtype is judged when the packet leaves. An address the host
 * gains a moment later (a veth's, a VPN's coming up) still takes a packet routed out while
 * it was not local, and the host accepts it. So pasta's connections are marked (a bit of the
 * conntrack mark) and any packet of theirs in the original direction that the host delivers
 * to itself is refused where it arrives; replies to pasta come in the reply direction. */
#define PASTA_CONNMARK "0x20000000/0x20000000"

/* The INPUT half (see PASTA_CONNMARK) for one tool: 0, or as host_rule's fail. */
static int host_input_rule(const char *tool, char *words, size_t size)
{
	static const char *const mark[] = {"-m", "owner",    "--gid-owner", CB_PASTA_GID_TEXT,
					   "-j", "CONNMARK", "--set-xmark", PASTA_CONNMARK,
					   NULL};
	static const char *const tcp[] = {
	    "-m",	 "connmark", "--mark",	      PASTA_CONNMARK, "-m",
	    "conntrack", "--ctdir",  "ORIGINAL",      "-p",	      "tcp",
	    "-j",	 "REJECT",   "--reject-with", "tcp-reset",    NULL};
	static const char *const other[] = {"-m", "connmark",  "--mark",  PASTA_CONNMARK,
					    "-m", "conntrack", "--ctdir", "ORIGINAL",
					    "-j", "REJECT",    NULL};
	int rc;

	if ((rc = host_rule_ensure(tool, "COWBOX-PASTA", mark, words, size)) != 0 ||
	    (rc = host_chain_ensure(tool, "INPUT", "COWBOX-PASTA-IN", words, size)) != 0 ||
	    (rc = host_rule_ensure(tool, "COWBOX-PASTA-IN", tcp, words, size)) != 0)
		return rc;
	return host_rule_ensure(tool, "COWBOX-PASTA-IN", other, words, size);
}

/* The host's rule for pasta's sockets (see cb_pasta_host_rule), for one tool (iptables or
 * ip6tables): each part checked (-C) and made only when missing, so that the workspaces
 * already served are never without it. */
static int host_rule(const char *tool)
{
	static const char *const match[] = {"-m", "owner",    "--gid-owner", CB_PASTA_GID_TEXT,
					    "-m", "addrtype", "--dst-type",  "LOCAL"};
	char words[300];
	int rc;

	/* the chain (made unless there), then its two rules, then the jump to it first */
	{
		char *const argv[] = {(char *)tool, "-w", "-N", "COWBOX-PASTA", NULL};

		if ((rc = run_tool(-1, argv, NULL, 0, words, sizeof words)) < 0)
			return rc;
	}
	for (int tcp = 1; tcp >= 0; tcp--) {
		char *argv[24];
		size_t n = 0;

		argv[n++] = (char *)tool;
		argv[n++] = "-w";
		argv[n++] = "-C";
		argv[n++] = "COWBOX-PASTA";
		for (size_t i = 0; i < sizeof match / sizeof *match; i++)
			argv[n++] = (char *)match[i];
		if (tcp) {
			argv[n++] = "-p";
			argv[n++] = "tcp";
		}
		argv[n++] = "-j";
		argv[n++] = "REJECT";
		if (tcp) {
			argv[n++] = "--reject-with";
			argv[n++] = "tcp-reset";
		}
		argv[n] = NULL;
		if ((rc = run_tool(-1, argv, NULL, 0, words, sizeof words)) < 0)
			return rc;
		if (rc == 0)
			continue;
		argv[2] = "-A";
		if ((rc = run_tool(-1, argv, NULL, 0, words, sizeof words)) != 0)
			goto fail;
	}
	{
		char *argv[] = {(char *)tool, "-w", "-C", "OUTPUT", "-j", "COWBOX-PASTA", NULL};
		char *ins[] = {(char *)tool, "-w", "-I", "OUTPUT", "1", "-j", "COWBOX-PASTA", NULL};

		if ((rc = run_tool(-1, argv, NULL, 0, words, sizeof words)) < 0)
			return rc;
		if (rc && (rc = run_tool(-1, ins, NULL, 0, words, sizeof words)) != 0)
			goto fail;
	}
	if ((rc = host_input_rule(tool, words, sizeof words)) != 0)
		goto fail;
	return 0;
fail:
	return rc < 0 ? rc
		      : cb_error_set(EPERM,
				     "network all: cannot keep the host's addresses from pasta: "
				     "%s: %s",
				     tool, *words ? words : "failed");
}

/* Whether the host has an IPv6 address (else ip6tables may well be missing or unusable). */
static int host_has_ipv6(void)
{
	FILE *f = fopen("/proc/net/if_inet6", "re");
	int c = f ? fgetc(f) : EOF;

	if (f)
		fclose(f);
	return c != EOF;
}

int cb_pasta_host_rule(void)
{
	int rc = host_rule("iptables");

	if (!rc && host_has_ipv6())
		rc = host_rule("ip6tables");
	return rc;
}

/* A container's packets reach the host through the engine's bridge: its INPUT sees only what
 * the host delivers to itself, so one chain, first in INPUT, refuses the container's address
 * there (see cb_pasta_source_rule). */
#define SOURCE_CHAIN "COWBOX-SOURCE-IN"

int cb_pasta_source_rule(const char *addr, const char *tag)
{
	const char *tool = strchr(addr, ':') ? "ip6tables" : "iptables";
	const char *const tcp[] = {"-s",	addr,  "-m",	    "comment", "--comment",
				   tag,		"-m",  "conntrack", "--ctdir", "ORIGINAL",
				   "-p",	"tcp", "-j",	    "REJECT",  "--reject-with",
				   "tcp-reset", NULL};
	const char *const other[] = {"-s", addr,     "-m",	  "comment", "--comment",
				     tag,  "-m",     "conntrack", "--ctdir", "ORIGINAL",
				     "-j", "REJECT", NULL};
	char words[300];
	int rc;

	if ((rc = host_chain_ensure(tool, "INPUT", SOURCE_CHAIN, words, sizeof words)) == 0 &&
	    (rc = host_rule_ensure(tool, SOURCE_CHAIN, tcp, words, sizeof words)) == 0)
		rc = host_rule_ensure(tool, SOURCE_CHAIN, other, words, sizeof words);
	if (rc > 0)
		rc = cb_error_set(EPERM,
				  "network all: cannot keep the host's addresses from %s: %s: %s",
				  addr, tool, *words ? words : "failed");
	return rc;
}

/* Each rule of the chain that names tag, deleted: the listing (one line per rule, run_tool
 * joins them with blanks) cut at each "-A ", its words given back with -D. */
static void source_purge(const char *tool, const char *tag)
{
	char *const list[] = {(char *)tool, "-w", "-S", SOURCE_CHAIN, NULL};
	size_t size = 65536, tlen = strlen(tag);
	char *all = malloc(size), *rule, *next;

	if (!all || run_tool(-1, list, NULL, 0, all, size) != 0) {
		free(all);
		return;
	}
	for (rule = strstr(all, "-A "); rule; rule = next) {
		char *argv[40], *c = rule, *save = NULL, *w, *hit, words[300];
		size_t n = 0;

		if ((next = strstr(rule + 3, " -A ")))
			*next++ = 0;
		hit = strstr(rule, "--comment ");
		if (!hit || strncmp(hit + 10, tag, tlen) ||
		    (hit[10 + tlen] && hit[10 + tlen] != ' '))
			continue;
		argv[n++] = (char *)tool;
		argv[n++] = "-w";
		for (; n < sizeof argv / sizeof *argv - 1 && (w = strtok_r(c, " ", &save));
		     c = NULL)
			argv[n++] = w;
		argv[n] = NULL;
		argv[2] = "-D";
		(void)run_tool(-1, argv, NULL, 0, words, sizeof words);
	}
	free(all);
}

void cb_pasta_source_purge(const char *tag)
{
	source_purge("iptables", tag);
	if (host_has_ipv6())
		source_purge("ip6tables", tag);
}

/* The host's addresses now, into the namespace's rules. IPv6's only matter when the host has
 * any (a kernel without IPv6 has no ip6tables either). */
static int guard_apply(struct cb_pasta_guard *g)
{
	struct rules v4 = {0}, v6 = {0};
	int rc;

	if (!(rc = host_rules(&v4, &v6)) && !(rc = restore(g->netns_fd, 0, &v4)) && v6.n)
		rc = restore(g->netns_fd, 1, &v6);
	free(v4.text);
	free(v6.text);
	return rc;
}

/* Each change of the host's addresses (any message on the subscription; an overrun too)
 * rewrites the rules: what the host holds at that moment. */
static void *guard_main(void *arg)
{
	struct cb_pasta_guard *g = arg;
	char buf[8192];

	for (;;) {
		struct pollfd pf[2] = {{.fd = g->events, .events = POLLIN},
				       {.fd = g->stop_fd, .events = POLLIN}};
		int changed = 0;

		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			break;
		if (pf[1].revents)
			break;
		while (recv(g->events, buf, sizeof buf, MSG_DONTWAIT) > 0 || errno == ENOBUFS)
			changed = 1;
		if (changed && guard_apply(g) < 0)
			fprintf(stderr, "cowbox: %s\n", cb_error_message());
	}
	return NULL;
}

int cb_pasta_guard_start(int netns_fd, struct cb_pasta_guard **out)
{
	struct cb_pasta_guard *g = calloc(1, sizeof(*g));
	struct sockaddr_nl sub = {.nl_family = AF_NETLINK,
				  .nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR};
	int rc;

	*out = NULL;
	if (!g)
		return cb_error_set(ENOMEM, "network all: out of memory");
	g->events = g->stop_fd = -1;
	g->netns_fd = fcntl(netns_fd, F_DUPFD_CLOEXEC, 3);
	g->events = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	g->stop_fd = eventfd(0, EFD_CLOEXEC);
	/* subscribed before the first dump: a change meanwhile is seen again */
	if (g->netns_fd < 0 || g->events < 0 || g->stop_fd < 0 ||
	    bind(g->events, (struct sockaddr *)&sub, sizeof sub) < 0) {
		rc = cb_error_set(errno, "network all: watching the host's addresses: %s",
				  strerror(errno));
		goto out;
	}
	if ((rc = guard_apply(g)) < 0)
		goto out;
	if ((rc = pthread_create(&g->thread, NULL, guard_main, g))) {
		rc = cb_error_set(rc, "network all: guard thread: %s", strerror(rc));
		goto out;
	}
	*out = g;
	g = NULL;
out:
	if (g) {
		if (g->netns_fd >= 0)
			close(g->netns_fd);
		if (g->events >= 0)
			close(g->events);
		if (g->stop_fd >= 0)
			close(g->stop_fd);
		free(g);
	}
	return rc;
}

void cb_pasta_guard_stop(struct cb_pasta_guard *g)
{
	uint64_t one = 1;

	if (!g)
		return;
	(void)!write(g->stop_fd, &one, sizeof one);
	pthread_join(g->thread, NULL);
	close(g->netns_fd);
	close(g->events);
	close(g->stop_fd);
	free(g);
}
