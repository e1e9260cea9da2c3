/* The egress proxy of a backend under network public or allow: a listener inside the
 * workspace's network namespace (loopback only there) served by net/proxy.c from the daemon,
 * with the options' header secrets. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/net.h"

#define PROXY_URL "127.0.0.1:" CB_NET_PROXY_PORT_TEXT
const char *const cb_backend_proxy_env[] = {
    "HTTP_PROXY=http://" PROXY_URL,
    "HTTPS_PROXY=http://" PROXY_URL,
    "ALL_PROXY=socks5h://" PROXY_URL,
    "http_proxy=http://" PROXY_URL,
    "https_proxy=http://" PROXY_URL,
    "all_proxy=socks5h://" PROXY_URL,
    "NO_PROXY=localhost,127.0.0.1,::1",
    "no_proxy=localhost,127.0.0.1,::1",
    NULL,
};

const char *const cb_backend_trust_env[] = {
    "SSL_CERT_FILE=" CB_BACKEND_SYSTEM_CA,  "REQUESTS_CA_BUNDLE=" CB_BACKEND_SYSTEM_CA,
    "CURL_CA_BUNDLE=" CB_BACKEND_SYSTEM_CA, "NODE_EXTRA_CA_CERTS=" CB_BACKEND_SYSTEM_CA,
    "GIT_SSL_CAINFO=" CB_BACKEND_SYSTEM_CA, NULL,
};

int cb_backend_net_proxied(const struct cb_backend_options *o)
{
	return o->net == CB_BACKEND_NET_PUBLIC || o->net == CB_BACKEND_NET_ALLOW;
}

int cb_backend_policy(const struct cb_backend_options *o, struct cb_net_policy **out)
{
	size_t n = 0;

	*out = NULL;
	if (!cb_backend_net_proxied(o))
		return 0;
	while (o->allow && o->allow[n])
		n++;
	return cb_net_policy_new(o->net == CB_BACKEND_NET_PUBLIC ? CB_NET_POLICY_PUBLIC
								 : CB_NET_POLICY_ALLOW,
				 o->allow, n, out);
}

int cb_backend_proxy_start(struct cb_backend *b, int netns_fd)
{
	int fd = -1, rc;

	if (!cb_backend_net_proxied(&b->opt))
		return 0;
	if ((rc = cb_netns_listen(netns_fd, CB_NET_PROXY_PORT, &fd)) < 0)
		return cb_error_wrap(rc, "network %s: the egress proxy",
				     cb_backend_net_name(b->opt.net));
	return cb_backend_proxy_serve(b, fd);
}

int cb_backend_proxy_serve(struct cb_backend *b, int listen_fd)
{
	struct cb_net_proxy_config cfg = {.listen_fd = listen_fd};
	struct cb_net_policy *pol = NULL;
	struct cb_net_binding *bindings = NULL;
	char **values = NULL;
	int rc;

	if ((rc = cb_backend_policy(&b->opt, &pol)) < 0)
		goto out;
	/* header secrets: values read now, on the host, for the proxy alone */
	if (b->opt.n_secrets &&
	    ((rc = cb_backend_trust_prepare(b)) < 0 ||
	     (rc = cb_backend_secrets_resolve(&b->opt, &bindings, &values)) < 0))
		goto out;
	cfg.bindings = bindings;
	cfg.n_bindings = b->opt.n_secrets;
	cfg.ca_dir = b->dir;
	cfg.policy = pol;
	cfg.record = b->net_record;
	cfg.record_arg = b->net_record_arg;
	cfg.max_conns = b->opt.proxy_conns;
	rc = cb_net_proxy_start(&cfg, &b->proxy);
	cfg.listen_fd = -1; /* the proxy's now, or closed by it */
out:
	if (cfg.listen_fd >= 0)
		close(cfg.listen_fd);
	cb_net_policy_free(pol);
	free(bindings);
	cb_backend_secrets_values_free(values);
	return rc;
}

void cb_backend_proxy_stop(struct cb_backend *b)
{
	cb_net_proxy_stop(b->proxy);
	b->proxy = NULL;
}
