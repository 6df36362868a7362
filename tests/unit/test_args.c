/* Unit tests for daemon/args.c's table decoder and request.c's op table. */
#include <stddef.h>
#include <string.h>

#include "tests/harness.h"

#include "daemon/daemon.h"

TEST(args_op_table_is_well_formed)
{
	struct gpuq_error err;
	CHECKF(request_check_ops(&err) == 0, "%s", err.message);
}

struct sample_args {
	uint64_t size;
	bool has_size;
	char name[8];
	int mode;
	uint64_t seed;
	bool flag;
};

static const char *const sample_modes[] = { "fast", "slow", NULL };

static bool sample_wants_seed(const void *args)
{
	return ((const struct sample_args *)args)->mode == 1;
}

static const struct args_field sample_fields[] = {
	{ "size", ARGS_U64, 0, ARGS_AT(struct sample_args, size),
	  ARGS_GIVEN(struct sample_args, has_size), .lo = 1, .hi = 100 },
	{ "name", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct sample_args, name),
	  .missing = "sample needs a name" },
	{ "mode", ARGS_ENUM, 0, ARGS_AT(struct sample_args, mode), .names = sample_modes,
	  .bad_name = "field 'mode': '%s' is not fast or slow", .strsize = 8 },
	{ "seed", ARGS_U64, ARGS_REQUIRED, ARGS_AT(struct sample_args, seed),
	  .when = sample_wants_seed },
	{ "flag", ARGS_BOOL, 0, ARGS_AT(struct sample_args, flag) },
};
static const struct sample_args sample_defaults = { .size = 7 };
static const struct args_spec sample_spec =
	ARGS_SPEC(struct sample_args, sample_fields, &sample_defaults);

/* Decodes the map m builds (consumed) with sample_spec: rc, *a and *err set. */
static int decode_sample(struct mp_map *m, struct sample_args *a, struct gpuq_error *err)
{
	msgpack_sbuffer buf;
	struct msg msg;
	msgpack_sbuffer_init(&buf);
	mp_map_finish(m, &buf);
	CHECK(msg_decode(&msg, buf.data, buf.size, &msg_request_limits, err) == 0);
	struct request req = { .map = msg.root };
	int rc = args_decode(&req, &sample_spec, a, err);
	msg_free(&msg);
	msgpack_sbuffer_destroy(&buf);
	return rc;
}

TEST(args_decode_defaults_presence_and_when)
{
	struct sample_args a;
	struct gpuq_error err;
	struct mp_map m;
	CHECK(args_spec_check(&sample_spec, &err) == 0);
	mp_map_init(&m);
	mp_put_str(&m, "name", "w0");
	CHECKF(decode_sample(&m, &a, &err) == 0, "%s", err.message);
	CHECK_EQ(a.size, 7);
	CHECK(!a.has_size);
	CHECK_STR(a.name, "w0");
	CHECK_EQ(a.mode, 0);
	mp_map_init(&m);
	mp_put_str(&m, "name", "w0");
	mp_put_u64(&m, "size", 9);
	mp_put_str(&m, "mode", "fast");
	mp_put_str(&m, "seed", "ignored: fast takes no seed");
	mp_put_bool(&m, "flag", true);
	CHECKF(decode_sample(&m, &a, &err) == 0, "%s", err.message);
	CHECK(a.has_size && a.size == 9 && a.flag);
}

static void decode_bad(struct mp_map *m, const char *message)
{
	struct sample_args a;
	struct gpuq_error err;
	CHECK(decode_sample(m, &a, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	CHECK_STR(err.message, message);
}

TEST(args_decode_errors_in_table_order)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_u64(&m, "size", 0);
	decode_bad(&m, "field 'size': 0 is out of range (1 to 100)");
	mp_map_init(&m);
	mp_put_u64(&m, "size", 5);
	decode_bad(&m, "sample needs a name");
	mp_map_init(&m);
	mp_put_str(&m, "name", "too long a name");
	mp_put_str(&m, "mode", "up");
	decode_bad(&m, "field 'name': a string of 15 bytes is too long (at most 7)");
	mp_map_init(&m);
	mp_put_str(&m, "name", "w0");
	mp_put_str(&m, "mode", "up");
	decode_bad(&m, "field 'mode': 'up' is not fast or slow");
	mp_map_init(&m);
	mp_put_str(&m, "name", "w0");
	mp_put_str(&m, "mode", "slow");
	decode_bad(&m, "field 'seed' is required");
	mp_map_init(&m);
	mp_put_str(&m, "name", "w0");
	mp_put_str(&m, "flag", "yes");
	decode_bad(&m, "field 'flag': expected a bool, got str");
}
