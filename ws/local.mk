# ws layer: its convenience library ws/libcb_ws.la, sources and tests go here.
