# exec layer: its convenience library exec/libcb_exec.la, sources and tests go here.
