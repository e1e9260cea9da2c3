/* Network policy (net/policy.c) and the egress proxy (net/proxy.c): what a workspace under
 * network public or allow may connect to, decided outside the sandbox on the address used. */
#ifndef COWBOX_NET_H
#define COWBOX_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Where the proxy listens inside a workspace's network namespace (127.0.0.1 there). */
#define CB_NET_PROXY_PORT      3128
#define CB_NET_PROXY_PORT_TEXT "3128"

enum cb_net_policy_mode {
	CB_NET_POLICY_PUBLIC, /* any address but the special ranges (private, loopback, ...) */
	CB_NET_POLICY_ALLOW,  /* only what an entry names */
};

enum cb_net_entry_kind {
	CB_NET_ENTRY_HOST,     /* an exact name */
	CB_NET_ENTRY_WILDCARD, /* *.domain: any subdomain, not the domain itself */
	CB_NET_ENTRY_CIDR,     /* an address (a /32 or /128) or a range */
};

struct cb_net_entry {
	char *text; /* as written, for the rule named in answers */
	enum cb_net_entry_kind kind;
	char *host; /* HOST: the name; WILDCARD: the suffix with its dot (".example.com");
		       lower case, no trailing dot */
	int family; /* CIDR: AF_INET or AF_INET6 */
	uint8_t addr[16];
	int prefix;
	int port; /* 0: 443 and 80 */
};

struct cb_net_policy {
	enum cb_net_policy_mode mode;
	size_t n;
	struct cb_net_entry *entries;
};

/* An answer: allowed or not, and the rule that decided (an entry as written, "public", or why
 * nothing allowed it), one line. */
struct cb_net_verdict {
	int allowed;
	char rule[256];
};

/* Parse one entry (host, host:port, *.domain, an IPv4 or [IPv6] address with an optional
 * port, a CIDR): 0, or -EINVAL with a message naming the entry and what is wrong (empty
 * host, bad CIDR, port out of range, a wildcard not in front). out is cleared on error. */
int cb_net_entry_parse(const char *text, struct cb_net_entry *out);

/* A policy from a mode and its entries (public takes none: -EINVAL); free with
 * cb_net_policy_free. Every entry is checked as cb_net_entry_parse does. */
int cb_net_policy_new(enum cb_net_policy_mode mode, char *const *entries, size_t n,
		      struct cb_net_policy **out);
void cb_net_policy_free(struct cb_net_policy *p);

/* Before resolving: may a connection to name:port be tried at all? Under allow, a name that
 * no host or wildcard entry matches is refused without a lookup, unless an address or CIDR
 * entry opens that port (then its address decides); a literal address is decided by
 * cb_net_check_addr. Never blocks. */
void cb_net_check_name(const struct cb_net_policy *p, const char *name, int port,
		       struct cb_net_verdict *v);

/* The decision on the address actually connected to (name as asked, possibly an address
 * literal): special ranges (private, loopback, link-local with metadata, CGNAT, multicast,
 * ULA, this-network, their IPv4-mapped and NAT64 forms) are refused unless an address or CIDR
 * entry with a matching port contains the address; otherwise public allows it, and allow
 * needs an entry matching the name or the address and the port. */
void cb_net_check_addr(const struct cb_net_policy *p, const char *name, const struct sockaddr *sa,
		       int port, struct cb_net_verdict *v);

/* reaches: whether "host[:port]" (port 443 when absent; [v6]:port for IPv6) is opened by the
 * policy and by which rule. Names are not resolved: an allowed name's addresses are still
 * checked at connect time. -EINVAL with a message for a malformed destination. */
int cb_net_reaches(const struct cb_net_policy *p, const char *dest, struct cb_net_verdict *v);

/* The special range an address lies in ("loopback 127.0.0.0/8", ...), NULL for a public one. */
const char *cb_net_special_range(const struct sockaddr *sa);

/* Whether an address or CIDR entry of p with a matching port contains sa's address (what
 * opens a special range or one of the host's own addresses). */
int cb_net_entry_names_addr(const struct cb_net_policy *p, const struct sockaddr *sa, int port);

/* Whether the host (this network namespace) delivers sa's address to itself: 1 for an address
 * of any of its interfaces (or a local route's range), 0 for one it routes elsewhere or cannot
 * reach, -errno with a message when the kernel cannot be asked (callers refuse then). Asked of
 * the routing tables by netlink at each call: an address added a moment ago counts. *nl is
 * the caller's netlink socket (-1: one is made; the caller closes it), used by one thread at a
 * time. */
int cb_net_host_own(int *nl, const struct sockaddr *sa);

/* ---- the proxy (net/proxy.c) ---- */

/* One connection attempt as the proxy saw it, for the network log. */
struct cb_net_record {
	double time;	     /* when it was asked for (Unix seconds) */
	const char *proto;   /* "connect", "http", "socks5" */
	const char *name;    /* the destination as asked ("" if the request was malformed) */
	const char *address; /* the address connected to or refused ("" when none) */
	int port;
	int allowed;
	const char *rule;
	unsigned long long bytes_up, bytes_down; /* sandbox to destination, and back */
	double duration;			 /* seconds from the request to the close */
	int secret;				 /* a header secret was injected */
};

/* A header secret (docs/network.md#header-secrets): requests to host (any port, through
 * CONNECT or SOCKS5) whose path starts with path_prefix get "header: prefix value suffix",
 * replacing what the sandbox sent. The value is resolved already (never stored here). */
struct cb_net_binding {
	const char *host; /* lower case, no trailing dot */
	const char *header;
	const char *value;
	const char *path_prefix; /* "/" for every path */
	const char *prefix, *suffix;
};

struct cb_net_proxy_config {
	int listen_fd; /* a listening TCP socket (taken over, closed by the proxy) */
	const struct cb_net_policy *policy; /* copied */
	/* Called on the proxy's thread once per attempt, when it ends; may be NULL. */
	void (*record)(void *arg, const struct cb_net_record *r);
	void *record_arg;
	double dns_timeout; /* seconds; <= 0: 5 */
	/* Event loops, each on a thread of its own, all accepting from listen_fd; <= 0: as
	 * $COWBOX_PROXY_LOOPS says (tests), else one per online CPU; at most 4. */
	int loops;
	/* Header secrets: connections to a bound host are intercepted (TLS ended here with a
	 * leaf of the CA in ca_dir, the upstream's certificate verified against the system
	 * store and $COWBOX_PROXY_EXTRA_CA); every other host is tunnelled untouched. */
	const struct cb_net_binding *bindings; /* copied */
	size_t n_bindings;
	const char *ca_dir; /* holds CB_NET_CA_KEY and CB_NET_CA_CERT; needed with bindings */
	/* Connections open at once (docs/network.md#connection-cap); 0: CB_NET_MAX_CONNS. Lowered
	 * at start so that they, at CB_NET_FDS_PER_CONN each, leave CB_NET_FD_RESERVE of the
	 * process's open-file limit to the mount and the turn ops. */
	size_t max_conns;
};

#define CB_NET_MAX_CONNS    256 /* the default cap of a workspace's proxy connections */
#define CB_NET_FDS_PER_CONN 6	/* a tunnel's: two sockets, two pipes */
#define CB_NET_FD_RESERVE   512 /* fds of the daemon's limit the proxy never counts on */
#define CB_NET_IDLE_MIN	    1.0 /* seconds without a byte before a tunnel counts as idle */

struct cb_net_proxy;

/* Start the proxy on its own threads (its event loops, docs/network.md#event-loops): HTTP CONNECT,
 * plain HTTP forwarding (absolute URIs) and SOCKS5 (CONNECT, names resolved here), each destination
 * checked by the policy before and after resolution. Names are looked up in $COWBOX_PROXY_HOSTS (a
 * hosts-format file) first, then by DNS (asynchronously, with the timeout). */
int cb_net_proxy_start(const struct cb_net_proxy_config *cfg, struct cb_net_proxy **out);
/* Stop it: every connection is closed and recorded; NULL is a no-op. */
void cb_net_proxy_stop(struct cb_net_proxy *p);
/* Connections open now (tests, info). */
size_t cb_net_proxy_open_count(struct cb_net_proxy *p);
/* The cap on connections it keeps (max_conns as lowered for the fd reserve). */
size_t cb_net_proxy_max_conns(struct cb_net_proxy *p);

/* ---- the workspace's certificate authority (net/ca.c) ---- */

/* The names in a workspace directory (outside the sandbox): the key (0600), its certificate,
 * and the trust bundle the sandbox's TLS clients read (system CAs + the certificate). */
#define CB_NET_CA_KEY	 "ca-key.pem"
#define CB_NET_CA_CERT	 "ca.pem"
#define CB_NET_CA_BUNDLE "ca-bundle.pem"

/* Make dir's CA (an EC P-256 key, 0600, and a self-signed certificate for 10 years, named
 * after label) unless both files exist: 0, or -errno with a message. */
int cb_net_ca_ensure(const char *dir, const char *label);
/* Write dir's bundle: system_bundle (skipped when missing or NULL), then dir's certificate,
 * by a file renamed in place, mode 0644. */
int cb_net_ca_bundle(const char *dir, const char *system_bundle);

#endif
