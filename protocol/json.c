/* JSON rendering of decoded msgpack objects (see msg_print_json in protocol/msg.h). */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "protocol/msg.h"

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
 * The CLI never sets a locale with another decimal point.
 */
static void json_number(FILE *f, double d, bool f32)
{
	if (!isfinite(d)) {
		fputs("null", f);
		return;
	}
	char buf[40];
	gpuq_format_number(buf, sizeof buf, d, f32);
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
