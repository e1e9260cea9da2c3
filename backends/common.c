/* Helpers the backend tables share: where a command starts, its timeout, and waiting for a
 * runner handle when the backend has nothing of its own to clean up. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cowbox/error.h"
#include "util/beneath.h"

int cb_backend_cwd(const struct cb_backend *b, const char *cwd, int allow_abs, char **out)
{
	const char *wd = b->opt.working_dir ? b->opt.working_dir : "";
	int n;

	*out = NULL;
	/* The workspace's path rule (util/beneath): no ".." component, relative unless the
	 * backend runs the command in a root of its own; names like "build..old" are fine. */
	if (cwd && *cwd && (cwd[0] != '/' || !allow_abs) && cb_beneath_check(cwd) < 0)
		return cb_error_wrap(-EXDEV, "cwd: must stay inside the workspace");
	if (cwd && cwd[0] == '/' && allow_abs && cwd[strspn(cwd, "/")] &&
	    cb_beneath_check(cwd + strspn(cwd, "/")) < 0)
		return cb_error_wrap(-EXDEV, "cwd %s: must stay inside the workspace", cwd);
	if (cwd && cwd[0] == '/')
		n = asprintf(out, "%s", cwd);
	else if (cwd && *cwd && *wd)
		n = asprintf(out, "%s/%s", wd, cwd);
	else
		n = asprintf(out, "%s", cwd && *cwd ? cwd : wd);
	if (n < 0) {
		*out = NULL;
		return cb_error_set(ENOMEM, "cwd: out of memory");
	}
	return 0;
}

const char *cb_backend_shell_program(const struct cb_backend *b)
{
	return b->opt.shell && !strcmp(b->opt.shell, "bash") ? "bash" : NULL;
}

const char *cb_backend_user(const struct cb_backend *b, const struct cb_backend_cmd *cmd)
{
	return cmd->user ? cmd->user : b->opt.user;
}

struct cb_exec_keep *cb_backend_keep(const struct cb_backend *b, const struct cb_backend_cmd *cmd)
{
	enum cb_backend_bg bg = cmd->background ? cmd->background : b->opt.background;

	return bg == CB_BACKEND_BG_KILL ? NULL : b->keep;
}

double cb_backend_timeout(const struct cb_backend *b, const struct cb_backend_cmd *cmd)
{
	struct cb_backend_limits lim;

	if (cmd->timeout < 0)
		return 0;
	if (cmd->timeout > 0)
		return cmd->timeout;
	cb_backend_limits_of(&b->opt, &lim);
	return lim.timeout;
}

int cb_backend_wait_plain(struct cb_backend *b, struct cb_exec *h, struct cb_exec_result *res)
{
	(void)b;
	return cb_exec_wait(h, res);
}

void cb_backend_kill_plain(struct cb_backend *b, struct cb_exec *h, int sig)
{
	(void)b;
	cb_exec_kill(h, sig);
}

int cb_backend_which_result(struct cb_exec_result *res, const char *binary, const char *where,
			    char **path)
{
	int rc = 0;

	*path = NULL;
	if (res->exit_code == 0 && res->out_len && res->out[0] == '/') {
		res->out[strcspn(res->out, "\n")] = 0;
		if (!(*path = strdup(res->out)))
			rc = cb_error_set(ENOMEM, "which: out of memory");
	} else {
		rc = cb_error_set(ENOENT, "which %s: not found on the %s's PATH", binary, where);
	}
	cb_exec_result_free(res);
	return rc;
}
