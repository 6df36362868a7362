/*
 * Names of the wire enums (error codes, dtypes, job states), error helpers,
 * and size parsing. Everything here is pure and safe from any thread.
 */
#include "protocol/protocol.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const errc_names[] = {
#define GPUQ_ERRC_NAME(name, str) [name] = str,
	GPUQ_ERRORS(GPUQ_ERRC_NAME)
#undef GPUQ_ERRC_NAME
};

const char *gpuq_errc_name(enum gpuq_errc code)
{
	if ((unsigned)code >= GPUQ_ERRC_COUNT)
		return errc_names[GPUQ_E_INTERNAL];
	return errc_names[code];
}

/* True when s[0..len) spells exactly the NUL-terminated name. */
static bool name_is(const char *s, size_t len, const char *name)
{
	return strlen(name) == len && (len == 0 || memcmp(s, name, len) == 0);
}

enum gpuq_errc gpuq_errc_from_name(const char *s, size_t len)
{
	for (int i = 0; i < GPUQ_ERRC_COUNT; i++)
		if (name_is(s, len, errc_names[i]))
			return (enum gpuq_errc)i;
	return GPUQ_E_INTERNAL;
}

int gpuq_vfail(struct gpuq_error *err, enum gpuq_errc code, const char *fmt,
	       va_list ap)
{
	if (err) {
		err->code = code;
		vsnprintf(err->message, sizeof err->message, fmt, ap);
	}
	return -1;
}

int gpuq_fail(struct gpuq_error *err, enum gpuq_errc code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gpuq_vfail(err, code, fmt, ap);
	va_end(ap);
	return -1;
}

void gpuq_error_clear(struct gpuq_error *err)
{
	if (err) {
		err->code = GPUQ_OK;
		err->message[0] = '\0';
	}
}

static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
#define GPUQ_DTYPE_ROW(name, str, size) [name] = { str, size },
	GPUQ_DTYPES(GPUQ_DTYPE_ROW)
#undef GPUQ_DTYPE_ROW
};

/* ", bytes, u8, ...": the list starts two characters in. */
static const char dtype_list[] =
#define GPUQ_DTYPE_LIST(name, str, size) ", " str
	GPUQ_DTYPES(GPUQ_DTYPE_LIST)
#undef GPUQ_DTYPE_LIST
	;

const char *gpuq_dtype_name(enum gpuq_dtype dtype)
{
	if ((unsigned)dtype >= GPUQ_DTYPE_COUNT)
		return "unknown";
	return dtypes[dtype].name;
}

/* 0 for a value outside the enum, so a bad dtype never sizes a buffer. */
size_t gpuq_dtype_size(enum gpuq_dtype dtype)
{
	if ((unsigned)dtype >= GPUQ_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

int gpuq_dtype_from_name(const char *s, size_t len, enum gpuq_dtype *out)
{
	for (int i = 0; i < GPUQ_DTYPE_COUNT; i++) {
		if (name_is(s, len, dtypes[i].name)) {
			*out = (enum gpuq_dtype)i;
			return 0;
		}
	}
	return -1;
}

const char *gpuq_dtype_list(void)
{
	return dtype_list + 2;
}

static const char *const job_state_names[] = {
#define GPUQ_JOB_STATE_NAME(name, str) [name] = str,
	GPUQ_JOB_STATES(GPUQ_JOB_STATE_NAME)
#undef GPUQ_JOB_STATE_NAME
};

bool gpuq_dtype_is_float(enum gpuq_dtype dtype)
{
	return dtype == GPUQ_DTYPE_F16 || dtype == GPUQ_DTYPE_BF16 || dtype == GPUQ_DTYPE_F32 ||
	       dtype == GPUQ_DTYPE_F64;
}

bool gpuq_f32_overflows(double v)
{
	/* FLT_MAX + 2^103, half an ulp above it, rounds to even: up, to infinity */
	return (v < 0 ? -v : v) >= 0x1.ffffffp+127;
}

void gpuq_format_number(char *out, size_t size, double v, bool f32)
{
	int max = f32 ? 9 : 17;
	for (int prec = f32 ? 6 : 15;; prec++) {
		snprintf(out, size, "%.*g", prec, v);
		double back = strtod(out, NULL);
		if (prec >= max || (f32 ? (float)back == (float)v : back == v))
			return;
	}
}

const char *gpuq_job_state_name(enum gpuq_job_state state)
{
	size_t n = sizeof job_state_names / sizeof job_state_names[0];
	if ((unsigned)state >= n)
		return "unknown";
	return job_state_names[state];
}

static const char *const priority_names[] = {
#define GPUQ_PRIORITY_NAME(name, str) [name] = str,
	GPUQ_PRIORITY_NAMES(GPUQ_PRIORITY_NAME)
#undef GPUQ_PRIORITY_NAME
};

const char *gpuq_priority_name(enum gpuq_priority priority)
{
	if ((unsigned)priority >= GPUQ_PRIORITIES)
		return "unknown";
	return priority_names[priority];
}

int gpuq_priority_from_name(const char *s, size_t len, enum gpuq_priority *out)
{
	for (int i = 0; i < GPUQ_PRIORITIES; i++) {
		if (strlen(priority_names[i]) == len && memcmp(priority_names[i], s, len) == 0) {
			*out = (enum gpuq_priority)i;
			return 0;
		}
	}
	return -1;
}

/*
 * The multiplier of a unit suffix, as the units' names say: "" or "B" is
 * bytes; K M G T P E (either case) alone or with "iB" are powers of 1024
 * (64K and 64KiB are 65536), and with "B" alone powers of 1000, SI's
 * (64KB is 64000). 0 if malformed.
 */
static uint64_t size_unit(const char *s)
{
	static const char letters[] = "kmgtpe";
	if (*s == '\0' || ((*s == 'B' || *s == 'b') && s[1] == '\0'))
		return 1;
	const char *at = strchr(letters, *s | 0x20); /* ASCII lower case */
	if (!at)
		return 0;
	unsigned power = (unsigned)(at - letters + 1);
	s++;
	bool iec = *s == 'i' || *s == 'I';
	if (iec)
		s++;
	bool bytes = *s == 'B' || *s == 'b';
	if (bytes)
		s++;
	if (*s != '\0' || (iec && !bytes)) /* "Ki" without the B */
		return 0;
	if (bytes && !iec) {
		uint64_t m = 1;
		while (power-- > 0)
			m *= 1000;
		return m;
	}
	return (uint64_t)1 << (10 * power);
}

/*
 * floor(0.DIGITS * mult), exactly and without floating point, working from
 * the last digit: floor((d + x) / 10) == floor((d + floor(x)) / 10) for an
 * integer d. With mult <= 2^60 (10^18 is less) nothing here can overflow.
 */
static uint64_t size_fraction(const char *digits, size_t n, uint64_t mult)
{
	uint64_t acc = 0;
	while (n-- > 0)
		acc = ((uint64_t)(digits[n] - '0') * mult + acc) / 10;
	return acc;
}

/*
 * Grammar: DIGITS [ "." DIGITS ] [ UNIT ]. No sign, no spaces. A fraction is
 * exact in whole bytes and rounded down below a byte ("1.5" is 1, "0.3K" is
 * 307), so "1.5G" means exactly 1610612736.
 */
int gpuq_parse_size(const char *s, uint64_t *out)
{
	if (!s || *s < '0' || *s > '9')
		return -1;
	uint64_t whole = 0;
	for (; *s >= '0' && *s <= '9'; s++) {
		uint64_t d = (uint64_t)(*s - '0');
		if (whole > (UINT64_MAX - d) / 10)
			return -1;
		whole = whole * 10 + d;
	}
	const char *frac = s;
	size_t nfrac = 0;
	if (*s == '.') {
		frac = ++s;
		while (*s >= '0' && *s <= '9')
			s++;
		nfrac = (size_t)(s - frac);
		if (nfrac == 0)
			return -1;
	}
	uint64_t mult = size_unit(s);
	if (mult == 0 || whole > UINT64_MAX / mult)
		return -1;
	/*
	 * No overflow check is needed here: whole * mult is at most
	 * UINT64_MAX - (mult - 1) and the fraction at most mult - 1.
	 */
	*out = whole * mult + size_fraction(frac, nfrac, mult);
	return 0;
}

void gpuq_format_uuid(char *out, size_t size, const unsigned char bytes[16])
{
	const unsigned char *b = bytes;
	snprintf(out, size,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
		 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
}
