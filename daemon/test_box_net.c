/* Unit tests of libcowbox's network calls (cowbox/box_net.h) against a real daemon and a real
 * ns sandbox: reaches under network allow, the network log, a published sandbox server. */
#include "config.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/box.h"
#include "cowbox/box_net.h"
#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "test_box_home.h"

static char home[] = "/tmp/cb-test-boxnet-XXXXXX";

static void setup(void)
{
	box_home_setup(home);
}

static void teardown(void)
{
	box_home_teardown(home);
}

TestSuite(boxnet, .init = setup, .fini = teardown);

/* What "GET / HTTP/1.0" to addr ("127.0.0.1:PORT") answers (its first bytes), "" if nothing. */
static void fetch(const char *addr, char *buf, size_t size)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	const char *colon = strrchr(addr, ':');
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t n = 0;
	ssize_t r;

	buf[0] = 0;
	sa.sin_port = htons(colon ? atoi(colon + 1) : 0);
	if (fd < 0)
		return;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
	    write(fd, "GET /hello HTTP/1.0\r\n\r\n", 23) == 23)
		while (n + 1 < size && (r = read(fd, buf + n, size - 1 - n)) > 0)
			n += (size_t)r;
	buf[n] = 0;
	close(fd);
}

Test(boxnet, reaches_log_and_publish, .timeout = 120)
{
	static const char *const allow[] = {"api.example.test:8080", "10.9.0.0/16", NULL};
	struct cb_box_options o = {.network = "allow", .allow = allow};
	struct cb_box_result res = {0};
	struct cb_box *box = NULL;
	char *rule = NULL, *addr = NULL, *again = NULL, buf[512];
	json_t *rows = NULL;

	if (geteuid() != 0)
		cr_skip_test("network allow needs the daemon to run as root");
	cr_assert_eq(cb_box_create(&o, &box), 0, "%s", cb_error_message());

	cr_assert_eq(cb_box_reaches(box, "api.example.test:8080", &rule), 1, "%s",
		     cb_error_message());
	cr_assert_str_eq(rule, "allow api.example.test:8080");
	free(rule);
	cr_assert_eq(cb_box_reaches(box, "api.example.test", &rule), 0, "%s", cb_error_message());
	cr_assert(strstr(rule, "api.example.test:443"), "%s", rule);
	free(rule);
	cr_assert_eq(cb_box_reaches(box, "10.9.3.4:22", NULL), 0, "%s", cb_error_message());
	cr_assert_eq(cb_box_reaches(box, "10.9.3.4:443", NULL), 1, "%s", cb_error_message());
	cr_assert_eq(cb_box_reaches(box, "[::1", NULL), -EPROTO);
	cr_assert_str_eq(cb_box_last_code(), "invalid_request");

	/* nothing went through the proxy yet */
	cr_assert_eq(cb_box_net_log(box, 0, &rows), 0, "%s", cb_error_message());
	cr_assert(json_is_array(rows));
	json_decref(rows);
	/* one refusal, logged in turn 1 */
	cr_assert_eq(cb_box_run(box, NULL, "curl -sS -m 5 http://other.example.test:9999/ || true",
				NULL, &res),
		     0, "%s", cb_error_message());
	cb_box_result_free(&res);
	cr_assert_eq(cb_box_net_log(box, 1, &rows), 1, "%s", cb_error_message());
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(rows, 0), "name")),
			 "other.example.test");
	cr_assert(json_is_false(json_object_get(json_array_get(rows, 0), "allowed")), "%s",
		  json_dumps(rows, 0));
	json_decref(rows);

	/* a server the sandbox keeps on its own loopback, reached from here */
	cr_assert_eq(cb_box_run(box, NULL,
				"mkdir -p /tmp/www && echo from-inside > /tmp/www/hello && "
				"(cd /tmp/www && exec python3 -m http.server 8099 --bind "
				"127.0.0.1 >/dev/null 2>&1 &)",
				NULL, &res),
		     0, "%s", cb_error_message());
	cb_box_result_free(&res);
	cr_assert_eq(cb_box_publish(box, 8099, &addr), 0, "%s", cb_error_message());
	cr_assert_eq(strncmp(addr, "127.0.0.1:", 10), 0, "%s", addr);
	cr_assert_eq(cb_box_publish(box, 8099, &again), 0, "%s", cb_error_message());
	cr_assert_str_eq(again, addr);
	for (int i = 0; i < 300; i++) {
		fetch(addr, buf, sizeof(buf));
		if (strstr(buf, "from-inside"))
			break;
		usleep(50 * 1000);
	}
	cr_assert(strstr(buf, "from-inside"), "the published server answered: %s", buf);
	cr_assert_eq(cb_box_unpublish(box, 8099), 0, "%s", cb_error_message());
	fetch(addr, buf, sizeof(buf));
	cr_assert_str_eq(buf, "");
	cr_assert_eq(cb_box_unpublish(box, 8099), -ENOENT);
	cr_assert_str_eq(cb_box_last_code(), "not_found");
	free(again);
	cr_assert_eq(cb_box_publish(box, 0, &again), -EPROTO);
	cr_assert_null(again);
	free(addr);
	box_close_checked(box);
}
