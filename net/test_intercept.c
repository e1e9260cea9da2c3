/* Unit tests of header secrets' request rewriter (heads, bodies, chunks, refusals, the path
 * prefix) and of the workspace CA (made 0600, a leaf that verifies against it). */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"
#include "net/intercept.h"

static struct cb_net_binding binds[2] = {
    {.host = "api.test",
     .header = "Authorization",
     .value = "S3CRET",
     .path_prefix = "/v1/",
     .prefix = "Bearer ",
     .suffix = ""},
    {.host = "api.test",
     .header = "X-Key",
     .value = "K",
     .path_prefix = "/",
     .prefix = "",
     .suffix = "!"},
};
static struct cb_net_icpt_host host = {.name = "api.test", .n = 2, .b = binds};

/* The stream in (fed in pieces of step bytes) as the destination gets it; NULL if refused. */
static char *rewrite(const char *in, size_t step, const char **error)
{
	struct cb_net_rewriter rw = {
	    .host = &host, .sni = "api.test", .target = "api.test", .port = 443};
	struct evbuffer *i = evbuffer_new(), *o = evbuffer_new();
	size_t len = strlen(in), n;
	char *out = NULL;
	int rc = 0;

	for (size_t at = 0; at < len && !rc; at += step) {
		evbuffer_add(i, in + at, at + step < len ? step : len - at);
		rc = cb_net_rewrite(&rw, i, o);
	}
	*error = rw.error;
	if (!rc) {
		n = evbuffer_get_length(o);
		out = calloc(1, n + 1);
		evbuffer_remove(o, out, n);
	}
	evbuffer_free(i);
	evbuffer_free(o);
	return out;
}

Test(rewrite, headers_set_replaced_and_bodies_kept_in_any_pieces)
{
	static const char in[] =
	    "POST /v1/a HTTP/1.1\r\nHost: api.test\r\nauthorization: mine\r\nContent-Length: 5"
	    "\r\n\r\nhello"
	    "POST /v1/b HTTP/1.1\r\nHost: API.test.:443\r\nTransfer-Encoding: "
	    "chunked\r\n\r\n3\r\nabc"
	    "\r\n0\r\nT: 1\r\n\r\n"
	    "GET /v2/c HTTP/1.1\r\nHost: api.test\r\nAuthorization: mine\r\n\r\n";
	static const char want[] =
	    "POST /v1/a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n"
	    "Authorization: Bearer S3CRET\r\nX-Key: K!\r\n\r\nhello"
	    "POST /v1/b HTTP/1.1\r\nHost: API.test.:443\r\nTransfer-Encoding: chunked\r\n"
	    "Authorization: Bearer S3CRET\r\nX-Key: K!\r\n\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\n"
	    "GET /v2/c HTTP/1.1\r\nHost: api.test\r\nAuthorization: mine\r\nX-Key: K!\r\n\r\n";
	const char *err;

	for (size_t step = 1; step <= sizeof in; step += step < 8 ? 1 : 37) {
		char *out = rewrite(in, step, &err);

		cr_assert(out, "step %zu refused: %s", step, err);
		cr_expect_str_eq(out, want, "step %zu", step);
		free(out);
	}
}

Test(rewrite, path_prefix_needs_a_clean_path)
{
	static const struct {
		const char *target;
		int set;
	} cases[] = {
	    {"/v1/x", 1},
	    {"/v1/", 1},
	    {"/v1", 0},
	    {"/v10/x", 0},
	    {"/v1/../admin", 0},
	    {"/v1/./x", 0},
	    {"/v1/%2e%2e/x", 0},
	    {"/v1/..%2fx", 0},
	    {"/v1/a\\b", 0},
	    {"/v1/x?y=/../", 1},
	    {"/v1/..a/b", 1},
	    {"*", 0},
	    {"https://api.test/v1/x", 1},
	    {"/V1/x", 0},
	};
	char req[256];
	const char *err;

	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *out;

		snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: api.test\r\n\r\n",
			 cases[i].target);
		out = rewrite(req, sizeof req, &err);
		cr_assert(out, "%s refused: %s", cases[i].target, err);
		cr_expect_eq(!!strstr(out, "S3CRET"), cases[i].set, "%s", cases[i].target);
		free(out);
	}
}

Test(rewrite, ambiguous_requests_refused)
{
	static const char *const bad[] = {
	    "GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\nTransfer-Encoding: "
	    "chunked\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nX: a\r\n b\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nX: a\nY: b\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nContent-Length: -1\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\nnocolon\r\n\r\n",
	    "GET /v1/ HTTP/1.1\r\nHost: api.test\r\nAuthorization : mine\r\n\r\n",
	    "GET / HTTP/1.1\r\nHost: api.test\r\n: empty\r\n\r\n",
	    "GET /\r\n\r\n",
	    "CONNECT a:443 HTTP/1.1\r\nHost: api.test\r\n\r\n",
	    "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
	    "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabX\r\n",
	};
	const char *err;

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char *out = rewrite(bad[i], 1000, &err);

		cr_expect_null(out, "accepted: %s", bad[i]);
		free(out);
	}
}

Test(rewrite, upgrade_goes_raw)
{
	const char *err;
	char *out = rewrite("GET /v1/ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\n\r\n"
			    "GET /v1/ HTTP/1.1\r\n\r\n",
			    7, &err);

	cr_assert(out, "%s", err);
	cr_expect_str_eq(out, "GET /v1/ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\n"
			      "Authorization: Bearer S3CRET\r\nX-Key: K!\r\n\r\nGET /v1/ HTTP/1.1"
			      "\r\n\r\n");
	free(out);
}

/* Header secrets follow the request: a request on a connection to the bound host that names
 * another host (Host, an absolute target, the SNI, the connection's target) is refused as
 * misdirected before any of it goes out, whichever request of the connection it is. */
Test(rewrite, misdirected_requests_refused)
{
	static const struct {
		const char *sni, *target, *req;
	} bad[] = {
	    {"api.test", "api.test", "GET /v1/x HTTP/1.1\r\nHost: evil.test\r\n\r\n"},
	    {"api.test", "api.test", "GET /v1/x HTTP/1.1\r\nHost: api.test.evil.test\r\n\r\n"},
	    {"api.test", "api.test", "GET /v1/x HTTP/1.1\r\nHost: api.test:8443\r\n\r\n"},
	    {"api.test", "api.test", "GET /v1/x HTTP/1.1\r\nHost: api.test:\r\n\r\n"},
	    {"api.test", "api.test", "GET /v1/x HTTP/1.1\r\n\r\n"},
	    {"api.test", "api.test",
	     "GET /v1/x HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\n\r\n"},
	    {"api.test", "api.test",
	     "GET https://evil.test/v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    {"api.test", "api.test",
	     "GET https://api.test@evil.test/v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    {"api.test", "api.test", "GET evil.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    {"evil.test", "api.test", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    {NULL, "api.test", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    {"api.test", "evil.test", "GET /v1/x HTTP/1.1\r\nHost: api.test\r\n\r\n"},
	    /* the second request of a keep-alive connection */
	    {"api.test", "api.test",
	     "GET /v1/a HTTP/1.1\r\nHost: api.test\r\n\r\nGET /v1/b HTTP/1.1\r\nHost: evil.test"
	     "\r\n\r\n"},
	};

	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct cb_net_rewriter rw = {
		    .host = &host, .sni = bad[i].sni, .target = bad[i].target, .port = 443};
		struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
		size_t n;
		char *got;

		evbuffer_add(in, bad[i].req, strlen(bad[i].req));
		cr_expect_eq(cb_net_rewrite(&rw, in, out), -1, "accepted: %s", bad[i].req);
		cr_expect(rw.misdirected, "%s: %s", bad[i].req, rw.error);
		cr_expect(rw.error && strstr(rw.error, "misdirected request"), "%s", bad[i].req);
		/* nothing of the refused request went out, and no secret with it */
		n = evbuffer_get_length(out);
		got = calloc(1, n + 1);
		evbuffer_remove(out, got, n);
		cr_expect_null(strstr(got, "evil"), "%s went out: %s", bad[i].req, got);
		cr_expect_leq(n, strlen(bad[i].req) + 64, "%s", bad[i].req);
		free(got);
		evbuffer_free(in);
		evbuffer_free(out);
	}
}

Test(ca, made_private_and_signs_verifiable_leaves)
{
	char dir[] = "/tmp/cbca.XXXXXX", path[256];
	X509 *ca, *leaf;
	EVP_PKEY *key, *lkey = EVP_EC_gen("P-256");
	X509_STORE *store = X509_STORE_new();
	X509_STORE_CTX *ctx = X509_STORE_CTX_new();
	struct stat st;

	cr_assert(mkdtemp(dir));
	cr_assert_eq(cb_net_ca_ensure(dir, "cb-test"), 0, "%s", cb_error_message());
	snprintf(path, sizeof path, "%s/" CB_NET_CA_KEY, dir);
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(st.st_mode & 0777, 0600);
	cr_assert_eq(cb_net_ca_load(dir, &ca, &key), 0, "%s", cb_error_message());
	leaf = cb_net_ca_leaf(ca, key, lkey, "api.test");
	cr_assert(leaf);
	X509_STORE_add_cert(store, ca);
	X509_STORE_CTX_init(ctx, store, leaf, NULL);
	X509_VERIFY_PARAM_set1_host(X509_STORE_CTX_get0_param(ctx), "api.test", 0);
	cr_expect_eq(X509_verify_cert(ctx), 1, "%s",
		     X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
	cr_assert_eq(cb_net_ca_bundle(dir, "/nonexistent"), 0, "%s", cb_error_message());
	X509_STORE_CTX_free(ctx);
	X509_STORE_free(store);
	X509_free(leaf);
	X509_free(ca);
	EVP_PKEY_free(key);
	EVP_PKEY_free(lkey);
	snprintf(path, sizeof path, "rm -rf %s", dir);
	cr_expect_eq(system(path), 0);
}

/* Mutated streams fed in random pieces: refused with a reason or passed, never a crash nor
 * a read out of bounds (ASan and UBSan run this). COWBOX_SEED replays a run. */
Test(rewrite, fuzzed_streams)
{
	static const char *const seeds[] = {
	    "POST /v1/a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n\r\nabcGET /v1/ "
	    "HTTP/1.1\r\nHost: api.test\r\n\r\n",
	    "POST /v1/b HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc"
	    "\r\n0\r\n\r\n",
	    "GET /v1/ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: x\r\nAuthorization: a\r\n\r\nraw",
	};
	const char *env = getenv("COWBOX_SEED");
	unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)getpid();

	fprintf(stderr, "rewrite fuzz: COWBOX_SEED=%u\n", seed);
	srandom(seed);
	for (int iter = 0; iter < 3000; iter++) {
		char buf[512];
		size_t len = strlen(strcpy(buf, seeds[random() % 3]));
		struct cb_net_rewriter rw = {
		    .host = &host, .sni = "api.test", .target = "api.test", .port = 443};
		struct evbuffer *i = evbuffer_new(), *o = evbuffer_new();
		int rc = 0;

		for (int m = 0, n = 1 + (int)(random() % 4); m < n; m++) {
			size_t at = (size_t)random() % len;

			if (random() % 2)
				buf[at] = (char)(random() % 256);
			else if (len + 4 < sizeof buf) {
				memmove(buf + at + 4, buf + at, len - at + 1);
				memcpy(buf + at, "\r\n:0", 4);
				len += 4;
			}
		}
		for (size_t at = 0; at < len && rc == 0;) {
			size_t step = 1 + (size_t)random() % 40;

			step = step < len - at ? step : len - at;
			evbuffer_add(i, buf + at, step);
			at += step;
			rc = cb_net_rewrite(&rw, i, o);
		}
		if (rc < 0)
			cr_expect(rw.error, "refused without a reason");
		evbuffer_free(i);
		evbuffer_free(o);
	}
}
