/* Embedding cowbox from C: one agent turn through libcowbox (include/cowbox/box.h), printing
 * each step. Build: cc embed.c $(pkg-config --cflags --libs cowbox); run: ./embed BASE_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cowbox/box.h>
#include <cowbox/error.h>

static int fail(const char *step, int rc)
{
	fprintf(stderr, "embed: %s failed (%d, %s): %s\n", step, rc, cb_box_last_code(),
		cb_error_message());
	return 1;
}

/* Print a streamed chunk as it arrives. */
static void on_output(int stream, const void *data, size_t len, void *arg)
{
	(void)arg;
	printf("exec %s: %.*s", stream == 1 ? "stdout" : "stderr", (int)len, (const char *)data);
}

int main(int argc, char **argv)
{
	struct cb_box_options opts = {.base = argc > 1 ? argv[1] : NULL};
	const char *argv_ls[] = {"ls", "/workspace", NULL};
	struct cb_box_result res = {0};
	struct cb_box_proc *proc = NULL;
	struct cb_box *box = NULL;
	json_t *files = NULL, *events = NULL;
	char ref[64];
	void *data = NULL;
	size_t len = 0;
	long long before, after, turn;
	int rc, status = 1;

	/* 1. A workspace over the base directory: copy-on-write, the base never changes. */
	if ((rc = cb_box_create(&opts, &box)))
		return fail("create", rc);
	snprintf(ref, sizeof(ref), "%s", cb_box_ref(box));
	printf("create: %s workdir %s\n", ref, cb_box_workdir(box));

	/* 2. A command in the namespace sandbox, its output collected. */
	if ((rc = cb_box_run(box, argv_ls, NULL, NULL, &res)))
		goto fail_run;
	printf("run: exit %d\n%s", res.exit_code, res.out);
	cb_box_result_free(&res);

	/* 3. A streamed command fed through its stdin. */
	if ((rc = cb_box_exec(box, NULL, "read line; echo got $line", NULL, &proc)) ||
	    (rc = cb_box_proc_write(proc, "hello\n", 6)) || (rc = cb_box_proc_close_stdin(proc)) ||
	    (rc = cb_box_proc_poll(proc, -1, on_output, NULL, &res)) < 0)
		goto fail_exec;
	printf("exec: exit %d\n", res.exit_code);
	cb_box_result_free(&res);
	cb_box_proc_free(proc);
	proc = NULL;

	/* 4. A turn boundary, an edit, another turn, and the changes between them. */
	if ((before = cb_box_snapshot(box, "before", &files)) < 0) {
		rc = (int)before;
		goto fail_box;
	}
	printf("snapshot: turn %lld, %zu files\n", before, json_object_size(files));
	json_decref(files);
	if ((rc = cb_box_write(box, "notes/agent.txt", "written by the agent\n", 21)))
		goto fail_box;
	if ((rc = cb_box_read(box, "notes/agent.txt", &data, &len)))
		goto fail_box;
	printf("write+read: %zu bytes: %s", len, (char *)data);
	free(data);
	if ((after = cb_box_snapshot(box, "after", NULL)) < 0) {
		rc = (int)after;
		goto fail_box;
	}
	if ((rc = cb_box_diff(box, before, after, &events)) < 0)
		goto fail_box;
	printf("diff %lld..%lld: %d events\n", before, after, rc);
	for (size_t i = 0; i < json_array_size(events); i++) {
		json_t *ev = json_array_get(events, i);

		printf("  %s %s\n", json_string_value(json_object_get(ev, "event")),
		       json_string_value(json_object_get(ev, "path")));
	}
	json_decref(events);

	/* 5. Undo the turn: the file is gone again. */
	if ((turn = cb_box_rollback(box, before)) < 0) {
		rc = (int)turn;
		goto fail_box;
	}
	printf("rollback: to turn %lld, recorded as turn %lld\n", before, turn);
	if (cb_box_read(box, "notes/agent.txt", &data, &len) == 0) {
		printf("rollback: notes/agent.txt is still there\n");
		free(data);
		status = 1;
	} else {
		printf("rollback: notes/agent.txt is gone (%s)\n", cb_box_last_code());
		status = 0;
	}

	/* 6. Stop the daemon, then delete the workspace. */
	if ((rc = cb_box_close(box)))
		return fail("close", rc);
	if ((rc = cb_box_destroy(ref)))
		return fail("destroy", rc);
	printf("destroy: %s\n", ref);
	return status;

fail_exec:
	cb_box_proc_free(proc);
	status = fail("exec", rc);
	goto out;
fail_run:
	status = fail("run", rc);
	goto out;
fail_box:
	status = fail("turns", rc);
out:
	cb_box_result_free(&res);
	cb_box_close(box);
	cb_box_destroy(ref);
	return status;
}
