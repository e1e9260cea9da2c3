/* Header secrets' TLS in the egress proxy: the contexts to the sandbox (the workspace CA's leaf of
 * each bound host) and to the destination (verified, its sessions kept for resumption). */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cowbox/error.h"
#include "net/intercept.h"
#include "net/proxy_util.h"

static const unsigned char alpn_h1[] = "\x08http/1.1";

/* The sandbox offers h2 and http/1.1: it gets http/1.1, which the rewriter speaks. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
		       const unsigned char *in, unsigned int inlen, void *arg)
{
	unsigned char *sel = NULL;

	(void)ssl;
	(void)arg;
	if (SSL_select_next_proto(&sel, outlen, alpn_h1, sizeof alpn_h1 - 1, in, inlen) !=
	    OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_NOACK;
	*out = sel;
	return SSL_TLSEXT_ERR_OK;
}

static int ssl_fail(const char *what)
{
	char buf[256] = "";

	ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
	ERR_clear_error();
	return cb_error_set(EINVAL, "header secrets: %s: %s", what, buf);
}

static char *dup_or(const char *s, const char *def)
{
	return strdup(s ? s : def);
}

static int add_binding(struct cb_net_icpt *ic, const struct cb_net_binding *src)
{
	struct cb_net_icpt_host *h = NULL;
	struct cb_net_binding *b, *nb;

	for (size_t i = 0; i < ic->n_hosts && !h; i++)
		if (!strcasecmp(ic->hosts[i].name, src->host))
			h = &ic->hosts[i];
	if (!h) {
		struct cb_net_icpt_host *nh =
		    realloc(ic->hosts, (ic->n_hosts + 1) * sizeof(*ic->hosts));

		if (!nh)
			return -ENOMEM;
		ic->hosts = nh;
		h = &ic->hosts[ic->n_hosts++];
		memset(h, 0, sizeof(*h));
		if (!(h->name = strdup(src->host)))
			return -ENOMEM;
	}
	if (!(nb = realloc(h->b, (h->n + 1) * sizeof(*h->b))))
		return -ENOMEM;
	h->b = nb;
	b = &h->b[h->n++];
	memset(b, 0, sizeof(*b));
	b->host = h->name;
	b->header = dup_or(src->header, "");
	b->value = dup_or(src->value, "");
	b->path_prefix = dup_or(src->path_prefix, "/");
	b->prefix = dup_or(src->prefix, "");
	b->suffix = dup_or(src->suffix, "");
	return b->header && b->value && b->path_prefix && b->prefix && b->suffix ? 0 : -ENOMEM;
}

/* The index of the SSL ex data naming the bound host and port of an upstream session. */
static int ex_index = -1;
static pthread_once_t ex_once = PTHREAD_ONCE_INIT;

/* An upstream SSL's key goes with it (libevent frees the SSL with its bufferevent). */
static void ex_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
	(void)parent;
	(void)ad;
	(void)idx;
	(void)argl;
	(void)argp;
	free(ptr);
}

static void ex_init(void)
{
	ex_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, ex_free);
}

/* Where an upstream connection's session goes: its host's slot for that port. */
struct sess_key {
	struct cb_net_icpt_host *h;
	int port;
};

/* The proxy's event loops share the bound hosts' session slots; held for a lookup or a swap,
 * never across a handshake. */
static pthread_mutex_t sess_lock = PTHREAD_MUTEX_INITIALIZER;

/* With sess_lock held. */
static struct cb_net_icpt_session *session_slot(struct cb_net_icpt_host *h, int port, int make)
{
	struct cb_net_icpt_session *s = NULL;

	for (size_t i = 0; i < CB_NET_ICPT_PORTS; i++)
		if (h->sess[i].port == port)
			return &h->sess[i];
		else if (!s && !h->sess[i].port)
			s = &h->sess[i];
	if (!make)
		return NULL;
	if (!s) { /* a host reached on more ports than slots: the first slot goes */
		s = &h->sess[0];
		SSL_SESSION_free(s->s);
		s->s = NULL;
	}
	s->port = port;
	return s;
}

/* OpenSSL hands over each new session (TLS 1.3: each ticket, after the handshake): the
 * newest is the one resumed next, by every connection to that host and port. A copy is kept:
 * OpenSSL marks the connection's own session not resumable when the connection ends without
 * a close_notify, as the sandbox's or the destination's often does. */
static int new_session(SSL *ssl, SSL_SESSION *sess)
{
	struct sess_key *k = SSL_get_ex_data(ssl, ex_index);
	SSL_SESSION *copy = k ? SSL_SESSION_dup(sess) : NULL, *old = NULL;
	struct cb_net_icpt_session *s;

	if (!copy)
		return 0;
	pthread_mutex_lock(&sess_lock);
	s = session_slot(k->h, k->port, 1);
	old = s->s;
	s->s = copy;
	pthread_mutex_unlock(&sess_lock);
	SSL_SESSION_free(old);
	return 0; /* sess stays OpenSSL's */
}

/* h's context to serve the sandbox: its leaf and key set once, not per connection. */
static int host_server(struct cb_net_icpt_host *h, X509 *ca, EVP_PKEY *ca_key, EVP_PKEY *key)
{
	if (!(h->leaf = cb_net_ca_leaf(ca, ca_key, key, h->name)))
		return ssl_fail(h->name);
	if (!(h->server = SSL_CTX_new(TLS_server_method())) ||
	    SSL_CTX_use_certificate(h->server, h->leaf) != 1 ||
	    SSL_CTX_use_PrivateKey(h->server, key) != 1)
		return ssl_fail("TLS contexts");
	SSL_CTX_set_min_proto_version(h->server, TLS1_2_VERSION);
	SSL_CTX_set_alpn_select_cb(h->server, alpn_select, NULL);
	return 0;
}

int cb_net_icpt_new(const struct cb_net_proxy_config *cfg, struct cb_net_icpt **out)
{
	struct cb_net_icpt *ic = NULL;
	const char *extra = getenv("COWBOX_PROXY_EXTRA_CA");
	X509 *ca = NULL;
	EVP_PKEY *ca_key = NULL;
	int rc = 0;

	*out = NULL;
	if (!cfg->n_bindings)
		return 0;
	pthread_once(&ex_once, ex_init);
	if (ex_index < 0)
		return ssl_fail("SSL ex data");
	if (!cfg->ca_dir)
		return cb_error_set(EINVAL, "header secrets: no certificate authority");
	if (!(ic = calloc(1, sizeof(*ic)))) {
		rc = cb_error_set(ENOMEM, "header secrets: out of memory");
		goto out;
	}
	for (size_t i = 0; i < cfg->n_bindings && !rc; i++)
		if (add_binding(ic, &cfg->bindings[i]) < 0)
			rc = cb_error_set(ENOMEM, "header secrets: out of memory");
	if (rc || (rc = cb_net_ca_load(cfg->ca_dir, &ca, &ca_key)) < 0)
		goto out;
	if (!(ic->leaf_key = EVP_EC_gen("P-256"))) {
		rc = ssl_fail("make the leaf key");
		goto out;
	}
	for (size_t i = 0; i < ic->n_hosts && !rc; i++)
		rc = host_server(&ic->hosts[i], ca, ca_key, ic->leaf_key);
	if (rc)
		goto out;
	if (!(ic->client = SSL_CTX_new(TLS_client_method()))) {
		rc = ssl_fail("TLS contexts");
		goto out;
	}
	SSL_CTX_set_min_proto_version(ic->client, TLS1_2_VERSION);
	SSL_CTX_set_verify(ic->client, SSL_VERIFY_PEER, NULL);
	/* sessions kept by cb_net_icpt_host, not in OpenSSL's cache (keyed by nothing we use) */
	SSL_CTX_set_session_cache_mode(ic->client,
				       SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(ic->client, new_session);
	if (SSL_CTX_set_default_verify_paths(ic->client) != 1) {
		rc = ssl_fail("the system's trust store");
		goto out;
	}
	if (extra && *extra && SSL_CTX_load_verify_locations(ic->client, extra, NULL) != 1) {
		rc = ssl_fail("COWBOX_PROXY_EXTRA_CA");
		cb_error_wrap(rc, "%s", extra);
		goto out;
	}
	*out = ic;
	ic = NULL;
out:
	X509_free(ca);
	EVP_PKEY_free(ca_key);
	cb_net_icpt_free(ic);
	return rc;
}

void cb_net_icpt_free(struct cb_net_icpt *ic)
{
	if (!ic)
		return;
	for (size_t i = 0; i < ic->n_hosts; i++) {
		struct cb_net_icpt_host *h = &ic->hosts[i];

		for (size_t k = 0; k < h->n; k++) {
			/* the secret goes from memory with the proxy */
			if (h->b[k].value)
				OPENSSL_cleanse((char *)h->b[k].value, strlen(h->b[k].value));
			free((char *)h->b[k].header);
			free((char *)h->b[k].value);
			free((char *)h->b[k].path_prefix);
			free((char *)h->b[k].prefix);
			free((char *)h->b[k].suffix);
		}
		free(h->b);
		free(h->name);
		X509_free(h->leaf);
		SSL_CTX_free(h->server);
		for (size_t k = 0; k < CB_NET_ICPT_PORTS; k++)
			SSL_SESSION_free(h->sess[k].s);
	}
	free(ic->hosts);
	EVP_PKEY_free(ic->leaf_key);
	SSL_CTX_free(ic->client);
	free(ic);
}

struct cb_net_icpt_host *cb_net_icpt_find(const struct cb_net_icpt *ic, const char *name)
{
	size_t n = strlen(name);

	if (n && name[n - 1] == '.')
		n--; /* "api.example.com." is the same host */
	for (size_t i = 0; ic && i < ic->n_hosts; i++)
		if (strlen(ic->hosts[i].name) == n && !strncasecmp(ic->hosts[i].name, name, n))
			return &ic->hosts[i];
	return NULL;
}

SSL *cb_net_icpt_upstream(struct cb_net_icpt *ic, struct cb_net_icpt_host *h, const char *name,
			  int port)
{
	struct sockaddr_storage ss;
	struct cb_net_icpt_session *s;
	SSL_SESSION *resume = NULL;
	struct sess_key *k = malloc(sizeof(*k));
	SSL *ssl = k ? SSL_new(ic->client) : NULL;
	int ok;

	if (!ssl || !SSL_set_ex_data(ssl, ex_index, k)) {
		SSL_free(ssl);
		free(k);
		return NULL;
	}
	*k = (struct sess_key){h, port};
	if (cb_net_proxy_literal(name, &ss) == 0)
		ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
	else
		ok = SSL_set_tlsext_host_name(ssl, name) && SSL_set1_host(ssl, name);
	/* a session of the same host and port was verified for this name when it was made; an
	 * expired or refused one is a full handshake, verified again */
	pthread_mutex_lock(&sess_lock);
	s = session_slot(h, port, 0);
	if (s && s->s && SSL_SESSION_is_resumable(s->s) && SSL_SESSION_up_ref(s->s))
		resume = s->s; /* ours until set: another loop may swap the slot meanwhile */
	pthread_mutex_unlock(&sess_lock);
	if (ok && resume)
		ok = SSL_set_session(ssl, resume);
	SSL_SESSION_free(resume);
	if (!ok || SSL_set_alpn_protos(ssl, alpn_h1, sizeof alpn_h1 - 1) != 0) {
		SSL_free(ssl);
		return NULL;
	}
	return ssl;
}

SSL *cb_net_icpt_downstream(const struct cb_net_icpt_host *h)
{
	return SSL_new(h->server);
}

void cb_net_icpt_tls_error(SSL *ssl, unsigned long err, char *buf, size_t size)
{
	long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	char e[256] = "no detail";

	if (v != X509_V_OK) {
		snprintf(buf, size, "certificate verify failed: %s",
			 X509_verify_cert_error_string(v));
		return;
	}
	if (err)
		ERR_error_string_n(err, e, sizeof e);
	snprintf(buf, size, "%s", e);
}
