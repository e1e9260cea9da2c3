/* Network policy: parsing allow entries (host, host:port, *.domain, addresses, CIDRs) and
 * deciding a destination, by name before resolution and by the address actually connected. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/net.h"

struct special_range {
	int family;
	uint8_t addr[16];
	int prefix;
	const char *name;
};

/* Checked in order: the first match names the range (metadata before link-local). */
static const struct special_range special[] = {
    {AF_INET, {169, 254, 169, 254}, 32, "cloud metadata 169.254.169.254"},
    {AF_INET, {0}, 8, "this network 0.0.0.0/8"},
    {AF_INET, {10}, 8, "private 10.0.0.0/8"},
    {AF_INET, {100, 64}, 10, "carrier-grade NAT 100.64.0.0/10"},
    {AF_INET, {127}, 8, "loopback 127.0.0.0/8"},
    {AF_INET, {169, 254}, 16, "link-local 169.254.0.0/16"},
    {AF_INET, {172, 16}, 12, "private 172.16.0.0/12"},
    {AF_INET, {192, 0, 0}, 24, "IETF protocol assignments 192.0.0.0/24"},
    {AF_INET, {192, 168}, 16, "private 192.168.0.0/16"},
    {AF_INET, {198, 18}, 15, "benchmarking 198.18.0.0/15"},
    {AF_INET, {224}, 4, "multicast 224.0.0.0/4"},
    {AF_INET, {240}, 4, "reserved 240.0.0.0/4"},
    {AF_INET6, {0}, 128, "unspecified ::"},
    {AF_INET6, {[15] = 1}, 128, "loopback ::1"},
    {AF_INET6, {0}, 96, "IPv4-compatible ::/96"},
    {AF_INET6, {0xfc}, 7, "unique local fc00::/7"},
    {AF_INET6, {0xfe, 0x80}, 10, "link-local fe80::/10"},
    {AF_INET6, {0xfe, 0xc0}, 10, "site-local fec0::/10"},
    {AF_INET6, {0xff}, 8, "multicast ff00::/8"},
};

static int prefix_match(const uint8_t *a, const uint8_t *b, int prefix)
{
	int full = prefix / 8, rest = prefix % 8;

	if (memcmp(a, b, (size_t)full))
		return 0;
	return !rest || ((a[full] ^ b[full]) & (0xff << (8 - rest)) & 0xff) == 0;
}

/* An address as (family, bytes), IPv4-mapped (::ffff:a.b.c.d) and NAT64 (64:ff9b::a.b.c.d)
 * forms folded to IPv4, so that one table decides both. */
static int addr_of(const struct sockaddr *sa, uint8_t out[16])
{
	static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
	static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b};

	memset(out, 0, 16);
	if (sa->sa_family == AF_INET) {
		memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return AF_INET;
	}
	if (sa->sa_family != AF_INET6)
		return 0;
	memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	if (!memcmp(out, mapped, 12) || !memcmp(out, nat64, 12)) {
		memmove(out, out + 12, 4);
		memset(out + 4, 0, 12);
		return AF_INET;
	}
	return AF_INET6;
}

const char *cb_net_special_range(const struct sockaddr *sa)
{
	uint8_t a[16];
	int fam = addr_of(sa, a);

	if (!fam)
		return "not an IP address";
	for (size_t i = 0; i < sizeof special / sizeof *special; i++)
		if (special[i].family == fam && prefix_match(a, special[i].addr, special[i].prefix))
			return special[i].name;
	return NULL;
}

static int valid_label_char(char c)
{
	return isalnum((unsigned char)c) || c == '-' || c == '_';
}

/* A DNS name: labels of letters, digits, '-' and '_', 1-63 each, 253 in all. */
static int name_ok(const char *s)
{
	size_t len = strlen(s), label = 0;

	if (!len || len > 253)
		return 0;
	for (const char *c = s; *c; c++) {
		if (*c == '.') {
			if (!label)
				return 0;
			label = 0;
		} else if (!valid_label_char(*c) || ++label > 63) {
			return 0;
		}
	}
	return label > 0;
}

static int port_parse(const char *s, int *out)
{
	long v = 0;

	if (!*s || strlen(s) > 5)
		return -1;
	for (const char *c = s; *c; c++) {
		if (!isdigit((unsigned char)*c))
			return -1;
		v = v * 10 + (*c - '0');
	}
	if (v < 1 || v > 65535)
		return -1;
	*out = (int)v;
	return 0;
}

/* Split "host:port", "[v6]:port", "v6", "v6/len" into host and port (0 when none). */
static int split_port(char *s, char **host, int *port, const char *what, const char *text)
{
	char *colon;

	*port = 0;
	*host = s;
	if (*s == '[') {
		char *end = strchr(s, ']');

		if (!end || (end[1] && end[1] != ':'))
			return cb_error_set(EINVAL,
					    "%s '%s': a bracketed IPv6 address needs ']' "
					    "and an optional :port",
					    what, text);
		*end = 0;
		*host = s + 1;
		colon = end[1] ? end + 1 : NULL;
	} else {
		colon = strchr(s, ':');
		if (colon && strchr(colon + 1, ':'))
			colon = NULL; /* a bare IPv6 address (or CIDR): no port */
	}
	if (colon) {
		*colon = 0;
		if (port_parse(colon + 1, port) < 0)
			return cb_error_set(EINVAL, "%s '%s': port '%s' is not in 1-65535", what,
					    text, colon + 1);
	}
	return 0;
}

static int cidr_parse(char *host, struct cb_net_entry *e, const char *text)
{
	char *slash = strchr(host, '/');
	int max;

	if (slash)
		*slash = 0;
	if (inet_pton(AF_INET, host, e->addr) == 1)
		e->family = AF_INET, max = 32;
	else if (inet_pton(AF_INET6, host, e->addr) == 1)
		e->family = AF_INET6, max = 128;
	else if (slash)
		return cb_error_set(EINVAL, "allow entry '%s': '%s' is not an IP address", text,
				    host);
	else
		return 1; /* not an address: a name */
	e->prefix = max;
	if (slash) {
		char *end;
		long v = strtol(slash + 1, &end, 10);

		if (!slash[1] || *end || v < 0 || v > max)
			return cb_error_set(EINVAL,
					    "allow entry '%s': prefix length '%s' is not in "
					    "0-%d",
					    text, slash + 1, max);
		e->prefix = (int)v;
		for (int bit = e->prefix; bit < max; bit++)
			if (e->addr[bit / 8] & (0x80 >> (bit % 8)))
				return cb_error_set(EINVAL,
						    "allow entry '%s': bits set past the "
						    "/%d prefix (a bad CIDR)",
						    text, e->prefix);
	}
	e->kind = CB_NET_ENTRY_CIDR;
	return 0;
}

static void entry_free(struct cb_net_entry *e)
{
	free(e->text);
	free(e->host);
	memset(e, 0, sizeof(*e));
}

int cb_net_entry_parse(const char *text, struct cb_net_entry *out)
{
	char *s = NULL, *host;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!text || !*text)
		return cb_error_set(EINVAL, "allow entry: empty");
	if (!(s = strdup(text)) || !(out->text = strdup(text))) {
		rc = cb_error_set(ENOMEM, "allow entry: out of memory");
		goto out;
	}
	if ((rc = split_port(s, &host, &out->port, "allow entry", text)) < 0)
		goto out;
	if (!*host) {
		rc = cb_error_set(EINVAL, "allow entry '%s': empty host", text);
		goto out;
	}
	if ((rc = cidr_parse(host, out, text)) <= 0)
		goto out;
	for (char *c = host; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	if (host[strlen(host) - 1] == '.' && host[1])
		host[strlen(host) - 1] = 0;
	out->kind = CB_NET_ENTRY_HOST;
	if (!strncmp(host, "*.", 2)) {
		out->kind = CB_NET_ENTRY_WILDCARD;
		host++; /* keep the dot: ".example.com" */
	}
	if (strchr(host, '*')) {
		rc = cb_error_set(EINVAL,
				  "allow entry '%s': a wildcard only as the whole first "
				  "label (*.example.com)",
				  text);
		goto out;
	}
	if (!name_ok(out->kind == CB_NET_ENTRY_WILDCARD ? host + 1 : host)) {
		rc = cb_error_set(EINVAL,
				  "allow entry '%s': '%s' is not a host name, an address "
				  "or a CIDR",
				  text, host);
		goto out;
	}
	if (!(out->host = strdup(host)))
		rc = cb_error_set(ENOMEM, "allow entry: out of memory");
out:
	free(s);
	if (rc < 0)
		entry_free(out);
	return rc < 0 ? rc : 0;
}

int cb_net_policy_new(enum cb_net_policy_mode mode, char *const *entries, size_t n,
		      struct cb_net_policy **out)
{
	struct cb_net_policy *p = calloc(1, sizeof(*p));
	int rc = 0;

	*out = NULL;
	if (!p || (n && !(p->entries = calloc(n, sizeof(*p->entries))))) {
		rc = cb_error_set(ENOMEM, "network policy: out of memory");
		goto out;
	}
	p->mode = mode;
	if (mode == CB_NET_POLICY_PUBLIC && n) {
		rc = cb_error_set(EINVAL, "network public takes no allow entries (use network "
					  "allow)");
		goto out;
	}
	for (; p->n < n; p->n++)
		if ((rc = cb_net_entry_parse(entries[p->n], &p->entries[p->n])) < 0)
			goto out;
	*out = p;
	p = NULL;
out:
	cb_net_policy_free(p);
	return rc;
}

void cb_net_policy_free(struct cb_net_policy *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		entry_free(&p->entries[i]);
	free(p->entries);
	free(p);
}

static int port_ok(const struct cb_net_entry *e, int port)
{
	return e->port ? e->port == port : (port == 443 || port == 80);
}

static int name_matches(const struct cb_net_entry *e, const char *name)
{
	size_t nl = strlen(name), sl;

	if (e->kind == CB_NET_ENTRY_HOST)
		return !strcasecmp(e->host, name);
	if (e->kind != CB_NET_ENTRY_WILDCARD)
		return 0;
	sl = strlen(e->host);
	return nl > sl && !strcasecmp(name + nl - sl, e->host);
}

static void verdict(struct cb_net_verdict *v, int allowed, const char *fmt, const char *a,
		    const char *b)
{
	v->allowed = allowed;
	snprintf(v->rule, sizeof v->rule, fmt, a, b);
}

/* The name without a trailing dot ("example.com." is example.com). */
static void name_norm(const char *name, char *buf, size_t size)
{
	size_t n;

	snprintf(buf, size, "%s", name ? name : "");
	n = strlen(buf);
	if (n > 1 && buf[n - 1] == '.')
		buf[n - 1] = 0;
}

/* The host or wildcard entry that opens name:port, if any. */
static const struct cb_net_entry *name_entry(const struct cb_net_policy *p, const char *name,
					     int port)
{
	for (size_t i = 0; i < p->n; i++)
		if (name_matches(&p->entries[i], name) && port_ok(&p->entries[i], port))
			return &p->entries[i];
	return NULL;
}

void cb_net_check_name(const struct cb_net_policy *p, const char *name, int port,
		       struct cb_net_verdict *v)
{
	const struct cb_net_entry *e;
	char n[256], ps[16];
	uint8_t a[16];

	name_norm(name, n, sizeof n);
	snprintf(ps, sizeof ps, "%d", port);
	if (inet_pton(AF_INET, n, a) == 1 || inet_pton(AF_INET6, n, a) == 1) {
		verdict(v, 1, "address %s%s: decided on the address", n, "");
		return;
	}
	if (!*n || !name_ok(n)) {
		verdict(v, 0, "'%s' is not a host name%s", n, "");
		return;
	}
	if (p->mode == CB_NET_POLICY_PUBLIC) {
		verdict(v, 1, "public%s%s", "", "");
		return;
	}
	if ((e = name_entry(p, n, port))) {
		verdict(v, 1, "allow %s%s", e->text, "");
		return;
	}
	/* an address or CIDR entry may open the name's address: resolve and decide on that */
	for (size_t i = 0; i < p->n; i++)
		if (p->entries[i].kind == CB_NET_ENTRY_CIDR && port_ok(&p->entries[i], port)) {
			verdict(v, 1, "%s: decided on its address%s", n, "");
			return;
		}
	verdict(v, 0, "no allow entry matches %s:%s", n, ps);
}

int cb_net_entry_names_addr(const struct cb_net_policy *p, const struct sockaddr *sa, int port)
{
	uint8_t a[16];
	int fam = addr_of(sa, a);

	for (size_t i = 0; fam && i < p->n; i++) {
		const struct cb_net_entry *e = &p->entries[i];

		if (e->kind == CB_NET_ENTRY_CIDR && e->family == fam &&
		    prefix_match(a, e->addr, e->prefix) && port_ok(e, port))
			return 1;
	}
	return 0;
}

void cb_net_check_addr(const struct cb_net_policy *p, const char *name, const struct sockaddr *sa,
		       int port, struct cb_net_verdict *v)
{
	const struct cb_net_entry *e;
	char txt[INET6_ADDRSTRLEN], n[256];
	uint8_t a[16];
	int fam = addr_of(sa, a);
	const char *range = cb_net_special_range(sa);

	name_norm(name, n, sizeof n);
	inet_ntop(fam == AF_INET ? AF_INET : AF_INET6, a, txt, sizeof txt);
	if (!fam) {
		verdict(v, 0, "not an IP address%s%s", "", "");
		return;
	}
	/* An entry naming the address or its range opens it, special or not. */
	for (size_t i = 0; i < p->n; i++) {
		e = &p->entries[i];
		if (e->kind == CB_NET_ENTRY_CIDR && e->family == fam &&
		    prefix_match(a, e->addr, e->prefix) && port_ok(e, port)) {
			verdict(v, 1, "allow %s%s", e->text, "");
			return;
		}
	}
	if (range) {
		verdict(v, 0, "address %s is %s (refused unless an entry names it)", txt, range);
		return;
	}
	if (p->mode == CB_NET_POLICY_PUBLIC) {
		verdict(v, 1, "public%s%s", "", "");
		return;
	}
	if ((e = name_entry(p, n, port))) {
		verdict(v, 1, "allow %s%s", e->text, "");
		return;
	}
	v->allowed = 0;
	snprintf(v->rule, sizeof v->rule, "no allow entry matches %s (%s) port %d", n, txt, port);
}

int cb_net_reaches(const struct cb_net_policy *p, const char *dest, struct cb_net_verdict *v)
{
	struct sockaddr_storage ss = {0};
	char *s = dest ? strdup(dest) : NULL, *host;
	int port = 0, rc;

	if (!s)
		return cb_error_set(dest ? ENOMEM : EINVAL, "reaches: needs a host[:port]");
	if ((rc = split_port(s, &host, &port, "reaches", dest)) < 0)
		goto out;
	if (!port)
		port = 443;
	if (!*host) {
		rc = cb_error_set(EINVAL, "reaches '%s': empty host", dest);
		goto out;
	}
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1)
		ss.ss_family = AF_INET;
	else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1)
		ss.ss_family = AF_INET6;
	if (ss.ss_family)
		cb_net_check_addr(p, host, (struct sockaddr *)&ss, port, v);
	else if (!name_ok(host) && strcmp(host, "."))
		rc = cb_error_set(EINVAL, "reaches '%s': '%s' is not a host name or an address",
				  dest, host);
	else if (p->mode == CB_NET_POLICY_ALLOW && !name_entry(p, host, port)) {
		/* only an address entry could open it, and reaches does not resolve */
		v->allowed = 0;
		snprintf(v->rule, sizeof v->rule,
			 "no host entry matches %s:%d (an address or CIDR entry would open it only "
			 "by its address, not resolved here)",
			 host, port);
	} else
		cb_net_check_name(p, host, port, v);
out:
	free(s);
	return rc;
}
