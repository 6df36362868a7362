/*
 * Building msgpack maps and arrays whose entry counts are not known in
 * advance (see protocol/msg.h). Any thread, on builders it owns.
 */
#include <stdio.h>
#include <stdlib.h>

#include "protocol/frame.h"
#include "protocol/msg.h"
#include "protocol/utf8.h"

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

/*
 * Every string gpuq writes is valid UTF-8: a string that is not (a message
 * echoing a client's bytes, or cut inside a character) has each invalid
 * byte written as \xNN (protocol/utf8.h).
 */
static void mp_pack_text(msgpack_packer *pk, const char *s, size_t n)
{
	if (utf8_valid(s, n)) {
		msgpack_pack_str_with_body(pk, s, n);
		return;
	}
	char *escaped = malloc(4 * n);
	if (!escaped) {
		fprintf(stderr, "gpuq: out of memory building a message (%zu more bytes)\n", 4 * n);
		abort();
	}
	msgpack_pack_str_with_body(pk, escaped, utf8_escape(s, n, escaped));
	free(escaped);
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
	mp_pack_text(&m->pk, val, len);
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

void mp_put_bin(struct mp_map *m, const char *key, const void *val, size_t len)
{
	mp_key(&m->pk, key);
	msgpack_pack_bin(&m->pk, len);
	msgpack_pack_bin_body(&m->pk, val, len);
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
		mp_pack_text(&a->pk, val, strlen(val));
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
