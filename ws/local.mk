# ws layer: workspaces under $COWBOX_HOME (refs, names, create/resolve/info/list/remove).
noinst_LTLIBRARIES += ws/libcb_ws.la
ws_libcb_ws_la_SOURCES = ws/ws.h ws/workspace.c ws/workspace_state.c
COWBOX_LAYERS += ws/libcb_ws.la
pkginclude_HEADERS += include/cowbox/workspace.h
