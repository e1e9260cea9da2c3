# daemon layer: its convenience library daemon/libcb_daemon.la, sources and tests go here.
