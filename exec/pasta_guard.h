/* Private to exec/ and the backends that run passt or pasta (backends/vm_net.c): the host's
 * firewall rule that keeps their sockets from the host's own addresses (exec/pasta_guard.c). */
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

#endif
