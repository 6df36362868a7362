/*
 * Decoding a frame's msgpack map, and building maps to send.
 *
 * msgpack-c's unpacker trusts the counts in array and map headers: five bytes
 * can ask it to allocate a 96 GB array. msg_decode therefore walks the raw
 * bytes first (msg_check_limits) and refuses anything over the limits, or any
 * count that the remaining bytes cannot possibly hold, before the unpacker
 * sees it.
 */
#ifndef GPUQ_MSG_H
#define GPUQ_MSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "protocol.h"

struct msg_limits {
	uint32_t max_depth;         /* nesting of maps/arrays; the root map is depth 1 */
	uint32_t max_container;     /* entries in one map or array */
	uint32_t max_total_objects; /* objects in the whole frame */
	uint32_t max_str;           /* bytes in one str/bin/ext */
};

/* Limits for requests: depth 4, 256 entries, 4096 objects, 64 KiB strings. */
extern const struct msg_limits msg_request_limits;

/*
 * Checks that data[0..len) is exactly one msgpack object within the limits.
 * Returns 0, or -1 with err set to GPUQ_E_BAD_FRAME and what was wrong, and where.
 */
int msg_check_limits(const void *data, size_t len, const struct msg_limits *lim,
		     struct gpuq_error *err);

/* A decoded frame whose root is a map. */
struct msg {
	msgpack_unpacked unpacked;
	const msgpack_object *root; /* MSGPACK_OBJECT_MAP */
};

/*
 * Checks limits, unpacks with msgpack-c and requires a map at the root.
 * On success the msg must be released with msg_free. On failure err is a
 * GPUQ_E_BAD_FRAME and nothing needs freeing.
 * Strings, bins and exts in the msg point into data (msgpack-c does not copy
 * them): data must stay valid and unchanged until msg_free.
 */
int msg_decode(struct msg *m, const void *data, size_t len,
	       const struct msg_limits *lim, struct gpuq_error *err);
void msg_free(struct msg *m);

/*
 * 0 if no map in o (o itself, or any map or array nested in it) has the same
 * key twice; else -1 with a bad_request naming the key. A request is refused
 * rather than read with one of two values for a key.
 */
int msg_check_unique_keys(const msgpack_object *o, struct gpuq_error *err);

/* The value under key in map, or NULL. map must be a MAP object. */
const msgpack_object *msg_map_get(const msgpack_object *map, const char *key);

/*
 * Typed field access. Each returns 1 when the field is present and has the
 * right type (value stored), 0 when absent (or nil, which the protocol
 * defines as absent; nothing stored), and -1
 * with err set to GPUQ_E_BAD_REQUEST naming the field and the type expected
 * when it is present with another type or out of range.
 * Strings are not NUL-terminated in the frame: msg_get_str copies into out
 * (size outsz, NUL-terminated) and fails if the string does not fit or
 * contains a NUL byte.
 */
int msg_get_str(const msgpack_object *map, const char *key, char *out,
		size_t outsz, struct gpuq_error *err);
int msg_get_u64(const msgpack_object *map, const char *key, uint64_t *out,
		struct gpuq_error *err);
/* msg_get_u64, and a value outside [lo, hi] is a bad_request naming the field and the range. */
int msg_get_u64_in(const msgpack_object *map, const char *key, uint64_t lo, uint64_t hi,
		   uint64_t *out, struct gpuq_error *err);
int msg_get_i64(const msgpack_object *map, const char *key, int64_t *out,
		struct gpuq_error *err);
/* Accepts integers and floats. */
int msg_get_f64(const msgpack_object *map, const char *key, double *out,
		struct gpuq_error *err);
int msg_get_bool(const msgpack_object *map, const char *key, bool *out,
		 struct gpuq_error *err);
/* Arrays and maps: *out points into the message. */
int msg_get_array(const msgpack_object *map, const char *key,
		  const msgpack_object **out, struct gpuq_error *err);
int msg_get_map(const msgpack_object *map, const char *key,
		const msgpack_object **out, struct gpuq_error *err);

/*
 * Building a map whose entry count is not known in advance: entries are
 * packed into a body buffer and counted, and mp_map_finish writes the map
 * header before them. A nested map or array is built separately and put in
 * whole (mp_put_map / mp_put_array consume the child).
 * pk points at body, so an initialised mp_map or mp_array must not be copied
 * or moved. Running out of memory while building aborts (see msg.c).
 * Strings (mp_put_str, mp_put_strn, mp_array_str) are written as valid UTF-8:
 * a byte that is not part of a valid sequence becomes the text \xNN.
 */
struct mp_map {
	msgpack_sbuffer body;
	msgpack_packer pk;
	uint32_t count;
};

struct mp_array {
	msgpack_sbuffer body;
	msgpack_packer pk;
	uint32_t count;
};

void mp_map_init(struct mp_map *m);
void mp_map_destroy(struct mp_map *m);
void mp_put_str(struct mp_map *m, const char *key, const char *val);
void mp_put_strn(struct mp_map *m, const char *key, const char *val, size_t len);
void mp_put_u64(struct mp_map *m, const char *key, uint64_t val);
void mp_put_i64(struct mp_map *m, const char *key, int64_t val);
void mp_put_f64(struct mp_map *m, const char *key, double val);
void mp_put_bool(struct mp_map *m, const char *key, bool val);
void mp_put_nil(struct mp_map *m, const char *key);
/* Bytes as they are (msgpack bin), e.g. a request kept whole. */
void mp_put_bin(struct mp_map *m, const char *key, const void *val, size_t len);
void mp_put_map(struct mp_map *m, const char *key, struct mp_map *child);
void mp_put_array(struct mp_map *m, const char *key, struct mp_array *child);
/*
 * Copies a decoded object (e.g. a stored result map) in as the value of key,
 * as it is: its strings are not checked for UTF-8 as mp_put_str's are.
 */
void mp_put_object(struct mp_map *m, const char *key, const msgpack_object *obj);

void mp_array_init(struct mp_array *a);
void mp_array_destroy(struct mp_array *a);
void mp_array_str(struct mp_array *a, const char *val);
void mp_array_u64(struct mp_array *a, uint64_t val);
void mp_array_i64(struct mp_array *a, int64_t val);
void mp_array_f64(struct mp_array *a, double val);
void mp_array_bool(struct mp_array *a, bool val);
void mp_array_map(struct mp_array *a, struct mp_map *child);
void mp_array_array(struct mp_array *a, struct mp_array *child);

/*
 * Appends the finished map (header + entries) to out and destroys m.
 * mp_map_frame does the same preceded by the 4-byte frame header.
 */
void mp_map_finish(struct mp_map *m, msgpack_sbuffer *out);
void mp_map_frame(struct mp_map *m, msgpack_sbuffer *out);

/*
 * Writes obj as JSON (strings escaped, bin as base16 strings, map keys as
 * strings). Used by the CLI's --json and by the tests.
 */
void msg_print_json(FILE *f, const msgpack_object *obj);

#endif
