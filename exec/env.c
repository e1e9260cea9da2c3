/* Environments for commands: the host's environment without provider credentials, for the
 * local backend (the ns backend builds its environment from scratch). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"

extern char **environ;

static const char *const credential_prefixes[] = {"ANTHROPIC_", "OPENAI_", "LITELLM_", "AZURE_",
						  "AWS_",	"GEMINI_", "CODEX_",   "CURSOR_"};

int cb_exec_env_is_credential(const char *entry)
{
	size_t name_len = strcspn(entry, "=");
	for (size_t i = 0; i < sizeof credential_prefixes / sizeof *credential_prefixes; i++)
		if (!strncmp(entry, credential_prefixes[i], strlen(credential_prefixes[i])))
			return 1;
	return name_len == strlen("GOOGLE_API_KEY") && !strncmp(entry, "GOOGLE_API_KEY", name_len);
}

int cb_exec_env_host_stripped(char ***out)
{
	size_t n = 0, k = 0;
	*out = NULL;
	while (environ && environ[n])
		n++;
	char **env = calloc(n + 1, sizeof *env);
	if (!env)
		return cb_error_set(ENOMEM, "exec: out of memory");
	for (size_t i = 0; i < n; i++) {
		if (cb_exec_env_is_credential(environ[i]))
			continue;
		if (!(env[k++] = strdup(environ[i]))) {
			cb_exec_env_free(env);
			return cb_error_set(ENOMEM, "exec: out of memory");
		}
	}
	*out = env;
	return 0;
}

void cb_exec_env_free(char **env)
{
	if (!env)
		return;
	for (char **e = env; *e; e++)
		free(*e);
	free(env);
}
