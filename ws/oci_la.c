/* libarchive loaded on first use by export and import (see ws/oci_la.h): a table of its
 * functions filled by dlsym, so that no other cowbox command loads it. */
#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#define OCI_LA_NO_REDIRECT
#include "cowbox/error.h"
#include "oci_la.h"

struct oci_la oci_la;

static pthread_once_t la_once = PTHREAD_ONCE_INIT;
static char la_error[256];
static int la_loaded;

static void la_load(void)
{
	void *h = dlopen(CB_LIBARCHIVE_SONAME, RTLD_NOW | RTLD_LOCAL);
	const char *missing = NULL;

	if (!h) {
		snprintf(la_error, sizeof(la_error), "%s", dlerror());
		return;
	}
#define OCI_LA_SYM(f)                                                                              \
	if (!(*(void **)&oci_la.la_##f = dlsym(h, #f)) && !missing)                                \
		missing = #f;
	OCI_LA_FUNCS(OCI_LA_SYM)
#undef OCI_LA_SYM
	if (missing) {
		snprintf(la_error, sizeof(la_error), "%s has no %s", CB_LIBARCHIVE_SONAME, missing);
		dlclose(h);
		return;
	}
	la_loaded = 1;
}

int oci_la_load(void)
{
	pthread_once(&la_once, la_load);
	if (!la_loaded)
		return cb_error_set(ENOSYS, "libarchive: %s (scripts/setup installs it)", la_error);
	return 0;
}
