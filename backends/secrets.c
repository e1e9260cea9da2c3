/* Header secrets of a workspace's options: checked, kept out of backend.json (a value in a 0600
 * secrets.json beside it, a file by its path), resolved for the proxy, and the sandbox's trust. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"

#define SECRETS_FILE "secrets.json"
#define VALUE_MAX    8192 /* bytes of a secret, a prefix or a suffix */

/* Headers that frame or route the request: setting one would break what the proxy parses. */
static const char *const reserved_headers[] = {
    "host",    "content-length", "transfer-encoding", "connection",	     "upgrade", "te",
    "trailer", "keep-alive",	 "proxy-connection",  "proxy-authorization", "expect"};

static void secret_free(struct cb_backend_secret *s)
{
	if (s->value)
		memset(s->value, 0, strlen(s->value)); /* not left in freed memory */
	free(s->host);
	free(s->header);
	free(s->value);
	free(s->file);
	free(s->path_prefix);
	free(s->prefix);
	free(s->suffix);
	memset(s, 0, sizeof(*s));
}

void cb_backend_secrets_free(struct cb_backend_options *o)
{
	for (size_t i = 0; i < o->n_secrets; i++)
		secret_free(&o->secrets[i]);
	free(o->secrets);
	o->secrets = NULL;
	o->n_secrets = 0;
}

/* A string field of entry i: NULL (absent) is fine; text without CR, LF or NUL. */
static int text_field(json_t *e, size_t i, const char *key, char **out)
{
	json_t *v = json_object_get(e, key);
	const char *s;
	size_t n;

	*out = NULL;
	if (!v)
		return 0;
	if (!json_is_string(v))
		return cb_error_set(EINVAL, "backend option secrets: entry %zu: %s is not a string",
				    i, key);
	s = json_string_value(v);
	n = json_string_length(v);
	if (n > VALUE_MAX || strlen(s) != n || strpbrk(s, "\r\n"))
		return cb_error_set(
		    EINVAL,
		    "backend option secrets: entry %zu: %s holds a line break or NUL, "
		    "or is longer than %d bytes",
		    i, key, VALUE_MAX);
	if (!(*out = strdup(s)))
		return cb_error_set(ENOMEM, "backend option secrets: out of memory");
	return 0;
}

static int check_host(size_t i, char *h)
{
	size_t n = strlen(h);

	if (n && h[n - 1] == '.')
		h[--n] = 0;
	if (!n || n > 253)
		return cb_error_set(EINVAL,
				    "backend option secrets: entry %zu: host is empty or "
				    "too long",
				    i);
	for (size_t k = 0; k < n; k++) {
		if (!isalnum((unsigned char)h[k]) && !strchr(".-_:", h[k]))
			return cb_error_set(EINVAL,
					    "backend option secrets: entry %zu: host '%s' is not a "
					    "name or an address (no wildcard, port or scheme)",
					    i, h);
		h[k] = (char)tolower((unsigned char)h[k]);
	}
	return 0;
}

static int check_header(size_t i, const char *h)
{
	if (!*h || strlen(h) > 128 ||
	    strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
		      "0123456789!#$%&'*+-.^_`|~") != strlen(h))
		return cb_error_set(EINVAL,
				    "backend option secrets: entry %zu: header '%s' is not an HTTP "
				    "header name",
				    i, h);
	for (size_t k = 0; k < sizeof reserved_headers / sizeof *reserved_headers; k++)
		if (!strcasecmp(h, reserved_headers[k]))
			return cb_error_set(
			    EINVAL,
			    "backend option secrets: entry %zu: header %s frames or "
			    "routes the request; the proxy does not set it",
			    i, h);
	return 0;
}

static int secret_from_json(json_t *e, size_t i, struct cb_backend_secret *s)
{
	static const char *const keys[] = {"host",   "header", "value",	 "file",
					   "stored", "prefix", "suffix", "path_prefix"};
	const char *key;
	json_t *v;
	int rc, forms;

	if (!json_is_object(e))
		return cb_error_set(EINVAL, "backend option secrets: entry %zu is not an object",
				    i);
	json_object_foreach(e, key, v)
	{
		size_t k = 0;

		while (k < sizeof keys / sizeof *keys && strcmp(keys[k], key))
			k++;
		if (k == sizeof keys / sizeof *keys)
			return cb_error_set(
			    EINVAL, "backend option secrets: entry %zu: unknown key '%s'", i, key);
	}
	if ((rc = text_field(e, i, "host", &s->host)) ||
	    (rc = text_field(e, i, "header", &s->header)) ||
	    (rc = text_field(e, i, "value", &s->value)) ||
	    (rc = text_field(e, i, "file", &s->file)) ||
	    (rc = text_field(e, i, "path_prefix", &s->path_prefix)) ||
	    (rc = text_field(e, i, "prefix", &s->prefix)) ||
	    (rc = text_field(e, i, "suffix", &s->suffix)))
		return rc;
	s->stored = json_is_true(json_object_get(e, "stored"));
	if (!s->host || !s->header)
		return cb_error_set(EINVAL,
				    "backend option secrets: entry %zu needs host and header", i);
	if ((rc = check_host(i, s->host)) || (rc = check_header(i, s->header)))
		return rc;
	forms = !!s->value + !!s->file + s->stored;
	if (forms != 1)
		return cb_error_set(
		    EINVAL, "backend option secrets: entry %zu needs one of value or file", i);
	if (s->file && s->file[0] != '/')
		return cb_error_set(
		    EINVAL, "backend option secrets: entry %zu: file needs an absolute path", i);
	if (s->path_prefix && (s->path_prefix[0] != '/' || strpbrk(s->path_prefix, " \t?#")))
		return cb_error_set(EINVAL,
				    "backend option secrets: entry %zu: path_prefix is a path "
				    "starting with / (no query)",
				    i);
	return 0;
}

int cb_backend_secrets_from_json(json_t *v, struct cb_backend_options *out)
{
	size_t i;
	json_t *e;
	int rc = 0;

	if (!json_is_array(v) || json_array_size(v) > CB_BACKEND_MAX_SECRETS)
		return cb_error_set(EINVAL, "backend option secrets: needs a list of at most %d",
				    CB_BACKEND_MAX_SECRETS);
	if (!(out->secrets = calloc(json_array_size(v) + 1, sizeof(*out->secrets))))
		return cb_error_set(ENOMEM, "backend option secrets: out of memory");
	json_array_foreach(v, i, e)
	{
		out->n_secrets = i + 1;
		if ((rc = secret_from_json(e, i, &out->secrets[i])))
			break;
	}
	return rc;
}

json_t *cb_backend_secrets_to_json(const struct cb_backend_options *o)
{
	json_t *a = json_array();

	for (size_t i = 0; i < o->n_secrets; i++) {
		const struct cb_backend_secret *s = &o->secrets[i];
		json_t *e =
		    json_pack("{s:s, s:s, s:s, s:s, s:s}", "host", s->host, "header", s->header,
			      "path_prefix", s->path_prefix ? s->path_prefix : "/", "prefix",
			      s->prefix ? s->prefix : "", "suffix", s->suffix ? s->suffix : "");

		/* never the value: these options are shown (info, configure) and saved */
		if (s->file)
			json_object_set_new(e, "file", json_string(s->file));
		else
			json_object_set_new(e, "stored", json_true());
		json_array_append_new(a, e);
	}
	return a;
}

int cb_backend_secrets_save(const char *dir, const char *label, const struct cb_backend_options *o)
{
	char path[4096], tmp[4200];
	json_t *vals = json_array();
	int fd = -1, rc = 0, any = 0;
	char *text = NULL;

	snprintf(path, sizeof path, "%s/" SECRETS_FILE, dir);
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	for (size_t i = 0; i < o->n_secrets; i++) {
		const struct cb_backend_secret *s = &o->secrets[i];

		if (!s->value && !s->file) {
			rc = cb_error_set(
			    EINVAL,
			    "backend option secrets: entry %zu (%s) has no value: give "
			    "value or file",
			    i, s->host);
			goto out;
		}
		any |= !!s->value;
		json_array_append_new(vals, s->value ? json_string(s->value) : json_null());
	}
	if (!any) {
		if (unlink(path) < 0 && errno != ENOENT)
			rc = cb_error_set(errno, "%s: %s", path, strerror(errno));
		goto ca;
	}
	text = json_dumps(vals, JSON_COMPACT);
	unlink(tmp);
	/* 0600 from its first byte, and renamed in place: never readable by others */
	if (!text ||
	    (fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0 ||
	    write(fd, text, strlen(text)) != (ssize_t)strlen(text) || fsync(fd) < 0) {
		rc = cb_error_set(text ? errno : ENOMEM, "%s: %s", tmp,
				  strerror(text ? errno : ENOMEM));
		goto out;
	}
	if (rename(tmp, path) < 0)
		rc = cb_error_set(errno, "%s: %s", path, strerror(errno));
ca:
	/* the CA is made with the options that need it, at create */
	if (!rc && o->n_secrets)
		rc = cb_net_ca_ensure(dir, label);
out:
	if (fd >= 0)
		close(fd);
	if (rc && fd >= 0)
		unlink(tmp);
	if (text) {
		memset(text, 0, strlen(text));
		free(text);
	}
	json_decref(vals);
	return rc;
}

int cb_backend_secrets_load(const char *dir, struct cb_backend_options *o)
{
	char path[4096];
	json_error_t jerr;
	json_t *vals = NULL;
	int rc = 0, stored = 0;

	for (size_t i = 0; i < o->n_secrets; i++)
		stored |= o->secrets[i].stored;
	if (!stored)
		return 0;
	snprintf(path, sizeof path, "%s/" SECRETS_FILE, dir);
	if (!(vals = json_load_file(path, 0, &jerr)) || !json_is_array(vals) ||
	    json_array_size(vals) != o->n_secrets) {
		rc = cb_error_set(EIO, "%s: missing or not the secrets of backend.json (%s)", path,
				  vals ? "wrong shape" : jerr.text);
		goto out;
	}
	for (size_t i = 0; i < o->n_secrets && !rc; i++) {
		json_t *v = json_array_get(vals, i);

		if (!o->secrets[i].stored)
			continue;
		if (!json_is_string(v))
			rc = cb_error_set(EIO, "%s: entry %zu has no value", path, i);
		else if (!(o->secrets[i].value = strdup(json_string_value(v))))
			rc = cb_error_set(ENOMEM, "secrets: out of memory");
		o->secrets[i].stored = 0;
	}
out:
	json_decref(vals);
	return rc;
}

/* A secret file's content (one line; a final newline cut), read where the daemon runs. */
static int read_secret_file(const char *path, char **out)
{
	char buf[VALUE_MAX + 2];
	struct stat st;
	ssize_t n = -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY), rc = 0;

	*out = NULL;
	if (fd < 0 || fstat(fd, &st) < 0)
		rc = cb_error_set(errno, "secret file %s: %s", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		rc = cb_error_set(EINVAL, "secret file %s: not a regular file", path);
	else if ((n = read(fd, buf, sizeof buf - 1)) < 0)
		rc = cb_error_set(errno, "secret file %s: %s", path, strerror(errno));
	if (!rc && n >= 0) {
		buf[n] = 0;
		while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
			buf[--n] = 0;
		if ((size_t)n > VALUE_MAX || strlen(buf) != (size_t)n || strpbrk(buf, "\r\n"))
			rc = cb_error_set(EINVAL,
					  "secret file %s: one line of at most %d bytes, no NUL",
					  path, VALUE_MAX);
		else if (!(*out = strdup(buf)))
			rc = cb_error_set(ENOMEM, "secret file: out of memory");
	}
	memset(buf, 0, sizeof buf);
	if (fd >= 0)
		close(fd);
	return rc;
}

int cb_backend_secrets_resolve(const struct cb_backend_options *o, struct cb_net_binding **out,
			       char ***values)
{
	struct cb_net_binding *b = calloc(o->n_secrets + 1, sizeof(*b));
	char **vals = calloc(o->n_secrets + 1, sizeof(char *));
	int rc = 0;

	*out = NULL;
	*values = NULL;
	if (!b || !vals) {
		rc = cb_error_set(ENOMEM, "secrets: out of memory");
		goto out;
	}
	for (size_t i = 0; i < o->n_secrets && !rc; i++) {
		const struct cb_backend_secret *s = &o->secrets[i];

		if (s->file)
			rc = read_secret_file(s->file, &vals[i]);
		else if (!s->value || !(vals[i] = strdup(s->value)))
			rc = cb_error_set(s->value ? ENOMEM : EINVAL, "secret for %s: no value",
					  s->host);
		b[i] = (struct cb_net_binding){.host = s->host,
					       .header = s->header,
					       .value = vals[i],
					       .path_prefix = s->path_prefix ? s->path_prefix : "/",
					       .prefix = s->prefix ? s->prefix : "",
					       .suffix = s->suffix ? s->suffix : ""};
	}
	if (rc)
		cb_error_wrap(rc, "header secrets");
out:
	if (rc) {
		cb_backend_secrets_values_free(vals);
		free(b);
		return rc;
	}
	*out = b;
	*values = vals;
	return 0;
}

void cb_backend_secrets_values_free(char **values)
{
	for (size_t i = 0; values && values[i]; i++) {
		memset(values[i], 0, strlen(values[i]));
		free(values[i]);
	}
	free(values);
}

int cb_backend_trust_prepare(struct cb_backend *b)
{
	char sys[4200];
	int rc;

	if (!b->opt.n_secrets)
		return 0;
	snprintf(sys, sizeof sys, "%s" CB_BACKEND_SYSTEM_CA,
		 b->opt.image && b->ops->image_root ? b->opt.image : "");
	if ((rc = cb_net_ca_ensure(b->dir, b->ref)) < 0 || (rc = cb_net_ca_bundle(b->dir, sys)) < 0)
		cb_error_wrap(rc, "header secrets: the workspace's CA");
	return rc;
}
