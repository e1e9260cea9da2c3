/* Unit tests of the network policy: each entry kind parsed or refused with its message, and a
 * table of destinations (name, address, port) decided under public and allow policies; the
 * proxy's SOCKS5 request parser; the host's own addresses. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"
#include "net/proxy_util.h"

Test(policy, entries_refused_with_a_clear_message)
{
	static const struct {
		const char *entry, *says;
	} bad[] = {
	    {"", "empty"},
	    {":443", "empty host"},
	    {"example.com:0", "port '0'"},
	    {"example.com:65536", "port '65536'"},
	    {"example.com:http", "port 'http'"},
	    {"a.*.com", "wildcard"},
	    {"*example.com", "wildcard"},
	    {"*", "wildcard"},
	    {"*.", "wildcard"},
	    {"10.0.0.0/33", "prefix length"},
	    {"10.0.0.1/8", "bits set"},
	    {"fc00::/129", "prefix length"},
	    {"300.1.1.1/8", "not an IP address"},
	    {"exa mple.com", "not a host name"},
	    {"a..b", "not a host name"},
	    {"[::1", "bracketed"},
	};
	struct cb_net_entry e;

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		cr_expect_eq(cb_net_entry_parse(bad[i].entry, &e), -EINVAL, "'%s' accepted",
			     bad[i].entry);
		cr_expect(strstr(cb_error_message(), bad[i].says), "'%s': message '%s'",
			  bad[i].entry, cb_error_message());
	}
}

Test(policy, entries_parsed)
{
	static const struct {
		const char *entry;
		enum cb_net_entry_kind kind;
		int port, prefix;
	} good[] = {
	    {"Example.COM", CB_NET_ENTRY_HOST, 0, 0},
	    {"example.com.", CB_NET_ENTRY_HOST, 0, 0},
	    {"example.com:8443", CB_NET_ENTRY_HOST, 8443, 0},
	    {"*.example.com", CB_NET_ENTRY_WILDCARD, 0, 0},
	    {"10.1.2.3", CB_NET_ENTRY_CIDR, 0, 32},
	    {"10.1.2.3:22", CB_NET_ENTRY_CIDR, 22, 32},
	    {"10.0.0.0/8", CB_NET_ENTRY_CIDR, 0, 8},
	    {"2001:db8::1", CB_NET_ENTRY_CIDR, 0, 128},
	    {"[2001:db8::1]:8080", CB_NET_ENTRY_CIDR, 8080, 128},
	    {"fc00::/7", CB_NET_ENTRY_CIDR, 0, 7},
	};
	struct cb_net_entry e;

	for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
		cr_assert_eq(cb_net_entry_parse(good[i].entry, &e), 0, "%s: %s", good[i].entry,
			     cb_error_message());
		cr_expect_eq(e.kind, good[i].kind, "%s", good[i].entry);
		cr_expect_eq(e.port, good[i].port, "%s", good[i].entry);
		if (e.kind == CB_NET_ENTRY_CIDR)
			cr_expect_eq(e.prefix, good[i].prefix, "%s", good[i].entry);
		else
			cr_expect(!strchr(e.host, 'C') && e.host[strlen(e.host) - 1] != '.', "%s",
				  e.host);
		free(e.text);
		free(e.host);
	}
}

static void addr(const char *s, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET, s, &((struct sockaddr_in *)ss)->sin_addr) == 1)
		ss->ss_family = AF_INET;
	else if (inet_pton(AF_INET6, s, &((struct sockaddr_in6 *)ss)->sin6_addr) == 1)
		ss->ss_family = AF_INET6;
	else
		cr_assert_fail("bad test address %s", s);
}

/* A connection to name (resolved to address) on port: allowed or not, and the rule's words. */
struct decision {
	const char *name, *address;
	int port, allowed;
	const char *rule;
};

static void decide_all(struct cb_net_policy *p, const struct decision *d, size_t n)
{
	struct sockaddr_storage ss;
	struct cb_net_verdict v;

	for (size_t i = 0; i < n; i++) {
		addr(d[i].address, &ss);
		cb_net_check_addr(p, d[i].name, (struct sockaddr *)&ss, d[i].port, &v);
		cr_expect_eq(v.allowed, d[i].allowed, "%s (%s):%d: %s", d[i].name, d[i].address,
			     d[i].port, v.rule);
		cr_expect(strstr(v.rule, d[i].rule), "%s (%s):%d: rule '%s', wanted '%s'",
			  d[i].name, d[i].address, d[i].port, v.rule, d[i].rule);
	}
}

Test(policy, allow_table)
{
	char *entries[] = {
	    "api.example.test",	    "git.example.test:8443", "*.pkg.test", "203.0.113.7",
	    "198.51.100.0/24:8080", "2001:db8::/32",	     "10.9.9.9",   "fd00::5:1"};
	struct cb_net_policy *p;
	static const struct decision d[] = {
	    /* exact name, default ports only */
	    {"api.example.test", "93.184.216.34", 443, 1, "allow api.example.test"},
	    {"API.Example.Test.", "93.184.216.34", 80, 1, "allow api.example.test"},
	    {"api.example.test", "93.184.216.34", 8080, 0, "no allow entry matches"},
	    {"x.api.example.test", "93.184.216.34", 443, 0, "no allow entry"},
	    /* name with a port: that port only */
	    {"git.example.test", "93.184.216.35", 8443, 1, "allow git.example.test:8443"},
	    {"git.example.test", "93.184.216.35", 443, 0, "no allow entry"},
	    /* wildcard: subdomains, not the domain */
	    {"a.pkg.test", "93.184.216.36", 443, 1, "allow *.pkg.test"},
	    {"a.b.pkg.test", "93.184.216.36", 80, 1, "allow *.pkg.test"},
	    {"pkg.test", "93.184.216.36", 443, 0, "no allow entry"},
	    {"evilpkg.test", "93.184.216.36", 443, 0, "no allow entry"},
	    /* addresses and CIDRs */
	    {"203.0.113.7", "203.0.113.7", 443, 1, "allow 203.0.113.7"},
	    {"203.0.113.8", "203.0.113.8", 443, 0, "no allow entry"},
	    {"198.51.100.99", "198.51.100.99", 8080, 1, "allow 198.51.100.0/24:8080"},
	    {"198.51.100.99", "198.51.100.99", 443, 0, "no allow entry"},
	    {"2001:db8::42", "2001:db8::42", 443, 1, "allow 2001:db8::/32"},
	    {"2001:db9::42", "2001:db9::42", 443, 0, "no allow entry"},
	    /* an allowed name resolving to a special address (rebinding): refused */
	    {"api.example.test", "127.0.0.1", 443, 0, "loopback 127.0.0.0/8"},
	    {"api.example.test", "10.1.2.3", 443, 0, "private 10.0.0.0/8"},
	    {"api.example.test", "169.254.169.254", 80, 0, "metadata"},
	    {"api.example.test", "169.254.1.1", 80, 0, "link-local"},
	    {"api.example.test", "100.64.0.1", 443, 0, "carrier-grade NAT"},
	    {"api.example.test", "172.20.0.1", 443, 0, "private 172.16.0.0/12"},
	    {"api.example.test", "192.168.1.1", 443, 0, "private 192.168.0.0/16"},
	    {"api.example.test", "0.0.0.0", 443, 0, "this network"},
	    {"api.example.test", "224.0.0.1", 443, 0, "multicast"},
	    {"api.example.test", "::1", 443, 0, "loopback ::1"},
	    {"api.example.test", "fd12::1", 443, 0, "unique local"},
	    {"api.example.test", "fe80::1", 443, 0, "link-local fe80"},
	    {"api.example.test", "ff02::1", 443, 0, "multicast ff00"},
	    {"api.example.test", "::ffff:127.0.0.1", 443, 0, "loopback 127"},
	    {"api.example.test", "::ffff:169.254.169.254", 443, 0, "metadata"},
	    {"api.example.test", "64:ff9b::a00:1", 443, 0, "private 10.0.0.0/8"},
	    {"api.example.test", "::7f00:1", 443, 0, "IPv4-compatible"},
	    /* ... unless an entry names that address */
	    {"10.9.9.9", "10.9.9.9", 443, 1, "allow 10.9.9.9"},
	    {"internal.test", "10.9.9.9", 80, 1, "allow 10.9.9.9"},
	    {"10.9.9.9", "::ffff:10.9.9.9", 443, 1, "allow 10.9.9.9"},
	    {"10.9.9.9", "10.9.9.9", 22, 0, "private 10.0.0.0/8"},
	    {"fd00::5:1", "fd00::5:1", 443, 1, "allow fd00::5:1"},
	};

	cr_assert_eq(cb_net_policy_new(CB_NET_POLICY_ALLOW, entries, 8, &p), 0, "%s",
		     cb_error_message());
	decide_all(p, d, sizeof d / sizeof *d);
	cb_net_policy_free(p);
}

Test(policy, public_table)
{
	struct cb_net_policy *p;
	static const struct decision d[] = {
	    {"example.com", "93.184.216.34", 443, 1, "public"},
	    {"example.com", "93.184.216.34", 22, 1, "public"},
	    {"example.com", "2606:2800:220:1::1", 443, 1, "public"},
	    {"example.com", "127.0.0.2", 443, 0, "loopback"},
	    {"metadata.google.internal", "169.254.169.254", 80, 0, "metadata"},
	    {"x", "192.168.0.1", 80, 0, "private"},
	    {"x", "fc00::1", 80, 0, "unique local"},
	};

	cr_assert_eq(cb_net_policy_new(CB_NET_POLICY_PUBLIC, NULL, 0, &p), 0);
	decide_all(p, d, sizeof d / sizeof *d);
	cb_net_policy_free(p);
	cr_expect_eq(cb_net_policy_new(CB_NET_POLICY_PUBLIC, (char *[]){"a.test"}, 1, &p), -EINVAL);
}

Test(policy, name_checked_before_resolution)
{
	char *entries[] = {"api.example.test", "*.pkg.test"};
	struct cb_net_policy *p;
	struct cb_net_verdict v;

	cr_assert_eq(cb_net_policy_new(CB_NET_POLICY_ALLOW, entries, 2, &p), 0);
	cb_net_check_name(p, "api.example.test", 443, &v);
	cr_expect(v.allowed);
	cb_net_check_name(p, "other.test", 443, &v);
	cr_expect(!v.allowed && strstr(v.rule, "no allow entry matches other.test:443"), "%s",
		  v.rule);
	cb_net_check_name(p, "bad name", 443, &v);
	cr_expect(!v.allowed);
	cb_net_check_name(p, "1.2.3.4", 443, &v);
	cr_expect(v.allowed, "a literal is decided on the address");
	cb_net_policy_free(p);
	/* with a CIDR entry for the port, any name may resolve into it */
	entries[1] = "198.51.100.0/24:8080";
	cr_assert_eq(cb_net_policy_new(CB_NET_POLICY_ALLOW, entries, 2, &p), 0);
	cb_net_check_name(p, "other.test", 8080, &v);
	cr_expect(v.allowed && strstr(v.rule, "decided on its address"), "%s", v.rule);
	cb_net_check_name(p, "other.test", 443, &v);
	cr_expect(!v.allowed, "%s", v.rule);
	cb_net_policy_free(p);
}

Test(policy, reaches)
{
	char *entries[] = {"api.example.test", "10.0.0.0/8:5432", "[::1]:8080"};
	struct cb_net_policy *p;
	struct cb_net_verdict v;
	static const struct {
		const char *dest;
		int allowed;
		const char *rule;
	} d[] = {
	    {"api.example.test", 1, "allow api.example.test"},
	    {"api.example.test:80", 1, "allow api.example.test"},
	    {"api.example.test:22", 0, "entry matches"},
	    {"10.1.1.1:5432", 1, "allow 10.0.0.0/8:5432"},
	    {"10.1.1.1", 0, "private"},
	    {"[::1]:8080", 1, "allow [::1]:8080"},
	    {"::1", 0, "loopback"},
	    {"127.0.0.1:443", 0, "loopback"},
	    {"other.test", 0, "entry matches"},
	};

	cr_assert_eq(cb_net_policy_new(CB_NET_POLICY_ALLOW, entries, 3, &p), 0, "%s",
		     cb_error_message());
	for (size_t i = 0; i < sizeof d / sizeof *d; i++) {
		cr_assert_eq(cb_net_reaches(p, d[i].dest, &v), 0, "%s: %s", d[i].dest,
			     cb_error_message());
		cr_expect_eq(v.allowed, d[i].allowed, "%s: %s", d[i].dest, v.rule);
		cr_expect(strstr(v.rule, d[i].rule), "%s: '%s'", d[i].dest, v.rule);
	}
	cr_expect_eq(cb_net_reaches(p, "a.test:99999", &v), -EINVAL);
	cr_expect_eq(cb_net_reaches(p, ":80", &v), -EINVAL);
	cr_expect_eq(cb_net_reaches(p, "bad host", &v), -EINVAL);
	cb_net_policy_free(p);
}

Test(proxy, socks_request_parsed_whole_or_refused)
{
	static const unsigned char v4[] = {5, 1, 0, 1, 203, 0, 113, 7, 0x1f, 0x90};
	static const unsigned char v6[] = {5, 1, 0, 4, 0x20, 1, 0xd, 0xb8, 0, 0, 0,
					   0, 0, 0, 0, 0,    0, 0,   0,	   1, 1, 0xbb};
	static const unsigned char name[] = {5, 1, 0, 3, 5, 'a', '.', 'b', 'c', 'd', 0, 80};
	static const unsigned char bind[] = {5, 2, 0, 3, 1, 'x', 0, 80};
	static const unsigned char port0[] = {5, 1, 0, 1, 1, 2, 3, 4, 0, 0};
	static const unsigned char v4ver[] = {4, 1, 0, 1, 1, 2, 3, 4, 0, 80};
	static const unsigned char atyp[] = {5, 1, 0, 9, 1, 2, 3, 4, 0, 80};
	struct cb_net_socks_req r;

	cr_assert_eq(cb_net_socks_parse(v4, 4, &r), 0);
	cr_assert_eq(cb_net_socks_parse(v4, sizeof v4 - 1, &r), 0); /* not whole yet */
	cr_assert_eq(cb_net_socks_parse(v4, sizeof v4, &r), (long)sizeof v4);
	cr_assert_str_eq(r.name, "203.0.113.7");
	cr_assert_eq(r.port, 8080);
	cr_assert_null(r.error);
	cr_assert_eq(cb_net_socks_parse(v6, sizeof v6, &r), (long)sizeof v6);
	cr_assert_str_eq(r.name, "2001:db8::1");
	cr_assert_eq(r.port, 443);
	cr_assert_eq(cb_net_socks_parse(name, sizeof name, &r), (long)sizeof name);
	cr_assert_str_eq(r.name, "a.bcd");
	cr_assert_eq(r.port, 80);
	/* whole but refused: the name and port are still known, for the log */
	cr_assert_eq(cb_net_socks_parse(bind, sizeof bind, &r), (long)sizeof bind);
	cr_assert_str_eq(r.error, "socks5: only CONNECT is supported");
	cr_assert_eq(r.rep, 0x07);
	cr_assert_str_eq(r.name, "x");
	cr_assert_eq(cb_net_socks_parse(port0, sizeof port0, &r), (long)sizeof port0);
	cr_assert_str_eq(r.error, "socks5: port 0");
	cr_assert_eq(r.rep, 0x01);
	/* unreadable */
	cr_assert_eq(cb_net_socks_parse(v4ver, sizeof v4ver, &r), -1);
	cr_assert_str_eq(r.error, "socks5: bad version in the request");
	cr_assert_eq(cb_net_socks_parse(atyp, sizeof atyp, &r), -1);
	cr_assert_eq(r.rep, 0x08);
}

/* The host's own addresses, asked of the kernel: its loopback (and the IPv4-mapped form of it)
 * and the source address of its route out are its own; an address it routes elsewhere or
 * cannot reach is not. Prints what one question costs (the proxy asks at each connect). */
Test(policy, host_own_addresses)
{
	struct sockaddr_in lo = {.sin_family = AF_INET}, out = {.sin_family = AF_INET};
	struct sockaddr_in far = {.sin_family = AF_INET};
	struct sockaddr_in6 mapped = {.sin6_family = AF_INET6};
	socklen_t len = sizeof out;
	struct timespec t0, t1;
	int fd = socket(AF_INET, SOCK_DGRAM, 0), nl = -1;

	inet_pton(AF_INET, "127.0.0.1", &lo.sin_addr);
	inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped.sin6_addr);
	inet_pton(AF_INET, "203.0.113.254", &far.sin_addr);
	cr_expect_eq(cb_net_host_own(&nl, (struct sockaddr *)&lo), 1, "%s", cb_error_message());
	cr_expect_eq(cb_net_host_own(&nl, (struct sockaddr *)&mapped), 1, "%s", cb_error_message());
	cr_expect_eq(cb_net_host_own(&nl, (struct sockaddr *)&far), 0, "%s", cb_error_message());
	/* the address the host's route to far leaves from (no packet is sent) */
	far.sin_port = htons(9);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&far, sizeof far) == 0 &&
	    getsockname(fd, (struct sockaddr *)&out, &len) == 0)
		cr_expect_eq(cb_net_host_own(&nl, (struct sockaddr *)&out), 1, "%s",
			     cb_error_message());
	if (fd >= 0)
		close(fd);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 1000; i++)
		cb_net_host_own(&nl, (struct sockaddr *)&far);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "cb_net_host_own: %.1f us a question\n",
		((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3 /
		    1000);
	cr_expect_geq(nl, 0);
	close(nl);
}
