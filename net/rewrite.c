/* Header secrets' request stream: each HTTP/1.1 request head the sandbox sends on an intercepted
 * connection checked (it must name the bound host) and given the bound host's headers, bodies
 * and chunks passed through. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net/intercept.h"
#include "net/proxy_util.h"

#define HEAD_MAX       16384 /* a request head or a trailer, in bytes */
#define CHUNK_LINE_MAX 1024  /* a chunk-size line */

enum { RW_HEAD, RW_BODY, RW_CHUNK_SIZE, RW_CHUNK_DATA, RW_CHUNK_END, RW_TRAILER, RW_RAW };

static int refuse(struct cb_net_rewriter *rw, const char *why)
{
	rw->error = why;
	return -1;
}

/* Whether s[0..n) is an HTTP token (a header name): a name with a space before its ':' is
 * one the server and the proxy could see differently, so it is refused. */
static int token_len(const char *s, size_t n)
{
	static const char tchar[] = "!#$%&'*+-.^_`|~";

	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr(tchar, s[i]))
			return 0;
	return n > 0;
}

/* A header line's name is name (case-insensitive). */
static int is_header(const char *line, size_t len, const char *name)
{
	size_t n = strlen(name);

	return len > n && line[n] == ':' && !strncasecmp(line, name, n);
}

static const char *header_value(const char *line, size_t len, size_t *vlen)
{
	const char *v = memchr(line, ':', len), *end = line + len;

	for (v++; v < end && (*v == ' ' || *v == '\t'); v++)
		;
	while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	*vlen = (size_t)(end - v);
	return v;
}

/* Whether a binding's path prefix covers the request target: its path (up to '?' or '#')
 * starts with the prefix and has no dot segment or encoded dot, slash or backslash, which a
 * server could resolve outside the prefix. */
static int path_matches(const char *target, size_t tlen, const char *prefix)
{
	const char *p = target, *end = target + tlen;
	size_t plen, pl = strlen(prefix);

	if (tlen > 7 && (!strncasecmp(p, "http://", 7) || !strncasecmp(p, "https://", 8))) {
		p = memchr(p, '/', tlen) + 2;
		while (p < end && *p != '/')
			p++;
		if (p == end)
			return !strcmp(prefix, "/");
	}
	for (plen = 0; p + plen < end && p[plen] != '?' && p[plen] != '#'; plen++)
		;
	if (!plen || *p != '/' || plen < pl || strncmp(p, prefix, pl))
		return 0;
	if (!strcmp(prefix, "/"))
		return 1; /* every path of the host: nothing to escape from */
	for (size_t i = 0; i < plen; i++) {
		size_t seg = 0;

		if (p[i] == '\\')
			return 0;
		if (p[i] == '%' && i + 2 < plen &&
		    (!strncasecmp(p + i, "%2e", 3) || !strncasecmp(p + i, "%2f", 3) ||
		     !strncasecmp(p + i, "%5c", 3)))
			return 0;
		if (p[i] != '/')
			continue;
		while (i + 1 + seg < plen && p[i + 1 + seg] != '/')
			seg++;
		if ((seg == 1 || seg == 2) && !strncmp(p + i + 1, "..", seg))
			return 0; /* "/." or "/.." */
	}
	return 1;
}

/* Whether s[0..n) is the bound host's name (case-insensitive, a trailing dot on either side
 * ignored). */
static int name_is(const char *bound, const char *s, size_t n)
{
	size_t bl = strlen(bound);

	if (bl > 1 && bound[bl - 1] == '.')
		bl--;
	if (n > 1 && s[n - 1] == '.')
		n--;
	return bl == n && !strncasecmp(bound, s, n);
}

/* Whether an authority a[0..n) ("host", "host:port", "[v6]", "[v6]:port") names the bound
 * host, and the connection's port when it gives one. */
static int authority_names(const struct cb_net_rewriter *rw, const char *a, size_t n)
{
	const char *host = a, *port = NULL, *end = a + n;
	size_t hl;
	long v = 0;

	if (n && a[0] == '[') {
		const char *e = memchr(a, ']', n);

		if (!e || (e + 1 < end && e[1] != ':'))
			return 0;
		host = a + 1;
		hl = (size_t)(e - host);
		if (e + 1 < end)
			port = e + 2;
	} else {
		const char *colon = memchr(a, ':', n);

		hl = colon ? (size_t)(colon - a) : n;
		if (colon)
			port = colon + 1;
	}
	if (port) {
		if (port == end || end - port > 5)
			return 0;
		for (const char *c = port; c < end; c++) {
			if (!isdigit((unsigned char)*c))
				return 0;
			v = v * 10 + (*c - '0');
		}
		if (v != rw->port)
			return 0;
	}
	return hl && name_is(rw->host->name, host, hl);
}

/* A misdirected request: refused with the reason naming what it named (at most 100 bytes of
 * it, control bytes as '?'), or only what was missing when s is NULL. */
static int misdirect(struct cb_net_rewriter *rw, const char *what, const char *s, size_t n)
{
	char shown[101];
	size_t k = n < 100 ? n : 100;

	for (size_t i = 0; s && i < k; i++)
		shown[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
	shown[s ? k : 0] = 0;
	if (s)
		snprintf(rw->why, sizeof rw->why, "misdirected request: %s '%s' is not %s:%d", what,
			 shown, rw->host->name, rw->port);
	else
		snprintf(rw->why, sizeof rw->why, "misdirected request: %s (bound host %s:%d)",
			 what, rw->host->name, rw->port);
	rw->misdirected = 1;
	return refuse(rw, rw->why);
}

/* The connection's names and the request target checked against the bound host: the SNI
 * (required for a name; an address has none), the connection's target and an absolute
 * target's authority (no user info). An origin-form path or "*" names no host. */
static int check_target(struct cb_net_rewriter *rw, const char *t, size_t tlen)
{
	const char *host = rw->host->name, *colon, *auth, *ae;
	struct sockaddr_storage lit;

	if (!rw->target || !name_is(host, rw->target, strlen(rw->target)))
		return misdirect(rw, "the connection's target", rw->target ? rw->target : "",
				 rw->target ? strlen(rw->target) : 0);
	if (!rw->sni && cb_net_proxy_literal(host, &lit) != 0)
		return misdirect(rw, "no TLS server name (SNI)", NULL, 0);
	if (rw->sni && !name_is(host, rw->sni, strlen(rw->sni)))
		return misdirect(rw, "the TLS server name (SNI)", rw->sni, strlen(rw->sni));
	if ((tlen && t[0] == '/') || (tlen == 1 && t[0] == '*'))
		return 0;
	colon = memchr(t, ':', tlen);
	if (!colon || (size_t)(t + tlen - colon) < 3 || strncmp(colon, "://", 3))
		return misdirect(rw, "the request target", t, tlen);
	auth = colon + 3;
	for (ae = auth; ae < t + tlen && *ae != '/' && *ae != '?' && *ae != '#'; ae++)
		;
	if (memchr(auth, '@', (size_t)(ae - auth)) ||
	    !authority_names(rw, auth, (size_t)(ae - auth)))
		return misdirect(rw, "the request target's authority", auth, (size_t)(ae - auth));
	return 0;
}

/* One request head (ending in CRLF CRLF) checked and rewritten into out. */
static int rewrite_head(struct cb_net_rewriter *rw, const char *head, size_t len,
			struct evbuffer *out)
{
	const char *eol = memchr(head, '\n', len), *sp1, *sp2, *l, *end = head + len - 2;
	int cl_seen = 0, chunked = 0, upgrade = 0, hosts = 0, set[64] = {0};
	unsigned long long cl = 0;
	const struct cb_net_icpt_host *h = rw->host;

	for (size_t i = 0; i < len; i++)
		if (!head[i] || (head[i] == '\n' && (!i || head[i - 1] != '\r')) ||
		    (head[i] == '\r' && (i + 1 == len || head[i + 1] != '\n')))
			return refuse(rw, "bad request head (NUL, bare CR or LF)");
	sp1 = memchr(head, ' ', (size_t)(eol - head));
	sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
	if (!sp1 || !sp2 || sp1 == head || strncmp(sp2 + 1, "HTTP/1.", 7))
		return refuse(rw, "bad request line (METHOD TARGET HTTP/1.x)");
	if (sp1 - head == 7 && !strncmp(head, "CONNECT", 7))
		return refuse(rw, "CONNECT inside an intercepted connection");
	if (check_target(rw, sp1 + 1, (size_t)(sp2 - sp1 - 1)) < 0)
		return -1;
	for (size_t k = 0; k < h->n && k < 64; k++)
		set[k] = path_matches(sp1 + 1, (size_t)(sp2 - sp1 - 1), h->b[k].path_prefix);
	evbuffer_add(out, head, (size_t)(eol + 1 - head));
	for (l = eol + 1; l < end;) {
		const char *le = memchr(l, '\n', (size_t)(end - l + 2)) + 1;
		size_t n = (size_t)(le - l) - 2, vlen;
		const char *v;
		int drop = 0;

		if (*l == ' ' || *l == '\t')
			return refuse(rw, "folded header line");
		if (!memchr(l, ':', n) || !token_len(l, (size_t)((char *)memchr(l, ':', n) - l)))
			return refuse(rw, "header line without a name and ':'");
		v = header_value(l, n, &vlen);
		if (is_header(l, n, "content-length")) {
			unsigned long long x = 0;

			if (!vlen || vlen > 18)
				return refuse(rw, "bad Content-Length");
			for (size_t i = 0; i < vlen; i++) {
				if (!isdigit((unsigned char)v[i]))
					return refuse(rw, "bad Content-Length");
				x = x * 10 + (unsigned)(v[i] - '0');
			}
			if (cl_seen && x != cl)
				return refuse(rw, "two different Content-Length");
			cl_seen = 1;
			cl = x;
		} else if (is_header(l, n, "transfer-encoding")) {
			if (chunked || vlen != 7 || strncasecmp(v, "chunked", 7))
				return refuse(rw, "Transfer-Encoding other than one chunked");
			chunked = 1;
		} else if (is_header(l, n, "upgrade")) {
			upgrade = 1;
		} else if (is_header(l, n, "host")) {
			if (hosts++)
				return misdirect(rw, "a second Host", v, vlen);
			if (!authority_names(rw, v, vlen))
				return misdirect(rw, "Host", v, vlen);
		}
		for (size_t k = 0; k < h->n && k < 64; k++)
			if (set[k] && is_header(l, n, h->b[k].header))
				drop = 1; /* the sandbox's own value goes */
		if (!drop)
			evbuffer_add(out, l, n + 2);
		l = le;
	}
	if (cl_seen && chunked)
		return refuse(rw, "both Content-Length and Transfer-Encoding");
	if (!hosts)
		return misdirect(rw, "no Host header", NULL, 0);
	for (size_t k = 0; k < h->n && k < 64; k++)
		if (set[k]) {
			evbuffer_add_printf(out, "%s: %s%s%s\r\n", h->b[k].header, h->b[k].prefix,
					    h->b[k].value, h->b[k].suffix);
			rw->injected = 1;
		}
	evbuffer_add(out, "\r\n", 2);
	rw->state = upgrade ? RW_RAW : chunked ? RW_CHUNK_SIZE : cl ? RW_BODY : RW_HEAD;
	rw->left = cl;
	return 0;
}

static int take_head(struct cb_net_rewriter *rw, struct evbuffer *in, struct evbuffer *out)
{
	struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
	char *head;
	int rc;

	if (end.pos < 0)
		return evbuffer_get_length(in) > HEAD_MAX ? refuse(rw, "request head too long") : 1;
	if ((size_t)end.pos + 4 > HEAD_MAX)
		return refuse(rw, "request head too long");
	if (!(head = malloc((size_t)end.pos + 4)))
		return refuse(rw, "out of memory");
	evbuffer_remove(in, head, (size_t)end.pos + 4);
	rc = rewrite_head(rw, head, (size_t)end.pos + 4, out);
	free(head);
	return rc;
}

/* A line ending in CRLF, moved to out (at most max bytes): 1 when it is not all there yet. */
static int take_line(struct cb_net_rewriter *rw, struct evbuffer *in, struct evbuffer *out,
		     size_t max, char *copy, size_t csize)
{
	struct evbuffer_ptr eol = evbuffer_search(in, "\r\n", 2, NULL);
	size_t n;

	if (eol.pos < 0)
		return evbuffer_get_length(in) > max ? refuse(rw, "line too long") : 1;
	n = (size_t)eol.pos + 2;
	if (n > max)
		return refuse(rw, "line too long");
	evbuffer_copyout(in, copy, n < csize ? n : csize - 1);
	copy[n < csize ? n : csize - 1] = 0;
	evbuffer_remove_buffer(in, out, n);
	return 0;
}

int cb_net_rewrite(struct cb_net_rewriter *rw, struct evbuffer *in, struct evbuffer *out)
{
	char line[CHUNK_LINE_MAX + 1];
	int rc = 0;

	while (!rc && evbuffer_get_length(in)) {
		size_t have = evbuffer_get_length(in);

		switch (rw->state) {
		case RW_HEAD:
			rc = take_head(rw, in, out);
			break;
		case RW_BODY:
		case RW_CHUNK_DATA: {
			size_t n = have < rw->left ? have : (size_t)rw->left;

			evbuffer_remove_buffer(in, out, n);
			if ((rw->left -= n) == 0)
				rw->state = rw->state == RW_BODY ? RW_HEAD : RW_CHUNK_END;
			break;
		}
		case RW_CHUNK_END:
			if (have < 2)
				return 0;
			evbuffer_copyout(in, line, 2);
			if (line[0] != '\r' || line[1] != '\n')
				return refuse(rw, "chunk not followed by CRLF");
			evbuffer_remove_buffer(in, out, 2);
			rw->state = RW_CHUNK_SIZE;
			break;
		case RW_CHUNK_SIZE: {
			char *e;

			if ((rc = take_line(rw, in, out, CHUNK_LINE_MAX, line, sizeof line)))
				break;
			if (!isxdigit((unsigned char)line[0]))
				return refuse(rw, "bad chunk size");
			errno = 0;
			rw->left = strtoull(line, &e, 16);
			if (errno || (*e != ';' && *e != '\r' && *e != ' ' && *e != '\t'))
				return refuse(rw, "bad chunk size");
			rw->state = rw->left ? RW_CHUNK_DATA : RW_TRAILER;
			break;
		}
		case RW_TRAILER:
			if ((rc = take_line(rw, in, out, HEAD_MAX, line, sizeof line)))
				break;
			if (!strcmp(line, "\r\n"))
				rw->state = RW_HEAD;
			break;
		default: /* RW_RAW */
			evbuffer_add_buffer(out, in);
		}
	}
	return rc < 0 ? -1 : 0;
}
