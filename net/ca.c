/* A workspace's own certificate authority for header secrets: made once with OpenSSL (key 0600
 * beside the workspace, never in the sandbox), and the leaf certificates it signs per host. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"
#include "net/intercept.h"
#include "net/proxy_util.h"

#define CA_DAYS	  3650
#define LEAF_DAYS 397 /* what browsers accept of a leaf, so no client balks at ours */

static int ssl_fail(int err, const char *what)
{
	char buf[256] = "";

	ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
	ERR_clear_error();
	return cb_error_set(err, "certificate authority: %s: %s", what, buf);
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *ext;
	int ok;

	X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
	if (!(ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value)))
		return 0;
	ok = X509_add_ext(cert, ext, -1);
	X509_EXTENSION_free(ext);
	return ok;
}

/* A certificate for key, named cn, signed by issuer's key (itself when issuer is NULL). */
static X509 *make_cert(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
		       const char *san, long days)
{
	X509 *x = X509_new();
	X509_NAME *name = x ? X509_get_subject_name(x) : NULL;
	unsigned char serial[16];
	BIGNUM *bn = NULL;
	int ok = x && RAND_bytes(serial, sizeof serial) == 1;

	serial[0] &= 0x7f; /* a positive serial */
	ok = ok && (bn = BN_bin2bn(serial, sizeof serial, NULL)) &&
	     BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) && X509_set_version(x, 2) &&
	     X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, (const unsigned char *)"cowbox",
					-1, -1, 0) &&
	     X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1,
					-1, 0) &&
	     X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
	     X509_gmtime_adj(X509_getm_notAfter(x), days * 86400L) &&
	     X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name) &&
	     X509_set_pubkey(x, key);
	if (ok && !issuer)
		ok = add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
		     add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") &&
		     add_ext(x, x, NID_subject_key_identifier, "hash");
	else if (ok)
		ok = add_ext(x, issuer, NID_basic_constraints, "critical,CA:FALSE") &&
		     add_ext(x, issuer, NID_key_usage, "critical,digitalSignature") &&
		     add_ext(x, issuer, NID_ext_key_usage, "serverAuth") &&
		     add_ext(x, issuer, NID_subject_alt_name, san) &&
		     add_ext(x, issuer, NID_authority_key_identifier, "keyid");
	ok = ok && X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256());
	BN_free(bn);
	if (!ok) {
		X509_free(x);
		return NULL;
	}
	return x;
}

/* Write data to path by a fresh file of mode, renamed in place: never half a key on disk. */
static int write_pem(const char *path, mode_t mode, EVP_PKEY *key, X509 *cert)
{
	char tmp[4200];
	FILE *f = NULL;
	int fd, rc = 0;

	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0 || !(f = fdopen(fd, "w"))) {
		rc = cb_error_set(errno, "certificate authority: %s: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	if (key ? !PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)
		: !PEM_write_X509(f, cert))
		rc = ssl_fail(EIO, path);
	if (fclose(f) != 0 && !rc)
		rc = cb_error_set(errno, "certificate authority: %s: %s", tmp, strerror(errno));
	if (!rc && rename(tmp, path) < 0)
		rc = cb_error_set(errno, "certificate authority: %s: %s", path, strerror(errno));
out:
	if (rc)
		unlink(tmp);
	return rc;
}

int cb_net_ca_ensure(const char *dir, const char *label)
{
	char key_path[4200], cert_path[4200], cn[128];
	EVP_PKEY *key = NULL;
	X509 *cert = NULL;
	int rc = 0;

	snprintf(key_path, sizeof key_path, "%s/" CB_NET_CA_KEY, dir);
	snprintf(cert_path, sizeof cert_path, "%s/" CB_NET_CA_CERT, dir);
	if (access(key_path, F_OK) == 0 && access(cert_path, F_OK) == 0)
		return 0;
	snprintf(cn, sizeof cn, "cowbox workspace %.80s CA", label);
	if (!(key = EVP_EC_gen("P-256")) || !(cert = make_cert(key, cn, NULL, NULL, NULL, CA_DAYS)))
		rc = ssl_fail(ENOMEM, "make the key and certificate");
	else if (!(rc = write_pem(key_path, 0600, key, NULL)))
		rc = write_pem(cert_path, 0644, NULL, cert);
	EVP_PKEY_free(key);
	X509_free(cert);
	return rc;
}

int cb_net_ca_load(const char *dir, X509 **cert, EVP_PKEY **key)
{
	char path[4200];
	FILE *f;
	int rc = 0;

	*cert = NULL;
	*key = NULL;
	snprintf(path, sizeof path, "%s/" CB_NET_CA_CERT, dir);
	if (!(f = fopen(path, "re")))
		return cb_error_set(errno, "certificate authority: %s: %s", path, strerror(errno));
	*cert = PEM_read_X509(f, NULL, NULL, NULL);
	fclose(f);
	snprintf(path, sizeof path, "%s/" CB_NET_CA_KEY, dir);
	if (!*cert)
		rc = ssl_fail(EINVAL, "read the certificate");
	else if (!(f = fopen(path, "re")))
		rc = cb_error_set(errno, "certificate authority: %s: %s", path, strerror(errno));
	else {
		*key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
		fclose(f);
		if (!*key)
			rc = ssl_fail(EINVAL, "read the key");
		else if (X509_check_private_key(*cert, *key) != 1)
			rc = ssl_fail(EINVAL, "the key does not match the certificate");
	}
	if (rc) {
		X509_free(*cert);
		EVP_PKEY_free(*key);
		*cert = NULL;
		*key = NULL;
	}
	return rc;
}

X509 *cb_net_ca_leaf(X509 *ca, EVP_PKEY *ca_key, EVP_PKEY *leaf_key, const char *host)
{
	struct sockaddr_storage ss;
	char san[300];

	snprintf(san, sizeof san, "%s:%s", cb_net_proxy_literal(host, &ss) == 0 ? "IP" : "DNS",
		 host);
	return make_cert(leaf_key, host, ca, ca_key, san, LEAF_DAYS);
}

int cb_net_ca_bundle(const char *dir, const char *system_bundle)
{
	char path[4200], tmp[4300], buf[65536];
	const char *srcs[2] = {system_bundle, NULL};
	int out = -1, rc = 0;
	ssize_t n;

	snprintf(path, sizeof path, "%s/" CB_NET_CA_CERT, dir);
	srcs[1] = path;
	snprintf(tmp, sizeof tmp, "%s/" CB_NET_CA_BUNDLE ".tmp.%d", dir, (int)getpid());
	unlink(tmp);
	if ((out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0) {
		rc = cb_error_set(errno, "CA bundle %s: %s", tmp, strerror(errno));
		goto out;
	}
	fchmod(out, 0644); /* whatever the umask: the sandbox's users read it */
	for (int i = 0; i < 2 && !rc; i++) {
		int in = srcs[i] ? open(srcs[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK) : -1;
		struct stat st;

		if (in < 0 && i == 0)
			continue; /* no system bundle: the workspace's CA alone */
		if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode)) {
			rc = cb_error_set(in < 0 ? errno : EINVAL, "CA bundle: %s: not readable",
					  srcs[i]);
			if (in >= 0)
				close(in);
			break;
		}
		while (!rc && (n = read(in, buf, sizeof buf)) > 0)
			if (write(out, buf, (size_t)n) != n)
				rc = cb_error_set(EIO, "CA bundle %s: short write", tmp);
		if (!rc && write(out, "\n", 1) != 1)
			rc = cb_error_set(EIO, "CA bundle %s: short write", tmp);
		close(in);
	}
	if (close(out) < 0 && !rc)
		rc = cb_error_set(errno, "CA bundle %s: %s", tmp, strerror(errno));
	snprintf(path, sizeof path, "%s/" CB_NET_CA_BUNDLE, dir);
	if (!rc && rename(tmp, path) < 0)
		rc = cb_error_set(errno, "CA bundle %s: %s", path, strerror(errno));
out:
	if (rc)
		unlink(tmp);
	return rc;
}
