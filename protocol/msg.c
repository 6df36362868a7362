/*
 * Decoding frames (a limit-checking walk over the raw bytes, then msgpack-c)
 * and typed field access. Building maps is in mp.c, JSON output in json.c.
 *
 * Nothing here keeps state between calls: any thread may use it on objects it
 * owns. A decoded msg points into the bytes it was decoded from (msgpack-c's
 * msgpack_unpack_next does not copy strings), so those bytes must outlive it.
 */
#include "protocol/msg.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/frame.h"

const struct msg_limits msg_request_limits = {
	.max_depth = 4,
	.max_container = 256,
	.max_total_objects = 4096,
	.max_str = 64 * 1024,
};

/* ---- The limit walker ---------------------------------------------------- */

enum mp_kind { MP_SCALAR, MP_STR, MP_BIN, MP_EXT, MP_ARRAY, MP_MAP, MP_INVALID };

static const char *const mp_kind_names[] = {
	[MP_SCALAR] = "scalar", [MP_STR] = "str", [MP_BIN] = "bin",
	[MP_EXT] = "ext",       [MP_ARRAY] = "array", [MP_MAP] = "map",
	[MP_INVALID] = "invalid",
};

/*
 * What a format byte announces: lenbytes of big-endian length or count
 * follow it, then `fixed` more bytes (a scalar's value, or an ext's type
 * byte). For fix formats the length or count is n.
 */
struct mp_format {
	const char *name;
	enum mp_kind kind;
	uint8_t lenbytes;
	uint8_t fixed;
	uint8_t n;
};

/* Formats 0xc0..0xdf, the ones that are not a fix range. */
static const struct mp_format mp_formats[32] = {
	{ "nil", MP_SCALAR, 0, 0, 0 },      { "0xc1", MP_INVALID, 0, 0, 0 },
	{ "false", MP_SCALAR, 0, 0, 0 },    { "true", MP_SCALAR, 0, 0, 0 },
	{ "bin8", MP_BIN, 1, 0, 0 },        { "bin16", MP_BIN, 2, 0, 0 },
	{ "bin32", MP_BIN, 4, 0, 0 },       { "ext8", MP_EXT, 1, 1, 0 },
	{ "ext16", MP_EXT, 2, 1, 0 },       { "ext32", MP_EXT, 4, 1, 0 },
	{ "float32", MP_SCALAR, 0, 4, 0 },  { "float64", MP_SCALAR, 0, 8, 0 },
	{ "uint8", MP_SCALAR, 0, 1, 0 },    { "uint16", MP_SCALAR, 0, 2, 0 },
	{ "uint32", MP_SCALAR, 0, 4, 0 },   { "uint64", MP_SCALAR, 0, 8, 0 },
	{ "int8", MP_SCALAR, 0, 1, 0 },     { "int16", MP_SCALAR, 0, 2, 0 },
	{ "int32", MP_SCALAR, 0, 4, 0 },    { "int64", MP_SCALAR, 0, 8, 0 },
	{ "fixext1", MP_EXT, 0, 1, 1 },     { "fixext2", MP_EXT, 0, 1, 2 },
	{ "fixext4", MP_EXT, 0, 1, 4 },     { "fixext8", MP_EXT, 0, 1, 8 },
	{ "fixext16", MP_EXT, 0, 1, 16 },   { "str8", MP_STR, 1, 0, 0 },
	{ "str16", MP_STR, 2, 0, 0 },       { "str32", MP_STR, 4, 0, 0 },
	{ "array16", MP_ARRAY, 2, 0, 0 },   { "array32", MP_ARRAY, 4, 0, 0 },
	{ "map16", MP_MAP, 2, 0, 0 },       { "map32", MP_MAP, 4, 0, 0 },
};

static struct mp_format mp_format_of(uint8_t b)
{
	if (b <= 0x7f)
		return (struct mp_format){ "positive fixint", MP_SCALAR, 0, 0, 0 };
	if (b <= 0x8f)
		return (struct mp_format){ "fixmap", MP_MAP, 0, 0, b & 0x0f };
	if (b <= 0x9f)
		return (struct mp_format){ "fixarray", MP_ARRAY, 0, 0, b & 0x0f };
	if (b <= 0xbf)
		return (struct mp_format){ "fixstr", MP_STR, 0, 0, b & 0x1f };
	if (b >= 0xe0)
		return (struct mp_format){ "negative fixint", MP_SCALAR, 0, 0, 0 };
	return mp_formats[b - 0xc0];
}

/* Containers open at once in the common case; deeper limits use the heap. */
#define WALK_STACK 16

struct walk {
	const uint8_t *p;
	size_t len;
	size_t pos;
	const struct msg_limits *lim;
	struct gpuq_error *err;
	uint64_t owed;    /* objects announced but not yet read */
	uint64_t objects; /* objects read */
	size_t open;      /* containers with entries still to read */
	uint64_t *left;   /* per open container: entries (keys and values) to read */
};

static int walk_fail(struct walk *w, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int walk_fail(struct walk *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	gpuq_vfail(w->err, GPUQ_E_BAD_FRAME, fmt, ap);
	va_end(ap);
	return -1;
}

static uint32_t read_be(const uint8_t *p, unsigned n)
{
	uint32_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* A str, bin or ext body of n bytes, starting at w->pos. */
static int walk_bytes(struct walk *w, const struct mp_format *f, uint32_t n,
		      size_t at)
{
	const char *kind = mp_kind_names[f->kind];
	if (n > w->lim->max_str)
		return walk_fail(w, "%s of %" PRIu32 " bytes at byte %zu exceeds the limit of %" PRIu32,
				 kind, n, at, w->lim->max_str);
	if (n > w->len - w->pos)
		return walk_fail(w, "%s of %" PRIu32 " bytes at byte %zu runs past the end of the frame (%zu bytes remain)",
				 kind, n, at, w->len - w->pos);
	w->pos += n;
	return 0;
}

/*
 * A map or array header of n entries. Every object takes at least a byte, so
 * the bytes left must hold every object announced so far and not yet read:
 * that bounds what msgpack-c will allocate by the size of the frame.
 */
static int walk_container(struct walk *w, const struct mp_format *f,
			  uint32_t n, size_t at)
{
	const char *kind = mp_kind_names[f->kind];
	if (w->open + 1 > w->lim->max_depth)
		return walk_fail(w, "%s at byte %zu is nested %zu deep, beyond the limit of %" PRIu32,
				 kind, at, w->open + 1, w->lim->max_depth);
	if (n > w->lim->max_container)
		return walk_fail(w, "%s of %" PRIu32 " entries at byte %zu exceeds the limit of %" PRIu32,
				 kind, n, at, w->lim->max_container);
	uint64_t objects = f->kind == MP_MAP ? 2 * (uint64_t)n : n;
	w->owed += objects;
	if (w->owed > w->len - w->pos)
		return walk_fail(w, "%s of %" PRIu32 " entries at byte %zu cannot fit: %" PRIu64 " objects are due and only %zu bytes remain",
				 kind, n, at, w->owed, w->len - w->pos);
	if (objects > 0)
		w->left[w->open++] = objects;
	return 0;
}

/* Reads the object at w->pos, opening it if it is a non-empty container. */
static int walk_object(struct walk *w)
{
	size_t at = w->pos;
	if (at == w->len)
		return walk_fail(w, "the frame ends at byte %zu with %" PRIu64 " objects still due",
				 at, w->owed);
	struct mp_format f = mp_format_of(w->p[at]);
	if (f.kind == MP_INVALID)
		return walk_fail(w, "byte %zu is 0xc1, which is not a msgpack format", at);
	if (++w->objects > w->lim->max_total_objects)
		return walk_fail(w, "object at byte %zu is one more than the limit of %" PRIu32 " objects",
				 at, w->lim->max_total_objects);
	size_t head = 1u + f.lenbytes + f.fixed;
	if (head > w->len - at)
		return walk_fail(w, "%s at byte %zu is truncated: it needs %zu bytes and %zu remain",
				 f.name, at, head, w->len - at);
	uint32_t n = f.lenbytes ? read_be(w->p + at + 1, f.lenbytes) : f.n;
	w->pos = at + head;
	w->owed--;
	switch (f.kind) {
	case MP_STR:
	case MP_BIN:
	case MP_EXT:
		return walk_bytes(w, &f, n, at);
	case MP_ARRAY:
	case MP_MAP:
		return walk_container(w, &f, n, at);
	default:
		return 0;
	}
}

/* Reads objects until the root is complete. */
static int walk_root(struct walk *w)
{
	do {
		if (w->open > 0)
			w->left[w->open - 1]--;
		if (walk_object(w) < 0)
			return -1;
		while (w->open > 0 && w->left[w->open - 1] == 0)
			w->open--;
	} while (w->open > 0);
	return 0;
}

int msg_check_limits(const void *data, size_t len, const struct msg_limits *lim,
		     struct gpuq_error *err)
{
	if (len == 0)
		return gpuq_fail(err, GPUQ_E_BAD_FRAME,
				 "empty payload: expected one msgpack object");
	uint64_t stack[WALK_STACK];
	struct walk w = { .p = data, .len = len, .lim = lim, .err = err,
			  .owed = 1, .left = stack };
	/* Nesting can exceed neither the limit nor the number of bytes. */
	size_t need = lim->max_depth < len ? lim->max_depth : len;
	if (need > WALK_STACK && !(w.left = malloc(need * sizeof *w.left)))
		return gpuq_fail(err, GPUQ_E_BAD_FRAME,
				 "out of memory checking a frame of %zu bytes", len);
	int rc = walk_root(&w);
	if (rc == 0 && w.pos != len)
		rc = walk_fail(&w, "%zu trailing bytes after the object that ends at byte %zu",
			       len - w.pos, w.pos);
	if (w.left != stack)
		free(w.left);
	return rc;
}

/* ---- Decoding ------------------------------------------------------------ */

static const char *obj_type_name(msgpack_object_type t)
{
	switch (t) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "unsigned integer";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative integer";
	case MSGPACK_OBJECT_FLOAT32: return "float32";
	case MSGPACK_OBJECT_FLOAT64: return "float64";
	case MSGPACK_OBJECT_STR: return "str";
	case MSGPACK_OBJECT_ARRAY: return "array";
	case MSGPACK_OBJECT_MAP: return "map";
	case MSGPACK_OBJECT_BIN: return "bin";
	case MSGPACK_OBJECT_EXT: return "ext";
	}
	return "unknown type";
}

int msg_decode(struct msg *m, const void *data, size_t len,
	       const struct msg_limits *lim, struct gpuq_error *err)
{
	if (msg_check_limits(data, len, lim, err) < 0)
		return -1;
	msgpack_unpacked_init(&m->unpacked);
	size_t off = 0;
	msgpack_unpack_return rc =
		msgpack_unpack_next(&m->unpacked, data, len, &off);
	if (rc != MSGPACK_UNPACK_SUCCESS || off != len) {
		msgpack_unpacked_destroy(&m->unpacked);
		return gpuq_fail(err, GPUQ_E_BAD_FRAME,
				 "msgpack-c could not unpack the frame (%s, %zu of %zu bytes read)",
				 rc == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "parse error",
				 off, len);
	}
	if (m->unpacked.data.type != MSGPACK_OBJECT_MAP) {
		const char *type = obj_type_name(m->unpacked.data.type);
		msgpack_unpacked_destroy(&m->unpacked);
		return gpuq_fail(err, GPUQ_E_BAD_FRAME,
				 "the frame's root is a msgpack %s; requests and replies are maps",
				 type);
	}
	m->root = &m->unpacked.data;
	return 0;
}

void msg_free(struct msg *m)
{
	msgpack_unpacked_destroy(&m->unpacked);
	m->root = NULL;
}

/* ---- Duplicate keys ------------------------------------------------------ */

/* Names key k for a message: the string itself, or its type. */
static void key_label(const msgpack_object *k, char *out, size_t size)
{
	if (k->type == MSGPACK_OBJECT_STR)
		snprintf(out, size, "'%.*s'", (int)(k->via.str.size < 200 ? k->via.str.size : 200),
			 k->via.str.ptr);
	else
		snprintf(out, size, "of type %s", obj_type_name(k->type));
}

/* msgpack_object_equal, with the common case first: string keys compared by length, then bytes. */
static bool keys_equal(const msgpack_object *a, const msgpack_object *b)
{
	if (a->type == MSGPACK_OBJECT_STR && b->type == MSGPACK_OBJECT_STR)
		return a->via.str.size == b->via.str.size &&
		       (a->via.str.size == 0 || /* an empty string's ptr may be NULL */
			memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
	return msgpack_object_equal(*a, *b);
}

int msg_check_unique_keys(const msgpack_object *o, struct gpuq_error *err)
{
	if (o->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < o->via.array.size; i++)
			if (msg_check_unique_keys(&o->via.array.ptr[i], err) < 0)
				return -1;
		return 0;
	}
	if (o->type != MSGPACK_OBJECT_MAP)
		return 0;
	const msgpack_object_kv *kv = o->via.map.ptr;
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		for (uint32_t j = 0; j < i; j++) {
			if (!keys_equal(&kv[i].key, &kv[j].key))
				continue;
			char label[224];
			key_label(&kv[i].key, label, sizeof label);
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "a map has the key %s twice; give each key once", label);
		}
		if (msg_check_unique_keys(&kv[i].val, err) < 0)
			return -1;
	}
	return 0;
}

/* ---- Field access -------------------------------------------------------- */

/* The first entry whose key is the str `key`: duplicates are not merged. */
const msgpack_object *msg_map_get(const msgpack_object *map, const char *key)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	size_t klen = strlen(key);
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
		    (klen == 0 || memcmp(k->via.str.ptr, key, klen) == 0))
			return &map->via.map.ptr[i].val;
	}
	return NULL;
}

/* The value of key, or NULL when absent or nil (the same to every getter). */
static const msgpack_object *field(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = msg_map_get(map, key);
	return o && o->type == MSGPACK_OBJECT_NIL ? NULL : o;
}

static int wrong_type(struct gpuq_error *err, const char *key,
		      const char *expected, const msgpack_object *o)
{
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': expected %s, got %s",
			 key, expected, obj_type_name(o->type));
}

int msg_get_str(const msgpack_object *map, const char *key, char *out,
		size_t outsz, struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type != MSGPACK_OBJECT_STR)
		return wrong_type(err, key, "a string", o);
	uint32_t n = o->via.str.size;
	if (outsz == 0 || n > outsz - 1)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': a string of %" PRIu32 " bytes is too long (at most %zu)",
				 key, n, outsz ? outsz - 1 : 0);
	const char *nul = n ? memchr(o->via.str.ptr, '\0', n) : NULL;
	if (nul)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': the string has a NUL byte at offset %td",
				 key, nul - o->via.str.ptr);
	if (n)
		memcpy(out, o->via.str.ptr, n);
	out[n] = '\0';
	return 1;
}

int msg_get_u64(const msgpack_object *map, const char *key, uint64_t *out,
		struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': expected an unsigned integer, got %" PRId64,
				 key, o->via.i64);
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return wrong_type(err, key, "an unsigned integer", o);
	*out = o->via.u64;
	return 1;
}

int msg_get_u64_in(const msgpack_object *map, const char *key, uint64_t lo, uint64_t hi,
		   uint64_t *out, struct gpuq_error *err)
{
	uint64_t v;
	int rc = msg_get_u64(map, key, &v, err);
	if (rc <= 0)
		return rc;
	if (v < lo || v > hi)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': %" PRIu64 " is out of range (%" PRIu64 " to %" PRIu64 ")",
				 key, v, lo, hi);
	*out = v;
	return 1;
}

int msg_get_i64(const msgpack_object *map, const char *key, int64_t *out,
		struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*out = o->via.i64;
		return 1;
	}
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return wrong_type(err, key, "an integer", o);
	if (o->via.u64 > INT64_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': %" PRIu64 " is out of range (at most %" PRId64 ")",
				 key, o->via.u64, INT64_MAX);
	*out = (int64_t)o->via.u64;
	return 1;
}

int msg_get_f64(const msgpack_object *map, const char *key, double *out,
		struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		*out = (double)o->via.u64;
		return 1;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		*out = (double)o->via.i64;
		return 1;
	case MSGPACK_OBJECT_FLOAT32: /* msgpack-c widens float32 into f64 */
	case MSGPACK_OBJECT_FLOAT64:
		*out = o->via.f64;
		return 1;
	default:
		return wrong_type(err, key, "a number", o);
	}
}

int msg_get_bool(const msgpack_object *map, const char *key, bool *out,
		 struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type != MSGPACK_OBJECT_BOOLEAN)
		return wrong_type(err, key, "a bool", o);
	*out = o->via.boolean;
	return 1;
}

int msg_get_array(const msgpack_object *map, const char *key,
		  const msgpack_object **out, struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type != MSGPACK_OBJECT_ARRAY)
		return wrong_type(err, key, "an array", o);
	*out = o;
	return 1;
}

int msg_get_map(const msgpack_object *map, const char *key,
		const msgpack_object **out, struct gpuq_error *err)
{
	const msgpack_object *o = field(map, key);
	if (!o)
		return 0;
	if (o->type != MSGPACK_OBJECT_MAP)
		return wrong_type(err, key, "a map", o);
	*out = o;
	return 1;
}
