/*
 * The gpuq wire contract, shared by the daemon, libgpuq and the tests.
 *
 * A frame is a 4-byte big-endian payload length followed by that many bytes
 * holding exactly one msgpack map. docs/protocol.md is the human spec of every
 * message; a change here changes it too.
 */
#ifndef GPUQ_PROTOCOL_H
#define GPUQ_PROTOCOL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUQ_PROTOCOL_VERSION 1
#define GPUQ_FRAME_HEADER_BYTES 4
#define GPUQ_DEFAULT_MAX_FRAME (1u << 20)
/* The smallest --max-frame accepted: every reply the daemon builds fits. */
#define GPUQ_MIN_MAX_FRAME 4096u
/* Descriptors that may ride on one request (SCM_RIGHTS). */
#define GPUQ_MAX_FDS_PER_REQUEST 4
/* The largest uid an `owner` field may name ((uid_t)-1 is no uid). */
#define GPUQ_MAX_UID 4294967294u

/*
 * Stable, machine-readable error codes. The string (second column) is what
 * travels on the wire; never renumber or rename an existing entry.
 */
#define GPUQ_ERRORS(X)                                                         \
	X(GPUQ_OK, "ok")                                                       \
	X(GPUQ_E_BAD_REQUEST, "bad_request")                                   \
	X(GPUQ_E_BAD_FRAME, "bad_frame")                                       \
	X(GPUQ_E_UNSUPPORTED_VERSION, "unsupported_version")                   \
	X(GPUQ_E_UNKNOWN_OP, "unknown_op")                                     \
	X(GPUQ_E_NOT_FOUND, "not_found")                                       \
	X(GPUQ_E_EXISTS, "exists")                                             \
	X(GPUQ_E_NO_DEVICE, "no_device")                                       \
	X(GPUQ_E_OUT_OF_MEMORY, "out_of_memory")                               \
	X(GPUQ_E_BUSY, "busy")                                                 \
	X(GPUQ_E_PERMISSION_DENIED, "permission_denied")                       \
	X(GPUQ_E_CANCELLED, "cancelled")                                       \
	X(GPUQ_E_TIMEOUT, "timeout")                                           \
	X(GPUQ_E_IO, "io_error")                                               \
	X(GPUQ_E_DEVICE_ERROR, "device_error")                                 \
	X(GPUQ_E_SHUTTING_DOWN, "shutting_down")                               \
	X(GPUQ_E_INTERNAL, "internal")                                         \
	X(GPUQ_E_RESTARTED, "restarted")

enum gpuq_errc {
#define GPUQ_ERRC_ENUM(name, str) name,
	GPUQ_ERRORS(GPUQ_ERRC_ENUM)
#undef GPUQ_ERRC_ENUM
	GPUQ_ERRC_COUNT
};

/* "bad_request" for GPUQ_E_BAD_REQUEST; "internal" for anything unknown. */
const char *gpuq_errc_name(enum gpuq_errc code);
/* The code whose wire name is s[0..len); GPUQ_E_INTERNAL if none matches. */
enum gpuq_errc gpuq_errc_from_name(const char *s, size_t len);

/* An error as it travels: a code and a message naming the thing and the fix. */
struct gpuq_error {
	enum gpuq_errc code;
	char message[512];
};

/* Sets err (if not NULL) and returns -1, so callers can `return gpuq_fail(...)`. */
int gpuq_fail(struct gpuq_error *err, enum gpuq_errc code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int gpuq_vfail(struct gpuq_error *err, enum gpuq_errc code, const char *fmt,
	       va_list ap) __attribute__((format(printf, 3, 0)));
void gpuq_error_clear(struct gpuq_error *err);

/* Element types of named buffers. "bytes" is the type of a buffer sized in bytes. */
#define GPUQ_DTYPES(X)                                                         \
	X(GPUQ_DTYPE_BYTES, "bytes", 1)                                        \
	X(GPUQ_DTYPE_U8, "u8", 1)                                              \
	X(GPUQ_DTYPE_I32, "i32", 4)                                            \
	X(GPUQ_DTYPE_I64, "i64", 8)                                            \
	X(GPUQ_DTYPE_F16, "f16", 2)                                            \
	X(GPUQ_DTYPE_BF16, "bf16", 2)                                          \
	X(GPUQ_DTYPE_F32, "f32", 4)                                            \
	X(GPUQ_DTYPE_F64, "f64", 8)

enum gpuq_dtype {
#define GPUQ_DTYPE_ENUM(name, str, size) name,
	GPUQ_DTYPES(GPUQ_DTYPE_ENUM)
#undef GPUQ_DTYPE_ENUM
	GPUQ_DTYPE_COUNT
};

const char *gpuq_dtype_name(enum gpuq_dtype dtype);
size_t gpuq_dtype_size(enum gpuq_dtype dtype);
/* 0 and *out set when s[0..len) names a dtype, -1 otherwise. */
int gpuq_dtype_from_name(const char *s, size_t len, enum gpuq_dtype *out);
/* "bytes, u8, i32, ..." for error messages. */
const char *gpuq_dtype_list(void);
/* f16, bf16, f32 and f64. */
bool gpuq_dtype_is_float(enum gpuq_dtype dtype);
/*
 * Whether the finite double v rounds to infinity as a float (binary32):
 * its magnitude is at least FLT_MAX plus half an ulp. Fill values and chain
 * constants that do are out of range (docs/protocol.md).
 */
bool gpuq_f32_overflows(double v);
/*
 * v as the shortest %g text that reads back as v (as a float when f32: at
 * most 9 digits, else 17), so that two numbers in a message never read
 * the same, as %g's six digits may. Assumes the C locale's decimal point.
 */
void gpuq_format_number(char *out, size_t size, double v, bool f32);

/* Job states as they travel ("queued", ...). */
#define GPUQ_JOB_STATES(X)                                                     \
	X(GPUQ_JOB_QUEUED, "queued")                                           \
	X(GPUQ_JOB_RUNNING, "running")                                         \
	X(GPUQ_JOB_DONE, "done")                                               \
	X(GPUQ_JOB_FAILED, "failed")                                           \
	X(GPUQ_JOB_CANCELLED, "cancelled")

enum gpuq_job_state {
#define GPUQ_JOB_STATE_ENUM(name, str) name,
	GPUQ_JOB_STATES(GPUQ_JOB_STATE_ENUM)
#undef GPUQ_JOB_STATE_ENUM
};

const char *gpuq_job_state_name(enum gpuq_job_state state);

/* Job priorities as they travel; a smaller value is more urgent. */
#define GPUQ_PRIORITY_NAMES(X)                                                 \
	X(GPUQ_PRIORITY_HIGH, "high")                                          \
	X(GPUQ_PRIORITY_NORMAL, "normal")                                      \
	X(GPUQ_PRIORITY_LOW, "low")

enum gpuq_priority {
#define GPUQ_PRIORITY_ENUM(name, str) name,
	GPUQ_PRIORITY_NAMES(GPUQ_PRIORITY_ENUM)
#undef GPUQ_PRIORITY_ENUM
	GPUQ_PRIORITIES
};

const char *gpuq_priority_name(enum gpuq_priority priority);
/* 0 and *out set when s[0..len) names a priority, -1 otherwise. */
int gpuq_priority_from_name(const char *s, size_t len, enum gpuq_priority *out);

/*
 * Parses a size such as "4096", "64K", "1.5G" or "2GiB" (powers of 1024).
 * Returns 0 and sets *out, or -1 on anything malformed or overflowing.
 */
int gpuq_parse_size(const char *s, uint64_t *out);

/*
 * A GPU's UUID as `devices` shows it and attach names it ("GPU-" and the
 * 16 bytes in nvidia-smi's grouping), so that a client finds the daemon's
 * device among its own.
 */
void gpuq_format_uuid(char *out, size_t size, const unsigned char bytes[16]);

#endif
