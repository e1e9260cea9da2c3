/* The proxy's pure parts: HTTP proxy request heads (CONNECT and absolute URIs) and their
 * rewriting, the test-only hosts map, address helpers. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cowbox/error.h"
#include "net/proxy_util.h"

void cb_net_http_req_free(struct cb_net_http_req *r)
{
	free(r->host);
	free(r->rewritten);
	r->host = r->rewritten = NULL;
}

static int bad(struct cb_net_http_req *r, const char *why)
{
	r->error = why;
	return -1;
}

/* "host", "host:port", "[v6]:port" into r->host and r->port. */
static int authority(const char *a, size_t len, int def_port, struct cb_net_http_req *r)
{
	const char *host = a, *colon = NULL, *end = a + len;
	size_t hl;

	if (len && *a == '[') {
		const char *rb = memchr(a, ']', len);

		if (!rb)
			return bad(r, "bad IPv6 authority");
		host = a + 1;
		hl = (size_t)(rb - host);
		if (rb + 1 < end && rb[1] != ':')
			return bad(r, "bad authority");
		colon = rb + 1 < end ? rb + 1 : NULL;
	} else {
		colon = memchr(a, ':', len);
		hl = colon ? (size_t)(colon - a) : len;
	}
	if (!hl || hl > 253)
		return bad(r, "empty or too long host");
	for (size_t i = 0; i < hl; i++)
		if (!isalnum((unsigned char)host[i]) && !strchr(".-_:", host[i]))
			return bad(r, "bad character in the host");
	r->port = def_port;
	if (colon) {
		long v = 0;
		const char *c = colon + 1;

		if (c == end || end - c > 5)
			return bad(r, "bad port");
		for (; c < end; c++) {
			if (!isdigit((unsigned char)*c))
				return bad(r, "bad port");
			v = v * 10 + (*c - '0');
		}
		if (v < 1 || v > 65535)
			return bad(r, "port not in 1-65535");
		r->port = (int)v;
	}
	if (r->port < 1)
		return bad(r, "CONNECT needs host:port");
	r->host = strndup(host, hl);
	return r->host ? 0 : bad(r, "out of memory");
}

static int hop_by_hop(const char *line, size_t len)
{
	static const char *const names[] = {
	    "proxy-connection:", "proxy-authorization:", "connection:", "keep-alive:"};

	for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
		size_t n = strlen(names[i]);

		if (len >= n && !strncasecmp(line, names[i], n))
			return 1;
	}
	return 0;
}

static int token_ok(const char *s, size_t n)
{
	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalpha((unsigned char)s[i]))
			return 0;
	return 1;
}

int cb_net_http_parse(const char *head, struct cb_net_http_req *r)
{
	const char *eol = strstr(head, "\r\n"), *sp1, *sp2, *target, *auth, *path;
	size_t tl, out_len = 0, cap;
	char *out;

	memset(r, 0, sizeof(*r));
	if (!eol)
		return bad(r, "no request line");
	sp1 = memchr(head, ' ', (size_t)(eol - head));
	sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
	if (!sp1 || !sp2 || !token_ok(head, (size_t)(sp1 - head)) ||
	    strncmp(sp2 + 1, "HTTP/1.", 7) || eol - sp2 != 9)
		return bad(r, "bad request line (METHOD TARGET HTTP/1.x)");
	target = sp1 + 1;
	tl = (size_t)(sp2 - target);
	if (sp1 - head == 7 && !strncmp(head, "CONNECT", 7)) {
		r->connect = 1;
		return authority(target, tl, 0, r);
	}
	if (tl < 8 || strncasecmp(target, "http://", 7))
		return bad(r, "only CONNECT or an absolute http:// URI (https through CONNECT)");
	auth = target + 7;
	path = auth;
	while (path < sp2 && *path != '/' && *path != '?')
		path++;
	if (memchr(auth, '@', (size_t)(path - auth)))
		return bad(r, "credentials in the URI");
	if (authority(auth, (size_t)(path - auth), 80, r) < 0)
		return -1;
	/* the request line in origin form, headers but hop-by-hop ones, one request only */
	cap = strlen(head) + 64;
	if (!(out = malloc(cap)))
		return bad(r, "out of memory");
	out_len = (size_t)snprintf(out, cap, "%.*s %s%.*s %.*s\r\n", (int)(sp1 - head), head,
				   path == sp2 || *path == '?' ? "/" : "", (int)(sp2 - path), path,
				   8, sp2 + 1);
	for (const char *l = eol + 2; *l && strncmp(l, "\r\n", 2);) {
		const char *le = strstr(l, "\r\n");
		size_t n;

		/* A header line that does not end in CRLF (a bare LF, or the head cut short):
		 * refused, never read past. */
		if (!le) {
			free(out);
			return bad(r, "a header line without CRLF");
		}
		n = (size_t)(le - l) + 2;
		if (!hop_by_hop(l, n)) {
			memcpy(out + out_len, l, n);
			out_len += n;
		}
		l = le + 2;
	}
	out_len += (size_t)snprintf(out + out_len, cap - out_len, "Connection: close\r\n\r\n");
	r->rewritten = out;
	return 0;
}

int cb_net_proxy_literal(const char *s, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof(*out));
	if (inet_pton(AF_INET, s, &((struct sockaddr_in *)out)->sin_addr) == 1)
		out->ss_family = AF_INET;
	else if (inet_pton(AF_INET6, s, &((struct sockaddr_in6 *)out)->sin6_addr) == 1)
		out->ss_family = AF_INET6;
	else
		return -1;
	return 0;
}

void cb_net_proxy_set_port(struct sockaddr *sa, int port)
{
	if (sa->sa_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons((uint16_t)port);
	else if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons((uint16_t)port);
}

void cb_net_proxy_addr_text(const struct sockaddr *sa, char *buf, size_t size)
{
	const void *a = sa->sa_family == AF_INET
			    ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
			    : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;

	if (!inet_ntop(sa->sa_family, a, buf, (socklen_t)size))
		snprintf(buf, size, "?");
}

void cb_net_proxy_copy_name(char *dst, size_t size, const char *src, size_t len)
{
	size_t n = len < size - 1 ? len : size - 1;

	memcpy(dst, src, n);
	dst[n] = 0;
}

long cb_net_socks_parse(const unsigned char *h, size_t have, struct cb_net_socks_req *r)
{
	size_t need;

	memset(r, 0, sizeof(*r));
	if (have < 5)
		return 0;
	r->rep = 0x01;
	if (h[0] != 5) {
		r->error = "socks5: bad version in the request";
		return -1;
	}
	if (h[3] == 1)
		need = 4 + 4 + 2;
	else if (h[3] == 4)
		need = 4 + 16 + 2;
	else if (h[3] == 3)
		need = 4 + 1 + (size_t)h[4] + 2;
	else {
		r->error = "socks5: address type not supported";
		r->rep = 0x08;
		return -1;
	}
	if (have < need)
		return 0;
	r->port = h[need - 2] << 8 | h[need - 1];
	if (h[3] == 1)
		inet_ntop(AF_INET, h + 4, r->name, sizeof r->name);
	else if (h[3] == 4)
		inet_ntop(AF_INET6, h + 4, r->name, sizeof r->name);
	else
		cb_net_proxy_copy_name(r->name, sizeof r->name, (const char *)h + 5, h[4]);
	if (h[1] != 1) {
		r->error = "socks5: only CONNECT is supported";
		r->rep = 0x07;
	} else if (!r->port) {
		r->error = "socks5: port 0";
	}
	return (long)need;
}

int cb_net_hosts_load(const char *path, struct cb_net_hosts *out)
{
	FILE *f = fopen(path, "re");
	char line[1024];
	size_t cap = 0, lineno = 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (!f)
		return cb_error_set(errno, "COWBOX_PROXY_HOSTS %s: %s", path, strerror(errno));
	while (fgets(line, sizeof line, f)) {
		char *save = NULL, *addr, *name, *hash = strchr(line, '#');
		struct sockaddr_storage ss;

		lineno++;
		if (hash)
			*hash = 0;
		if (!(addr = strtok_r(line, " \t\r\n", &save)))
			continue;
		if (cb_net_proxy_literal(addr, &ss) < 0) {
			rc = cb_error_set(EINVAL,
					  "COWBOX_PROXY_HOSTS %s: line %zu: '%s' is not an "
					  "address",
					  path, lineno, addr);
			break;
		}
		while ((name = strtok_r(NULL, " \t\r\n", &save))) {
			if (out->n == cap) {
				size_t c2 = cap ? cap * 2 : 16;
				char **nn = realloc(out->names, c2 * sizeof(*nn));
				struct sockaddr_storage *na =
				    nn ? realloc(out->addrs, c2 * sizeof(*na)) : NULL;

				if (nn)
					out->names = nn;
				if (!na) {
					rc = cb_error_set(ENOMEM,
							  "COWBOX_PROXY_HOSTS: out of memory");
					goto out;
				}
				out->addrs = na;
				cap = c2;
			}
			if (!(out->names[out->n] = strdup(name))) {
				rc = cb_error_set(ENOMEM, "COWBOX_PROXY_HOSTS: out of memory");
				goto out;
			}
			out->addrs[out->n++] = ss;
		}
	}
out:
	fclose(f);
	if (rc < 0)
		cb_net_hosts_free(out);
	return rc;
}

size_t cb_net_hosts_find(const struct cb_net_hosts *h, const char *name,
			 struct sockaddr_storage **out, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < h->n && n < max; i++)
		if (!strcasecmp(h->names[i], name))
			out[n++] = &h->addrs[i];
	return n;
}

void cb_net_hosts_free(struct cb_net_hosts *h)
{
	for (size_t i = 0; i < h->n; i++)
		free(h->names[i]);
	free(h->names);
	free(h->addrs);
	memset(h, 0, sizeof(*h));
}

int cb_net_policy_copy(const struct cb_net_policy *p, struct cb_net_policy **out)
{
	char **texts = calloc(p->n + 1, sizeof(char *));
	int rc;

	if (!texts)
		return cb_error_set(ENOMEM, "network policy: out of memory");
	for (size_t i = 0; i < p->n; i++)
		texts[i] = p->entries[i].text;
	rc = cb_net_policy_new(p->mode, texts, p->n, out);
	free(texts);
	return rc;
}
