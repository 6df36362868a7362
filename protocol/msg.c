/*
 * Decoding frames (a limit-checking walk over the raw bytes, then msgpack-c),
 * typed field access, building maps, and JSON output.
 *
 * Nothing here keeps state between calls: any thread may use it on objects it
 * owns. A decoded msg points into the bytes it was decoded from (msgpack-c's
 * msgpack_unpack_next does not copy strings), so those bytes must outlive it.
 */
#include "protocol/msg.h"

#include <inttypes.h>
#include <math.h>
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

/* ---- Building ------------------------------------------------------------ */

/*
 * The packers' sink. A message cannot be half-built and still be sent, and
 * the builders return nothing, so running out of memory here is fatal, as
 * with xmalloc in tmux or zmalloc in Redis.
 */
static int mp_write(void *data, const char *buf, size_t len)
{
	if (msgpack_sbuffer_write(data, buf, len) != 0) {
		fprintf(stderr, "gpuq: out of memory building a message (%zu more bytes)\n",
			len);
		abort();
	}
	return 0;
}

static void mp_key(msgpack_packer *pk, const char *key)
{
	msgpack_pack_str_with_body(pk, key, strlen(key));
}

/* Appends a container header for count entries, then body, to out. */
static void mp_emit(msgpack_sbuffer *out, bool map, uint32_t count,
		    const msgpack_sbuffer *body)
{
	msgpack_packer pk;
	msgpack_packer_init(&pk, out, mp_write);
	if (map)
		msgpack_pack_map(&pk, count);
	else
		msgpack_pack_array(&pk, count);
	mp_write(out, body->data, body->size);
}

void mp_map_init(struct mp_map *m)
{
	msgpack_sbuffer_init(&m->body);
	msgpack_packer_init(&m->pk, &m->body, mp_write);
	m->count = 0;
}

/* Safe to call twice: the body is left empty. */
void mp_map_destroy(struct mp_map *m)
{
	msgpack_sbuffer_destroy(&m->body);
	msgpack_sbuffer_init(&m->body);
	m->count = 0;
}

/* A NULL val is packed as nil rather than crashing the daemon. */
void mp_put_str(struct mp_map *m, const char *key, const char *val)
{
	if (!val) {
		mp_put_nil(m, key);
		return;
	}
	mp_put_strn(m, key, val, strlen(val));
}

void mp_put_strn(struct mp_map *m, const char *key, const char *val, size_t len)
{
	mp_key(&m->pk, key);
	msgpack_pack_str_with_body(&m->pk, val, len);
	m->count++;
}

void mp_put_u64(struct mp_map *m, const char *key, uint64_t val)
{
	mp_key(&m->pk, key);
	msgpack_pack_uint64(&m->pk, val);
	m->count++;
}

void mp_put_i64(struct mp_map *m, const char *key, int64_t val)
{
	mp_key(&m->pk, key);
	msgpack_pack_int64(&m->pk, val);
	m->count++;
}

void mp_put_f64(struct mp_map *m, const char *key, double val)
{
	mp_key(&m->pk, key);
	msgpack_pack_double(&m->pk, val);
	m->count++;
}

void mp_put_bool(struct mp_map *m, const char *key, bool val)
{
	mp_key(&m->pk, key);
	if (val)
		msgpack_pack_true(&m->pk);
	else
		msgpack_pack_false(&m->pk);
	m->count++;
}

void mp_put_nil(struct mp_map *m, const char *key)
{
	mp_key(&m->pk, key);
	msgpack_pack_nil(&m->pk);
	m->count++;
}

void mp_put_map(struct mp_map *m, const char *key, struct mp_map *child)
{
	mp_key(&m->pk, key);
	mp_map_finish(child, &m->body);
	m->count++;
}

void mp_put_array(struct mp_map *m, const char *key, struct mp_array *child)
{
	mp_key(&m->pk, key);
	mp_emit(&m->body, false, child->count, &child->body);
	mp_array_destroy(child);
	m->count++;
}

void mp_put_object(struct mp_map *m, const char *key, const msgpack_object *obj)
{
	mp_key(&m->pk, key);
	msgpack_pack_object(&m->pk, *obj);
	m->count++;
}

void mp_array_init(struct mp_array *a)
{
	msgpack_sbuffer_init(&a->body);
	msgpack_packer_init(&a->pk, &a->body, mp_write);
	a->count = 0;
}

void mp_array_destroy(struct mp_array *a)
{
	msgpack_sbuffer_destroy(&a->body);
	msgpack_sbuffer_init(&a->body);
	a->count = 0;
}

void mp_array_str(struct mp_array *a, const char *val)
{
	if (val)
		msgpack_pack_str_with_body(&a->pk, val, strlen(val));
	else
		msgpack_pack_nil(&a->pk);
	a->count++;
}

void mp_array_u64(struct mp_array *a, uint64_t val)
{
	msgpack_pack_uint64(&a->pk, val);
	a->count++;
}

void mp_array_i64(struct mp_array *a, int64_t val)
{
	msgpack_pack_int64(&a->pk, val);
	a->count++;
}

void mp_array_f64(struct mp_array *a, double val)
{
	msgpack_pack_double(&a->pk, val);
	a->count++;
}

void mp_array_bool(struct mp_array *a, bool val)
{
	if (val)
		msgpack_pack_true(&a->pk);
	else
		msgpack_pack_false(&a->pk);
	a->count++;
}

void mp_array_map(struct mp_array *a, struct mp_map *child)
{
	mp_map_finish(child, &a->body);
	a->count++;
}

void mp_array_array(struct mp_array *a, struct mp_array *child)
{
	mp_emit(&a->body, false, child->count, &child->body);
	mp_array_destroy(child);
	a->count++;
}

void mp_map_finish(struct mp_map *m, msgpack_sbuffer *out)
{
	mp_emit(out, true, m->count, &m->body);
	mp_map_destroy(m);
}

/* Reserves the frame header, appends the map, then fills the header in. */
void mp_map_frame(struct mp_map *m, msgpack_sbuffer *out)
{
	static const char zero[GPUQ_FRAME_HEADER_BYTES];
	size_t at = out->size;
	mp_write(out, zero, sizeof zero);
	mp_map_finish(m, out);
	size_t n = out->size - at - sizeof zero;
	if (n > UINT32_MAX) {
		/* Nothing the daemon builds comes near; the 4-byte header cannot say it. */
		fprintf(stderr, "gpuq: a message of %zu bytes cannot be framed\n", n);
		abort();
	}
	frame_put_header((uint8_t *)out->data + at, (uint32_t)n);
}

/* ---- JSON ---------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0. */
static size_t utf8_seq(const uint8_t *p, size_t n)
{
	uint32_t cp, min;
	size_t len;
	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		len = 2;
		cp = p[0] & 0x1fu;
		min = 0x80;
	} else if ((p[0] & 0xf0) == 0xe0) {
		len = 3;
		cp = p[0] & 0x0fu;
		min = 0x800;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		len = 4;
		cp = p[0] & 0x07u;
		min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3fu);
	}
	/* Overlong forms, UTF-16 surrogates and beyond U+10FFFF are invalid. */
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* One ASCII character inside a JSON string. */
static void json_char(FILE *f, uint8_t c)
{
	if (c == '"' || c == '\\') {
		putc('\\', f);
		putc(c, f);
	} else if (c == '\n') {
		fputs("\\n", f);
	} else if (c == '\r') {
		fputs("\\r", f);
	} else if (c == '\t') {
		fputs("\\t", f);
	} else if (c < 0x20 || c == 0x7f) {
		fprintf(f, "\\u%04x", c); /* DEL too, for terminals */
	} else {
		putc(c, f);
	}
}

/*
 * A JSON string. JSON text must be Unicode, and a msgpack str may hold any
 * bytes: each byte that does not start valid UTF-8 becomes U+FFFD.
 */
static void json_str(FILE *f, const char *s, size_t n)
{
	const uint8_t *p = (const uint8_t *)s;
	putc('"', f);
	for (size_t i = 0; i < n;) {
		size_t len = utf8_seq(p + i, n - i);
		if (len == 0) {
			fputs("\\ufffd", f);
			len = 1;
		} else if (len == 1) {
			json_char(f, p[i]);
		} else {
			fwrite(p + i, 1, len, f);
		}
		i += len;
	}
	putc('"', f);
}

static void json_hex(FILE *f, const char *s, size_t n)
{
	putc('"', f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%02x", (unsigned char)s[i]);
	putc('"', f);
}

/*
 * The shortest %g form that reads back as the same value (a float32 need
 * only round-trip as a float). Non-finite values have no JSON form: null.
 * Assumes the C locale's decimal point, as the CLI never sets another.
 */
static void json_number(FILE *f, double d, bool f32)
{
	if (!isfinite(d)) {
		fputs("null", f);
		return;
	}
	char buf[40];
	int prec = f32 ? 6 : 15, max = f32 ? 9 : 17;
	for (;; prec++) {
		snprintf(buf, sizeof buf, "%.*g", prec, d);
		double back = strtod(buf, NULL);
		if (prec == max || (f32 ? (float)back == (float)d : back == d))
			break;
	}
	fputs(buf, f);
}

static void json_value(FILE *f, const msgpack_object *o, bool in_key);

/*
 * JSON keys are strings: a str is itself, a bin its hex, and anything else
 * the text of its JSON form, escaped once. Keys nested inside that text are
 * written as plain JSON values, not escaped again: re-escaping at every level
 * would double the output per level (found by fuzzing).
 */
static void json_key(FILE *f, const msgpack_object *k)
{
	if (k->type == MSGPACK_OBJECT_STR) {
		json_str(f, k->via.str.ptr, k->via.str.size);
		return;
	}
	if (k->type == MSGPACK_OBJECT_BIN) {
		json_hex(f, k->via.bin.ptr, k->via.bin.size);
		return;
	}
	char *text = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&text, &len);
	if (!mem) {
		fputs("\"?\"", f);
		return;
	}
	json_value(mem, k, true);
	fclose(mem);
	json_str(f, text, len);
	free(text);
}

static void json_container(FILE *f, const msgpack_object *o, bool in_key)
{
	if (o->type == MSGPACK_OBJECT_ARRAY) {
		putc('[', f);
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			if (i)
				putc(',', f);
			json_value(f, &o->via.array.ptr[i], in_key);
		}
		putc(']', f);
		return;
	}
	putc('{', f);
	for (uint32_t i = 0; i < o->via.map.size; i++) {
		const msgpack_object_kv *kv = &o->via.map.ptr[i];
		if (i)
			putc(',', f);
		if (in_key)
			json_value(f, &kv->key, true);
		else
			json_key(f, &kv->key);
		putc(':', f);
		json_value(f, &kv->val, in_key);
	}
	putc('}', f);
}

/* in_key: writing the text of a key, which json_key escapes as a whole. */
static void json_value(FILE *f, const msgpack_object *o, bool in_key)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL:
		fputs("null", f);
		break;
	case MSGPACK_OBJECT_BOOLEAN:
		fputs(o->via.boolean ? "true" : "false", f);
		break;
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		fprintf(f, "%" PRIu64, o->via.u64);
		break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		fprintf(f, "%" PRId64, o->via.i64);
		break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64:
		json_number(f, o->via.f64, o->type == MSGPACK_OBJECT_FLOAT32);
		break;
	case MSGPACK_OBJECT_STR:
		json_str(f, o->via.str.ptr, o->via.str.size);
		break;
	case MSGPACK_OBJECT_BIN:
		json_hex(f, o->via.bin.ptr, o->via.bin.size);
		break;
	case MSGPACK_OBJECT_EXT: /* no JSON form: its type and bytes */
		fprintf(f, "{\"ext\":%d,\"data\":", o->via.ext.type);
		json_hex(f, o->via.ext.ptr, o->via.ext.size);
		putc('}', f);
		break;
	case MSGPACK_OBJECT_ARRAY:
	case MSGPACK_OBJECT_MAP:
		json_container(f, o, in_key);
		break;
	default:
		fputs("null", f);
	}
}

void msg_print_json(FILE *f, const msgpack_object *obj)
{
	json_value(f, obj, false);
}
