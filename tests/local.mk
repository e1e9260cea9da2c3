# Tests: unit tests (criterion) live beside the layer they test in its local.mk;
# the integration tests below drive the built ./cowbox binary over real mounts.
TESTS += tests/integration/test_cli.py tests/integration/test_journal.py \
	tests/integration/test_marklog.py \
	tests/integration/test_daemon.py
EXTRA_DIST += tests/integration/cbtest.py
TESTS += tests/integration/test_turns.py tests/integration/test_turns_property.py \
	tests/integration/test_turn_races.py tests/integration/test_turn_memory.py
# faults: kill -9 of the daemon in the middle of turn operations (docs/reliability.md).
TESTS += tests/integration/test_faults_kill.py
EXTRA_DIST += tests/integration/turnutil.py
TESTS += tests/integration/test_exec.py tests/integration/test_escape.py tests/integration/test_acl.py
# api: the API ops, the shared backend conformance suite, the Python client.
TESTS += tests/integration/test_api.py tests/integration/test_backend_conformance.py \
	bindings/python/tests/test_client.py bindings/python/tests/test_directio.py
# fs: the workspace filesystem against a native directory, crash safety, scale.
TESTS += tests/integration/test_fs_differential.py tests/integration/test_fs_crash.py \
	tests/integration/test_fs_scale.py tests/integration/test_fs_fast.py \
	tests/integration/test_fs_whiteout_node.py tests/integration/test_fs_teardown.py \
	tests/integration/test_deep_paths.py tests/integration/test_fs_listing.py \
	tests/integration/test_fs_copyup.py
EXTRA_DIST += tests/integration/fsharness.py
# libcowbox for embedders: examples/embed.c against the build tree; make install + pkg-config.
TESTS += tests/integration/test_libcowbox.py
# faults in the data cowbox keeps: blobs, base, meta.db, a full disk, sparse files.
TESTS += tests/integration/test_faults_data.py
# limits by default: pids, memory and oom_score_adj, timeout, the upper-layer quota.
TESTS += tests/integration/test_limits.py
# the shared base cache and the background hash of the base
TESTS += tests/integration/test_basecache.py
# a workspace's lifecycle: access levels, hooks at create, idle stop, apply
TESTS += tests/integration/test_lifecycle.py bindings/python/tests/test_lifecycle.py
# the network policy and its egress proxy: allow entries, private ranges, the network log
TESTS += tests/integration/test_network_policy.py tests/integration/test_network_secrets.py
TESTS += tests/integration/test_network_hostaddr.py tests/integration/test_network_fds.py
# in-place workspaces: the upper layer is the user's folder
TESTS += tests/integration/test_in_place.py
# the ns backend's OCI images: layouts, the local store, the cache
TESTS += tests/integration/test_image.py
EXTRA_DIST += tests/integration/ociutil.py
# issue 13: libcowbox's public line (exports, installed headers), the daemon's running table,
# the one error table (C and Python)
TESTS += tests/integration/test_public_api.py tests/integration/test_api_requests.py \
	bindings/python/tests/test_errors.py
# the vm backend: its guest agent over its frames outside a VM; the conformance suite on one
# shared VM, and its lifecycle (two boots; each boot is tens of seconds under TCG)
TESTS += tests/integration/test_vm_agent.py tests/integration/test_vm_conformance.py \
	tests/integration/test_vm_lifecycle.py
# The CLI as a person meets it, as transcripts (cli/).
TESTS += tests/integration/test_cli_transcript.py
# issue 31: the seed pages' code on cowbox.litellm, cowbox.boxlite and cowbox.mistral (ns,
# local, and the docker engine where scripts/setup-podman made one)
TESTS += bindings/python/tests/test_seed_litellm.py bindings/python/tests/test_seed_boxlite.py \
	bindings/python/tests/test_seed_mistral.py
EXTRA_DIST += bindings/python/tests/seedutil.py
# issue 31: ns images pulled from the registries a registries.conf names (a loopback registry)
TESTS += tests/integration/test_image_pull.py
# workspaces as OCI images: export, create --from, a registry on loopback, podman run
TESTS += tests/integration/test_oci_export.py bindings/python/tests/test_oci.py
TESTS += tests/integration/test_volume_swap.py
TESTS += tests/integration/test_home_quota.py
# issue 30 (8): host paths in /proc/self/mountinfo inside
TESTS += tests/integration/test_mountinfo.py
TESTS += tests/integration/test_upper_image.py
TESTS += tests/integration/test_image_caps.py
# issue 29 (3): fsck and logical damage: a damaged mark log, deleted journal/turn rows,
# damaged meta.db pages, apply's temporary files, staging directories of dead daemons.
TESTS += tests/integration/test_fsck_logical.py

# merge: a fork brought back into a workspace
TESTS += tests/integration/test_merge.py
# never lose work: rollback keeps the open turn; turns restore metadata (issue 29).
TESTS += tests/integration/test_turns_keep.py
# a rollback gives the base back: an rm -rf undone costs no upper layer (issue 29).
TESTS += tests/integration/test_turns_base.py
EXTRA_DIST += tests/lsan.supp
