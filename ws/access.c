/* Access levels: their names, and the widest level a workspace serves, kept as one word in
 * the file "access" of its directory (absent: full). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/access.h"
#include "cowbox/workspace.h"
#include "cowbox/error.h"
#include "util/smallfile.h"

static const char *const access_names[] = {"none", "files", "full"};

/* See cowbox/access.h. */
int cb_access_parse(const char *name)
{
	for (int i = CB_ACCESS_NONE; i <= CB_ACCESS_FULL; i++)
		if (name && !strcmp(name, access_names[i]))
			return i;
	return cb_error_set(EINVAL, "access '%s': expected none, files or full",
			    name ? name : "(null)");
}

/* See cowbox/access.h. */
const char *cb_access_name(int level)
{
	return level >= CB_ACCESS_NONE && level < CB_ACCESS_FULL ? access_names[level] : "full";
}

/* See cowbox/access.h. */
int cb_ws_access_load(const char *dir)
{
	char buf[16];
	int rc = cb_smallfile_read(dir, "access", buf, sizeof(buf));

	if (rc < 0)
		return rc == -ENOENT ? CB_ACCESS_FULL : rc;
	buf[strcspn(buf, "\n")] = '\0';
	rc = cb_access_parse(buf);
	return rc < 0 ? cb_error_wrap(rc, "%s/access", dir) : rc;
}

/* See cowbox/access.h. */
int cb_ws_access_save(const char *dir, int level)
{
	char text[16];

	snprintf(text, sizeof(text), "%s\n", cb_access_name(level));
	return cb_smallfile_write(dir, "access", text, 0600);
}
