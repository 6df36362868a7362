/*
 * Decoding a request's arguments from its op's table (daemon/args.h), in
 * one pass. The plain types go through protocol/msg.c's getters, so that a
 * wrong type or a string too long is worded as everywhere else; the types
 * that name something are resolved here. Main thread only.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/args.h"
#include "daemon/daemon.h"

int args_owner(struct request *req, const char *things, uid_t *owner, struct gpuq_error *err)
{
	uint64_t o;
	*owner = req->conn->uid;
	int rc = msg_get_u64_in(req->map, "owner", 0, GPUQ_MAX_UID, &o, err);
	if (rc <= 0)
		return rc;
	if (req->conn->uid != 0 && o != (uint64_t)req->conn->uid)
		return gpuq_fail(err, GPUQ_E_PERMISSION_DENIED,
				 "only root may name another owner's %s (you are uid %d)", things,
				 (int)req->conn->uid);
	*owner = (uid_t)o;
	return 1;
}

int args_device_check(struct request *req, uint64_t d, struct gpuq_error *err)
{
	if (d >= (uint64_t)req->d->pool.count)
		return gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %llu does not exist (devices: 0-%d)",
				 (unsigned long long)d, req->d->pool.count - 1);
	return 0;
}

struct buffer *args_resolve(struct request *req, uid_t owner, const char *name, int device,
			    struct gpuq_error *err)
{
	if (device >= 0 && args_device_check(req, (uint64_t)device, err) < 0)
		return NULL; /* not "not found on device 99", as if there were one */
	return buffer_resolve(&req->d->buffers, owner, req->conn->uid, name, device, err);
}

int args_device(struct request *req, const char *key, bool required, int *device,
		struct gpuq_error *err)
{
	uint64_t d = 0;
	int rc = msg_get_u64(req->map, key, &d, err);
	if (rc == 0 && required)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s' is required", key);
	if (rc < 0 || (rc > 0 && args_device_check(req, d, err) < 0))
		return -1;
	if (rc > 0)
		*device = (int)d;
	return rc;
}

int args_devices(struct request *req, const char *key, struct args_devices *out,
		 struct gpuq_error *err)
{
	const msgpack_object *list;
	int count = req->d->pool.count;
	out->n = 0;
	int rc = msg_get_array(req->map, key, &list, err);
	if (rc <= 0)
		return rc;
	if (list->via.array.size == 0 || list->via.array.size > (uint32_t)count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': %u devices listed; give 1 to %d distinct ones", key,
				 list->via.array.size, count);
	for (uint32_t i = 0; i < list->via.array.size; i++) {
		const msgpack_object *o = &list->via.array.ptr[i];
		if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "field '%s': entry %u is not a device of this daemon (0-%d)", key,
					 i, count - 1);
		if (args_device_check(req, o->via.u64, err) < 0)
			return -1;
		for (int j = 0; j < out->n; j++)
			if (out->dev[j] == (int)o->via.u64)
				return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
						 "field '%s': device %d is listed twice", key, out->dev[j]);
		out->dev[out->n++] = (int)o->via.u64;
	}
	return 1;
}

/*
 * The reference's text: a plain one ("NAME" or "NAME@GPU") has room for 31
 * more bytes than a name, one with a range for 95; the limits are part of
 * the "too long" messages clients see.
 */
static int buffer_text(struct request *req, const char *key, bool with_range, char *text,
		       size_t size, struct gpuq_error *err)
{
	int rc = msg_get_str(req->map, key, text, size, err);
	if (rc == 0 && with_range)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "field '%s' (NAME, NAME@GPU, optionally [START:STOP]) is required", key);
	else if (rc == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s' (NAME or NAME@GPU) is required", key);
	return rc;
}

static int buffer_usable(const struct buffer *b, unsigned flags, struct gpuq_error *err)
{
	if (flags & ARGS_ANY_STATE)
		return 0;
	if ((flags & ARGS_LOST_OK) && b->state == BUFFER_LOST)
		return 0;
	return buffer_check_usable(b, err);
}

int args_buffer(struct request *req, const char *key, bool with_range, unsigned flags,
		struct args_buffer *out, struct gpuq_error *err)
{
	char text[BUFFER_NAME_MAX + 96];
	uid_t owner;
	size_t size = with_range ? BUFFER_NAME_MAX + 96 : BUFFER_NAME_MAX + 32;
	memset(&out->ref, 0, sizeof out->ref);
	out->b = NULL;
	int rc = buffer_text(req, key, with_range, text, size, err);
	if (rc <= 0)
		return rc;
	if (with_range)
		rc = buffer_ref_parse_range(text, key, &out->ref, err);
	else
		rc = buffer_ref_parse(text, key, out->ref.name, &out->ref.device, err);
	if (rc < 0 || args_owner(req, "buffers", &owner, err) < 0)
		return -1;
	out->b = args_resolve(req, owner, out->ref.name, out->ref.device, err);
	if (!out->b || buffer_usable(out->b, flags, err) < 0) {
		out->b = NULL;
		return -1;
	}
	return 1;
}

/* The key is there with a value other than nil (which the protocol reads as absent). */
static bool given(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = msg_map_get(map, key);
	return o && o->type != MSGPACK_OBJECT_NIL;
}

/* ARGS_ENUM: the string's index in f->names, or -1 with f->bad_name. */
static int decode_enum(struct request *req, const struct args_field *f, int *out,
		       struct gpuq_error *err)
{
	char s[64];
	int rc = msg_get_str(req->map, f->key, s, f->strsize && f->strsize < sizeof s ? f->strsize : sizeof s, err);
	if (rc <= 0)
		return rc;
	for (int i = 0; f->names[i]; i++)
		if (strcmp(f->names[i], s) == 0) {
			*out = i;
			return 1;
		}
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST, f->bad_name, s);
}

/* A number, and whether it is also an integer (msg_get_i64 takes it). */
static int decode_number(struct request *req, const char *key, struct args_number *n,
			 struct gpuq_error *err)
{
	struct gpuq_error not_int;
	int rc = msg_get_f64(req->map, key, &n->f, err);
	if (rc <= 0)
		return rc;
	n->is_int = msg_get_i64(req->map, key, &n->i, &not_int) > 0;
	n->is_u64 = !n->is_int && msg_get_u64(req->map, key, &n->u, &not_int) > 0;
	return 1;
}

static int decode_u64(struct request *req, const struct args_field *f, uint64_t *out,
		      struct gpuq_error *err)
{
	if (f->lo < f->hi)
		return msg_get_u64_in(req->map, f->key, f->lo, f->hi, out, err);
	return msg_get_u64(req->map, f->key, out, err);
}

/* Decodes one field into slot: 1 given, 0 absent, -1 with err. */
static int decode_field(struct request *req, const struct args_field *f, void *slot,
			struct gpuq_error *err)
{
	switch (f->type) {
	case ARGS_BOOL: return msg_get_bool(req->map, f->key, slot, err);
	case ARGS_U64: return decode_u64(req, f, slot, err);
	case ARGS_I64: return msg_get_i64(req->map, f->key, slot, err);
	case ARGS_F64: return msg_get_f64(req->map, f->key, slot, err);
	case ARGS_NUMBER: return decode_number(req, f->key, slot, err);
	case ARGS_STR: return msg_get_str(req->map, f->key, slot, f->size, err);
	case ARGS_ARRAY: return msg_get_array(req->map, f->key, slot, err);
	case ARGS_MAP: return msg_get_map(req->map, f->key, slot, err);
	case ARGS_PRESENT: return *(bool *)slot = given(req->map, f->key);
	case ARGS_ENUM: return decode_enum(req, f, slot, err);
	case ARGS_OWNER:
		return args_owner(req, f->flags & ARGS_OF_REGIONS ? "regions" : "buffers", slot, err);
	case ARGS_DEVICE: return args_device(req, f->key, false, slot, err);
	case ARGS_DEVICES: return args_devices(req, f->key, slot, err);
	case ARGS_BUFFER: return args_buffer(req, f->key, true, f->flags, slot, err);
	case ARGS_BUFFER_NAME: return args_buffer(req, f->key, false, f->flags, slot, err);
	}
	return gpuq_fail(err, GPUQ_E_INTERNAL, "field '%s': no decoder for type %d", f->key,
			 (int)f->type);
}

int args_key_named(const char *key, struct gpuq_error *err)
{
	struct gpuq_error inner = *err;
	return gpuq_fail(err, inner.code, "field '%s': %s", key, inner.message);
}

int args_decode(struct request *req, const struct args_spec *spec, void *out,
		struct gpuq_error *err)
{
	char *base = out;
	if (spec->defaults)
		memcpy(out, spec->defaults, spec->size);
	else
		memset(out, 0, spec->size);
	for (size_t i = 0; i < spec->nfields; i++) {
		const struct args_field *f = &spec->fields[i];
		if (f->when && !f->when(out))
			continue;
		int rc = decode_field(req, f, base + f->at, err);
		if (rc < 0 && (f->flags & ARGS_KEY_NAMED) && err->code != GPUQ_E_BAD_REQUEST)
			return args_key_named(f->key, err);
		if (rc < 0)
			return -1;
		if (rc == 0 && (f->flags & ARGS_REQUIRED)) {
			if (f->missing)
				return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "%s", f->missing);
			if (f->type == ARGS_BUFFER || f->type == ARGS_BUFFER_NAME)
				return -1; /* args_buffer worded it, saying what a reference looks like */
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s' is required", f->key);
		}
		if (f->given_at)
			*(bool *)(base + f->given_at - 1) = rc > 0;
		if (f->then && f->then(req, out, err) < 0)
			return -1;
	}
	return 0;
}

/* The slot size each type needs; 0 for ARGS_STR (any array of at least 2). */
static size_t type_size(enum args_type t)
{
	switch (t) {
	case ARGS_BOOL: case ARGS_PRESENT: return sizeof(bool);
	case ARGS_U64: return sizeof(uint64_t);
	case ARGS_I64: return sizeof(int64_t);
	case ARGS_F64: return sizeof(double);
	case ARGS_NUMBER: return sizeof(struct args_number);
	case ARGS_STR: return 0;
	case ARGS_ARRAY: case ARGS_MAP: return sizeof(const void *);
	case ARGS_ENUM: case ARGS_DEVICE: return sizeof(int);
	case ARGS_OWNER: return sizeof(uid_t);
	case ARGS_DEVICES: return sizeof(struct args_devices);
	case ARGS_BUFFER: case ARGS_BUFFER_NAME: return sizeof(struct args_buffer);
	}
	return SIZE_MAX;
}

static int field_check(const struct args_spec *spec, const struct args_field *f,
		       struct gpuq_error *err)
{
	size_t need = type_size(f->type);
	if (need == SIZE_MAX || (need ? f->size != need : f->size < 2))
		return gpuq_fail(err, GPUQ_E_INTERNAL, "field '%s': a slot of %zu bytes for type %d",
				 f->key, f->size, (int)f->type);
	if (f->at + f->size > spec->size || (f->given_at && f->given_at > spec->size))
		return gpuq_fail(err, GPUQ_E_INTERNAL, "field '%s' lies outside its %zu-byte struct",
				 f->key, spec->size);
	if (f->type == ARGS_ENUM && (!f->names || !f->bad_name))
		return gpuq_fail(err, GPUQ_E_INTERNAL, "field '%s': an enum needs names and bad_name",
				 f->key);
	return 0;
}

int args_spec_check(const struct args_spec *spec, struct gpuq_error *err)
{
	if (spec->size > ARGS_MAX_SIZE)
		return gpuq_fail(err, GPUQ_E_INTERNAL, "an argument struct of %zu bytes; at most %d",
				 spec->size, ARGS_MAX_SIZE);
	for (size_t i = 0; i < spec->nfields; i++)
		if (field_check(spec, &spec->fields[i], err) < 0)
			return -1;
	return 0;
}
