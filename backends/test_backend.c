/* Unit tests of the backends layer without a daemon: options from JSON and back, backend.json,
 * command environments, path-safe read/write on a plain directory, and the local table. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/image.h"

static char tmp[] = "/tmp/cb-test-backend-XXXXXX";
static char root[4200];

static void setup(void)
{
	cr_assert_not_null(mkdtemp(tmp));
	snprintf(root, sizeof(root), "%s/root", tmp);
	cr_assert_eq(mkdir(root, 0755), 0);
}

static void teardown(void)
{
	char cmd[4300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	cr_expect_eq(system(cmd), 0);
}

static struct cb_backend *open_with(const char *json)
{
	struct cb_backend_options o;
	struct cb_backend *b = NULL;
	json_error_t jerr;
	json_t *j = json_loads(json, 0, &jerr);

	cr_assert_not_null(j, "%s", jerr.text);
	cr_assert_eq(cb_backend_options_from_json(j, &o), 0, "%s", cb_error_message());
	json_decref(j);
	cr_assert_eq(cb_backend_options_save(tmp, &o), 0, "%s", cb_error_message());
	cb_backend_options_free(&o);
	cr_assert_eq(cb_backend_open("cb-00000000000000000000000000000000", tmp, root, "t", &b), 0,
		     "%s", cb_error_message());
	return b;
}

TestSuite(backend, .init = setup, .fini = teardown);

Test(backend, options_refuse_bad_input)
{
	static const char *const bad[] = {
	    "[]",
	    "{\"backend\":\"qemu\"}",
	    "{\"bogus\":1}",
	    "{\"env\":{\"A\":1}}",
	    "{\"env\":{\"A=B\":\"x\"}}",
	    "{\"network\":\"some\"}",
	    "{\"timeout\":-1}",
	    "{\"working_dir\":\"/abs\"}",
	    "{\"working_dir\":\"a/../..\"}",
	    "{\"on_create\":\"echo\"}",
	    "{\"backend\":\"local\",\"memory_mb\":64}",
	    "{\"backend\":\"local\",\"network\":\"none\"}",
	    "{\"backend\":\"local\",\"network\":\"all\"}",
	    "{\"image\":\"-rf\"}",
	    "{\"image\":\"\"}",
	    "{\"image\":\"oci:\"}",
	    "{\"image\":\"oci:/a:\"}",
	    "{\"image\":\"oci:/a:b/c:d\"}",
	    "{\"image\":\"containers-storage:-x\"}",
	    "{\"image\":\"a\\nb\"}",
	    "{\"backend\":\"docker\",\"image\":\"--privileged\"}",
	    "{\"backend\":\"local\",\"image\":\"/\"}",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		struct cb_backend_options o;
		json_t *j = json_loads(bad[i], 0, NULL);

		cr_expect_eq(cb_backend_options_from_json(j, &o), -EINVAL, "%s accepted", bad[i]);
		cr_expect_neq(strlen(cb_error_message()), 0);
		json_decref(j);
	}
}

/* What an image option names, by its spelling alone (cowbox/image.h). */
Test(backend, image_kinds)
{
	struct cb_backend_options o = {.kind = "docker"};

	cr_expect_eq(cb_backend_image_kind("/srv/root"), CB_BACKEND_IMAGE_DIR);
	cr_expect_eq(cb_backend_image_kind("./root"), CB_BACKEND_IMAGE_DIR);
	cr_expect_eq(cb_backend_image_kind("oci:/l:tag"), CB_BACKEND_IMAGE_OCI);
	cr_expect_eq(cb_backend_image_kind("containers-storage:x"), CB_BACKEND_IMAGE_STORE);
	cr_expect_eq(cb_backend_image_kind("debian:bookworm"), CB_BACKEND_IMAGE_STORE);
	cr_expect_eq(cb_backend_image_check("oci:/l"), 0);
	cr_expect_eq(cb_backend_image_check("oci:rel/l:v1.2"), 0);
	cr_expect_eq(cb_backend_image_check("localhost/x:1"), 0);
	/* docker's default: the option, else the environment, else the built-in name */
	unsetenv("COWBOX_DOCKER_IMAGE");
	cr_expect_str_eq(cb_backend_image_of(&o), CB_BACKEND_DOCKER_DEFAULT_IMAGE);
	setenv("COWBOX_DOCKER_IMAGE", "from-env:1", 1);
	cr_expect_str_eq(cb_backend_image_of(&o), "from-env:1");
	o.image = "given:2";
	cr_expect_str_eq(cb_backend_image_of(&o), "given:2");
	o.kind = "ns";
	o.image = NULL;
	cr_expect_null(cb_backend_image_of(&o));
	unsetenv("COWBOX_DOCKER_IMAGE");
}

Test(backend, options_round_trip_through_backend_json)
{
	struct cb_backend *b = open_with(
	    "{\"backend\":\"docker\",\"env\":{\"K\":\"v\"},\"network\":\"all\",\"cpus\":1.5,"
	    "\"memory_mb\":256,\"on_create\":[\"true\"],\"setup_script\":\"echo hi\","
	    "\"working_dir\":\"sub\"}");

	cr_expect_str_eq(b->ops->name, "docker");
	cr_expect_str_eq(b->opt.env[0], "K=v");
	cr_expect_eq(b->opt.net, CB_BACKEND_NET_ALL);
	cr_expect_eq(b->opt.memory_mb, 256);
	cr_expect_str_eq(b->opt.on_create[0], "true");
	cr_expect_str_eq(b->opt.working_dir, "sub");
	cb_backend_free(b);
}

Test(backend, local_saved_as_network_all_still_loads_as_host)
{
	char path[4200];
	struct cb_backend *b = NULL;
	FILE *f;

	/* What a cowbox before network host wrote for every local workspace. */
	snprintf(path, sizeof(path), "%s/backend.json", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("{\"backend\":\"local\",\"env\":{},\"network\":\"all\"}", f);
	fclose(f);
	cr_assert_eq(cb_backend_open("cb-00000000000000000000000000000000", tmp, root, "t", &b), 0,
		     "%s", cb_error_message());
	cr_expect_eq(b->opt.net, CB_BACKEND_NET_HOST);
	cb_backend_free(b);
}

Test(backend, env_layers_and_strips_credentials)
{
	struct cb_backend *b =
	    open_with("{\"backend\":\"ns\",\"env\":{\"A\":\"opt\",\"B\":\"o\"}}");
	char *extra[] = {"A=cmd", NULL}, **env = NULL;
	int seen_a = 0, seen_b = 0;

	setenv("OPENAI_API_KEY", "sk-secret", 1);
	cr_assert_eq(cb_backend_env(b, extra, &env), 0);
	for (size_t i = 0; env[i]; i++) {
		cr_expect(strncmp(env[i], "OPENAI_API_KEY=", 15), "%s leaked", env[i]);
		seen_a += !strcmp(env[i], "A=cmd");
		seen_b += !strcmp(env[i], "B=o");
		cr_expect(strncmp(env[i], "A=opt", 5), "options' A not replaced");
	}
	cr_expect_eq(seen_a + seen_b, 2);
	cb_exec_env_free(env);
	cb_backend_free(b);
	/* local: the host's environment, minus provider credentials */
	b = open_with("{\"backend\":\"local\"}");
	cr_assert_eq(cb_backend_env(b, NULL, &env), 0);
	for (size_t i = 0; env[i]; i++)
		cr_expect(strncmp(env[i], "OPENAI_API_KEY=", 15), "credential leaked");
	cb_exec_env_free(env);
	cb_backend_free(b);
	unsetenv("OPENAI_API_KEY");
}

Test(backend, read_write_stay_beneath_the_root)
{
	struct cb_backend *b = open_with("{\"backend\":\"local\"}");
	char path[4300];
	void *got;
	size_t n;
	off_t size;

	cr_assert_eq(cb_backend_write(b, "a/b/c.txt", 0, "hello", 5, 1, 0), 0, "%s",
		     cb_error_message());
	cr_assert_eq(cb_backend_write(b, "a/b/c.txt", 5, " world", 6, 0, 0), 0);
	cr_assert_eq(cb_backend_read(b, "a/b/c.txt", 6, 100, &got, &n, &size), 0);
	cr_expect_eq(n, 5);
	cr_expect_eq(size, 11);
	cr_expect_eq(memcmp(got, "world", 5), 0);
	free(got);
	snprintf(path, sizeof(path), "%s/out", root);
	cr_assert_eq(symlink("/etc", path), 0);
	snprintf(path, sizeof(path), "%s/up", root);
	cr_assert_eq(symlink("..", path), 0);
	static const char *const escapes[] = {"../x", "/etc/passwd", "out/passwd",
					      "up/x", "a/../../x",   "a/../a/b/c.txt"};
	for (size_t i = 0; i < sizeof(escapes) / sizeof(*escapes); i++) {
		/* .. and absolute: EXDEV; a symlink on the way, inside or out: ELOOP */
		int want = strchr(escapes[i], '.') || escapes[i][0] == '/' ? -EXDEV : -ELOOP;

		cr_expect_eq(cb_backend_read(b, escapes[i], 0, 10, &got, &n, &size), want, "%s",
			     escapes[i]);
		cr_expect_neq(strstr(cb_error_message(), escapes[i]), NULL, "%s",
			      cb_error_message());
		cr_expect_eq(cb_backend_write(b, escapes[i], 0, "x", 1, 1, 0), want, "%s",
			     escapes[i]);
	}
	snprintf(path, sizeof(path), "%s/x", tmp);
	cr_expect_neq(access(path, F_OK), 0, "a write escaped to %s", path);
	cr_expect_eq(cb_backend_read(b, "nope", 0, 10, &got, &n, &size), -ENOENT);
	cr_expect_eq(cb_backend_read(b, "a", 0, 10, &got, &n, &size), -EISDIR);
	/* A FIFO is refused at once, with its name, never opened to wait for a writer. */
	snprintf(path, sizeof(path), "%s/a/fifo", root);
	cr_assert_eq(mkfifo(path, 0644), 0);
	cr_expect_eq(cb_backend_read(b, "a/fifo", 0, 10, &got, &n, &size), -EINVAL);
	cr_expect_neq(strstr(cb_error_message(), "a/fifo"), NULL, "%s", cb_error_message());
	cr_expect_eq(cb_backend_write(b, "a/fifo", 0, "x", 1, 1, 0), -EINVAL);
	cb_backend_free(b);
}

Test(backend, local_table_runs_and_finds)
{
	struct cb_backend *b = open_with("{\"backend\":\"local\",\"working_dir\":\"w/x\"}");
	char *argv[] = {"sh", "-c", "pwd; exit 4", NULL}, *path = NULL, dir[4300];
	struct cb_backend_cmd cmd = {.argv = argv};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;

	snprintf(dir, sizeof(dir), "%s/w/x", root);
	cr_assert_eq(cb_backend_ensure(b), 0, "%s", cb_error_message());
	cr_assert_eq(access(dir, F_OK), 0, "working_dir was not made");
	cr_assert_eq(b->ops->exec(b, &cmd, NULL, &h), 0, "%s", cb_error_message());
	cr_assert_eq(b->ops->wait(b, h, &res), 0);
	cb_exec_free(h);
	cr_expect_eq(res.exit_code, 4);
	strcat(dir, "\n");
	cr_expect_str_eq(res.out, dir);
	cb_exec_result_free(&res);
	cr_expect_eq(b->ops->which(b, "sh", &path), 0);
	cr_expect_eq(path[0], '/');
	free(path);
	cr_expect_eq(b->ops->which(b, "no-such-binary-here", &path), -ENOENT);
	cr_expect_neq(strstr(cb_error_message(), "no-such-binary-here"), NULL);
	cb_backend_free(b);
}

/* What differs between backends is their table's: the default, the kinds a message names,
 * where commands start, what each refuses, the limits and home of a confined one. */
Test(backend, table_decides_per_backend)
{
	struct cb_backend_options o = {0};
	struct cb_backend_limits lim;
	char *wd = NULL;

	cr_expect_str_eq(cb_backend_find(NULL)->name, "ns");
	cr_expect_null(cb_backend_find("qemu"));
	cr_expect_str_eq(cb_backend_kinds(), "ns, local, docker or vm");
	cr_assert_eq(cb_backend_workdir("ns", "/m", "sub", &wd), 0);
	cr_expect_str_eq(wd, "/workspace/sub");
	free(wd);
	cr_assert_eq(cb_backend_workdir("docker", "/m", NULL, &wd), 0);
	cr_expect_str_eq(wd, "/workspace");
	free(wd);
	cr_assert_eq(cb_backend_workdir("local", "/m", "sub", &wd), 0);
	cr_expect_str_eq(wd, "/m/sub");
	free(wd);
	cr_assert_eq(cb_backend_workdir("vm", "/m", "sub", &wd), 0);
	cr_expect_str_eq(wd, "/workspace/sub");
	free(wd);
	cr_expect_eq(cb_backend_workdir("qemu", "/m", NULL, &wd), -EINVAL);
	cr_expect_null(wd);
	/* each backend's validate: what it cannot enforce */
	static const char *const refused[] = {
	    "{\"backend\":\"local\",\"memory_mb\":64}",
	    "{\"backend\":\"local\",\"user\":\"1\"}",
	    "{\"backend\":\"local\",\"network\":\"all\"}",
	    "{\"backend\":\"docker\",\"image\":\"-x\"}",
	    "{\"backend\":\"docker\",\"privileged\":true}",
	    "{\"backend\":\"ns\",\"image\":\"\"}",
	    "{\"backend\":\"vm\",\"network\":\"host\"}",
	    "{\"backend\":\"vm\",\"network\":\"public\",\"secrets\":"
	    "[{\"host\":\"a.test\",\"header\":\"X-K\",\"value\":\"v\"}]}",
	    "{\"backend\":\"vm\",\"pids\":10}",
	    "{\"backend\":\"vm\",\"privileged\":true}"};
	for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
		json_t *j = json_loads(refused[i], 0, NULL);

		cr_expect_eq(cb_backend_options_from_json(j, &o), -EINVAL, "%s", refused[i]);
		json_decref(j);
	}
	/* vm's user is switched to by its agent (backends/vm_agent.c) */
	{
		json_t *j = json_loads("{\"backend\":\"vm\",\"user\":\"nobody\"}", 0, NULL);

		cr_expect_eq(cb_backend_options_from_json(j, &o), 0, "%s", cb_error_message());
		cr_expect_str_eq(o.user, "nobody");
		cb_backend_options_free(&o);
		json_decref(j);
	}
	/* vm's network all is passt's (backends/vm_net.c); public and allow reach the egress
	 * proxy over the agent's port (backends/vm_forward.c), without secrets */
	static const char *const vm_nets[] = {"all", "public"};
	for (size_t i = 0; i < sizeof vm_nets / sizeof *vm_nets; i++) {
		json_t *j = json_pack("{s:s, s:s}", "backend", "vm", "network", vm_nets[i]);

		cr_expect_eq(cb_backend_options_from_json(j, &o), 0, "%s", cb_error_message());
		cr_expect_str_eq(cb_backend_net_name(o.net), vm_nets[i]);
		cb_backend_options_free(&o);
		json_decref(j);
	}
	o.kind = "local";
	cb_backend_limits_of(&o, &lim);
	cr_expect_eq(lim.memory_mb + lim.pids, 0);
	o.kind = "docker";
	cb_backend_limits_of(&o, &lim);
	cr_expect_eq(lim.memory_mb, CB_BACKEND_DEFAULT_MEMORY_MB);
}

/* join: a backend used from another process makes nothing of its own but the directories;
 * docker's commands need its daemon. */
Test(backend, join_in_this_process)
{
	struct cb_backend *b = open_with("{\"backend\":\"local\",\"working_dir\":\"w\"}");
	struct cb_backend_cmd cmd = {.shell = "pwd"};
	struct cb_exec_result res = {0};
	struct cb_exec *h = NULL;
	char want[4300];

	cr_assert_eq(cb_backend_join(b, -1), 0, "%s", cb_error_message());
	cr_assert_eq(b->ops->exec(b, &cmd, NULL, &h), 0, "%s", cb_error_message());
	cr_assert_eq(b->ops->wait(b, h, &res), 0);
	snprintf(want, sizeof want, "%s/w\n", root);
	cr_expect_str_eq(res.out, want);
	cb_exec_result_free(&res);
	cb_exec_free(h);
	cb_backend_free(b);
	b = open_with("{\"backend\":\"docker\"}");
	cr_expect_eq(cb_backend_join(b, -1), -EOPNOTSUPP);
	cb_backend_free(b);
	b = open_with("{\"backend\":\"vm\"}");
	cr_expect_eq(cb_backend_join(b, -1), -EOPNOTSUPP);
	cb_backend_free(b);
}
