/* Private to net/: header secrets. The TLS contexts and leaf certificates of the bound hosts
 * (net/intercept.c, net/ca.c) and the HTTP/1.1 request stream rewriter that injects them
 * (net/rewrite.c). */
#ifndef COWBOX_NET_INTERCEPT_H
#define COWBOX_NET_INTERCEPT_H

#include <event2/buffer.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stddef.h>

#include "cowbox/net.h"

/* CA files of dir as OpenSSL objects (the key matches the certificate): 0 or -errno. */
int cb_net_ca_load(const char *dir, X509 **cert, EVP_PKEY **key);
/* A leaf for host (a name, or an address literal as an IP SAN) with leaf_key, signed by ca. */
X509 *cb_net_ca_leaf(X509 *ca, EVP_PKEY *ca_key, EVP_PKEY *leaf_key, const char *host);

/* The last TLS session the destination gave for one port of a bound host, resumed by the next
 * connection there: no certificate chain to verify, no signature to check. */
struct cb_net_icpt_session {
	int port; /* 0: free */
	SSL_SESSION *s;
};
#define CB_NET_ICPT_PORTS 4 /* ports a host keeps sessions for */

/* One bound host: its bindings and its leaf, made once when the proxy starts. */
struct cb_net_icpt_host {
	char *name;
	X509 *leaf;
	SSL_CTX *server; /* to the sandbox: the leaf, HTTP/1.1 by ALPN */
	size_t n;
	struct cb_net_binding *b;			    /* strings owned */
	struct cb_net_icpt_session sess[CB_NET_ICPT_PORTS]; /* under intercept.c's lock */
};

struct cb_net_icpt {
	SSL_CTX *client; /* to the destination: verified, HTTP/1.1 by ALPN */
	EVP_PKEY *leaf_key;
	size_t n_hosts;
	struct cb_net_icpt_host *hosts;
};

/* From the proxy's configuration: NULL in *out when it has no bindings; -errno with a message
 * (an unreadable CA or $COWBOX_PROXY_EXTRA_CA). */
int cb_net_icpt_new(const struct cb_net_proxy_config *cfg, struct cb_net_icpt **out);
void cb_net_icpt_free(struct cb_net_icpt *ic);
/* The bound host of name (case-insensitive), or NULL: that connection is tunnelled. */
struct cb_net_icpt_host *cb_net_icpt_find(const struct cb_net_icpt *ic, const char *name);
/* A TLS connection to the destination name (bound host h) on port: SNI, its name (or address)
 * verified, HTTP/1.1, resuming h's last session on that port; the sessions it is given are
 * kept in h for the next. From any of the proxy's loops. */
SSL *cb_net_icpt_upstream(struct cb_net_icpt *ic, struct cb_net_icpt_host *h, const char *name,
			  int port);
/* A TLS connection to serve the sandbox for h with h's leaf. */
SSL *cb_net_icpt_downstream(const struct cb_net_icpt_host *h);
/* Why a handshake failed, one line (the certificate check's reason when it was that). */
void cb_net_icpt_tls_error(SSL *ssl, unsigned long err, char *buf, size_t size);

/* The request stream of one intercepted connection, from the sandbox to the destination. */
struct cb_net_rewriter {
	const struct cb_net_icpt_host *host;
	/* What names the host besides each request's Host and target, all checked against
	 * host->name on every request: the sandbox's SNI (NULL: it sent none) and the
	 * connection's target (the CONNECT or SOCKS5 name and port). */
	const char *sni;
	const char *target;
	int port;
	int misdirected; /* the refusal is a name mismatch (answered 421, not 400) */
	int state;
	unsigned long long left; /* bytes of the body or chunk still to pass */
	int injected;		 /* a secret went into at least one request */
	const char *error;	 /* why the stream was refused (static text, or why[]) */
	char why[320];		 /* a misdirected request's reason, naming what it named */
};

/* Move what can be moved of in to out: each request head with the host's headers set where
 * the path matches, bodies (Content-Length or chunked) untouched, anything after an Upgrade
 * raw. An incomplete head waits in in. 0, or -1 with rw->error: a malformed or ambiguous
 * request (both Content-Length and chunked, folded lines, bare LF, a head over 16 KiB), or,
 * with rw->misdirected set, one whose SNI, connection target, absolute target's authority or
 * Host (exactly one, required) does not name the bound host (a port given must be the
 * connection's): on a shared front end such a request reaches another site. */
int cb_net_rewrite(struct cb_net_rewriter *rw, struct evbuffer *in, struct evbuffer *out);

#endif
