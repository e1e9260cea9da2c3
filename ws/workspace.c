/* Workspaces on disk: $COWBOX_HOME, refs and names, creating and resolving. Anything that
 * cowbox did not create is refused here, before any caller acts on it. */
#include "config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/workspace.h"
#include "ws.h"

int ws_pathf(char **out, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vasprintf(out, fmt, ap);
	va_end(ap);
	if (n < 0) {
		*out = NULL;
		return cb_error_set(ENOMEM, "out of memory");
	}
	return 0;
}

int cb_ws_home(char **out)
{
	const char *env = getenv("COWBOX_HOME");
	const char *xdg = getenv("XDG_DATA_HOME");
	const char *home = getenv("HOME");

	*out = NULL;
	if (env && *env) {
		if (env[0] != '/')
			return cb_error_set(EINVAL,
					    "COWBOX_HOME must be an absolute path, not '%s'", env);
		return ws_pathf(out, "%s", env);
	}
	if (geteuid() == 0)
		return ws_pathf(out, "/var/lib/cowbox");
	if (xdg && xdg[0] == '/')
		return ws_pathf(out, "%s/cowbox", xdg);
	if (!home || home[0] != '/') {
		struct passwd *pw = getpwuid(geteuid());

		home = pw ? pw->pw_dir : NULL;
	}
	if (!home)
		return cb_error_set(ENOENT, "no home directory to keep workspaces in; set "
					    "COWBOX_HOME");
	return ws_pathf(out, "%s/.local/share/cowbox", home);
}

int cb_ws_ref_syntax(const char *s)
{
	if (!s || strncmp(s, "cb-", 3) || strlen(s) != CB_WS_REF_LEN)
		return 0;
	for (const char *p = s + 3; *p; p++)
		if (!isdigit((unsigned char)*p) && !(*p >= 'a' && *p <= 'f'))
			return 0;
	return 1;
}

int cb_ws_name_check(const char *name)
{
	size_t len = name ? strlen(name) : 0;

	if (len == 0 || len > 64)
		return cb_error_set(EINVAL,
				    "bad workspace name '%s': it must be 1 to 64 characters",
				    name ? name : "");
	if (!isalnum((unsigned char)name[0]))
		return cb_error_set(
		    EINVAL, "bad workspace name '%s': it must start with a letter or digit", name);
	for (const char *p = name; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("._-", *p))
			return cb_error_set(
			    EINVAL,
			    "bad workspace name '%s': only letters, digits, '.', '_' "
			    "and '-' are allowed",
			    name);
	if (!strncmp(name, "cb-", 3))
		return cb_error_set(
		    EINVAL,
		    "bad workspace name '%s': names may not start with 'cb-', which "
		    "is how refs look",
		    name);
	return 0;
}

int cb_ws_path(const char *ref, const char *leaf, char **out)
{
	char *home = NULL;
	int rc = cb_ws_home(&home);

	if (rc)
		return rc;
	rc = leaf ? ws_pathf(out, "%s/workspaces/%s/%s", home, ref, leaf)
		  : ws_pathf(out, "%s/workspaces/%s", home, ref);
	free(home);
	return rc;
}

/* mkdir that accepts an existing directory, for the shared parts of the home. */
static int ws_mkdir(const char *path, mode_t mode)
{
	if (mkdir(path, mode) == 0 || errno == EEXIST)
		return 0;
	return cb_error_set(errno, "mkdir %s: %s", path, strerror(errno));
}

int ws_mkdir_home(const char *home)
{
	char *p = NULL;
	int rc;

	rc = ws_pathf(&p, "%s", home);
	/* mkdir -p of the home itself, so COWBOX_HOME may name a directory not yet made. */
	for (char *s = p ? p + 1 : NULL; !rc && s && (s = strchr(s, '/')); s++) {
		*s = '\0';
		rc = ws_mkdir(p, 0755);
		*s = '/';
	}
	if (!rc)
		rc = ws_mkdir(p, 0755);
	free(p);
	if (!rc && !(rc = ws_pathf(&p, "%s/workspaces", home))) {
		rc = ws_mkdir(p, 0700);
		free(p);
	}
	if (!rc && !(rc = ws_pathf(&p, "%s/names", home))) {
		rc = ws_mkdir(p, 0700);
		free(p);
	}
	return rc;
}

static int ws_new_ref(char ref[CB_WS_REF_LEN + 1])
{
	unsigned char raw[16];

	if (getrandom(raw, sizeof(raw), 0) != sizeof(raw))
		return cb_error_set(errno ? errno : EIO, "getrandom: %s", strerror(errno));
	memcpy(ref, "cb-", 3);
	for (int i = 0; i < 16; i++)
		snprintf(ref + 3 + 2 * i, 3, "%02x", raw[i]);
	return 0;
}

/* The current message with "workspace <ref>: " in front and each command's REF placeholder
 * (as in 'cowbox fsck REF --repair', written by layers that do not know the ref) filled in,
 * so the advice can be pasted as it is. */
static int ws_error_ref(int rc, const char *ref)
{
	const char *msg = cb_error_message(), *p;
	char out[2048];
	size_t n = 0;

	for (p = msg; *p && n + CB_WS_REF_LEN + 2 < sizeof(out); p++) {
		if (!strncmp(p, " REF", 4) && (p[4] == ' ' || p[4] == '\'' || p[4] == '\0')) {
			n += (size_t)snprintf(out + n, sizeof(out) - n, " %s", ref);
			p += 3;
		} else {
			out[n++] = *p;
		}
	}
	out[n] = '\0';
	if (!strncmp(out, "workspace ", 10))
		return cb_error_set(-rc, "%s", out);
	return cb_error_set(-rc, "workspace %s: %s", ref, out);
}

/* Who holds a name: the ref its link points at, or -ENOENT. */
int ws_name_lookup(const char *home, const char *name, char ref[CB_WS_REF_LEN + 1])
{
	char *link = NULL, target[64];
	ssize_t n;
	int rc = ws_pathf(&link, "%s/names/%s", home, name);

	if (rc)
		return rc;
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0) {
		rc = errno == ENOENT ? cb_error_set(ENOENT, "no workspace named '%s'", name)
				     : cb_error_set(errno, "read %s: %s", link, strerror(errno));
	} else {
		target[n] = '\0';
		if (!cb_ws_ref_syntax(target))
			rc = cb_error_set(EINVAL, "name link %s points at '%s', not a ref", link,
					  target);
		else
			memcpy(ref, target, CB_WS_REF_LEN + 1);
	}
	free(link);
	return rc;
}

/* Steps after the ref directory exists; the caller deletes it again on failure. In place,
 * base is the user's folder, recorded as turn 0 before the creation mark. */
static int ws_fill(const char *dir, const char *base, const char *name, int in_place, int synced)
{
	struct cb_db *db = NULL;
	char *p = NULL;
	int rc;

	if ((rc = ws_pathf(&p, "%s/upper", dir)) || (rc = ws_mkdir(p, 0755)))
		goto out;
	free(p);
	if ((rc = ws_pathf(&p, "%s/mnt", dir)) || (rc = ws_mkdir(p, 0755)))
		goto out;
	free(p);
	/* A copy of the base's path beside meta.db: fsck --repair needs it to rebuild a
	 * database that was lost. */
	if (base) {
		FILE *f;

		if ((rc = ws_pathf(&p, "%s/base.path", dir)))
			goto out;
		f = fopen(p, "we");
		if (!f || fprintf(f, "%s\n", base) < 0 || fclose(f) != 0) {
			rc = cb_error_set(errno ? errno : EIO, "write %s: %s", p, strerror(errno));
			goto out;
		}
		free(p);
		p = NULL;
	}
	if ((rc = ws_pathf(&p, "%s/meta.db", dir)) ||
	    (rc = synced ? cb_db_open(p, &db) : cb_db_open_unsynced(p, &db)))
		goto out;
	if (base && (rc = cb_db_meta_set(db, "base", base)))
		goto out;
	if (name && (rc = cb_db_meta_set(db, "name", name)))
		goto out;
	if (in_place &&
	    ((rc = ws_in_place_mark(dir)) || (rc = cb_db_meta_set(db, "in_place", "1")) ||
	     (rc = ws_in_place_record(dir, base))))
		goto out;
	/* Written last: a workspace without it is an interrupted creation. */
	rc = cb_db_meta_set(db, "created", "1");
out:
	free(p);
	cb_db_close(db);
	return rc;
}

/* The first steps of every creation: a usable name not taken yet, and $COWBOX_HOME (*home,
 * the caller frees it, also on failure). 0 or -errno with a message. */
static int ws_create_begin(const char *name, char **home)
{
	char other[CB_WS_REF_LEN + 1];
	int rc;

	if (name && (rc = cb_ws_name_check(name)))
		return rc;
	if ((rc = cb_ws_home(home)))
		return rc;
	cb_ws_clean_unpublished();
	if (name && ws_name_lookup(*home, name, other) == 0)
		return cb_error_set(EEXIST, "the name '%s' is already used by %s", name, other);
	return 0;
}

static int ws_create(const char *base, const char *name, int in_place, FILE *log,
		     char ref[CB_WS_REF_LEN + 1])
{
	char *home = NULL, *dir = NULL, *link = NULL, *base_abs = NULL;
	struct stat st;
	int rc;

	ref[0] = '\0';
	if ((rc = ws_create_begin(name, &home)))
		goto out;
	if (in_place && !base) {
		rc = cb_error_set(EINVAL, "in place: which folder?");
		goto out;
	}
	if (base) {
		base_abs = realpath(base, NULL);
		if (!base_abs) {
			rc = cb_error_set(errno, "base %s: %s", base, strerror(errno));
			goto out;
		}
		if (stat(base_abs, &st) < 0 || !S_ISDIR(st.st_mode)) {
			rc = cb_error_set(ENOTDIR, "base %s: not a directory", base);
			goto out;
		}
	}
	if (in_place && (rc = ws_in_place_check(base_abs, home)))
		goto out;
	if ((rc = ws_mkdir_home(home)) || (rc = ws_new_ref(ref)))
		goto out;
	if ((rc = ws_pathf(&dir, "%s/workspaces/%s", home, ref)))
		goto out;
	if (mkdir(dir, 0700) < 0) {
		rc = cb_error_set(errno, "mkdir %s: %s", dir, strerror(errno));
		goto out;
	}
	if (log) {
		fprintf(log, "cowbox: creating workspace %s in %s\n", ref, dir);
		fflush(log);
	}
	if (log && in_place) {
		fprintf(log, "cowbox: recording %s as turn 0 (hashed, and kept as blobs)\n",
			base_abs);
		fflush(log);
	}
	rc = ws_fill(dir, base_abs, name, in_place, 1);
	if (!rc && name) {
		/* The link claims the name atomically: of two racing creates one gets EEXIST. */
		if ((rc = ws_pathf(&link, "%s/names/%s", home, name)))
			goto undo;
		if (symlink(ref, link) < 0) {
			rc = errno == EEXIST
				 ? cb_error_set(EEXIST, "the name '%s' is already in use", name)
				 : cb_error_set(errno, "symlink %s: %s", link, strerror(errno));
			goto undo;
		}
	}
	if (!rc)
		goto out;
undo:
	ws_delete_tree(dir);
	ref[0] = '\0';
out:
	free(link);
	free(dir);
	free(base_abs);
	free(home);
	return rc;
}

int cb_ws_create(const char *base, const char *name, FILE *log, char ref[CB_WS_REF_LEN + 1])
{
	return ws_create(base, name, 0, log, ref);
}

int cb_ws_create_in_place(const char *folder, const char *name, FILE *log,
			  char ref[CB_WS_REF_LEN + 1])
{
	return ws_create(folder, name, 1, log, ref);
}

#define WS_UNPUBLISHED ".unpublished-"

int cb_ws_create_unpublished(const char *base, const char *name, char ref[CB_WS_REF_LEN + 1],
			     char **dir)
{
	char *home = NULL, *base_abs = NULL;
	int rc;

	ref[0] = '\0';
	*dir = NULL;
	if ((rc = ws_create_begin(name, &home)))
		goto out;
	if (base && !(base_abs = realpath(base, NULL))) {
		rc = cb_error_set(errno, "base %s: %s", base, strerror(errno));
		goto out;
	}
	if ((rc = ws_mkdir_home(home)) || (rc = ws_new_ref(ref)))
		goto out;
	/* Not a ref: nothing lists, resolves or mounts it. The pid says whose it is. */
	if ((rc = ws_pathf(dir, "%s/workspaces/" WS_UNPUBLISHED "%d-%s", home, (int)getpid(), ref)))
		goto out;
	if (mkdir(*dir, 0700) < 0) {
		rc = cb_error_set(errno, "mkdir %s: %s", *dir, strerror(errno));
		goto out;
	}
	/* The name goes into meta.db when the link exists (cb_ws_publish), so that a workspace
	 * is never shown under a name that does not resolve to it. */
	if ((rc = ws_fill(*dir, base_abs, NULL, 0, 0)))
		ws_delete_tree(*dir);
out:
	if (rc) {
		free(*dir);
		*dir = NULL;
		ref[0] = '\0';
	}
	free(base_abs);
	free(home);
	return rc;
}

int cb_ws_publish(const char *ref, const char *dir, const char *name)
{
	char *target = NULL, *link = NULL, *home = NULL;
	struct cb_db *db = NULL;
	int rc;

	if ((rc = cb_ws_home(&home)) || (rc = ws_pathf(&target, "%s/workspaces/%s", home, ref)))
		goto out;
	if (rename(dir, target) < 0) {
		rc = cb_error_set(errno, "publish %s: %s", target, strerror(errno));
		ws_delete_tree(dir);
		goto out;
	}
	if (!name)
		goto out;
	/* The link claims the name atomically: of two racing creates one gets EEXIST. */
	if ((rc = ws_pathf(&link, "%s/names/%s", home, name)))
		goto out;
	if (symlink(ref, link) < 0) {
		rc = errno == EEXIST ? cb_error_set(EEXIST, "the name '%s' is already in use", name)
				     : cb_error_set(errno, "symlink %s: %s", link, strerror(errno));
		ws_delete_tree(target);
		goto out;
	}
	free(target);
	if (!(rc = ws_pathf(&target, "%s/workspaces/%s/meta.db", home, ref)) &&
	    !(rc = cb_db_open(target, &db)))
		rc = cb_db_meta_set(db, "name", name);
	cb_db_close(db);
out:
	free(link);
	free(target);
	free(home);
	return rc;
}

void cb_ws_delete_unpublished(const char *dir)
{
	ws_delete_tree(dir);
}

int cb_ws_sweep_unpublished(int (*fn)(const char *path, void *arg), void *arg)
{
	char *home = NULL, *dir = NULL, *path = NULL;
	struct dirent *de;
	int removed = 0;
	DIR *d;

	if (cb_ws_home(&home) || ws_pathf(&dir, "%s/workspaces", home))
		goto out;
	d = opendir(dir);
	while (d && (de = readdir(d))) {
		int pid;

		if (strncmp(de->d_name, WS_UNPUBLISHED, strlen(WS_UNPUBLISHED)) ||
		    sscanf(de->d_name + strlen(WS_UNPUBLISHED), "%d-", &pid) != 1 || pid <= 0 ||
		    cb_ws_pid_serving(pid))
			continue;
		if (!ws_pathf(&path, "%s/%s", dir, de->d_name)) {
			ws_delete_tree(path);
			if (access(path, F_OK) < 0 && errno == ENOENT) {
				removed++;
				if (fn)
					fn(path, arg);
			}
		}
		free(path);
		path = NULL;
	}
	if (d)
		closedir(d);
out:
	cb_error_clear();
	free(dir);
	free(home);
	return removed;
}

void cb_ws_clean_unpublished(void)
{
	cb_ws_sweep_unpublished(NULL, NULL);
}

int cb_ws_resolve(const char *arg, char ref[CB_WS_REF_LEN + 1])
{
	char *db = NULL;
	int rc = cb_ws_find(arg, ref);

	if (rc)
		return rc;
	if ((rc = cb_ws_path(ref, "meta.db", &db)))
		goto out;
	rc = ws_check_complete(db);
	if (rc)
		rc = ws_error_ref(rc, ref);
out:
	if (rc)
		ref[0] = '\0';
	free(db);
	return rc;
}

int cb_ws_find(const char *arg, char ref[CB_WS_REF_LEN + 1])
{
	char *home = NULL, *dir = NULL;
	int rc;

	ref[0] = '\0';
	if (!arg || !*arg)
		return cb_error_set(EINVAL, "no workspace given");
	if (!strncmp(arg, "cb-", 3) && !cb_ws_ref_syntax(arg))
		return cb_error_set(EINVAL,
				    "'%s' is not a cowbox ref: refs are 'cb-' and 32 lowercase hex "
				    "digits, as printed by cowbox create",
				    arg);
	if (!cb_ws_ref_syntax(arg) && cb_ws_name_check(arg))
		return cb_error_set(EINVAL, "'%s' is neither a workspace ref nor a workspace name",
				    arg);
	if ((rc = cb_ws_home(&home)))
		return rc;
	/* Every command that names a workspace: forks whose builder died go (ls, create and rm
	 * sweep too). */
	cb_ws_clean_unpublished();
	if (cb_ws_ref_syntax(arg))
		memcpy(ref, arg, CB_WS_REF_LEN + 1);
	else if ((rc = ws_name_lookup(home, arg, ref)))
		goto out;
	if ((rc = ws_pathf(&dir, "%s/workspaces/%s", home, ref)))
		goto out;
	if (access(dir, F_OK) < 0)
		rc = cb_error_set(ENOENT, "no workspace %s in %s", ref, home);
out:
	if (rc)
		ref[0] = '\0';
	free(dir);
	free(home);
	return rc;
}
