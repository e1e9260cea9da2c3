# backends layer: its convenience library backends/libcb_backends.la, sources and tests go here.
