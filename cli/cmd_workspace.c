/* Workspace lifecycle commands that need no daemon: create, ls, info, rm. They print a
 * human form or, with --json, one JSON value on stdout. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/access.h"
#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "cowbox/backend.h"
#include "cowbox/client.h"
#include "cowbox/daemon.h"
#include "cowbox/image.h"
#include "cowbox/net.h"
#include "cowbox/workspace.h"

static const char create_usage[] =
    "usage: cowbox create [--base DIR | --in-place DIR] [--name NAME] [OPTIONS] [--json]\n"
    "       cowbox create --from SRC [--turn N] [--base DIR] [--name NAME] [OPTIONS]\n"
    "  --from SRC             rebuild a workspace from `cowbox export`'s image, SRC\n"
    "                         oci:DIR[:TAG] or docker://HOST/REPO:TAG (pulled with skopeo):\n"
    "                         the same turns and maps (each checked against the image's\n"
    "                         digest), the base unpacked under $COWBOX_HOME/bases, or\n"
    "                         --base DIR when DIR holds exactly the exported base\n"
    "  --turn N               (--from) import the turns up to N only\n"
    "  --backend ns|local|docker|vm  where commands run (default ns: a namespace sandbox;\n"
    "                         local: on the host, NOT isolated; docker: a container of the\n"
    "                         engine; vm: a qemu VM under its own kernel)\n"
    "  --image IMAGE          the root commands see (ns, vm) or the engine's image (docker):\n"
    "                         a directory, oci:PATH[:TAG] or a name in the local podman\n"
    "                         store (containers-storage:NAME or NAME, never pulled)\n"
    "  --env K=V | --env K    every command gets K=V (K alone: this shell's value of K)\n"
    "  --working-dir DIR      where commands start, under /workspace\n"
    "  --user NAME|UID[:GROUP] commands run as this user inside (ns, docker, vm)\n"
    "  --shell sh|bash        what runs command strings and hooks (default sh)\n"
    "  --network none|all|host|public|allow  (default none); public and allow go through\n"
    "                         the workspace's egress proxy (docs/network.md)\n"
    "  --allow ENTRY          under allow: host, host:port, *.domain, an address or a CIDR\n"
    "  --proxy-conns N        (public, allow) the egress proxy's connections open at once\n"
    "                         (default 256; past it the longest idle one is closed)\n"
    "  --secret HOST:HEADER:env:VAR|file:PATH[:PATH_PREFIX] [--secret-prefix TEXT]\n"
    "         [--secret-suffix TEXT]  (public, allow) HTTPS requests to HOST get HEADER set\n"
    "                         by the proxy; the secret never enters the sandbox\n"
    "  --volume HOST_DIR:PATH[:ro|rw]  bind a host directory in (read-only unless rw), <= 8\n"
    "  --timeout SECONDS      each command's default limit (default 600, 0: none)\n"
    "  --cpus N               CPU quota (e.g. 0.5)\n"
    "  --memory-mb SIZE       memory cap in MiB, or 512m, 2g (default 4096, 0: none);\n"
    "                         --memory is the same\n"
    "  --pids N               processes and threads (default 1024, 0: none)\n"
    "  --disk-mb SIZE         quota of the workspace's changes in MiB, or 1g (default 10240,\n"
    "                         0: none); --disk is the same. Past it writes fail with ENOSPC\n"
    "  --disk-inodes N        inodes of its changes (default 1000000, 0: none)\n"
    "  --on-create CMD        a shell command run once at create, in order (repeatable);\n"
    "                         what the hooks change is the turn labelled on_create\n"
    "  --setup-script SCRIPT  shell run once after the on-create hooks\n"
    "  --setup-timeout SECONDS  its limit (default 600)\n"
    "  --on-destroy CMD       a shell command run when the workspace is removed (repeatable)\n"
    "  --background keep|kill  jobs a command leaves running (&, nohup, setsid) run on until\n"
    "                         the workspace closes (keep, the default) or end with it\n"
    "  --privileged           (ns) commands run as the host's uid 0, no user namespace\n"
    "  --access none|files|full  the widest level it serves (default full): files allows\n"
    "                         read, write and turns but no command; none only what its\n"
    "                         owner uses (info, snapshot, diff, turns, close)\n"
    "  --idle-timeout SECONDS  a daemon the API started stops once no client held it that\n"
    "                         long (default 600, 0: never); `cowbox mount` keeps it\n"
    "Create a workspace over the read-only directory DIR (none: an empty workspace) and\n"
    "print its ref (cb- and 32 hex digits). NAME is an optional unique alias.\n"
    "--in-place DIR: the agent's edits land in DIR itself (the mount's upper layer is DIR),\n"
    "journaled as usual; DIR is recorded as turn 0 first (its files kept as blobs), so\n"
    "snapshot, diff and rollback work. rm leaves DIR as it is.\n"
    "Each option is the API's create option of the same name (docs/protocol.md, configure),\n"
    "kept in the workspace's backend.json and checked as the API checks it; an OCI image is\n"
    "unpacked now, so that a bad image fails the create. With --on-create or\n"
    "--setup-script the workspace's daemon starts now and runs them (it stops after its\n"
    "idle timeout); a failing hook fails the create, which removes the workspace.\n";

/* --allow entries one create takes (more belong in a policy file, not a command line) */
#define CREATE_MAX_ALLOW 256

/* What create's flags say: the backend options (the API's configure options, as JSON, checked
 * by cb_backend_options_from_json) and what lives beside them. */
struct create_opts {
	json_t *options;   /* the backend options given */
	json_t *secrets;   /* the --secret entries (backend option secrets), or NULL */
	int access;	   /* the widest level it serves (cowbox/access.h); -1: the default */
	long long idle;	   /* --idle-timeout in seconds; -1: the default */
	const char *image; /* --image, checked (and unpacked) before it is kept */
	int n_volumes;
};

/* Append value to the array option key of o (made on first use). */
static void opt_append(json_t *o, const char *key, json_t *value)
{
	json_t *a = json_object_get(o, key);

	if (!a) {
		a = json_array();
		json_object_set_new(o, key, a);
	}
	json_array_append_new(a, value);
}

/* --image: checked as configure checks it, and an OCI image unpacked now (the cache keeps it
 * for the workspace's daemon), so that a bad image fails the create. docker's image is the
 * engine's to find. */
static int create_image(const struct cb_backend_options *bo, const char *image)
{
	struct cb_backend_image_cap cap;
	char *root = NULL;
	int rc;

	if (bo->kind && cb_backend_find(bo->kind) && !cb_backend_find(bo->kind)->image_root)
		return 0;
	/* unpacked under the cap the workspace's options set, as its daemon would */
	cb_backend_image_cap_of(bo, &cap);
	if ((rc = cb_backend_image_root_capped(image, &cap, &root, NULL, NULL)) < 0)
		return rc;
	free(root);
	return 0;
}

/* The options kept for the workspace: checked as the options of any client are
 * (backends/options.c), saved in its backend.json; --idle-timeout in the workspace
 * directory, for its daemons (--access once the hooks ran: create_access). */
static int create_options(const char *ref, struct create_opts *co)
{
	struct cb_backend_options bo;
	char *dir = NULL;
	int rc;

	if (co->secrets)
		json_object_set(co->options, "secrets", co->secrets);
	if ((rc = cb_ws_path(ref, NULL, &dir)) < 0 ||
	    (co->idle >= 0 && (rc = cb_daemon_idle_save(dir, (double)co->idle)) < 0))
		goto out;
	if (!json_object_size(co->options))
		goto out;
	if ((rc = cb_backend_options_from_json(co->options, &bo)) < 0)
		goto out;
	if (co->image) {
		cli_phase("create", "unpacking the image %s", co->image);
		rc = create_image(&bo, co->image);
		cli_phase_done();
	}
	if (!rc)
		rc = cb_backend_options_save(dir, &bo);
	cb_backend_options_free(&bo);
out:
	free(dir);
	return rc;
}

/* --access: saved in the workspace directory; a daemon the hooks started serves it at once. */
static int create_access(const char *ref, int level)
{
	struct cb_client *c = NULL;
	char *dir = NULL;
	int rc;

	if ((rc = cb_ws_path(ref, NULL, &dir)) < 0 || (rc = cb_ws_access_save(dir, level)) < 0)
		goto out;
	if (cb_daemon_connect(ref, &c) < 0) /* no daemon: the file is all there is */
		cb_error_clear();
	else
		rc = cb_client_request(c,
				       json_pack("{s:s, s:s, s:b}", "op", "access", "level",
						 cb_access_name(level), "workspace", 1),
				       10000, NULL);
out:
	cb_client_close(c);
	free(dir);
	return rc;
}

/* Hooks and the setup script run at create, in the workspace's daemon (configure with the
 * options, as the API's create sends it): *baseline is the on_create turn. */
static int create_hooks(const char *ref, json_t *options, long long *baseline)
{
	struct cb_client *c = NULL;
	json_t *reply = NULL;
	int rc;

	if (!(rc = cb_daemon_ensure(ref, NULL, 30000, NULL)) &&
	    !(rc = cb_daemon_connect(ref, &c))) {
		/* the hooks boot the backend first (the vm's boot: its phases) */
		struct cli_phase_watch *w = cli_phase_watch_start("create", ref);

		rc = cb_client_request(
		    c, json_pack("{s:s, s:O}", "op", "configure", "options", options), -1, &reply);
		cli_phase_watch_stop(w);
	}
	if (!rc)
		*baseline = json_integer_value(json_object_get(reply, "baseline_turn"));
	json_decref(reply);
	cb_client_close(c);
	return rc;
}

/* --secret adds an entry; --secret-prefix and --secret-suffix belong to the one before. */
static int create_secret(struct create_opts *co, int c, const char *arg)
{
	json_t *e = NULL, *last;

	if (c == 'K') {
		if (!co->secrets)
			co->secrets = json_array();
		if (cli_secret_json(arg, NULL, NULL, &e) < 0)
			return cli_usage_error(create_usage, "%s", cb_error_message());
		json_array_append_new(co->secrets, e);
		return CLI_OK;
	}
	last = co->secrets ? json_array_get(co->secrets, json_array_size(co->secrets) - 1) : NULL;
	if (!last) {
		return cli_usage_error(create_usage, "%s comes after the --secret it belongs to",
				       c == 'P' ? "--secret-prefix" : "--secret-suffix");
	}
	json_object_set_new(last, c == 'P' ? "prefix" : "suffix", json_string(arg));
	return CLI_OK;
}

static int parse_count(const char *opt, const char *s, long long *out)
{
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	if (!*s || *end || errno || *out < 0)
		return cli_usage_error(create_usage, "%s needs a whole number >= 0, not '%s'", opt,
				       s);
	return 0;
}

static int parse_seconds(const char *opt, const char *s, double *out)
{
	char *end;

	errno = 0;
	*out = strtod(s, &end);
	if (!*s || *end || errno || *out < 0)
		return cli_usage_error(create_usage, "%s needs a number >= 0, not '%s'", opt, s);
	return 0;
}

/* One create flag into co: CLI_OK, or the exit status of a usage error. */
static int create_flag(struct create_opts *co, int c, const char *arg)
{
	json_t *o = co->options, *v = NULL;
	long long n;
	double d;

	switch (c) {
	case 'B':
		if (!cb_backend_find(arg))
			return cli_usage_error(create_usage, "--backend is %s, not '%s'",
					       cb_backend_kinds(), arg);
		json_object_set_new(o, "backend", json_string(arg));
		return CLI_OK;
	case 'D':
	case 'Y':
	case 'm':
		if (cli_parse_mib(arg, &n) < 0)
			return cli_usage_error(create_usage, "%s: %s",
					       c == 'm' ? "--memory-mb" : "--disk-mb",
					       cb_error_message());
		json_object_set_new(o, c == 'm' ? "memory_mb" : "disk_mb", json_integer(n));
		return CLI_OK;
	case 'I':
	case 'p':
		if (parse_count(c == 'I' ? "--disk-inodes" : "--pids", arg, &n))
			return CLI_USAGE;
		json_object_set_new(o, c == 'I' ? "disk_inodes" : "pids", json_integer(n));
		return CLI_OK;
	case 't':
	case 'C':
	case 'Z':
		if (parse_seconds(c == 't'   ? "--timeout"
				  : c == 'C' ? "--cpus"
					     : "--setup-timeout",
				  arg, &d))
			return CLI_USAGE;
		json_object_set_new(o,
				    c == 't'   ? "timeout"
				    : c == 'C' ? "cpus"
					       : "setup_timeout",
				    json_real(d));
		return CLI_OK;
	case 'U':
		if (cb_backend_user_check("--user", arg) < 0)
			return cli_usage_error(create_usage, "%s", cb_error_message());
		json_object_set_new(o, "user", json_string(arg));
		return CLI_OK;
	case 'S':
		if (strcmp(arg, "sh") && strcmp(arg, "bash"))
			return cli_usage_error(create_usage, "--shell is sh or bash, not '%s'",
					       arg);
		json_object_set_new(o, "shell", json_string(arg));
		return CLI_OK;
	case 'G': {
		enum cb_backend_bg bg;

		if (cb_backend_bg_parse("--background", arg, &bg) < 0)
			return cli_usage_error(create_usage, "%s", cb_error_message());
		json_object_set_new(o, "background", json_string(arg));
		return CLI_OK;
	}
	case 'V':
		if (co->n_volumes == CB_BACKEND_MAX_VOLUMES)
			return cli_usage_error(create_usage, "at most %d --volume",
					       CB_BACKEND_MAX_VOLUMES);
		/* checked as configure checks them: host directories resolved, COWBOX_HOME out */
		if (cb_backend_volume_spec(arg, &v) < 0)
			return cli_fail_rc("create", -EINVAL);
		opt_append(o, "volumes", v);
		co->n_volumes++;
		return CLI_OK;
	case 'M':
		co->image = arg;
		json_object_set_new(o, "image", json_string(arg));
		return CLI_OK;
	case 'N':
		json_object_set_new(o, "network", json_string(arg));
		return CLI_OK;
	case 'W':
		if (json_array_size(json_object_get(o, "allow")) == CREATE_MAX_ALLOW)
			return cli_usage_error(create_usage, "at most %d --allow",
					       CREATE_MAX_ALLOW);
		opt_append(o, "allow", json_string(arg));
		return CLI_OK;
	case 'E': {
		char *kv = NULL;

		if (cli_env_arg(arg, &kv) < 0)
			return cli_usage_error(create_usage, "%s", cb_error_message());
		json_t *env = json_object_get(o, "env");
		char *eq = strchr(kv, '=');

		if (!env)
			json_object_set_new(o, "env", env = json_object());
		*eq = 0;
		json_object_set_new(env, kv, json_string(eq + 1));
		free(kv);
		return CLI_OK;
	}
	case 'w':
		json_object_set_new(o, "working_dir", json_string(arg));
		return CLI_OK;
	case 'O':
	case 'X' + 256:
		opt_append(o, c == 'O' ? "on_create" : "on_destroy", json_string(arg));
		return CLI_OK;
	case 's':
		json_object_set_new(o, "setup_script", json_string(arg));
		return CLI_OK;
	case 'R':
		json_object_set_new(o, "privileged", json_true());
		return CLI_OK;
	case 'T':
		return parse_count("--idle-timeout", arg, &co->idle) ? CLI_USAGE : CLI_OK;
	case 'X' + 257:
		if (parse_count("--proxy-conns", arg, &n))
			return CLI_USAGE;
		json_object_set_new(o, "proxy_conns", json_integer(n));
		return CLI_OK;
	case 'A':
		if ((co->access = cb_access_parse(arg)) < 0)
			return cli_usage_error(create_usage, "--access: %s", cb_error_message());
		return CLI_OK;
	case 'K':
	case 'P':
	case 'X':
		return create_secret(co, c, arg);
	}
	return cli_usage_error(create_usage, "unknown option");
}

int cmd_create(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"base", required_argument, NULL, 'b'},
	    {"in-place", required_argument, NULL, 'i'},
	    {"name", required_argument, NULL, 'n'},
	    {"backend", required_argument, NULL, 'B'},
	    {"image", required_argument, NULL, 'M'},
	    {"env", required_argument, NULL, 'E'},
	    {"working-dir", required_argument, NULL, 'w'},
	    {"user", required_argument, NULL, 'U'},
	    {"shell", required_argument, NULL, 'S'},
	    {"network", required_argument, NULL, 'N'},
	    {"allow", required_argument, NULL, 'W'},
	    {"secret", required_argument, NULL, 'K'},
	    {"secret-prefix", required_argument, NULL, 'P'},
	    {"secret-suffix", required_argument, NULL, 'X'},
	    {"volume", required_argument, NULL, 'V'},
	    {"timeout", required_argument, NULL, 't'},
	    {"cpus", required_argument, NULL, 'C'},
	    {"memory-mb", required_argument, NULL, 'm'},
	    {"memory", required_argument, NULL, 'm'},
	    {"pids", required_argument, NULL, 'p'},
	    {"disk-mb", required_argument, NULL, 'D'},
	    {"disk", required_argument, NULL, 'Y'},
	    {"disk-inodes", required_argument, NULL, 'I'},
	    {"on-create", required_argument, NULL, 'O'},
	    {"setup-script", required_argument, NULL, 's'},
	    {"setup-timeout", required_argument, NULL, 'Z'},
	    {"on-destroy", required_argument, NULL, 'X' + 256},
	    {"background", required_argument, NULL, 'G'},
	    {"privileged", no_argument, NULL, 'R'},
	    {"access", required_argument, NULL, 'A'},
	    {"idle-timeout", required_argument, NULL, 'T'},
	    {"proxy-conns", required_argument, NULL, 'X' + 257},
	    {"from", required_argument, NULL, 'X' + 258},
	    {"turn", required_argument, NULL, 'X' + 259},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	const char *base = NULL, *name = NULL, *in_place = NULL, *from = NULL;
	long long from_turn = -1;
	char ref[CB_WS_REF_LEN + 1];
	struct create_opts co = {.access = -1, .idle = -1};
	long long baseline = -1;
	int c, status = CLI_OK, rc;

	co.options = json_object();
	while ((c = cli_getopt(argc, argv, "b:n:", opts, &common, create_usage, &status)) > 0) {
		if (c == 'b')
			base = optarg;
		else if (c == 'i')
			in_place = optarg;
		else if (c == 'n')
			name = optarg;
		else if (c == 'X' + 258)
			from = optarg;
		else if (c == 'X' + 259) {
			char *end;

			from_turn = strtoll(optarg, &end, 10);
			if (*end || from_turn < 0) {
				status =
				    cli_usage_error(create_usage, "--turn takes a turn number");
				goto out;
			}
		} else if ((status = create_flag(&co, c, optarg)) != CLI_OK)
			goto out;
	}
	if (c < 0)
		goto out;
	if (optind != argc) {
		status =
		    cli_usage_error(create_usage, "create takes no operand ('%s')", argv[optind]);
		goto out;
	}
	if (base && in_place) {
		status = cli_usage_error(create_usage, "--base and --in-place exclude each other");
		goto out;
	}
	if ((in_place && from) || (from_turn >= 0 && !from)) {
		status = cli_usage_error(create_usage, "%s",
					 from_turn >= 0 && !from
					     ? "--turn needs --from"
					     : "--from and --in-place exclude each other");
		goto out;
	}
	if (from)
		rc = cli_create_from(from, from_turn, base, name,
				     json_is_true(json_object_get(co.options, "privileged")), ref);
	else if (in_place)
		rc = cb_ws_create_in_place(in_place, name, stderr, ref);
	else
		rc = cb_ws_create(base, name, stderr, ref);
	if (rc) {
		status = cli_fail_rc("create", rc);
		goto out;
	}
	rc = create_options(ref, &co);
	if (!rc && (json_object_get(co.options, "on_create") ||
		    json_object_get(co.options, "setup_script"))) {
		cli_phase("create", "running the on-create hooks and setup script");
		rc = create_hooks(ref, co.options, &baseline);
		cli_phase_done();
	}
	/* the widest access last: configure with options (the hooks) needs full, as the API's
	 * create sets it after configure */
	if (!rc && co.access >= 0)
		rc = create_access(ref, co.access);
	if (rc < 0) {
		status = cli_fail_rc("create", rc);
		cb_daemon_stop(ref, 30000);
		cb_error_clear();
		cb_ws_remove(ref);
		goto out;
	}
	if (common.json) {
		struct cb_ws_info info;

		if ((rc = cb_ws_info(ref, &info))) {
			status = cli_fail_rc("create", rc);
			goto out;
		}
		json_t *j = json_pack("{s:s, s:s?, s:s?, s:s}", "ref", ref, "name", info.name,
				      "base", info.base, "mountpoint", info.mountpoint);

		if (baseline >= 0)
			json_object_set_new(j, "baseline_turn", json_integer(baseline));
		cb_ws_info_free(&info);
		status = cli_print_json(j);
		goto out;
	}
	printf("%s\n", ref);
out:
	json_decref(co.options);
	json_decref(co.secrets);
	return status;
}

/* network allow's entries (NULL under the other modes). */
static json_t *info_allow(const struct cb_backend_options *bo)
{
	json_t *a = bo->net == CB_BACKEND_NET_ALLOW ? json_array() : NULL;

	for (size_t k = 0; a && bo->allow && bo->allow[k]; k++)
		json_array_append_new(a, json_string(bo->allow[k]));
	return a;
}

static json_t *info_json(const struct cb_ws_info *i)
{
	return json_pack("{s:s, s:s?, s:s?, s:s, s:s, s:s, s:I, s:I, s:b}", "ref", i->ref, "name",
			 i->name, "base", i->base, "dir", i->dir ? i->dir : "", "mountpoint",
			 i->mountpoint ? i->mountpoint : "", "state", cb_ws_state_name(i->state),
			 "pid", (json_int_t)(i->daemon_pid > 0 ? i->daemon_pid : 0), "upper_bytes",
			 (json_int_t)i->upper_bytes, "in_place", i->in_place);
}

struct ls_state {
	int json;
	json_t *rows; /* always collected: the text table is sized from every row */
};

static int ls_row(const struct cb_ws_info *i, void *arg)
{
	struct ls_state *s = arg;

	return json_array_append_new(s->rows, info_json(i));
}

static const char *ls_field(json_t *row, const char *key)
{
	const char *v = json_string_value(json_object_get(row, key));

	return v && *v ? cli_q(v) : "-";
}

/* Columns as wide as their widest value, the mount point last since it is the longest. */
static void ls_print_table(json_t *rows)
{
	static const char *const keys[] = {"ref", "name", "upper", "state", "base"};
	static const char *const heads[] = {"REF", "NAME", "UPPER", "STATE", "BASE"};
	int width[5];
	char size[32];
	size_t n;
	json_t *row;

	for (int k = 0; k < 5; k++)
		width[k] = (int)strlen(heads[k]);
	json_array_foreach(rows, n, row)
	{
		json_object_set_new(
		    row, "upper",
		    json_string(cli_size(json_integer_value(json_object_get(row, "upper_bytes")),
					 size, sizeof(size))));
		for (int k = 0; k < 5; k++)
			if ((int)strlen(ls_field(row, keys[k])) > width[k])
				width[k] = (int)strlen(ls_field(row, keys[k]));
	}
	for (int k = 0; k < 5; k++)
		printf("%-*s  ", width[k], heads[k]);
	printf("MOUNTPOINT\n");
	json_array_foreach(rows, n, row)
	{
		for (int k = 0; k < 5; k++)
			printf("%-*s  ", width[k], ls_field(row, keys[k]));
		printf("%s\n", ls_field(row, "mountpoint"));
	}
}

static const char ls_usage[] =
    "usage: cowbox ls [--json]\n"
    "List workspaces: ref, name, upper size, state, base, mount point.\n";

int cmd_ls(int argc, char **argv)
{
	struct cli_common common = {0};
	struct ls_state s = {0};
	int c, status;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, ls_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (optind != argc)
		return cli_usage_error(ls_usage, "ls takes no operand ('%s')", argv[optind]);
	s.json = common.json;
	s.rows = json_array();
	if (!s.rows || cb_ws_list(ls_row, &s)) {
		json_decref(s.rows);
		return cli_fail("ls", NULL);
	}
	if (s.json)
		return cli_print_json(s.rows);
	if (json_array_size(s.rows))
		ls_print_table(s.rows);
	json_decref(s.rows);
	return CLI_OK;
}

static const char info_usage[] =
    "usage: cowbox info REF [--stats] [--json | -f FIELD]\n"
    "-f, --field FIELD: print one field of --json's object and nothing else (for scripts):\n"
    "a string as it is, e.g. `cowbox info -f mountpoint REF`; FIELD.KEY goes into an object\n"
    "(limits.memory_mb).\n"
    "Show a workspace: name, base, state, daemon pid, mount point, upper size; while it is\n"
    "mounted also its libfuse, FUSE transport (io_uring or /dev/fuse) and fast paths, and how\n"
    "far the background hash of the base got (files and bytes hashed of the total).\n"
    "--stats adds the FUSE requests served since the mount, per opcode, with the mean time\n"
    "the daemon spent on one.\n";

/* The mounted daemon's "fs" (and with stats "fs_stats") objects, or NULL when there is no
 * daemon to ask (info then shows what is on disk only). */
static json_t *info_fs_query(const char *ref, int stats)
{
	struct cb_client *c = NULL;
	json_t *reply = NULL;

	if (cb_daemon_connect(ref, &c) == 0 &&
	    cb_client_request(c, json_pack("{s:s, s:b}", "op", "info", "stats", stats), 10000,
			      &reply) == 0 &&
	    json_is_object(json_object_get(reply, "fs"))) {
		cb_client_close(c);
		return reply;
	}
	cb_error_clear();
	cb_client_close(c);
	json_decref(reply);
	return NULL;
}

static void info_fs_print(json_t *d)
{
	json_t *fs = json_object_get(d, "fs"), *st = json_object_get(d, "fs_stats"), *v;
	const char *op;
	json_t *bh = json_object_get(d, "base_hash");
	size_t k;

	json_array_foreach(json_object_get(d, "published"), k, v)
	    printf("published:   127.0.0.1:%lld -> port %lld inside\n",
		   (long long)json_integer_value(json_object_get(v, "host_port")),
		   (long long)json_integer_value(json_object_get(v, "port")));

	if (bh)
		printf("base hash:   %s, %lld of %lld files, %lld of %lld bytes (%lld from the "
		       "shared cache, %lld hashed)\n",
		       json_string_value(json_object_get(bh, "state")),
		       (long long)json_integer_value(json_object_get(bh, "files_done")),
		       (long long)json_integer_value(json_object_get(bh, "files_total")),
		       (long long)json_integer_value(json_object_get(bh, "bytes_done")),
		       (long long)json_integer_value(json_object_get(bh, "bytes_total")),
		       (long long)json_integer_value(json_object_get(bh, "from_shared")),
		       (long long)json_integer_value(json_object_get(bh, "hashed")));

	printf("libfuse:     %s\n", json_string_value(json_object_get(fs, "libfuse")));
	printf("transport:   %s\n", json_string_value(json_object_get(fs, "transport")));
	printf("fast paths:  passthrough %s, killpriv_v2 %s, writeback cache %s\n",
	       json_is_true(json_object_get(fs, "passthrough")) ? "on" : "off",
	       json_is_true(json_object_get(fs, "killpriv_v2")) ? "on" : "off",
	       json_is_true(json_object_get(fs, "writeback_cache")) ? "on" : "off");
	if (!json_is_object(st))
		return;
	printf("%-16s %12s %12s\n", "FUSE request", "count", "mean us");
	json_object_foreach(st, op, v)
	{
		json_int_t n = json_integer_value(json_object_get(v, "count"));
		json_int_t ns = json_integer_value(json_object_get(v, "ns"));

		printf("%-16s %12lld %12.1f\n", op, (long long)n, n ? ns / 1000.0 / n : 0.0);
	}
}

/* One limit: its value, or "none". */
static const char *limit_text(json_t *l, const char *key, const char *unit, char *buf, size_t n)
{
	json_t *v = json_object_get(l, key);

	if (!json_is_number(v) || json_number_value(v) <= 0)
		return "none";
	snprintf(buf, n, "%.15g%s", json_number_value(v), unit);
	return buf;
}

static void info_limits_print(json_t *l)
{
	char a[48], b[48], c[48], d[48], e[48], s1[32];
	json_t *used = json_object_get(l, "disk_used_bytes");
	json_int_t quota = json_integer_value(json_object_get(l, "disk_bytes"));

	printf("limits:      timeout %s, memory %s (oom_score_adj %d), pids %s\n",
	       limit_text(l, "timeout", " s", a, sizeof(a)),
	       limit_text(l, "memory_mb", " MiB", b, sizeof(b)),
	       (int)json_integer_value(json_object_get(l, "oom_score_adj")),
	       limit_text(l, "pids", "", c, sizeof(c)));
	printf("disk quota:  %s, %s inodes", quota > 0 ? cli_size(quota, d, sizeof(d)) : "none",
	       limit_text(l, "disk_inodes", "", e, sizeof(e)));
	if (json_is_integer(used))
		printf("; used %s, %lld inodes", cli_size(json_integer_value(used), s1, sizeof(s1)),
		       (long long)json_integer_value(json_object_get(l, "disk_used_inodes")));
	printf("\n");
	if (json_integer_value(json_object_get(l, "home_bytes")) > 0)
		printf(
		    "home cap:    %s (/home/cowbox: a filesystem of its own)\n",
		    cli_size(json_integer_value(json_object_get(l, "home_bytes")), s1, sizeof(s1)));
}

/* info -f FIELD: one value of the --json object (FIELD.KEY goes into an object), a string as
 * it is, null as an empty line, anything else as JSON; j is consumed. */
static int info_field(json_t *j, const char *field)
{
	json_t *v = j;
	const char *p = field;
	int status = CLI_OK;

	while (v && *p) {
		size_t n = strcspn(p, ".");
		char key[128];

		snprintf(key, sizeof(key), "%.*s", (int)(n < sizeof(key) ? n : sizeof(key) - 1), p);
		v = json_is_object(v) ? json_object_get(v, key) : NULL;
		p += n + (p[n] == '.');
	}
	if (!v) {
		const char *k;
		json_t *x;
		char names[1024] = "";
		size_t len = 0;

		json_object_foreach(j, k, x)
		{
			int w =
			    snprintf(names + len, sizeof(names) - len, "%s%s", len ? ", " : "", k);

			if (w < 0 || (size_t)w >= sizeof(names) - len)
				break;
			len += (size_t)w;
		}
		status = cli_usage_error(info_usage, "no field '%s' (fields: %s)", field, names);
	} else if (json_is_string(v)) {
		printf("%s\n", json_string_value(v));
	} else if (json_is_null(v)) {
		printf("\n");
	} else {
		char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

		printf("%s\n", text ? text : "");
		free(text);
	}
	json_decref(j);
	return status;
}

int cmd_info(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"stats", no_argument, NULL, 's'},
	    {"field", required_argument, NULL, 'f'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	struct cb_ws_info i;
	json_t *fs = NULL;
	const char *field = NULL;
	char size[32];
	int c, status, stats = 0;

	while ((c = cli_getopt(argc, argv, "f:", opts, &common, info_usage, &status)) > 0)
		if (c == 's')
			stats = 1;
		else if (c == 'f')
			field = optarg;
	if (cli_one_ref(c, argc, argv, info_usage, &status))
		return status;
	if ((status = cb_ws_info(argv[optind], &i)))
		return cli_fail_rc("info", status);
	if (i.daemon_pid > 0)
		fs = info_fs_query(i.ref, stats);
	/* The blob store's size */
	char blobs[4200];
	long long nblobs = 0, blob_bytes = 0;

	snprintf(blobs, sizeof(blobs), "%s/blobs", i.dir);
	cb_ws_blob_usage_dir(blobs, &nblobs, &blob_bytes);
	/* The backend's network: `host` opens the host's own namespace, so info says so. */
	struct cb_backend_options bo;
	struct cb_backend_limits lim;
	const char *net = NULL, *kind = NULL;
	json_t *limits = NULL, *allow = NULL, *secrets = NULL;
	/* the image its commands run in: docker's default when none is set (cowbox/image.h) */
	char *image = NULL;
	unsigned long proxy_conns = 0; /* the egress proxy's cap (network public or allow) */

	if (cb_backend_options_load(i.dir, &bo) == 0) {
		/* the daemon's answer also says what the upper layer holds against its quota */
		cb_backend_limits_of(&bo, &lim);
		limits = fs && json_object_get(fs, "limits")
			     ? json_incref(json_object_get(fs, "limits"))
			     : cb_backend_limits_json(&lim);
		net = cb_backend_net_name(bo.net);
		kind = cb_backend_find(bo.kind)->name;
		allow = info_allow(&bo);
		if (cb_backend_image_of(&bo) && !(image = strdup(cb_backend_image_of(&bo))))
			cb_error_clear(); /* out of memory: info shows no image */
		secrets = bo.n_secrets ? cb_backend_secrets_to_json(&bo) : NULL; /* no values */
		if (cb_backend_net_proxied(&bo))
			proxy_conns = bo.proxy_conns ? bo.proxy_conns : CB_NET_MAX_CONNS;
		if (bo.net == CB_BACKEND_NET_HOST)
			fprintf(stderr, "cowbox info: warning: network host: the workspace's "
					"commands share the host's network namespace (its "
					"loopback services, its abstract unix sockets)\n");
		cb_backend_options_free(&bo);
	} else {
		cb_error_clear();
	}
	/* the host ids its sandbox's 0-65535 are (none: privileged, or never served as root) */
	unsigned long id_base = 0;
	if (cb_ws_ids_get(i.dir, &id_base) < 0)
		cb_error_clear();
	/* what the workspace serves, and how long a daemon the API started stays idle */
	double idle = 0;
	int level = cb_ws_access_load(i.dir);
	if (level < 0 || cb_daemon_idle_load(i.dir, &idle) < 0)
		cb_error_clear();
	if (common.json || field) {
		json_t *j = info_json(&i);

		json_object_set_new(j, "supported_access", json_string(cb_access_name(level)));
		json_object_set_new(j, "idle_timeout", json_real(idle));
		json_object_set_new(j, "id_base", json_integer((json_int_t)id_base));
		json_object_set_new(j, "blob_count", json_integer(nblobs));
		json_object_set_new(j, "blob_bytes", json_integer(blob_bytes));
		if (fs) {
			json_object_set(j, "fs", json_object_get(fs, "fs"));
			if (json_object_get(fs, "fs_stats"))
				json_object_set(j, "fs_stats", json_object_get(fs, "fs_stats"));
			if (json_object_get(fs, "base_hash"))
				json_object_set(j, "base_hash", json_object_get(fs, "base_hash"));
			if (json_object_get(fs, "published"))
				json_object_set(j, "published", json_object_get(fs, "published"));
			json_decref(fs);
		}
		if (net) {
			json_object_set_new(j, "backend", json_string(kind));
			json_object_set_new(j, "network", json_string(net));
			if (!strcmp(kind, "vm"))
				json_object_set_new(j, "accel", json_string(cb_backend_vm_accel()));
			if (allow)
				json_object_set_new(j, "allow", allow);
			json_object_set_new(j, "image", image ? json_string(image) : json_null());
			if (secrets)
				json_object_set_new(j, "secrets", secrets);
			if (proxy_conns)
				json_object_set_new(j, "proxy_conns",
						    json_integer((json_int_t)proxy_conns));
		}
		free(image);
		if (limits)
			json_object_set_new(j, "limits", limits);
		cb_ws_info_free(&i);
		return field ? info_field(j, field) : cli_print_json(j);
	}
	printf("ref:         %s\n", i.ref);
	printf("name:        %s\n", i.name ? i.name : "-");
	printf("base:        %s\n", i.base ? cli_q(i.base) : "- (empty workspace)");
	printf("mode:        %s\n", i.in_place ? "in place (the agent's edits land in the base "
						 "folder; the journal keeps its turns)"
					       : "copy-on-write (the base is never written)");
	printf("state:       %s\n", cb_ws_state_name(i.state));
	if (i.daemon_pid > 0)
		printf("daemon pid:  %d\n", (int)i.daemon_pid);
	printf("mount point: %s\n", i.mountpoint);
	printf("upper size:  %s\n", cli_size(i.upper_bytes, size, sizeof(size)));
	printf("blob store:  %lld blobs, %s\n", nblobs, cli_size(blob_bytes, size, sizeof(size)));
	if (net)
		printf("backend:     %s, network %s%s%s\n", kind, net,
		       !strcmp(kind, "vm") ? ", accel " : "",
		       !strcmp(kind, "vm") ? cb_backend_vm_accel() : "");
	if (image)
		printf("image:       %s\n", image);
	else if (kind && cb_backend_find(kind) && cb_backend_find(kind)->image_root)
		printf("image:       - (the host's /usr, /etc, ...)\n");
	free(image);
	for (size_t k = 0; k < json_array_size(allow); k++)
		printf("allow:       %s\n", json_string_value(json_array_get(allow, k)));
	json_decref(allow);
	if (proxy_conns)
		printf("proxy conns: %lu at once (past them the longest idle is closed)\n",
		       proxy_conns);
	for (size_t k = 0; k < json_array_size(secrets); k++) {
		json_t *e = json_array_get(secrets, k);

		printf("secret:      %s on https://%s%s* (%s)\n",
		       json_string_value(json_object_get(e, "header")),
		       json_string_value(json_object_get(e, "host")),
		       json_string_value(json_object_get(e, "path_prefix")),
		       json_object_get(e, "file") ? json_string_value(json_object_get(e, "file"))
						  : "stored 0600 in its directory");
	}
	json_decref(secrets);
	if (limits) {
		info_limits_print(limits);
		json_decref(limits);
	}
	printf("access:      %s at most\n", cb_access_name(level));
	if (idle > 0)
		printf("idle stop:   after %g s without a client (not while `cowbox mount`ed)\n",
		       idle);
	else
		printf("idle stop:   never\n");
	printf("directory:   %s\n", i.dir);
	if (id_base)
		printf("sandbox ids: host %lu-%lu are its uids/gids 0-65535\n", id_base,
		       id_base + 65535);
	else
		printf("sandbox ids: - (privileged, or not yet served as root)\n");
	if (fs) {
		info_fs_print(fs);
		json_decref(fs);
	}
	cb_ws_info_free(&i);
	return CLI_OK;
}

static const char rm_usage[] =
    "usage: cowbox rm REF [-f] [--json]\n"
    "Stop the workspace's daemon, unmount it and delete it with its upper layer and journal.\n"
    "Removing a workspace that is already gone succeeds quietly. A mounted workspace with\n"
    "changes no snapshot recorded (`cowbox diff REF last` lists them) is kept unless -f,\n"
    "--force is given (exit 4).\n";

/* The changes of a served workspace since its last turn (0 when it is not served). */
static long long rm_unrecorded(const char *ref)
{
	struct cb_client *c = NULL;
	json_t *reply = NULL;
	long long n = 0, last;

	if (cb_daemon_connect(ref, &c) == 0 && cli_turn(ref, "last", &last) == 0 &&
	    cb_client_request(c, json_pack("{s:s, s:I}", "op", "diff", "a", (json_int_t)last),
			      60000, &reply) == 0)
		n = (long long)json_array_size(json_object_get(reply, "events"));
	cb_error_clear();
	json_decref(reply);
	cb_client_close(c);
	return n;
}

int cmd_rm(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"force", no_argument, NULL, 'f'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	char ref[CB_WS_REF_LEN + 1];
	int c, status, force = 0;
	long long unrecorded;

	while ((c = cli_getopt(argc, argv, "f", opts, &common, rm_usage, &status)) > 0)
		force = 1;
	if (cli_one_ref(c, argc, argv, rm_usage, &status))
		return status;
	/* the ref a name stands for, for --json (a workspace already gone keeps what was given) */
	if (cb_ws_resolve(argv[optind], ref) < 0) {
		cb_error_clear();
		snprintf(ref, sizeof(ref), "%s", "");
	}
	if (*ref && !force && (unrecorded = rm_unrecorded(ref)) > 0) {
		cli_set_code("conflict");
		return cli_fail(
		    "rm",
		    "%s is mounted with %lld change%s no snapshot recorded (`cowbox diff "
		    "%s last`); -f removes it anyway",
		    argv[optind], unrecorded, unrecorded == 1 ? "" : "s", argv[optind]);
	}
	/* A crashed daemon's docker container goes too. */
	cli_phase("rm", "stopping %s and removing its files", argv[optind]);
	if (cb_backend_remove_leftovers(argv[optind]) < 0)
		fprintf(stderr, "cowbox rm: warning: %s\n", cb_error_message());
	status = cb_ws_remove(argv[optind]);
	cli_phase_done();
	if (status)
		return cli_fail_rc("rm", status);
	if (common.json)
		return cli_print_json(json_pack(
		    "{s:s, s:s?, s:b}", "ref", *ref ? ref : argv[optind], "name",
		    *ref && strcmp(ref, argv[optind]) ? argv[optind] : NULL, "removed", *ref != 0));
	return CLI_OK;
}
