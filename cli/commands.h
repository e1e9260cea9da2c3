/* The cowbox subcommands: each takes the arguments after its own name (argv[0] is the
 * command name) and returns the process exit status. */
#ifndef COWBOX_CLI_COMMANDS_H
#define COWBOX_CLI_COMMANDS_H

struct cli_command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary; /* one line for `cowbox --help` */
};

/* The table, in cli/main.c; ends with a NULL name. */
extern const struct cli_command cli_commands[];

/* Workspace lifecycle (cli/cmd_workspace.c and friends). */
int cmd_create(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_mount(int argc, char **argv); /* cli/cmd_mount.c */
int cmd_umount(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_log(int argc, char **argv);
int cmd_access(int argc, char **argv); /* cli/cmd_access.c */

/* Exec (cli/cmd_exec.c). */
int cmd_exec(int argc, char **argv);
int cmd_shell(int argc, char **argv);

/* Turns (cli/cmd_turns.c). */
int cmd_snapshot(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_rollback(int argc, char **argv);
int cmd_turns(int argc, char **argv);
int cmd_prune(int argc, char **argv);
int cmd_fork(int argc, char **argv);
int cmd_apply(int argc, char **argv); /* cli/cmd_apply.c */
int cmd_merge(int argc, char **argv); /* cli/cmd_merge.c */

/* Workspaces as OCI images (cli/cmd_oci.c): export, and what create --from runs. */
int cmd_export(int argc, char **argv);
/* Rebuild a workspace from src (oci:DIR[:TAG] or docker://...), up to turn (< 0: all), over
 * base (NULL: the image's), named name; ref gets it. 0 or -errno with a message. */
int cli_create_from(const char *src, long long turn, const char *base, const char *name,
		    int privileged, char *ref);

/* The network (cli/cmd_net.c). */
int cmd_reaches(int argc, char **argv);
int cmd_net_log(int argc, char **argv);
int cmd_publish(int argc, char **argv);
int cmd_unpublish(int argc, char **argv);
int cmd_host_url(int argc, char **argv);

/* Checking and repairing stored state (cli/cmd_fsck.c). */
int cmd_fsck(int argc, char **argv);

/* The ns backend's unpacked OCI images: ls, prune (cli/cmd_image.c). */
int cmd_image(int argc, char **argv);

#endif
