/* Unit tests for daemon/buffer.c's references: NAME, NAME@GPU, [START:STOP]. */
#include "tests/harness.h"

#include "daemon/buffer.h"

static struct buffer_ref parse_ok(const char *ref)
{
	struct buffer_ref r;
	struct gpuq_error err;
	CHECKF(buffer_ref_parse_range(ref, "buffer", &r, &err) == 0, "'%s': %s", ref, err.message);
	return r;
}

static void parse_bad(const char *ref, const char *contains)
{
	struct buffer_ref r;
	struct gpuq_error err;
	CHECKF(buffer_ref_parse_range(ref, "src", &r, &err) < 0, "'%s' was accepted", ref);
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
	CHECKF(strstr(err.message, contains), "'%s': \"%s\" lacks \"%s\"", ref, err.message,
	       contains);
	/* A bad name is buffer_name_check's to describe; a bad range names the field. */
	CHECKF(strstr(err.message, "buffer name") || strstr(err.message, "'src'"),
	       "'%s': \"%s\" does not name the field", ref, err.message);
}

TEST(buffer_ref_plain_names)
{
	struct buffer_ref r = parse_ok("w0");
	CHECK_STR(r.name, "w0");
	CHECK_EQ(r.device, -1);
	CHECK(!r.has_range && !r.has_length);
	CHECK_EQ(r.offset, 0);
	r = parse_ok("grads.v1@12");
	CHECK_STR(r.name, "grads.v1");
	CHECK_EQ(r.device, 12);
	CHECK(!r.has_range);
}

TEST(buffer_ref_ranges)
{
	struct buffer_ref r = parse_ok("w0@1[4K:1M]");
	CHECK_STR(r.name, "w0");
	CHECK_EQ(r.device, 1);
	CHECK(r.has_range && r.has_length);
	CHECK_EQ(r.offset, 4096);
	CHECK_EQ(r.length, (1u << 20) - 4096); /* a slice: bytes 4K up to 1M */
	r = parse_ok("w0[100:]");
	CHECK_EQ(r.device, -1);
	CHECK(r.has_range && !r.has_length);
	CHECK_EQ(r.offset, 100);
	r = parse_ok("w0[:17]");
	CHECK(r.has_range && r.has_length);
	CHECK_EQ(r.offset, 0);
	CHECK_EQ(r.length, 17);
	r = parse_ok("w0@0[0:0]");
	CHECK(r.has_range && r.has_length);
	CHECK_EQ(r.length, 0);
	r = parse_ok("x[1.5G:3G]");
	CHECK_EQ(r.offset, 3ull << 29);
	CHECK_EQ(r.length, 3ull << 29);
	r = parse_ok("w0[7:7]");
	CHECK(r.has_range && r.has_length);
	CHECK_EQ(r.offset, 7);
	CHECK_EQ(r.length, 0);
}

TEST(buffer_ref_malformed)
{
	parse_bad("w0[", "malformed range");
	parse_bad("w0[]", "malformed range");
	parse_bad("w0[:]", "malformed range");
	parse_bad("w0[10]", "malformed range");
	parse_bad("w0[1:2", "malformed range");
	parse_bad("w0[a:2]", "malformed range");
	parse_bad("w0[1:2]x", "malformed range");
	parse_bad("w0[-1:2]", "malformed range");
	parse_bad("w0[1:2:3]", "malformed range");
	parse_bad("w0[99999999999999999999:1]", "malformed range");
	parse_bad("w0@x[1:2]", "NAME@GPU");
	parse_bad("w0@[1:2]", "NAME@GPU");
	parse_bad("[1:2]", "1 to 64");
	parse_bad("-w[1:2]", "must not start");
	/* [OFFSET:LENGTH] as it was once read: STOP below START says what to write */
	parse_bad("w0[4K:100]", "ends before it starts");
	parse_bad("w0[4K:100]", "[4096:4196]");
}

/* Regions are named as buffers are, and their name errors call the name a region's. */
TEST(region_names_are_worded_as_regions)
{
	struct buffer_ref r;
	struct gpuq_error err;
	CHECK(region_ref_parse_range("-r[1:2]", "region", &r, &err) < 0);
	CHECKF(strstr(err.message, "region name '-r' must not start with '.' or '-'"), "%s", err.message);
	CHECK(region_ref_parse_range("r@x", "region", &r, &err) < 0);
	CHECKF(strstr(err.message, "field 'region'"), "%s", err.message);
	CHECK(region_name_check(".x", &err) < 0);
	CHECKF(strstr(err.message, "region name '.x' must not start"), "%s", err.message);
	CHECK(region_name_check("", &err) < 0);
	CHECKF(strstr(err.message, "region name '' must be 1 to"), "%s", err.message);
	CHECK(region_name_check("a b", &err) < 0);
	CHECKF(strstr(err.message, "region name 'a b' has ' ' at byte 1"), "%s", err.message);
	CHECK(region_name_check("ring.0", &err) == 0);
	CHECK(buffer_name_check(".x", &err) < 0);
	CHECKF(strstr(err.message, "buffer name '.x'"), "%s", err.message);
	r = (struct buffer_ref){ 0 };
	CHECK(region_ref_parse_range("in[4K:]", "region", &r, &err) == 0);
	CHECK_STR(r.name, "in");
	CHECK_EQ(r.offset, 4096);
}

TEST(buffer_range_check_bounds)
{
	struct buffer b = { .name = "w", .device = 1, .bytes = 1000 };
	struct gpuq_error err;
	uint64_t len = 0;
	CHECK(buffer_range_check(&b, 0, false, 0, &len, &err) == 0);
	CHECK_EQ(len, 1000);
	CHECK(buffer_range_check(&b, 400, false, 0, &len, &err) == 0);
	CHECK_EQ(len, 600);
	CHECK(buffer_range_check(&b, 1000, false, 0, &len, &err) == 0);
	CHECK_EQ(len, 0);
	CHECK(buffer_range_check(&b, 999, true, 1, &len, &err) == 0);
	CHECK_EQ(len, 1);
	CHECK(buffer_range_check(&b, 999, true, 2, &len, &err) < 0);
	CHECK(strstr(err.message, "outside buffer 'w@1'"));
	CHECK(buffer_range_check(&b, 1001, false, 0, &len, &err) < 0);
	CHECK(strstr(err.message, "past the end"));
	CHECK(buffer_range_check(&b, 10, true, UINT64_MAX, &len, &err) < 0);
	CHECK_EQ(err.code, GPUQ_E_BAD_REQUEST);
}
