/* Small helpers on turn map entries (copy, compare, names), shared by the turn store in db/
 * and the snapshot/diff/rollback code in ws/. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"

void cb_entry_clear(struct cb_entry *e)
{
	free(e->path);
	free(e->target);
	free(e->comm);
	free(e->xattrs);
	free(e->link);
	memset(e, 0, sizeof(*e));
}

static int entry_dup(char **dst, const char *src)
{
	*dst = NULL;
	if (!src)
		return 0;
	*dst = strdup(src);
	return *dst ? 0 : -ENOMEM;
}

int cb_entry_copy(struct cb_entry *dst, const struct cb_entry *src)
{
	struct cb_entry tmp = *src;
	int ret;

	tmp.path = tmp.target = tmp.comm = tmp.link = NULL;
	tmp.xattrs = NULL;
	tmp.xattrs_len = 0;
	if (src->xattrs_len) {
		if (!(tmp.xattrs = malloc(src->xattrs_len))) {
			cb_entry_clear(&tmp);
			return cb_error_set(ENOMEM, "copy entry %s: out of memory", src->path);
		}
		memcpy(tmp.xattrs, src->xattrs, src->xattrs_len);
		tmp.xattrs_len = src->xattrs_len;
	}
	ret = entry_dup(&tmp.path, src->path);
	if (!ret)
		ret = entry_dup(&tmp.target, src->target);
	if (!ret)
		ret = entry_dup(&tmp.comm, src->comm);
	if (!ret)
		ret = entry_dup(&tmp.link, src->link);
	if (ret) {
		cb_entry_clear(&tmp);
		return cb_error_set(ENOMEM, "copy entry %s: out of memory", src->path);
	}
	cb_entry_clear(dst);
	*dst = tmp;
	return 0;
}

int cb_entry_same(const struct cb_entry *a, const struct cb_entry *b)
{
	if (a->type != b->type)
		return 0;
	switch (a->type) {
	case CB_ENTRY_ABSENT:
		return 1;
	case CB_ENTRY_DIR:
		return a->mode == b->mode;
	case CB_ENTRY_SYMLINK:
		return a->target && b->target && !strcmp(a->target, b->target);
	case CB_ENTRY_FILE:
		return a->mode == b->mode && a->size == b->size &&
		       !memcmp(a->sha256, b->sha256, CB_SHA256_LEN);
	}
	return 0;
}

int cb_entry_meta_moved(const struct cb_entry *a, const struct cb_entry *b)
{
	/* b without a time recorded none of it (a base entry, an older row): nothing to say */
	if (a->type == CB_ENTRY_ABSENT || !b->has_mtime || !cb_entry_same(a, b))
		return 0;
	if (b->has_mtime && (!a->has_mtime || a->mtime_ns != b->mtime_ns))
		return 1;
	if (b->has_owner && (!a->has_owner || a->uid != b->uid || a->gid != b->gid))
		return 1;
	return a->xattrs_len != b->xattrs_len ||
	       (a->xattrs_len && memcmp(a->xattrs, b->xattrs, a->xattrs_len));
}

const char *cb_entry_type_name(enum cb_entry_type type)
{
	switch (type) {
	case CB_ENTRY_FILE:
		return "file";
	case CB_ENTRY_DIR:
		return "dir";
	case CB_ENTRY_SYMLINK:
		return "symlink";
	case CB_ENTRY_ABSENT:
		break;
	}
	return "absent";
}

void cb_hex(const unsigned char *bytes, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[bytes[i] >> 4];
		out[2 * i + 1] = digits[bytes[i] & 15];
	}
	out[2 * n] = '\0';
}
