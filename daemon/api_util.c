/* The API ops' helpers: the workspace's backend (kept in struct cb_daemon), opened lazily and
 * replaced by configure, and base64 for binary data in JSON. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "cowbox/error.h"
#include "cowbox/image.h"
#include "cowbox/overlay.h"

/* References per backend generation: configure replaces d->api_backend while ops may still
 * use the old one, which goes (and its container with it) when its last user lets go. */
struct api_ref {
	struct cb_backend *b;
	int refs;
	struct api_ref *next;
};

static struct api_ref *ref_of(struct cb_daemon *d, struct cb_backend *b)
{
	for (struct api_ref *r = d->api_refs; r; r = r->next)
		if (r->b == b)
			return r;
	return NULL;
}

/* Drop one reference (d->api_lock held); returns the backend to free after unlocking, if any. */
static struct cb_backend *ref_drop(struct cb_daemon *d, struct cb_backend *b)
{
	struct api_ref *r = ref_of(d, b);

	if (!r || --r->refs > 0)
		return NULL;
	for (struct api_ref **p = &d->api_refs; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			break;
		}
	free(r);
	return b;
}

/* b->phase: kept for the info op ("backend_phase"). */
static void backend_phase(void *arg, const char *what)
{
	struct cb_daemon *d = arg;

	pthread_mutex_lock(&d->phase_lock);
	snprintf(d->phase, sizeof(d->phase), "%s", what ? what : "");
	pthread_mutex_unlock(&d->phase_lock);
}

int cb_api_backend(struct cb_daemon *d, int create, struct cb_backend **out)
{
	struct api_ref *r;
	int rc = 0;

	*out = NULL;
	pthread_mutex_lock(&d->api_lock);
	if (d->api_released) {
		rc = cb_error_set(ESHUTDOWN, "the daemon of %s is stopping", d->ref);
	} else if (!d->api_backend) {
		rc = cb_backend_open(d->ref, d->dir, d->mountpoint, d->name, &d->api_backend);
		r = rc ? NULL : calloc(1, sizeof(*r));
		if (!rc && !r) {
			cb_backend_free(d->api_backend);
			d->api_backend = NULL;
			rc = cb_error_set(ENOMEM, "backend: out of memory");
		} else if (r) {
			/* None of the daemon's threads does I/O through its own mount. */
			d->api_backend->io = &cb_daemon_backend_io;
			d->api_backend->io_arg = d;
			d->api_backend->net_record = cb_daemon_net_record;
			d->api_backend->net_record_arg = d;
			d->api_backend->phase = backend_phase;
			d->api_backend->phase_arg = d;
			r->b = d->api_backend;
			r->refs = 1; /* the daemon's own */
			r->next = d->api_refs;
			d->api_refs = r;
		}
	}
	if (!rc) {
		ref_of(d, d->api_backend)->refs++;
		*out = d->api_backend;
	}
	pthread_mutex_unlock(&d->api_lock);
	if (!rc && create && (rc = cb_backend_ensure(*out)) < 0) {
		cb_api_backend_put(d, *out);
		*out = NULL;
	}
	return rc;
}

void cb_api_backend_put(struct cb_daemon *d, struct cb_backend *b)
{
	struct cb_backend *gone;

	if (!b)
		return;
	pthread_mutex_lock(&d->api_lock);
	gone = ref_drop(d, b);
	pthread_mutex_unlock(&d->api_lock);
	cb_backend_free(gone);
}

/* A new workspace's options decide how its files are owned: the mount follows (the range is
 * kept once allocated, for a later change of mind); so does the upper layer's quota. */
static int configure_ids(struct cb_daemon *d, const struct cb_backend_options *opt)
{
	struct cb_backend_limits lim;
	unsigned long base;
	int rc = cb_daemon_ids(d->dir, opt->privileged, &base);

	if (!rc && d->ov)
		cb_overlay_set_id_base(d->ov, base);
	/* and its quota (passthrough, chosen at mount, changes at the next one). A capped
	 * upper/ of another size: the mount counts the new cap until the next start makes
	 * the image again for it (ws/upper_image.c). */
	cb_backend_limits_of(opt, &lim);
	if (!rc && d->ov)
		rc = cb_overlay_set_quota(
		    d->ov, d->upper_capped && lim.disk_bytes == d->upper_cap ? 0 : lim.disk_bytes,
		    lim.disk_inodes);
	return rc;
}

int cb_api_configure(struct cb_daemon *d, json_t *options)
{
	struct cb_backend_options opt;
	struct cb_backend *gone = NULL;
	char marker[4096];
	int rc;

	if ((rc = cb_backend_options_from_json(options, &opt)) < 0)
		return rc;
	/* ns: an OCI image is unpacked now (once: the cache keeps it), so that a bad image fails
	 * the configure that names it rather than the first command */
	if (opt.image && cb_backend_find(opt.kind)->image_root) {
		struct cb_backend_image_cap cap;
		char *root = NULL;

		cb_backend_image_cap_of(&opt, &cap);
		rc = cb_backend_image_root_capped(opt.image, &cap, &root, NULL, NULL);
		free(root);
		if (rc < 0)
			goto out;
	}
	/* docker: the engine's image, present or pulled now, for the same reason */
	if (opt.image && cb_backend_find(opt.kind)->check_image &&
	    (rc = cb_backend_find(opt.kind)->check_image(opt.image)) < 0)
		goto out;
	snprintf(marker, sizeof(marker), "%s/backend.created", d->dir);
	pthread_mutex_lock(&d->api_lock);
	if ((d->api_backend && d->api_backend->created) || access(marker, F_OK) == 0) {
		rc = cb_error_set(EBUSY,
				  "configure: the backend of %s was already created; "
				  "options shape a new workspace only",
				  d->ref);
	} else if (!(rc = configure_ids(d, &opt)) &&
		   !(rc = cb_backend_options_save(d->dir, &opt)) && d->api_backend) {
		gone = ref_drop(d, d->api_backend); /* the next op opens the new options */
		d->api_backend = NULL;
	}
	pthread_mutex_unlock(&d->api_lock);
out:
	cb_backend_free(gone);
	cb_backend_options_free(&opt);
	return rc;
}

/* Called once the API's commands are gone: forwarders stop, the container goes (now, or when
 * a straggling op lets go of it). */
void cb_api_backend_release(struct cb_daemon *d)
{
	struct cb_backend *gone = NULL;

	pthread_mutex_lock(&d->api_lock);
	d->api_released = 1;
	if (d->api_backend)
		gone = ref_drop(d, d->api_backend);
	d->api_backend = NULL;
	pthread_mutex_unlock(&d->api_lock);
	cb_backend_free(gone);
	/* the home's capped filesystem is mounted while the daemon serves (backends/home.c);
	 * a daemon that failed before it found its workspace has no directory */
	if (d->dir)
		cb_backend_home_release(d->dir);
}

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

json_t *cb_api_b64_json(const void *data, size_t len)
{
	const unsigned char *p = data;
	size_t olen = 4 * ((len + 2) / 3), o = 0;
	char *s = malloc(olen + 1);
	json_t *j;

	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		unsigned v = (unsigned)p[i] << 16;

		if (i + 1 < len)
			v |= (unsigned)p[i + 1] << 8;
		if (i + 2 < len)
			v |= p[i + 2];
		s[o++] = b64_alphabet[(v >> 18) & 63];
		s[o++] = b64_alphabet[(v >> 12) & 63];
		s[o++] = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
		s[o++] = i + 2 < len ? b64_alphabet[v & 63] : '=';
	}
	s[o] = 0;
	j = json_stringn_nocheck(s, o);
	free(s);
	return j;
}

/* A table, not strchr: a 4 MiB chunk is millions of characters. */
static signed char b64_table[256];
static pthread_once_t b64_once = PTHREAD_ONCE_INIT;

static void b64_table_init(void)
{
	memset(b64_table, -1, sizeof(b64_table));
	for (int i = 0; i < 64; i++)
		b64_table[(unsigned char)b64_alphabet[i]] = (signed char)i;
}

static int b64_value(int c)
{
	return b64_table[c & 255];
}

int cb_api_b64_decode(const char *field, const char *s, void **out, size_t *len)
{
	size_t n = strlen(s), o = 0;
	unsigned char *buf;

	*out = NULL;
	*len = 0;
	pthread_once(&b64_once, b64_table_init);
	if (n % 4)
		return cb_error_set(EINVAL, "%s: not base64 (length %zu is not a multiple of 4)",
				    field, n);
	buf = malloc(n / 4 * 3 + 1);
	if (!buf)
		return cb_error_set(ENOMEM, "%s: out of memory", field);
	for (size_t i = 0; i < n; i += 4) {
		int v[4];

		for (int k = 0; k < 4; k++) {
			v[k] = b64_value((unsigned char)s[i + k]);
			if (v[k] < 0 && !(s[i + k] == '=' && i + 4 == n && k >= 2)) {
				free(buf);
				return cb_error_set(EINVAL, "%s: not base64 (bad character at %zu)",
						    field, i + k);
			}
		}
		buf[o++] = (unsigned char)(v[0] << 2 | v[1] >> 4);
		if (v[2] >= 0)
			buf[o++] = (unsigned char)((v[1] & 15) << 4 | v[2] >> 2);
		if (v[2] >= 0 && v[3] >= 0)
			buf[o++] = (unsigned char)((v[2] & 3) << 6 | v[3]);
	}
	*out = buf;
	*len = o;
	return 0;
}
