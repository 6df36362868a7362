/*
 * A request's arguments, declared as data and decoded once.
 *
 * Each op declares its fields in a table (struct args_field): the key, the
 * type, whether it is required, its limits, and where its value goes in
 * that op's own argument struct. args_decode walks the table in order,
 * once, and fills the struct: plain values are type-checked, and the
 * fields that name something (a buffer, the owner, a device, a device
 * list) are resolved, so that the handler receives a `struct buffer *` or
 * a checked device index, never the request's map.
 *
 * The table's order is the order in which errors are found: the first
 * field that is wrong decides the reply, as the hand-written readers did.
 * A field's `when` skips it (a field another field makes meaningless is
 * not read at all, so a wrong type there is no error), and its `then`
 * runs a check of the op's own right after it, so that checks that span
 * fields come at the point where the readers made them.
 *
 * Defaults are an instance of the op's struct (args_spec.defaults), copied
 * in before decoding; without one the struct starts zeroed.
 * Main thread only.
 */
#ifndef GPUQ_ARGS_H
#define GPUQ_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/buffer.h"
#include "protocol/protocol.h"
#include "workers/backend/backend.h" /* GPUQ_MAX_DEVICES */

struct request;

enum args_type {
	ARGS_BOOL,    /* bool */
	ARGS_U64,     /* uint64_t; with lo < hi, out of [lo, hi] is a bad_request */
	ARGS_I64,     /* int64_t */
	ARGS_F64,     /* double (integers too) */
	ARGS_NUMBER,  /* struct args_number: a number, and whether it is an integer */
	ARGS_STR,     /* char[size], NUL-terminated; too long or holding a NUL: bad_request */
	ARGS_ARRAY,   /* const msgpack_object * (an array) pointing into the request */
	ARGS_MAP,     /* const msgpack_object * (a map) pointing into the request */
	ARGS_PRESENT, /* bool: the key is given (not nil), whatever its type: checked later */
	ARGS_ENUM,    /* int: the index of the string in names[]; else bad_name */
	ARGS_OWNER,   /* uid_t: whose namespace names resolve in (root may name another) */
	ARGS_DEVICE,  /* int: one of this daemon's devices, else not_found */
	ARGS_DEVICES, /* struct args_devices: 1 to count distinct devices */
	ARGS_BUFFER,  /* struct args_buffer: NAME[@GPU][[START:STOP]], resolved and usable */
	ARGS_BUFFER_NAME, /* struct args_buffer: NAME or NAME@GPU (no range), resolved and usable */
};

/* ARGS_FIELD flags */
#define ARGS_REQUIRED 0x1u   /* absent (or nil) is a bad_request: `missing`, or a message of the type's */
#define ARGS_ANY_STATE 0x2u  /* ARGS_BUFFER*: resolved whatever its state (not checked usable) */
#define ARGS_LOST_OK 0x4u    /* ARGS_BUFFER*: usable, or lost to a device reset */
#define ARGS_KEY_NAMED 0x8u  /* ARGS_BUFFER*: a refusal other than bad_request starts "field 'KEY': " */
#define ARGS_OF_REGIONS 0x10u /* ARGS_OWNER: it names regions, not buffers (its refusal says so) */

struct args_number {
	double f;
	bool is_int; /* an integer that fits in int64_t: i holds it exactly */
	int64_t i;
	bool is_u64; /* an integer above INT64_MAX: u holds it exactly */
	uint64_t u;
};

struct args_devices {
	int dev[GPUQ_MAX_DEVICES];
	int n; /* 0 when absent */
};

struct args_buffer {
	struct buffer *b;
	struct buffer_ref ref; /* as parsed: name, @GPU, range */
};

struct args_field {
	const char *key;
	enum args_type type;
	unsigned flags;
	size_t at;       /* offsetof the value in the op's struct */
	size_t size;     /* its size (ARGS_STR: the char array's) */
	size_t given_at; /* 1 + offsetof a bool set when the field is given; 0: none */
	uint64_t lo, hi; /* ARGS_U64 limits, when lo < hi */
	const char *missing;      /* the whole message when required and absent */
	const char *const *names; /* ARGS_ENUM: the accepted strings, NULL-terminated */
	const char *bad_name;     /* ARGS_ENUM: message for another string, with one %s */
	size_t strsize;           /* ARGS_ENUM: the longest string read + 1 (too long: bad_request) */
	/* Decoded only when this says so, given what is decoded so far; NULL: always. */
	bool (*when)(const void *args);
	/* Runs right after the field is decoded (given or not): 0, or -1 with err. */
	int (*then)(struct request *req, void *args, struct gpuq_error *err);
};

/* An op's whole argument declaration: its fields, its struct's size and defaults. */
struct args_spec {
	const struct args_field *fields;
	size_t nfields;
	size_t size;
	const void *defaults; /* NULL: zeroed */
};

/*
 * The largest argument struct any op may declare (request.c keeps it on the
 * stack): run's holds an expression's text (4 KiB) and its parsed program.
 */
#define ARGS_MAX_SIZE 16384

/*
 * Table-writing helpers. ARGS_AT places a field at member of type T;
 * ARGS_GIVEN records presence in the bool member g; ARGS_SPEC builds the
 * spec of an op from its struct type, field table and defaults.
 */
#define ARGS_AT(T, member) .at = offsetof(T, member), .size = sizeof(((T *)0)->member)
#define ARGS_GIVEN(T, g) .given_at = offsetof(T, g) + 1
#define ARGS_SPEC(T, fields_, defaults_) \
	{ (fields_), sizeof(fields_) / sizeof((fields_)[0]), sizeof(T), (defaults_) }
#define ARGS_NONE { NULL, 0, 0, NULL }

/*
 * Fills out (spec->size bytes) from req's map, field by field in table
 * order. 0, or -1 with err: the first field that is wrong, worded as the
 * protocol's getters and readers word it (docs/protocol.md).
 */
int args_decode(struct request *req, const struct args_spec *spec, void *out,
		struct gpuq_error *err);

/*
 * 0 if spec is well formed (every slot the size its type writes, inside
 * the struct; enums with their names), else -1 with err naming the field.
 * The unit tests check every op's spec with it.
 */
int args_spec_check(const struct args_spec *spec, struct gpuq_error *err);

/*
 * The resolutions args_decode makes, for callers that still read a field
 * by hand. Each returns 1 when the field is given, 0 when absent, -1 with err.
 */
/* things: what the owner's namespace holds here ("buffers", "regions"), for the refusal */
int args_owner(struct request *req, const char *things, uid_t *owner, struct gpuq_error *err);
int args_device(struct request *req, const char *key, bool required, int *device,
		struct gpuq_error *err);
int args_devices(struct request *req, const char *key, struct args_devices *out,
		 struct gpuq_error *err);
int args_buffer(struct request *req, const char *key, bool with_range, unsigned flags,
		struct args_buffer *out, struct gpuq_error *err);

/* err's message prefixed with "field 'KEY': ", its code kept; -1. */
int args_key_named(const char *key, struct gpuq_error *err);
/*
 * Device d is one of this daemon's: 0, or -1 with not_found "device 99
 * does not exist (devices: 0-7)", the words every op uses for a `device`,
 * an entry of `devices` and the @GPU of a name (docs/protocol.md).
 */
int args_device_check(struct request *req, uint64_t d, struct gpuq_error *err);
/*
 * The buffer NAME (device -1) or NAME@device of owner, whatever its state,
 * or NULL with err: a device that does not exist is said to, before any
 * buffer is looked for.
 */
struct buffer *args_resolve(struct request *req, uid_t owner, const char *name, int device,
			    struct gpuq_error *err);

#endif
