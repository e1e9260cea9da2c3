/* The cowbox command line: finds the subcommand and hands it the rest of argv. Parsing of
 * each command's own options lives beside its code in cli/cmd_*.c. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "commands.h"

/* Each group of commands adds its rows here, in the order `cowbox --help` lists them. */
const struct cli_command cli_commands[] = {
    /* workspace lifecycle */
    {"create", cmd_create, "create a workspace over a base directory; prints its ref"},
    {"mount", cmd_mount, "mount a workspace (starts its daemon in the background)"},
    {"umount", cmd_umount, "unmount a workspace and stop its daemon"},
    {"ls", cmd_ls, "list workspaces"},
    {"info", cmd_info, "show one workspace"},
    {"rm", cmd_rm, "unmount and delete a workspace"},
    {"log", cmd_log, "show the journal of changes"},
    {"serve", cmd_serve, "run a workspace daemon (what mount starts)"},
    {"access", cmd_access, "show or lower the widest access level a workspace serves"},
    /* exec */
    {"exec", cmd_exec, "run a command in a workspace, isolated (namespace sandbox)"},
    {"shell", cmd_shell, "an interactive shell in a workspace's sandbox"},
    /* turns */
    {"snapshot", cmd_snapshot, "record a turn; print every file's SHA-256"},
    {"diff", cmd_diff, "what changed between two turns, or a turn and now"},
    {"rollback", cmd_rollback, "make the live workspace what it was at a turn"},
    {"turns", cmd_turns, "list a workspace's turns and blob store size"},
    {"prune", cmd_prune, "drop old turns and the blobs only they needed"},
    {"fork", cmd_fork, "a new workspace starting at a turn of another"},
    {"apply", cmd_apply, "write a turn's changes onto the base or another folder"},
    {"merge", cmd_merge, "bring a fork's changes back into a workspace as one turn"},
    {"export", cmd_export, "a workspace's base and turns as an OCI image (layout or registry)"},
    {"reaches", cmd_reaches, "whether the network policy opens a host[:port], by which rule"},
    {"net-log", cmd_net_log, "what the workspace's egress proxy let through or refused"},
    {"publish", cmd_publish, "reach a server inside the sandbox from the host's 127.0.0.1"},
    {"unpublish", cmd_unpublish, "close a port publish opened"},
    {"host-url", cmd_host_url, "the URL by which the sandbox reaches a port of the host"},
    {"fsck", cmd_fsck, "check blobs, base and meta.db; --repair what can be repaired"},
    {"image", cmd_image, "list (ls) or collect (prune) the unpacked OCI image roots"},
    {NULL, NULL, NULL},
};

static void cli_usage(FILE *out)
{
	fprintf(out, "usage: cowbox COMMAND [OPTIONS] [ARGS]\n\n"
		     "Copy-on-write sandbox workspaces for AI agents.\n\ncommands:\n");
	for (const struct cli_command *c = cli_commands; c->name; c++)
		fprintf(out, "  %-10s %s\n", c->name, c->summary);
	fprintf(out,
		"\nRun 'cowbox COMMAND --help' for a command's options; 'man cowbox' for more.\n");
}

/* Edits (insert, delete, change, swap of neighbours) from a to b, for "did you mean". */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), d[16][16];

	if (la > 15 || lb > 15)
		return 99;
	for (size_t i = 0; i <= la; i++)
		for (size_t j = 0; j <= lb; j++) {
			size_t best;

			if (!i || !j) {
				d[i][j] = i + j;
				continue;
			}
			best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			if (d[i - 1][j] + 1 < best)
				best = d[i - 1][j] + 1;
			if (d[i][j - 1] + 1 < best)
				best = d[i][j - 1] + 1;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    d[i - 2][j - 2] + 1 < best)
				best = d[i - 2][j - 2] + 1;
			d[i][j] = best;
		}
	return d[la][lb];
}

/* An unknown command: the commands within two edits of it (or that it starts), if any. */
static int unknown_command(const char *name)
{
	size_t best = 3;
	int found = 0;

	fprintf(stderr, "cowbox: unknown command '%s'\n", name);
	for (const struct cli_command *c = cli_commands; c->name; c++) {
		size_t d = edit_distance(name, c->name);

		if (strlen(name) >= 2 && !strncmp(c->name, name, strlen(name)))
			d = 1;
		if (d < best)
			best = d;
	}
	for (const struct cli_command *c = cli_commands; best < 3 && c->name; c++) {
		size_t d = edit_distance(name, c->name);

		if (strlen(name) >= 2 && !strncmp(c->name, name, strlen(name)))
			d = 1;
		if (d == best)
			fprintf(stderr, "%s%s", found++ ? ", " : "did you mean: ", c->name);
	}
	if (found)
		fputc('\n', stderr);
	fprintf(stderr, "see `cowbox --help`\n");
	return 2;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		cli_usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		cli_usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("cowbox %s\n", COWBOX_VERSION);
		return 0;
	}
	for (const struct cli_command *c = cli_commands; c->name; c++)
		if (!strcmp(c->name, argv[1]))
			return c->run(argc - 1, argv + 1);
	return unknown_command(argv[1]);
}
