/* Environments for commands: the host's environment without credentials, for the local
 * backend (the ns backend builds its environment from scratch). One table says what goes. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"

extern char **environ;

/* What the local backend strips from the host's environment; docs/security.md ("The local
 * backend") and the man page list the same. Names are compared case-insensitively. */
enum strip_rule {
	STRIP_NAME,	 /* the whole name */
	STRIP_PREFIX,	 /* names that start with it */
	STRIP_PART,	 /* names that contain it anywhere */
	STRIP_WORD_AUTH, /* a _-separated part that starts or ends with AUTH, but not AUTHOR */
	STRIP_URL_CREDS, /* *_URL, *_URI, *_DSN names with password= in the value (any name
			    whose value is a URL with user:password@ goes too) */
};

static const struct {
	enum strip_rule rule;
	const char *text;
} strip_table[] = {
    /* model providers and clouds: their keys, whatever each is called */
    {STRIP_PREFIX, "ANTHROPIC_"},
    {STRIP_PREFIX, "OPENAI_"},
    {STRIP_PREFIX, "LITELLM_"},
    {STRIP_PREFIX, "AZURE_"},
    {STRIP_PREFIX, "AWS_"},
    {STRIP_PREFIX, "GEMINI_"},
    {STRIP_PREFIX, "CODEX_"},
    {STRIP_PREFIX, "CURSOR_"},
    {STRIP_PREFIX, "VAULT_"},
    {STRIP_NAME, "GOOGLE_API_KEY"},
    /* secrets by what their names say */
    {STRIP_PART, "TOKEN"},
    {STRIP_PART, "SECRET"},
    {STRIP_PART, "PASSWORD"},
    {STRIP_PART, "PASSWD"},
    {STRIP_PART, "API_KEY"},
    {STRIP_PART, "APIKEY"},
    {STRIP_PART, "ACCESS_KEY"},
    {STRIP_PART, "PRIVATE_KEY"},
    {STRIP_PART, "CREDENTIAL"},
    {STRIP_PART, "SESSION_KEY"},
    {STRIP_WORD_AUTH, "AUTH"},
    /* credential files, agent sockets and connection strings */
    {STRIP_NAME, "SSH_AUTH_SOCK"},
    {STRIP_NAME, "GPG_AGENT_INFO"},
    {STRIP_NAME, "GOOGLE_APPLICATION_CREDENTIALS"},
    {STRIP_NAME, "KUBECONFIG"},
    {STRIP_NAME, "DOCKER_AUTH_CONFIG"},
    {STRIP_NAME, "NPM_TOKEN"},
    {STRIP_NAME, "HF_TOKEN"},
    {STRIP_NAME, "GITHUB_TOKEN"},
    {STRIP_NAME, "GH_TOKEN"},
    {STRIP_NAME, "DATABASE_URL"},
    {STRIP_NAME, "REDIS_URL"},
    {STRIP_URL_CREDS, NULL},
};

/* Does name (of len bytes) contain part, ignoring case? */
static int name_has(const char *name, size_t len, const char *part)
{
	size_t n = strlen(part);

	for (size_t i = 0; i + n <= len; i++)
		if (!strncasecmp(name + i, part, n))
			return 1;
	return 0;
}

/* AUTH as a word: SSH_AUTH_SOCK, OAUTH_X, X_AUTHORIZATION, BASICAUTH; not GIT_AUTHOR_NAME. */
static int name_has_auth_word(const char *name, size_t len)
{
	for (size_t i = 0; i < len;) {
		size_t w = i;

		while (w < len && name[w] != '_')
			w++;
		size_t wl = w - i;
		const char *word = name + i;
		int starts = wl >= 4 && !strncasecmp(word, "AUTH", 4);
		int author = wl >= 6 && !strncasecmp(word, "AUTHOR", 6) &&
			     (wl == 6 || (wl == 7 && (word[6] | 0x20) == 's'));

		if ((starts && !author) || (wl >= 4 && !strncasecmp(word + wl - 4, "AUTH", 4)))
			return 1;
		i = w + 1;
	}
	return 0;
}

/* scheme://user:password@host: the authority part (up to / ? #) holds ':' before '@'. */
static int value_has_url_userinfo(const char *value)
{
	for (const char *p = strstr(value, "://"); p; p = strstr(p + 1, "://")) {
		const char *auth = p + 3;
		size_t alen = strcspn(auth, "/?#");
		const char *at = memchr(auth, '@', alen);

		if (at && memchr(auth, ':', (size_t)(at - auth)))
			return 1;
	}
	return 0;
}

static int url_name(const char *name, size_t len)
{
	static const char *const ends[] = {"_URL", "_URI", "_DSN", "_URLS"};

	for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
		size_t n = strlen(ends[i]);

		if (len >= n && !strncasecmp(name + len - n, ends[i], n))
			return 1;
	}
	return 0;
}

int cb_exec_env_is_credential(const char *entry)
{
	size_t len = strcspn(entry, "=");
	const char *value = entry[len] ? entry + len + 1 : "";

	for (size_t i = 0; i < sizeof strip_table / sizeof *strip_table; i++) {
		const char *t = strip_table[i].text;

		switch (strip_table[i].rule) {
		case STRIP_NAME:
			if (len == strlen(t) && !strncasecmp(entry, t, len))
				return 1;
			break;
		case STRIP_PREFIX:
			if (len >= strlen(t) && !strncasecmp(entry, t, strlen(t)))
				return 1;
			break;
		case STRIP_PART:
			if (name_has(entry, len, t))
				return 1;
			break;
		case STRIP_WORD_AUTH:
			if (name_has_auth_word(entry, len))
				return 1;
			break;
		case STRIP_URL_CREDS:
			if (url_name(entry, len) && strcasestr(value, "password="))
				return 1;
			break;
		}
	}
	/* A password in a URL is one whatever the variable is called. */
	return value_has_url_userinfo(value);
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
