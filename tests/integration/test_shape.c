/*
 * An array's shape kept by gpuqd: optional `shape` on alloc and put, shown in
 * `buffers` rows only where one was given (docs/protocol.md, alloc).
 */
#include <string.h>
#include <unistd.h>

#include "tests/integration/fixture.h"

/* alloc name (count f32) with shape dims[0..n); returns the reply. */
static struct gpuq_reply *alloc_shaped(struct gpuq_client *c, const char *name, uint64_t count,
				       const uint64_t *dims, int n)
{
	struct mp_map req;
	struct mp_array shape;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "count", count);
	mp_put_str(&req, "dtype", "f32");
	mp_array_init(&shape);
	for (int i = 0; i < n; i++)
		mp_array_u64(&shape, dims[i]);
	mp_put_array(&req, "shape", &shape);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

/* The `shape` of the caller's only buffer called name in `buffers`, or NULL (and the reply). */
static const msgpack_object *listed_shape(struct gpuq_client *c, const char *name,
					  struct gpuq_reply **r)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "buffers");
	*r = call(c, &req, NULL, 0);
	expect_ok(*r, "buffers");
	const msgpack_object *list = reply_path(*r, "buffers");
	for (uint32_t i = 0; list && i < list->via.array.size; i++) {
		const msgpack_object *row = &list->via.array.ptr[i];
		const msgpack_object *n = msg_map_get(row, "name");
		if (n && n->via.str.size == strlen(name) && !memcmp(n->via.str.ptr, name, n->via.str.size))
			return msg_map_get(row, "shape");
	}
	CHECKF(false, "buffer '%s' is not listed", name);
	return NULL;
}

static void check_dims(const msgpack_object *shape, const uint64_t *dims, uint32_t n)
{
	CHECK(shape && shape->type == MSGPACK_OBJECT_ARRAY);
	if (!shape || shape->type != MSGPACK_OBJECT_ARRAY)
		return;
	CHECK_EQ(shape->via.array.size, n);
	for (uint32_t i = 0; i < n && i < shape->via.array.size; i++)
		CHECK_EQ(shape->via.array.ptr[i].via.u64, dims[i]);
}

TEST(shape_is_kept_from_alloc_and_put)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const uint64_t a[] = { 2, 3, 4 };
	struct gpuq_reply *r = alloc_shaped(c, "m", 24, a, 3);
	expect_ok(r, "alloc with shape");
	gpuq_reply_free(r);
	check_dims(listed_shape(c, "m", &r), a, 3);
	gpuq_reply_free(r);

	/* A put may give the whole buffer a new shape (of the same count). */
	int src = memfd_random(96, 1);
	struct mp_map req;
	struct mp_array shape;
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "m");
	mp_put_u64(&req, "fds", 1);
	mp_array_init(&shape);
	mp_array_u64(&shape, 6);
	mp_array_u64(&shape, 4);
	mp_put_array(&req, "shape", &shape);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, &src, 1);
	expect_ok(r, "put with shape");
	gpuq_reply_free(r);
	close(src);
	const uint64_t b[] = { 6, 4 };
	check_dims(listed_shape(c, "m", &r), b, 2);
	gpuq_reply_free(r);

	/* Without a shape, a row has no `shape` key: other replies are as they were. */
	do_alloc(c, "plain", 0, 4096);
	CHECK(listed_shape(c, "plain", &r) == NULL);
	gpuq_reply_free(r);
	gpuq_close(c);
	daemon_stop(&d);
}

TEST(a_shape_that_does_not_fit_is_refused)
{
	struct daemon_proc d;
	daemon_start(&d, NULL);
	struct gpuq_client *c = client_open(&d);
	const uint64_t wrong[] = { 5, 5 };
	struct gpuq_reply *r = alloc_shaped(c, "w", 24, wrong, 2);
	expect_error(r, GPUQ_E_BAD_REQUEST, "multiply to 25 elements, but the buffer holds 24");
	gpuq_reply_free(r);
	const uint64_t nine[] = { 1, 1, 1, 1, 1, 1, 1, 1, 24 };
	r = alloc_shaped(c, "w", 24, nine, 9);
	expect_error(r, GPUQ_E_BAD_REQUEST, "9 dimensions; at most 8");
	gpuq_reply_free(r);
	const uint64_t huge[] = { UINT64_MAX, 4 };
	r = alloc_shaped(c, "w", 24, huge, 2);
	expect_error(r, GPUQ_E_BAD_REQUEST, "more than");
	gpuq_reply_free(r);

	struct mp_map req;
	struct mp_array shape;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_u64(&req, "count", 24);
	mp_put_str(&req, "dtype", "f32");
	mp_array_init(&shape);
	mp_array_i64(&shape, -24);
	mp_put_array(&req, "shape", &shape);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_REQUEST, "dimension 0 is not a non-negative integer");
	gpuq_reply_free(r);
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", "w");
	mp_put_u64(&req, "count", 24);
	mp_put_str(&req, "dtype", "f32");
	mp_put_u64(&req, "shape", 24);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, NULL, 0);
	expect_error(r, GPUQ_E_BAD_REQUEST, "shape");
	gpuq_reply_free(r);
	CHECK(!has_buffer(c, "w", NULL)); /* nothing was allocated */

	/* A put's shape is checked before any byte moves. */
	do_alloc_typed(c, "v", 0, "f32", 24);
	int src = memfd_random(96, 1);
	gpuq_request_begin(c, &req, "put");
	mp_put_str(&req, "buffer", "v");
	mp_put_u64(&req, "fds", 1);
	mp_array_init(&shape);
	mp_array_u64(&shape, 7);
	mp_put_array(&req, "shape", &shape);
	mp_put_bool(&req, "wait", true);
	r = call(c, &req, &src, 1);
	expect_error(r, GPUQ_E_BAD_REQUEST, "multiply to 7 elements");
	gpuq_reply_free(r);
	close(src);
	gpuq_close(c);
	daemon_stop(&d);
}
