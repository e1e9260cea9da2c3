/* The small shared parts of the subcommands: getopt with --json/--help, the error format
 * and JSON output, so that every command behaves the same way. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "cowbox/error.h"

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *own,
	       struct cli_common *common, const char *usage, int *status)
{
	struct option all[32];
	size_t n = 0;
	int c;

	for (; own && own[n].name && n < 28; n++)
		all[n] = own[n];
	all[n++] = (struct option){"json", no_argument, NULL, 0x1001};
	all[n++] = (struct option){"help", no_argument, NULL, 'h'};
	all[n] = (struct option){NULL, 0, NULL, 0};
	for (;;) {
		/* Options may follow operands, unless shortopts starts with '+': then parsing
		 * stops at the first operand, so that "exec REF cmd -x" leaves -x to cmd. */
		const char *own_spec = shortopts ? shortopts : "";
		int stop = own_spec[0] == '+';
		char spec[64];

		snprintf(spec, sizeof(spec), "%s:h%s", stop ? "+" : "", own_spec + stop);
		c = getopt_long(argc, argv, spec, all, NULL);
		if (c == 0x1001) {
			common->json = 1;
			continue;
		}
		if (c == 'h') {
			common->help = 1;
			printf("%s", usage);
			*status = CLI_OK;
			return -1;
		}
		if (c == '?' || c == ':') {
			fprintf(stderr, "cowbox %s: %s option '%s'\n", argv[0],
				c == '?' ? "unknown" : "missing value for",
				argv[optind - 1] ? argv[optind - 1] : "");
			fprintf(stderr, "%s", usage);
			*status = CLI_USAGE;
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
	*status = cli_usage_error(usage, "%s takes one workspace ref or name", argv[0]);
	return -1;
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;

	if (!fmt) {
		fprintf(stderr, "cowbox %s: %s\n", cmd, cb_error_message());
		return CLI_FAIL;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "cowbox %s: %s\n", cmd, msg);
	return CLI_FAIL;
}

int cli_usage_error(const char *usage, const char *fmt, ...)
{
	va_list ap;

	fputs("cowbox: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n%s", usage);
	return CLI_USAGE;
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
