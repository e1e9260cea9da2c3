# cli: the cowbox binary; argument parsing and output only, the work is in libcowbox.
bin_PROGRAMS += cowbox
cowbox_SOURCES = cli/main.c cli/commands.h
# Each command group adds its file below.
cowbox_SOURCES += cli/cmd_common.h cli/cmd_common.c cli/cmd_workspace.c cli/cmd_mount.c
cowbox_SOURCES += cli/cmd_exec.c cli/exec.h cli/exec_net.c cli/exec_dir.c cli/exec_daemon.c
# The layers linked in (highest first, as a static link resolves), not libcowbox.so, and the
# heavy libraries statically when configure found their archives (COWBOX_BIN_DEPS): loading
# and relocating them was most of the binary's start (see docs/performance.md, Exec).
cowbox_LDADD = daemon/libcb_daemon.la backends/libcb_backends.la net/libcb_net.la exec/libcb_exec.la \
	ws/libcb_ws.la fs/libcb_fs.la db/libcb_db.la util/libcb_util.la $(COWBOX_BIN_DEPS)
cowbox_SOURCES += cli/cmd_turns.c cli/map_print.h cli/map_print.c cli/cmd_fsck.c cli/cmd_net.c \
	cli/cmd_image.c
cowbox_SOURCES += cli/cmd_access.c cli/cmd_apply.c cli/phase_watch.c
# export, create --from: workspaces as OCI images
cowbox_SOURCES += cli/cmd_oci.c
dist_man_MANS += man/cowbox.1

# merge: a fork's changes brought back into a workspace
cowbox_SOURCES += cli/cmd_merge.c
