/*
 * Reading a reply's fields and writing numbers for people: the bottom of
 * the CLI's output, beneath render.c, progress.c and every command file.
 * A reader never fails: a missing or mistyped field gives the default.
 */
#include <inttypes.h>
#include <math.h>

#include "client/cli/cli.h"

uint64_t field_u64(const msgpack_object *map, const char *key, uint64_t dflt)
{
	struct gpuq_error err;
	uint64_t v;

	return msg_get_u64(map, key, &v, &err) == 1 ? v : dflt;
}

double field_f64(const msgpack_object *map, const char *key, double dflt)
{
	struct gpuq_error err;
	double v;

	return msg_get_f64(map, key, &v, &err) == 1 ? v : dflt;
}

bool field_bool(const msgpack_object *map, const char *key, bool dflt)
{
	struct gpuq_error err;
	bool v;

	return msg_get_bool(map, key, &v, &err) == 1 ? v : dflt;
}

const char *field_str(const msgpack_object *map, const char *key, char *buf,
		      size_t size, const char *dflt)
{
	const msgpack_object *o = msg_map_get(map, key);

	if (o && o->type == MSGPACK_OBJECT_STR)
		snprintf(buf, size, "%.*s", (int)o->via.str.size, o->via.str.ptr);
	else
		snprintf(buf, size, "%s", dflt);
	return buf;
}

/* The array under key, or NULL. */
const msgpack_object *field_array(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = msg_map_get(map, key);

	return o && o->type == MSGPACK_OBJECT_ARRAY ? o : NULL;
}

const char *human_bytes(char *buf, size_t size, uint64_t n, int decimals)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	/* Move up a unit where printing would round up to "1024.0". */
	double top = 1024 - 0.5 * pow(10, -decimals);
	double v = (double)n / 1024;
	int u = 0;

	if (n < 1024) {
		snprintf(buf, size, "%" PRIu64 " B", n);
		return buf;
	}
	while (v >= top && u < 5) {
		v /= 1024;
		u++;
	}
	snprintf(buf, size, "%.*f %s", decimals, v, units[u]);
	return buf;
}

const char *human_seconds(char *buf, size_t size, double s)
{
	if (s < 0)
		snprintf(buf, size, "-");
	else if (s < 1e-5)
		snprintf(buf, size, "%.1f µs", s * 1e6);
	else if (s < 1e-3)
		snprintf(buf, size, "%.0f µs", s * 1e6);
	else if (s < 1)
		snprintf(buf, size, "%.1f ms", s * 1e3);
	else if (s < 60)
		snprintf(buf, size, "%.2f s", s);
	else if (s < 3600)
		snprintf(buf, size, "%dm%02ds", (int)(s / 60), (int)s % 60);
	else
		snprintf(buf, size, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
	return buf;
}
