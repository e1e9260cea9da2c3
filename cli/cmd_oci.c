/* cowbox export and create --from: workspaces as OCI images. The layout is written and read
 * by libcowbox (cowbox/oci.h); a registry is reached only through skopeo, with its own
 * credentials (the user's auth.json or docker config). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/error.h"
#include "cowbox/oci.h"
#include "cowbox/workspace.h"

extern char **environ;

/* The tag the runtime image (--image) gets in the layout its layers are copied into. */
#define RUNTIME_TAG "cowbox-runtime"

/* An image reference split: an OCI layout (dir, tag) or a registry's (docker://...). */
struct image_ref {
	char *dir; /* oci: the layout directory (malloc'd) */
	const char *tag;
	const char *docker; /* docker://HOST/REPO:TAG as given */
	int loopback;	    /* the registry's host is this machine */
};

static int ref_parse(const char *s, struct image_ref *r, const char *default_tag)
{
	memset(r, 0, sizeof(*r));
	if (!strncmp(s, "docker://", 9)) {
		const char *host = s + 9;

		r->docker = s;
		r->loopback = !strncmp(host, "localhost", 9) || !strncmp(host, "127.", 4) ||
			      !strncmp(host, "[::1]", 5);
		return 0;
	}
	if (strncmp(s, "oci:", 4) || !s[4])
		return cb_error_set(EINVAL,
				    "'%s' is neither oci:DIR[:TAG] nor docker://HOST/REPO:TAG", s);
	if (!(r->dir = strdup(s + 4)))
		return cb_error_set(ENOMEM, "out of memory");
	char *colon = strrchr(r->dir, ':'), *slash = strrchr(r->dir, '/');

	r->tag = default_tag;
	if (colon && (!slash || colon > slash) && colon[1]) {
		*colon = '\0';
		r->tag = colon + 1;
	}
	return 0;
}

/* Run skopeo with args (NULL-terminated, after "skopeo"); its output goes to stderr, so that
 * stdout keeps only cowbox's own (--json). */
static int run_skopeo(const char *const *args)
{
	const char *argv[16] = {"skopeo"};
	posix_spawn_file_actions_t fa;
	int n = 1, status, rc;
	pid_t pid;

	for (; args[n - 1] && n < 15; n++)
		argv[n] = args[n - 1];
	argv[n] = NULL;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, 2, 1);
	rc = posix_spawnp(&pid, "skopeo", &fa, NULL, (char *const *)argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc)
		return cb_error_set(rc, "skopeo: %s (is skopeo installed? scripts/setup)",
				    strerror(rc));
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return cb_error_set(errno, "skopeo: wait: %s", strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return cb_error_set(EIO, "skopeo %s %s %s failed (status %d; its message is above)",
				    argv[1], argv[n - 2], argv[n - 1],
				    WIFEXITED(status) ? WEXITSTATUS(status)
						      : 128 + WTERMSIG(status));
	return 0;
}

/* "oci:DIR:TAG" (malloc'd) */
static char *oci_name(const char *dir, const char *tag)
{
	char *s = NULL;

	return asprintf(&s, "oci:%s:%s", dir, tag) < 0 ? NULL : s;
}

/* An image named as skopeo names them; a bare name is one of the local podman store. */
static char *transport_name(const char *image)
{
	char *s = NULL;

	if (strstr(image, "://") || !strncmp(image, "oci:", 4) ||
	    !strncmp(image, "containers-storage:", 19) || !strncmp(image, "docker-archive:", 15) ||
	    !strncmp(image, "oci-archive:", 12))
		return strdup(image);
	return asprintf(&s, "containers-storage:%s", image) < 0 ? NULL : s;
}

static const char export_usage[] =
    "usage: cowbox export REF [--turn N|last] [--image IMAGE] [--insecure] [--json] DEST\n"
    "  DEST  oci:DIR[:TAG]  an OCI image layout directory (made if missing; TAG: latest)\n"
    "        docker://HOST/REPO:TAG  a registry, pushed with skopeo (credentials: the\n"
    "                       user's usual auth.json or docker config)\n"
    "  --turn N|last         the last turn exported (default: the latest)\n"
    "  --image IMAGE         a root the workspace runs on: its layers go first, so that\n"
    "                        `podman run DEST ls /workspace` works (oci:..., docker://...,\n"
    "                        containers-storage:NAME or NAME of the local podman store)\n"
    "  --insecure            push over plain HTTP / without TLS verification (implied for a\n"
    "                        registry on localhost or 127.*)\n"
    "Writes the workspace as an OCI image: the base as one layer, each turn's changes as one\n"
    "more (whiteouts and opaque directories of the image spec), all under /workspace; each\n"
    "turn's number, label, time, map digest and change list in the image's config. A layer\n"
    "the destination already holds (by digest) is not written or pushed again.\n"
    "`cowbox create --from SRC` rebuilds the workspace from it.\n";

int cmd_export(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"turn", required_argument, NULL, 't'},
	    {"image", required_argument, NULL, 'i'},
	    {"insecure", no_argument, NULL, 'k'},
	    {NULL, 0, NULL, 0},
	};
	struct cli_common common = {0};
	struct cb_oci_export_args a = {.turn = -1};
	struct cb_oci_export_stats st;
	struct image_ref dest = {0};
	const char *image = NULL;
	char ref[CB_WS_REF_LEN + 1], *from = NULL, *to = NULL, *layout = NULL;
	int c, status = CLI_OK, rc, insecure = 0;

	while ((c = cli_getopt(argc, argv, "", opts, &common, export_usage, &status)) > 0) {
		if (c == 't') {
			char *end;

			a.turn = strcmp(optarg, "last") ? strtoll(optarg, &end, 10) : -1;
			if (strcmp(optarg, "last") && (*end || a.turn < 0))
				return cli_usage_error(export_usage, "--turn takes N or last");
		} else if (c == 'i') {
			image = optarg;
		} else if (c == 'k') {
			insecure = 1;
		}
	}
	if (c < 0)
		return status;
	if (argc - optind != 2)
		return cli_usage_error(export_usage, "export takes a workspace and a destination");
	if ((rc = cb_ws_resolve(argv[optind], ref)) ||
	    (rc = ref_parse(argv[optind + 1], &dest, "latest")))
		return cli_fail_rc("export", rc);
	/* a registry's image is built in the workspace's own layout first: its blobs there
	 * stay, so the next export writes only new layers, and skopeo pushes only those the
	 * registry lacks */
	if (dest.docker && (rc = cb_ws_path(ref, "oci-export", &layout)))
		goto fail;
	a.ref = ref;
	a.layout = dest.docker ? layout : dest.dir;
	a.tag = dest.docker ? "export" : dest.tag;
	if (image) {
		if (!(from = transport_name(image)) || !(to = oci_name(a.layout, RUNTIME_TAG))) {
			rc = cb_error_set(ENOMEM, "out of memory");
			goto fail;
		}
		if (mkdir(a.layout, 0755) < 0 && errno != EEXIST) {
			rc = cb_error_set(errno, "mkdir %s: %s", a.layout, strerror(errno));
			goto fail;
		}
		cli_phase("export", "copying the runtime image %s", image);
		rc = run_skopeo((const char *[]){"copy", "--quiet", from, to, NULL});
		cli_phase_done();
		if (rc)
			goto fail;
		a.runtime_tag = RUNTIME_TAG;
	}
	cli_phase("export", "writing the layers of %s", ref);
	rc = cb_oci_export(&a, &st);
	cli_phase_done();
	if (rc)
		goto fail;
	if (dest.docker) {
		free(from);
		if (!(from = oci_name(a.layout, a.tag))) {
			rc = cb_error_set(ENOMEM, "out of memory");
			goto fail;
		}
		cli_phase("export", "pushing to %s", dest.docker);
		rc = run_skopeo((const char *[]){"copy", "--quiet",
						 insecure || dest.loopback
						     ? "--dest-tls-verify=false"
						     : "--dest-tls-verify=true",
						 from, dest.docker, NULL});
		cli_phase_done();
		if (rc)
			goto fail;
	}
	if (common.json)
		status = cli_print_json(json_pack(
		    "{s:s, s:I, s:s, s:i, s:i, s:I, s:I, s:I, s:s}", "ref", ref, "turn",
		    (json_int_t)st.turn, "destination", argv[optind + 1], "layers_written",
		    st.layers_written, "layers_reused", st.layers_reused, "bytes_written",
		    (json_int_t)st.bytes_written, "files_trusted", (json_int_t)st.files_trusted,
		    "files_hashed", (json_int_t)st.files_hashed, "manifest", st.manifest_digest));
	else
		printf("exported turn %lld of %s to %s: %d layers written (%lld bytes), %d "
		       "reused; manifest %s\n",
		       st.turn, ref, argv[optind + 1], st.layers_written, st.bytes_written,
		       st.layers_reused, st.manifest_digest);
	goto out;
fail:
	status = cli_fail_rc("export", rc);
out:
	free(dest.dir);
	free(layout);
	free(from);
	free(to);
	return status;
}

static void rm_tree(const char *path)
{
	char *rm[] = {"rm", "-rf", (char *)path, NULL};
	pid_t pid;
	int st;

	if (!posix_spawnp(&pid, "rm", NULL, NULL, rm, environ))
		waitpid(pid, &st, 0);
}

#define PULL_DIR    "/var/tmp"
#define PULL_PREFIX "cowbox-pull-"

/* Pull directories (PULL_PREFIX<pid>-XXXXXX) of ours whose process is gone: a create --from
 * killed while skopeo pulled. */
static void pull_sweep(void)
{
	DIR *d = opendir(PULL_DIR);
	struct dirent *de;
	struct stat st;
	char path[512];
	int pid;

	while (d && (de = readdir(d))) {
		if (sscanf(de->d_name, PULL_PREFIX "%d-", &pid) != 1 || pid <= 0 ||
		    !(kill(pid, 0) < 0 && errno == ESRCH))
			continue;
		snprintf(path, sizeof(path), PULL_DIR "/%s", de->d_name);
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid())
			rm_tree(path);
	}
	if (d)
		closedir(d);
}

int cli_create_from(const char *src, long long turn, const char *base, const char *name,
		    int privileged, char *ref)
{
	struct cb_oci_import_args a = {
	    .turn = turn, .base = base, .name = name, .own_ids = !privileged, .log = stderr};
	struct image_ref r;
	char tmp[128], *layout = NULL, *to = NULL;
	int rc = ref_parse(src, &r, NULL);

	if (rc)
		return rc;
	snprintf(tmp, sizeof(tmp), PULL_DIR "/" PULL_PREFIX "%d-XXXXXX", (int)getpid());
	if (r.docker) {
		/* pulled into a layout of our own first: the import reads only files */
		pull_sweep();
		if (!mkdtemp(tmp)) {
			rc = cb_error_set(errno, "mkdtemp: %s", strerror(errno));
			goto out;
		}
		if (asprintf(&layout, "%s/layout", tmp) < 0 || !(to = oci_name(layout, "import"))) {
			rc = cb_error_set(ENOMEM, "out of memory");
			goto out;
		}
		cli_phase("create", "pulling %s", src);
		rc = run_skopeo((const char *[]){"copy", "--quiet",
						 r.loopback ? "--src-tls-verify=false"
							    : "--src-tls-verify=true",
						 src, to, NULL});
		cli_phase_done();
		if (rc)
			goto out;
		a.layout = layout;
		a.tag = "import";
	} else {
		a.layout = r.dir;
		a.tag = r.tag;
	}
	rc = cb_oci_import(&a, ref);
out:
	if (r.docker && tmp[strlen(tmp) - 1] != 'X')
		rm_tree(tmp);
	free(r.dir);
	free(layout);
	free(to);
	return rc;
}
