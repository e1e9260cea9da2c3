# Tests: unit tests (criterion) live beside the layer they test in its local.mk;
# the integration tests below drive the built ./cowbox binary over real mounts.
