/*
 * drop_absent, the administrator's way to let go of the buffers kept for a
 * GPU gpuqd does not serve (daemon/absent.h): refused for a GPU it serves,
 * for one nothing is kept for (saying what is), and to anyone but root and
 * the admin group. What it drops, and how buffers come to be kept, is
 * tests/service.sh's (the configuration's devices change between starts)
 * and the Python suite's (a re-exec that leaves a GPU out).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "protocol/msg.h"
#include "tests/integration/fixture.h"

static struct gpuq_reply *drop_absent(struct gpuq_client *c, const char *uuid)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "drop_absent");
	if (uuid)
		mp_put_str(&req, "uuid", uuid);
	return call(c, &req, NULL, 0);
}

/* Device 0's uuid, from `devices`. */
static void device0_uuid(struct gpuq_client *c, char *out, size_t n)
{
	struct mp_map req;
	struct gpuq_error err;
	const msgpack_object *list = NULL;
	gpuq_request_begin(c, &req, "devices");
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	CHECK(r->ok && msg_get_array(r->root, "devices", &list, &err) == 1 && list->via.array.size > 0);
	CHECK(msg_get_str(&list->via.array.ptr[0], "uuid", out, n, &err) == 1);
	gpuq_reply_free(r);
}

static void stranger_may_not_drop(void *arg)
{
	struct gpuq_client *c = client_open(arg);
	struct gpuq_reply *r = drop_absent(c, "GPU-00000000-0000-0000-0000-000000000000");
	expect_error(r, GPUQ_E_PERMISSION_DENIED, "(rule: admin-group)");
	gpuq_reply_free(r);
	gpuq_close(c);
}

TEST(drop_absent_refuses_what_it_cannot_drop)
{
	struct daemon_proc d;
	char uuid[64], want[160];
	require_backend();
	daemon_start(&d, "--socket-group", "nogroup", NULL);
	struct gpuq_client *c = client_open(&d);
	device0_uuid(c, uuid, sizeof uuid);
	struct gpuq_reply *r = drop_absent(c, uuid);
	snprintf(want, sizeof want, "GPU %s is device 0 of this gpuqd: its buffers are listed", uuid);
	expect_error(r, GPUQ_E_BAD_REQUEST, want);
	gpuq_reply_free(r);
	r = drop_absent(c, "GPU-gone");
	expect_error(r, GPUQ_E_NOT_FOUND, "no buffers are kept for GPU GPU-gone (kept for: none)");
	gpuq_reply_free(r);
	r = drop_absent(c, NULL);
	expect_error(r, GPUQ_E_BAD_REQUEST, "uuid");
	gpuq_reply_free(r);
	if (geteuid() == 0)
		as_user(65534, NULL, 0, stranger_may_not_drop, &d);
	gpuq_close(c);
	daemon_stop(&d);
}
