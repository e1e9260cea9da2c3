/* cowbox image ls | prune: the OCI images the ns backend unpacked under $COWBOX_HOME/images,
 * which workspaces use each, and the collection of those none uses. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"
#include "commands.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/image.h"
#include "cowbox/oci.h"

static const char image_usage[] =
    "usage: cowbox image ls [--json]\n"
    "       cowbox image prune [--json]\n"
    "ls: every unpacked image root ($COWBOX_HOME/images/<config digest>), its size and\n"
    "inodes, and the workspaces whose image option names it now.\n"
    "prune: remove the roots no workspace's image option names and none holds (a running\n"
    "sandbox or backend, an unpack holds its root), and killed unpacks' leftovers; and the\n"
    "bases imports of exported workspaces unpacked ($COWBOX_HOME/bases) that no workspace\n"
    "uses.\n"
    "Idempotent; a workspace whose root was pruned unpacks it again on its next start.\n";

static int image_ls(json_t *j)
{
	json_t *img;
	size_t i;
	char size[32];

	printf("%-12s  %10s  %8s  %s\n", "IMAGE", "SIZE", "INODES", "WORKSPACES");
	json_array_foreach(json_object_get(j, "images"), i, img)
	{
		json_t *ws = json_object_get(img, "workspaces"), *w;
		size_t k;

		printf(
		    "%-12.12s  %10s  %8lld  ", json_string_value(json_object_get(img, "id")),
		    cli_size(json_integer_value(json_object_get(img, "bytes")), size, sizeof(size)),
		    (long long)json_integer_value(json_object_get(img, "inodes")));
		if (!json_array_size(ws))
			printf("(none: prune removes it)");
		json_array_foreach(ws, k, w) printf("%s%s", k ? " " : "", json_string_value(w));
		printf("\n");
	}
	json_decref(j);
	return CLI_OK;
}

static int image_prune(json_t *j)
{
	json_t *id;
	size_t i;
	char size[32];

	json_array_foreach(json_object_get(j, "removed"), i, id)
	    printf("removed %s\n", json_string_value(id));
	printf("%zu image root(s) removed, %s freed\n",
	       json_array_size(json_object_get(j, "removed")),
	       cli_size(json_integer_value(json_object_get(j, "bytes")), size, sizeof(size)));
	json_array_foreach(json_object_get(j, "bases_removed"), i, id)
	    printf("removed base %s\n", json_string_value(id));
	printf("%zu imported base(s) removed, %s freed%s\n",
	       json_array_size(json_object_get(j, "bases_removed")),
	       cli_size(json_integer_value(json_object_get(j, "bases_bytes")), size, sizeof(size)),
	       json_is_true(json_object_get(j, "bases_busy"))
		   ? " (an import was running: its bases wait for the next prune)"
		   : "");
	json_decref(j);
	return CLI_OK;
}

static void base_removed(const char *hex, unsigned long long bytes, void *arg)
{
	json_t *j = arg;

	json_array_append_new(json_object_get(j, "bases_removed"), json_string(hex));
	json_object_set_new(j, "bases_bytes",
			    json_integer(json_integer_value(json_object_get(j, "bases_bytes")) +
					 (json_int_t)bytes));
}

/* The imported bases no workspace uses go with the image roots: both are caches of images. */
static int bases_prune(json_t *j)
{
	int busy = 0, rc;

	json_object_set_new(j, "bases_removed", json_array());
	json_object_set_new(j, "bases_bytes", json_integer(0));
	rc = cb_oci_bases_prune(base_removed, j, &busy);
	json_object_set_new(j, "bases_busy", json_boolean(busy));
	return rc;
}

int cmd_image(int argc, char **argv)
{
	struct cli_common common = {0};
	int c, status, ls;
	json_t *j = NULL;

	while ((c = cli_getopt(argc, argv, "", NULL, &common, image_usage, &status)) > 0)
		;
	if (c < 0)
		return status;
	if (optind + 1 != argc || (strcmp(argv[optind], "ls") && strcmp(argv[optind], "prune")))
		return cli_usage_error(image_usage, "cowbox image takes ls or prune");
	ls = !strcmp(argv[optind], "ls");
	if ((ls ? cb_backend_image_list(&j) : cb_backend_image_prune(&j)) < 0)
		return cli_fail(ls ? "image ls" : "image prune", NULL);
	if (!ls && bases_prune(j) < 0) {
		json_decref(j);
		return cli_fail("image prune", NULL);
	}
	if (common.json)
		return cli_print_json(j);
	return ls ? image_ls(j) : image_prune(j);
}
