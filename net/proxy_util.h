/* Private to net/: the proxy's pure parts (request heads, the test hosts map, addresses), kept
 * apart from its event loop so that unit tests can drive them. */
#ifndef COWBOX_NET_PROXY_UTIL_H
#define COWBOX_NET_PROXY_UTIL_H

#include <stddef.h>
#include <sys/socket.h>

#include "cowbox/net.h"

/* A parsed HTTP proxy request head. */
struct cb_net_http_req {
	int connect;	   /* CONNECT host:port; else an absolute http:// URI */
	char *host;	   /* without brackets */
	int port;	   /* 80 by default for http:// */
	char *rewritten;   /* plain HTTP: the head to send (origin-form, hop-by-hop headers out,
			      Connection: close) */
	const char *error; /* why it was refused (static text) */
};

/* Parse a head (NUL-terminated, ending in an empty line): 0, or -1 with r->error set. Free
 * with cb_net_http_req_free either way. */
int cb_net_http_parse(const char *head, struct cb_net_http_req *r);
void cb_net_http_req_free(struct cb_net_http_req *r);

/* A hosts-format map ($COWBOX_PROXY_HOSTS): address then names, '#' comments. */
struct cb_net_hosts {
	size_t n;
	char **names;
	struct sockaddr_storage *addrs;
};
/* Load path: 0, or -errno with a message naming the file (and the line of a bad address). */
int cb_net_hosts_load(const char *path, struct cb_net_hosts *out);
/* The addresses of name (case-insensitive), in file order: how many (up to max). */
size_t cb_net_hosts_find(const struct cb_net_hosts *h, const char *name,
			 struct sockaddr_storage **out, size_t max);
void cb_net_hosts_free(struct cb_net_hosts *h);

/* An address literal (IPv4 or IPv6, no brackets) as a sockaddr: 0, else -1. */
int cb_net_proxy_literal(const char *s, struct sockaddr_storage *out);
void cb_net_proxy_set_port(struct sockaddr *sa, int port);
void cb_net_proxy_addr_text(const struct sockaddr *sa, char *buf, size_t size);
/* A length-counted name (SOCKS5) as a C string, NUL bytes cut. */
void cb_net_proxy_copy_name(char *dst, size_t size, const char *src, size_t len);

/* A SOCKS5 request (the one after the greeting), at most this long. */
#define CB_NET_SOCKS_REQ_MAX (4 + 1 + 255 + 2)
struct cb_net_socks_req {
	char name[256]; /* a name as asked, or an address as text */
	int port;
	const char *error; /* NULL, or why it is refused (static text) */
	unsigned char rep; /* then: the SOCKS5 reply code */
};
/* Parse the have bytes of h: 0 while the request is not whole, else how many bytes it takes
 * (name and port set; error too for a command other than CONNECT or port 0), or -1 with error
 * and rep for a version or an address type that cannot be read at all. */
long cb_net_socks_parse(const unsigned char *h, size_t have, struct cb_net_socks_req *r);

/* A copy of a policy (from its entries as written). */
int cb_net_policy_copy(const struct cb_net_policy *p, struct cb_net_policy **out);

#endif
