# fs layer: its convenience library fs/libcb_fs.la, sources and tests go here.
