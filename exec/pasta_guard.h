/* Private to exec/ and the backends that run passt, pasta or a container (vm_net.c, docker.c):
 * the firewall rules that keep a sandbox's network from the host's own addresses. */
#ifndef COWBOX_EXEC_PASTA_GUARD_H
#define COWBOX_EXEC_PASTA_GUARD_H

/* pasta and passt run with this group: one no account uses, so that the host's firewall can
 * tell their sockets from every other's. */
#define CB_PASTA_GID	  2147483630
#define CB_PASTA_GID_TEXT "2147483630"

/* In the caller's (the host's) namespace, a chain COWBOX-PASTA jumped to first from OUTPUT
 * rejects every packet of a socket of CB_PASTA_GID to an address the host delivers to itself
 * (addrtype LOCAL, decided per packet: no address is ever new to it), each part checked and
 * made only when missing (iptables, and ip6tables when the host has IPv6). 0, or -errno with
 * a message quoting the tool. */
int cb_pasta_host_rule(void);

/* Network all's guard (exec/pasta_guard.c): every address of the caller's (the host's)
 * interfaces rejected in netns_fd's firewall, unless it leaves through lo there, and rewritten
 * by a thread of its own at each change of the host's addresses. 0 once the first rules are
 * in; -errno with a message (iptables-restore missing or failing) otherwise. */
struct cb_pasta_guard;
int cb_pasta_guard_start(int netns_fd, struct cb_pasta_guard **out);

/* Stop its thread and free g (the rules stay with the namespace); NULL is fine. */
void cb_pasta_guard_stop(struct cb_pasta_guard *g);

/* The host's INPUT refuses every packet from addr (a container's address on the engine's
 * bridge) in the original direction of its connection: whatever reaches INPUT is for one of
 * the host's own addresses, judged per packet, so an address the host gains is refused before
 * any rewrite of a namespace's rules. Each rule carries tag (a comment) for
 * cb_pasta_source_purge. 0, or -errno with a message quoting the tool. */
int cb_pasta_source_rule(const char *addr, const char *tag);

/* Remove every rule cb_pasta_source_rule made with tag (iptables and ip6tables; none is fine). */
void cb_pasta_source_purge(const char *tag);

#endif
