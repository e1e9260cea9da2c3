/* The small shared parts of the subcommands: getopt with --json/--help, the error format
 * and JSON output, so that every command behaves the same way. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cmd_common.h"
#include "cowbox/error.h"

int cli_json_errors;

/* The protocol code of the failure being reported, when a daemon's reply said it. */
static char cli_code[32];

void cli_set_code(const char *code)
{
	snprintf(cli_code, sizeof(cli_code), "%s", code ? code : "");
}

/* The bad token of a getopt error: the cluster or long option that holds it (getopt has moved
 * optind past it, or not yet when more letters follow in the same cluster). */
static const char *bad_token(int argc, char **argv)
{
	for (int k = optind - 1; k <= optind && k < argc; k++) {
		const char *a = k > 0 ? argv[k] : NULL;

		if (!a || a[0] != '-' || !a[1] || !strcmp(a, "--"))
			continue;
		if (optopt ? (a[1] != '-' && strchr(a + 1, optopt)) : a[1] == '-')
			return a;
	}
	return optind > 0 && optind - 1 < argc ? argv[optind - 1] : "";
}

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *own,
	       struct cli_common *common, const char *usage, int *status)
{
	struct option all[48];
	size_t n = 0;
	int c;

	for (; own && own[n].name && n < 44; n++)
		all[n] = own[n];
	all[n++] = (struct option){"json", no_argument, NULL, 0x1001};
	all[n++] = (struct option){"help", no_argument, NULL, 'h'};
	all[n] = (struct option){NULL, 0, NULL, 0};
	opterr = 0; /* the errors are ours: naming the token, with a short usage */
	for (;;) {
		/* Options may follow operands, unless shortopts starts with '+': then parsing
		 * stops at the first operand, so that "exec REF cmd -x" leaves -x to cmd. */
		const char *own_spec = shortopts ? shortopts : "";
		int stop = own_spec[0] == '+';
		char spec[96];

		optopt = 0;
		snprintf(spec, sizeof(spec), "%s:h%s", stop ? "+" : "", own_spec + stop);
		c = getopt_long(argc, argv, spec, all, NULL);
		if (c == 0x1001) {
			common->json = 1;
			cli_json_errors = 1;
			continue;
		}
		if (c == 'h') {
			common->help = 1;
			printf("%s", usage);
			*status = CLI_OK;
			return -1;
		}
		if (c == '?' || c == ':') {
			const char *tok = bad_token(argc, argv);

			if (c == ':')
				*status =
				    cli_usage_error(usage, "missing value for option '%s'", tok);
			else if (optopt && strlen(tok) > 2)
				*status = cli_usage_error(usage, "unknown option '-%c' in '%s'",
							  optopt, tok);
			else
				*status = cli_usage_error(usage, "unknown option '%s'", tok);
			return -1;
		}
		return c == -1 ? 0 : c;
	}
}

int cli_one_ref(int c, int argc, char **argv, const char *usage, int *status)
{
	if (c < 0)
		return -1; /* *status is cli_getopt's */
	if (optind + 1 == argc)
		return 0;
	if (optind == argc)
		*status = cli_usage_error(usage, "missing the workspace (a ref or name)");
	else
		*status =
		    cli_usage_error(usage, "one workspace only: unexpected '%s'", argv[optind + 1]);
	return -1;
}

/* The protocol's codes, with the exit status each is reported with. */
static const struct {
	const char *code;
	int status;
} code_status[] = {
    {"not_found", CLI_NOT_FOUND},   {"in_use", CLI_CONFLICT}, {"conflict", CLI_CONFLICT},
    {"access_denied", CLI_REFUSED}, {"io_error", CLI_IO},     {"invalid_path", CLI_FAIL},
    {"invalid_request", CLI_FAIL},  {"timeout", CLI_FAIL},    {"output_limit", CLI_FAIL},
    {"unavailable", CLI_FAIL},	    {"usage", CLI_USAGE},     {"failed", CLI_FAIL},
};

static int code_known(const char *code, size_t len)
{
	for (size_t i = 0; i < sizeof(code_status) / sizeof(code_status[0]); i++)
		if (strlen(code_status[i].code) == len && !strncmp(code, code_status[i].code, len))
			return (int)i;
	return -1;
}

/* The code an errno is reported as. */
static const char *errno_code(int err)
{
	switch (err < 0 ? -err : err) {
	case ENOENT:
	case ESRCH:
		return "not_found";
	case EEXIST:
		return "conflict";
	case EBUSY:
	case EAGAIN:
	case ETXTBSY:
		return "in_use";
	case EACCES:
	case EPERM:
		return "access_denied";
	case EIO:
	case ENOSPC:
	case EDQUOT:
	case EROFS:
		return "io_error";
	case EINVAL:
		return "invalid_request";
	default:
		return "failed";
	}
}

/* Drop "PREFIX: " from the start of *msg when PREFIX is the command's or the op's own name, or
 * a protocol code (the client writes "op: code: message", a daemon "op: message"): the line
 * says the command once. Sets *code to a protocol code found there. */
static const char *clean_message(const char *cmd, const char *msg, const char **code)
{
	for (int round = 0; round < 3; round++) {
		const char *colon = strstr(msg, ": ");
		size_t len = colon ? (size_t)(colon - msg) : 0;
		int k;

		if (!colon || !len || memchr(msg, ' ', len))
			break;
		if ((k = code_known(msg, len)) >= 0) {
			*code = code_status[k].code;
			msg = colon + 2;
			continue;
		}
		/* "op: code: ..." as the client reports a reply; or the command's own name */
		if ((len == strlen(cmd) && !strncmp(msg, cmd, len)) ||
		    (strstr(colon + 2, ": ") &&
		     code_known(colon + 2, (size_t)(strstr(colon + 2, ": ") - colon - 2)) >= 0)) {
			msg = colon + 2;
			continue;
		}
		break;
	}
	return msg;
}

/* Under --json, the failure's JSON object ({"error": {"code", "message"}}) on stdout,
 * flushed. */
static void json_error_print(const char *code, const char *msg)
{
	json_t *j;
	char *text;

	if (!cli_json_errors)
		return;
	j = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", msg);
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (text)
		puts(text);
	fflush(stdout);
	free(text);
	json_decref(j);
}

/* Say the failure: a line on stderr, and the JSON object on stdout under --json. */
static int report(const char *cmd, const char *code, const char *msg)
{
	int k = code_known(code, strlen(code));

	cli_phase_done();
	fprintf(stderr, "cowbox %s: %s\n", cmd, msg);
	json_error_print(code, msg);
	cli_code[0] = 0;
	return k >= 0 ? code_status[k].status : CLI_FAIL;
}

int cli_fail_rc(const char *cmd, int rc)
{
	const char *code = cli_code[0] ? cli_code : errno_code(rc);
	const char *msg = clean_message(cmd, cb_error_message(), &code);

	if (!*msg)
		msg = strerror(rc < 0 ? -rc : rc ? rc : EIO);
	return report(cmd, code, msg);
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
	char msg[2048];
	const char *code = cli_code[0] ? cli_code : "failed";
	va_list ap;

	if (!fmt)
		return report(cmd, code, clean_message(cmd, cb_error_message(), &code));
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return report(cmd, code, clean_message(cmd, msg, &code));
}

int cli_usage_error(const char *usage, const char *fmt, ...)
{
	const char *name = usage, *line_end = strchr(usage, '\n');
	char cmd[64] = "", msg[2048];
	va_list ap;
	size_t n;

	/* usage opens "usage: cowbox CMD ...": the command's name is its third word */
	if (!strncmp(name, "usage: cowbox ", 14)) {
		name += 14;
		n = strcspn(name, " \n");
		snprintf(cmd, sizeof(cmd), "%.*s", (int)(n < sizeof(cmd) ? n : sizeof(cmd) - 1),
			 name);
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cli_phase_done();
	fprintf(stderr, "cowbox%s%s: %s\n", *cmd ? " " : "", cmd, msg);
	n = line_end ? (size_t)(line_end - usage) : strlen(usage);
	/* the synopsis's first line; "..." when it goes on (create's takes several) */
	fprintf(stderr, "%.*s%s\n", (int)n, usage,
		line_end && (line_end[1] == ' ' || line_end[1] == '\t') ? " ..." : "");
	fprintf(stderr, "see `cowbox%s%s --help`\n", *cmd ? " " : "", cmd);
	json_error_print("usage", msg);
	return CLI_USAGE;
}

/* name escaped into the ring, in double quotes when quotes. */
static const char *quote(const char *name, int quotes)
{
	static char *ring[8];
	static size_t slot;
	size_t len = strlen(name), need = 0;
	char *out, *o;

	if (!quotes || !len ||
	    !(name[0] == ' ' || name[0] == '\t' || name[len - 1] == ' ' || name[len - 1] == '\t')) {
		const unsigned char *p = (const unsigned char *)name;

		while (*p && *p >= 0x20 && *p != 0x7f && ((*p != '\\' && *p != '"') || !quotes))
			p++;
		if (!*p)
			return name;
	}
	need = 4 * len + 3;
	slot = (slot + 1) % 8;
	if (!(out = realloc(ring[slot], need)))
		return "?";
	ring[slot] = o = out;
	if (quotes)
		*o++ = '"';
	for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
		static const char from[] = "\a\b\t\n\v\f\r\"\\", to[] = "abtnvfr\"\\";
		const char *e = *p ? memchr(from, *p, sizeof(from) - 1) : NULL;

		if (e)
			e = &to[e - from];
		if (e && (quotes || *p < 0x20)) {
			*o++ = '\\';
			*o++ = *e;
		} else if (*p < 0x20 || *p == 0x7f) {
			o += sprintf(o, "\\%03o", *p);
		} else {
			*o++ = (char)*p;
		}
	}
	if (quotes)
		*o++ = '"';
	*o = 0;
	return out;
}

const char *cli_q(const char *name)
{
	return quote(name, 1);
}

const char *cli_q_text(const char *text)
{
	return quote(text, 0);
}

int cli_print_json(json_t *value)
{
	char *text = json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY);

	json_decref(value);
	if (!text)
		return cli_fail("json", "out of memory");
	puts(text);
	free(text);
	return CLI_OK;
}

int cli_print_reply_json(json_t *reply)
{
	json_object_del(reply, "id");
	json_object_del(reply, "ok");
	return cli_print_json(reply);
}

int cli_parse_mib(const char *s, long long *mib)
{
	unsigned long long n;
	char *end;

	errno = 0;
	n = strtoull(s, &end, 10);
	if (!*s || *s == '-' || errno || end == s)
		goto bad;
	switch (*end ? *end | 0x20 : 'm') {
	case 'k':
		n = (n + 1023) / 1024;
		break;
	case 'm':
		break;
	case 'g':
		n = n > (1ULL << 40) ? 0 : n * 1024;
		break;
	case 't':
		n = n > (1ULL << 30) ? 0 : n * 1024 * 1024;
		break;
	default:
		goto bad;
	}
	/* one letter, optionally "b" or "ib" after it (512mb, 2GiB) */
	if (*end && end[1] && strcasecmp(end + 1, "b") && strcasecmp(end + 1, "ib"))
		goto bad;
	if (n > (1ULL << 40) || (!n && strtoull(s, NULL, 10)))
		goto bad;
	*mib = (long long)n;
	return 0;
bad:
	return cb_error_set(EINVAL, "a size in MiB or with a unit (512m, 2g) is expected, not '%s'",
			    s);
}

int cli_env_arg(const char *arg, char **out)
{
	const char *eq = strchr(arg, '='), *v;

	*out = NULL;
	if (!*arg || eq == arg)
		return cb_error_set(EINVAL, "--env needs K=V or a name, not '%s'", arg);
	if (eq) {
		*out = strdup(arg);
	} else {
		if (!(v = getenv(arg)))
			return cb_error_set(EINVAL, "--env %s: %s is not set here", arg, arg);
		if (asprintf(out, "%s=%s", arg, v) < 0)
			*out = NULL;
	}
	return *out ? 0 : cb_error_set(ENOMEM, "out of memory");
}

/* Whether a phase line is on the terminal now. */
static int phase_shown;

void cli_phase(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	if (!isatty(STDERR_FILENO))
		return;
	fprintf(stderr, "\r\033[Kcowbox %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("...", stderr);
	fflush(stderr);
	phase_shown = 1;
}

void cli_phase_done(void)
{
	if (!phase_shown)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
	phase_shown = 0;
}

const char *cli_size(long long bytes, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%lld B", bytes);
	else
		snprintf(buf, size, "%.1f %s", v, units[u]);
	return buf;
}
