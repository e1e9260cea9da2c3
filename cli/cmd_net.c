/* The network commands: reaches (does the workspace's policy open a destination, by which
 * rule), net-log (what its egress proxy did, per turn), publish and unpublish; create's
 * --secret specs. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/client.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"

/* req (consumed) to ref's daemon, started if need be. */
static int net_request(const char *cmd, const char *ref_arg, json_t *req, json_t **reply)
{
	char ref[CB_WS_REF_LEN + 1];
	struct cb_client *c = NULL;
	int rc;

	*reply = NULL;
	if ((rc = cb_ws_resolve(ref_arg, ref)) || (rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) ||
	    (rc = cb_daemon_connect(ref, &c)))
		json_decref(req);
	else
		rc = cb_client_request(c, req, -1, reply); /* takes req */
	cb_client_close(c);
	return rc ? cli_fail_rc(cmd, rc) : CLI_OK;
}

static const char reaches_usage[] =
    "usage: cowbox reaches REF HOST[:PORT] [--json]\n"
    "Whether the workspace's network policy opens HOST:PORT (443 when no port is given) and\n"
    "by which rule. Exit status 0 when it does, 1 when it does not. Names are not resolved:\n"
    "the proxy still refuses an allowed name whose address is private.\n";

int cmd_reaches(int argc, char **argv)
{
	struct cli_common common = {0};
	json_t *reply;
	int c, status, allowed;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, reaches_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (argc - optind != 2)
		return cli_usage_error(reaches_usage, "reaches takes REF and HOST[:PORT]");
	status =
	    net_request("reaches", argv[optind],
			json_pack("{s:s, s:s}", "op", "reaches", "dest", argv[optind + 1]), &reply);
	if (status)
		return status;
	allowed = json_is_true(json_object_get(reply, "allowed"));
	if (common.json) {
		cli_print_reply_json(reply);
		return allowed ? CLI_OK : CLI_FAIL;
	}
	printf("%s: %s (%s)\n", argv[optind + 1], allowed ? "allowed" : "refused",
	       json_string_value(json_object_get(reply, "rule")));
	json_decref(reply);
	return allowed ? CLI_OK : CLI_FAIL;
}

void cli_print_net_rows(json_t *rows)
{
	json_t *r;
	size_t i;

	printf("%4s  %-19s  %-7s  %-8s  %-30s  %-15s  %5s  %9s  %9s  %s\n", "turn", "time (UTC)",
	       "proto", "verdict", "destination", "address", "port", "up", "down", "rule");
	json_array_foreach(rows, i, r)
	{
		time_t secs = (time_t)json_real_value(json_object_get(r, "time"));
		char when[32];
		struct tm tm;

		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", gmtime_r(&secs, &tm));
		printf("%4lld  %s  %-7s  %-8s  %-30s  %-15s  %5lld  %9lld  %9lld  %s%s\n",
		       (long long)json_integer_value(json_object_get(r, "turn")), when,
		       json_string_value(json_object_get(r, "proto")),
		       json_is_true(json_object_get(r, "allowed")) ? "allowed" : "refused",
		       cli_q(json_string_value(json_object_get(r, "name")) ?: ""),
		       json_string_value(json_object_get(r, "address")),
		       (long long)json_integer_value(json_object_get(r, "port")),
		       (long long)json_integer_value(json_object_get(r, "bytes_up")),
		       (long long)json_integer_value(json_object_get(r, "bytes_down")),
		       json_string_value(json_object_get(r, "rule")),
		       json_is_true(json_object_get(r, "secret")) ? " [secret]" : "");
	}
}

static const char publish_usage[] =
    "usage: cowbox publish REF [HOST_PORT:]PORT [--json]\n"
    "Make a server listening on 127.0.0.1:PORT inside the workspace's sandbox reachable from\n"
    "the host at 127.0.0.1:HOST_PORT (a free port when not given); prints that address. It\n"
    "stays open until `cowbox unpublish REF PORT` or as long as the workspace's daemon runs;\n"
    "`cowbox info` lists the open ones.\n";

static const char unpublish_usage[] = "usage: cowbox unpublish REF PORT [--json]\n"
				      "Close a port cowbox publish opened, and its connections.\n";

/* publish and unpublish: REF PORT to op. */
static int port_command(int argc, char **argv, const char *op, const char *usage)
{
	struct cli_common common = {0};
	json_t *reply, *req;
	const char *arg, *colon;
	char *end;
	long port, host_port = 0;
	int c, status;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (argc - optind != 2)
		return cli_usage_error(usage, "%s takes REF and PORT", op);
	arg = argv[optind + 1];
	/* publish's HOST_PORT:PORT, as docker's -p */
	if ((colon = strchr(arg, ':')) && !strcmp(op, "publish")) {
		host_port = strtol(arg, &end, 10);
		if (end != colon || host_port < 1 || host_port > 65535)
			return cli_usage_error(usage, "HOST_PORT is 1-65535, not '%.*s'",
					       (int)(colon - arg), arg);
		arg = colon + 1;
	}
	port = strtol(arg, &end, 10);
	if (!*arg || *end || port < 1 || port > 65535)
		return cli_usage_error(usage, "PORT is 1-65535, not '%s'", arg);
	req = json_pack("{s:s, s:i}", "op", op, "port", (int)port);
	if (host_port)
		json_object_set_new(req, "host_port", json_integer(host_port));
	status = net_request(op, argv[optind], req, &reply);
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	if (json_object_get(reply, "address"))
		printf("%s\n", json_string_value(json_object_get(reply, "address")));
	json_decref(reply);
	return CLI_OK;
}

static const char host_url_usage[] =
    "usage: cowbox host-url REF PORT [--json]\n"
    "The URL by which code inside the workspace's sandbox reaches PORT of the host's\n"
    "127.0.0.1, and only that port, under any network mode (the API's host_url): e.g.\n"
    "http://127.0.0.1:PORT (ns, local, vm), http://host.docker.internal:PORT (docker).\n";

int cmd_host_url(int argc, char **argv)
{
	struct cli_common common = {0};
	json_t *reply;
	char *end;
	long port;
	int c, status;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, host_url_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (argc - optind != 2)
		return cli_usage_error(host_url_usage, "host-url takes REF and PORT");
	port = strtol(argv[optind + 1], &end, 10);
	if (!*argv[optind + 1] || *end || port < 1 || port > 65535)
		return cli_usage_error(host_url_usage, "PORT is 1-65535, not '%s'",
				       argv[optind + 1]);
	status = net_request("host-url", argv[optind],
			     json_pack("{s:s, s:i}", "op", "host_url", "port", (int)port), &reply);
	if (status)
		return status;
	if (common.json)
		return cli_print_reply_json(reply);
	printf("%s\n", json_string_value(json_object_get(reply, "url")) ?: "");
	json_decref(reply);
	return CLI_OK;
}

int cmd_publish(int argc, char **argv)
{
	return port_command(argc, argv, "publish", publish_usage);
}

int cmd_unpublish(int argc, char **argv)
{
	return port_command(argc, argv, "unpublish", unpublish_usage);
}

static const char net_log_usage[] =
    "usage: cowbox net-log REF [--turn N] [--json]\n"
    "Every connection the workspace's egress proxy saw (oldest first): turn, time, protocol,\n"
    "destination and address, port, allowed or refused with the rule, bytes each way,\n"
    "duration, and whether a secret was injected. --turn: that turn's only.\n";

int cmd_net_log(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"turn", required_argument, NULL, 't'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	json_t *reply, *req;
	long long turn = 0;
	int c, status;

	while ((c = cli_getopt(argc, argv, "", opts, &common, net_log_usage, &status)) > 0)
		if (c == 't') {
			char *end;

			turn = strtoll(optarg, &end, 10);
			if (!*optarg || *end || turn < 1)
				return cli_usage_error(
				    net_log_usage, "--turn needs a turn number, not '%s'", optarg);
		}
	if (cli_one_ref(c, argc, argv, net_log_usage, &status))
		return status;
	req = json_pack("{s:s}", "op", "net_log");
	if (turn)
		json_object_set_new(req, "turn", json_integer(turn));
	if ((status = net_request("net-log", argv[optind], req, &reply)))
		return status;
	if (common.json) {
		status = cli_print_json(json_incref(json_object_get(reply, "rows")));
		json_decref(reply);
		return status;
	}
	cli_print_net_rows(json_object_get(reply, "rows"));
	json_decref(reply);
	return CLI_OK;
}

/* The value of an env: secret, read here (the daemon may be started later, by another
 * process, without it): kept in the workspace's secrets.json, never on the command line. */
static int secret_source(json_t *e, const char *spec, const char *kind, char *rest)
{
	char *pp = strrchr(rest, ':');

	/* a path prefix last: the source ends at the last ':' before a '/' */
	if (pp && pp[1] == '/') {
		json_object_set_new(e, "path_prefix", json_string(pp + 1));
		*pp = 0;
	}
	if (!strcmp(kind, "env")) {
		const char *v = *rest ? getenv(rest) : NULL;

		if (!v)
			return cb_error_set(EINVAL, "--secret %s: $%s is not set", spec, rest);
		json_object_set_new(e, "value", json_string(v));
	} else if (!strcmp(kind, "file")) {
		char *abs = realpath(rest, NULL);

		if (!abs)
			return cb_error_set(EINVAL, "--secret %s: %s: %s", spec, rest,
					    strerror(errno));
		json_object_set_new(e, "file", json_string(abs));
		free(abs);
	} else {
		return cb_error_set(EINVAL, "--secret %s: the value is env:VAR or file:PATH", spec);
	}
	return 0;
}

int cli_secret_json(const char *spec, const char *prefix, const char *suffix, json_t **out)
{
	char *copy = strdup(spec), *host, *header, *kind, *rest, *save = NULL;
	json_t *e = json_object();
	int rc = 0;

	*out = NULL;
	if (!copy || !e) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	host = strtok_r(copy, ":", &save);
	header = host ? strtok_r(NULL, ":", &save) : NULL;
	kind = header ? strtok_r(NULL, ":", &save) : NULL;
	rest = kind ? save : NULL;
	if (!rest || !*rest) {
		rc = cb_error_set(EINVAL,
				  "--secret %s: needs HOST:HEADER:env:VAR or "
				  "HOST:HEADER:file:PATH, then :PATH_PREFIX if any",
				  spec);
		goto out;
	}
	json_object_set_new(e, "host", json_string(host));
	json_object_set_new(e, "header", json_string(header));
	if (prefix)
		json_object_set_new(e, "prefix", json_string(prefix));
	if (suffix)
		json_object_set_new(e, "suffix", json_string(suffix));
	if ((rc = secret_source(e, spec, kind, rest)) == 0) {
		*out = e;
		e = NULL;
	}
out:
	json_decref(e);
	free(copy);
	return rc;
}
