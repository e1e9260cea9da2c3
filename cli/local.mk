# cli: the cowbox binary; argument parsing and output only, the work is in libcowbox.
bin_PROGRAMS += cowbox
cowbox_SOURCES = cli/main.c cli/commands.h
# Each command group adds its file below.
cowbox_SOURCES += cli/cmd_common.h cli/cmd_common.c cli/cmd_workspace.c cli/cmd_mount.c
cowbox_SOURCES += cli/cmd_exec.c
cowbox_LDADD = libcowbox.la $(DEPS_LIBS)
cowbox_SOURCES += cli/cmd_turns.c
dist_man_MANS += man/cowbox.1
