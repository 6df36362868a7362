/* Unit tests for protocol/protocol.c: enum names, errors, size parsing. */
#include <float.h>

#include "tests/harness.h"

#include "protocol/protocol.h"

TEST(errc_names_round_trip)
{
	static const char *const expected[GPUQ_ERRC_COUNT] = {
		"ok", "bad_request", "bad_frame", "unsupported_version",
		"unknown_op", "not_found", "exists", "no_device",
		"out_of_memory", "busy", "permission_denied", "cancelled",
		"timeout", "io_error", "device_error", "shutting_down",
		"internal", "restarted",
	};
	for (int i = 0; i < GPUQ_ERRC_COUNT; i++) {
		const char *name = gpuq_errc_name((enum gpuq_errc)i);
		CHECK_STR(name, expected[i]);
		CHECK_EQ(gpuq_errc_from_name(name, strlen(name)), i);
	}
	CHECK_EQ(GPUQ_ERRC_COUNT, 18);
}

TEST(errc_unknown)
{
	CHECK_STR(gpuq_errc_name(GPUQ_ERRC_COUNT), "internal");
	CHECK_STR(gpuq_errc_name((enum gpuq_errc)-1), "internal");
	CHECK_EQ(gpuq_errc_from_name("nope", 4), GPUQ_E_INTERNAL);
	CHECK_EQ(gpuq_errc_from_name("", 0), GPUQ_E_INTERNAL);
	/* A prefix or an extension of a name is not that name. */
	CHECK_EQ(gpuq_errc_from_name("bad", 3), GPUQ_E_INTERNAL);
	CHECK_EQ(gpuq_errc_from_name("busy!", 5), GPUQ_E_INTERNAL);
	/* Only len bytes are read: the name need not be NUL-terminated. */
	CHECK_EQ(gpuq_errc_from_name("busyXYZ", 4), GPUQ_E_BUSY);
	CHECK_EQ(gpuq_errc_from_name("OK", 2), GPUQ_E_INTERNAL);
}

TEST(fail_sets_error)
{
	struct gpuq_error err;
	gpuq_error_clear(&err);
	CHECK_EQ(err.code, GPUQ_OK);
	CHECK_STR(err.message, "");
	int rc = gpuq_fail(&err, GPUQ_E_NOT_FOUND, "buffer '%s' not found on gpu %d",
			   "w0", 1);
	CHECK_EQ(rc, -1);
	CHECK_EQ(err.code, GPUQ_E_NOT_FOUND);
	CHECK_STR(err.message, "buffer 'w0' not found on gpu 1");
	gpuq_error_clear(&err);
	CHECK_EQ(err.code, GPUQ_OK);
	CHECK_STR(err.message, "");
	/* A NULL err is allowed and still fails. */
	CHECK_EQ(gpuq_fail(NULL, GPUQ_E_IO, "x"), -1);
	gpuq_error_clear(NULL);
}

TEST(fail_truncates_long_message)
{
	struct gpuq_error err;
	char big[2000];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	gpuq_fail(&err, GPUQ_E_INTERNAL, "%s", big);
	CHECK_EQ(strlen(err.message), sizeof err.message - 1);
	CHECK_EQ(err.message[0], 'a');
}

TEST(dtypes)
{
	static const struct {
		const char *name;
		size_t size;
	} expected[] = {
		{ "bytes", 1 }, { "u8", 1 },   { "i32", 4 }, { "i64", 8 },
		{ "f16", 2 },   { "bf16", 2 }, { "f32", 4 }, { "f64", 8 },
	};
	CHECK_EQ(GPUQ_DTYPE_COUNT, sizeof expected / sizeof expected[0]);
	for (int i = 0; i < GPUQ_DTYPE_COUNT; i++) {
		enum gpuq_dtype d = (enum gpuq_dtype)i, back = GPUQ_DTYPE_COUNT;
		CHECK_STR(gpuq_dtype_name(d), expected[i].name);
		CHECK_EQ(gpuq_dtype_size(d), expected[i].size);
		CHECK_EQ(gpuq_dtype_from_name(expected[i].name,
					      strlen(expected[i].name), &back), 0);
		CHECK_EQ(back, d);
	}
	CHECK_STR(gpuq_dtype_list(), "bytes, u8, i32, i64, f16, bf16, f32, f64");
}

TEST(dtype_unknown)
{
	enum gpuq_dtype d = GPUQ_DTYPE_F64;
	CHECK_EQ(gpuq_dtype_from_name("f3", 2, &d), -1);
	CHECK_EQ(gpuq_dtype_from_name("f32x", 4, &d), -1);
	CHECK_EQ(gpuq_dtype_from_name("F32", 3, &d), -1);
	CHECK_EQ(gpuq_dtype_from_name("", 0, &d), -1);
	CHECK_EQ(d, GPUQ_DTYPE_F64); /* untouched on failure */
	CHECK_EQ(gpuq_dtype_from_name("f32x", 3, &d), 0);
	CHECK_EQ(d, GPUQ_DTYPE_F32);
	CHECK_STR(gpuq_dtype_name(GPUQ_DTYPE_COUNT), "unknown");
	CHECK_EQ(gpuq_dtype_size(GPUQ_DTYPE_COUNT), 0);
}

TEST(job_state_names)
{
	CHECK_STR(gpuq_job_state_name(GPUQ_JOB_QUEUED), "queued");
	CHECK_STR(gpuq_job_state_name(GPUQ_JOB_RUNNING), "running");
	CHECK_STR(gpuq_job_state_name(GPUQ_JOB_DONE), "done");
	CHECK_STR(gpuq_job_state_name(GPUQ_JOB_FAILED), "failed");
	CHECK_STR(gpuq_job_state_name(GPUQ_JOB_CANCELLED), "cancelled");
	CHECK_STR(gpuq_job_state_name((enum gpuq_job_state)99), "unknown");
}

static void check_size(const char *s, uint64_t want)
{
	uint64_t got = 0xdeadbeef;
	int rc = gpuq_parse_size(s, &got);
	CHECKF(rc == 0, "parse_size(\"%s\") failed", s);
	CHECKF(got == want, "parse_size(\"%s\") = %" PRIu64 ", want %" PRIu64, s,
	       got, want);
}

static void check_size_bad(const char *s)
{
	uint64_t got = 12345;
	int rc = gpuq_parse_size(s, &got);
	CHECKF(rc == -1, "parse_size(\"%s\") accepted it as %" PRIu64, s, got);
	CHECKF(got == 12345, "parse_size(\"%s\") changed *out on failure", s);
}

TEST(parse_size_good)
{
	check_size("0", 0);
	check_size("4096", 4096);
	check_size("64K", 64 << 10);
	check_size("64k", 64 << 10);
	check_size("64KB", 64000); /* SI: as the unit's name says */
	check_size("100MB", 100000000);
	check_size("1.5GB", 1500000000);
	check_size("1EB", 1000000000000000000ull);
	check_size("64KiB", 64 << 10);
	check_size("64kib", 64 << 10);
	check_size("3M", 3u << 20);
	check_size("1.5G", 1610612736ull);
	check_size("2GiB", 2ull << 30);
	check_size("1T", 1ull << 40);
	check_size("1P", 1ull << 50);
	check_size("15E", 15ull << 60);
	check_size("7B", 7);
	check_size("7b", 7);
	check_size("007", 7);
	check_size("18446744073709551615", UINT64_MAX);
	check_size("0.5K", 512);
	check_size("1.25M", 1310720);
	check_size("0.0009765625K", 1); /* exactly 2^-10 K */
	/* The largest whole number of K, plus a fraction: still in range. */
	check_size("18014398509481983.999K", UINT64_MAX - 1);
}

TEST(parse_size_rounds_fractions_down)
{
	check_size("1.5", 1);
	check_size("0.9", 0);
	check_size("0.3K", 307);    /* 307.2 */
	check_size("0.999K", 1022); /* 1022.976 */
	check_size("1.99999999999999999999999K", 2047);
	/* 2^60 * 0.9999999999999999999 is 2^60 - 0.115: the largest size. */
	check_size("15.9999999999999999999E", UINT64_MAX);
}

TEST(parse_size_bad)
{
	check_size_bad("");
	check_size_bad("-1");
	check_size_bad("+1");
	check_size_bad(" 1");
	check_size_bad("1 ");
	check_size_bad("1 K");
	check_size_bad("K");
	check_size_bad("abc");
	check_size_bad("12abc");
	check_size_bad("1KK");
	check_size_bad("1Ki");
	check_size_bad("1iB");
	check_size_bad("1KBB");
	check_size_bad("1X");
	check_size_bad("1.");
	check_size_bad(".5");
	check_size_bad("1.5.5");
	check_size_bad("1e3");
	check_size_bad("0x10");
	check_size_bad("18446744073709551616");
	check_size_bad("99999999999999999999999");
	check_size_bad("16E");
	check_size_bad("16.0E");
	check_size_bad("18014398509481984K");
	check_size_bad("16384P");
	check_size_bad("19EB"); /* 1.9e19: over 2^64 */
	check_size_bad("17179869184G");
	CHECK_EQ(gpuq_parse_size(NULL, &(uint64_t){ 0 }), -1);
}

/* nvidia-smi's grouping (8-4-4-4-12 hex digits after "GPU-"), which attach compares against. */
TEST(format_uuid_as_nvidia_smi_prints_it)
{
	const unsigned char bytes[16] = { 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,
					  0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10 };
	char text[64], small[12];
	gpuq_format_uuid(text, sizeof text, bytes);
	CHECK_STR(text, "GPU-01234567-89ab-cdef-fedc-ba9876543210");
	gpuq_format_uuid(small, sizeof small, bytes); /* cut, never overrun */
	CHECK_STR(small, "GPU-0123456");
}

static void check_number(double v, bool f32, const char *want)
{
	char text[32];
	gpuq_format_number(text, sizeof text, v, f32);
	CHECK_STR(text, want);
}

/* The shortest text that reads back as the value: as %g's where that is enough. */
TEST(format_number_reads_back_as_the_value)
{
	check_number(0.1, false, "0.1");
	check_number(65504, true, "65504");
	check_number(-2.5, false, "-2.5");
	check_number(0x1p63, false, "9.223372036854776e+18");
	check_number(3.4028236e38, false, "3.4028236e+38");
	check_number(FLT_MAX, true, "3.4028235e+38");
	check_number(0x1.fep+127, true, "3.3895314e+38"); /* bf16's largest */
	check_number(DBL_MAX, false, "1.7976931348623157e+308");
	check_number((float)(1.0 / 3), true, "0.33333334");
	check_number(1.0 / 3, false, "0.3333333333333333");
}
