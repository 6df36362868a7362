/*
 * libgpuq: building collective requests (gpuq.h, struct gpuq_collective).
 * Only the fields a caller set are sent, so the daemon's defaults apply to
 * the rest; whether they make sense is the daemon's to say.
 */
#include "client/lib/gpuq.h"

void gpuq_collective_put(struct mp_map *m, const struct gpuq_collective *c)
{
	if (c->buffer)
		mp_put_str(m, "buffer", c->buffer);
	if (c->out)
		mp_put_str(m, "out", c->out);
	if (c->src)
		mp_put_str(m, "src", c->src);
	if (c->dst)
		mp_put_str(m, "dst", c->dst);
	if (c->reduce)
		mp_put_str(m, "reduce", c->reduce);
	if (c->root >= 0)
		mp_put_u64(m, "root", (uint64_t)c->root);
	if (c->count)
		mp_put_u64(m, "count", c->count);
}

static void put_devices(struct mp_map *req, const int *devices, int ndevices)
{
	struct mp_array arr;

	if (ndevices <= 0)
		return;
	mp_array_init(&arr);
	for (int i = 0; i < ndevices; i++)
		mp_array_u64(&arr, (uint64_t)devices[i]);
	mp_put_array(req, "devices", &arr);
}

uint64_t gpuq_collective_begin(struct gpuq_client *cl, struct mp_map *req,
			       const struct gpuq_collective *c, const int *devices, int ndevices)
{
	uint64_t id = gpuq_request_begin(cl, req, c->op);

	put_devices(req, devices, ndevices);
	gpuq_collective_put(req, c);
	return id;
}

void gpuq_group_put(struct mp_map *m, const struct gpuq_collective *c, int nops)
{
	struct mp_array ops;

	mp_array_init(&ops);
	for (int i = 0; i < nops; i++) {
		struct mp_map entry;

		mp_map_init(&entry);
		mp_put_str(&entry, "op", c[i].op);
		gpuq_collective_put(&entry, &c[i]);
		mp_array_map(&ops, &entry);
	}
	mp_put_array(m, "ops", &ops);
}

uint64_t gpuq_group_begin(struct gpuq_client *cl, struct mp_map *req, const char *op,
			  const struct gpuq_collective *c, int nops, const int *devices,
			  int ndevices)
{
	uint64_t id = gpuq_request_begin(cl, req, op);

	put_devices(req, devices, ndevices);
	gpuq_group_put(req, c, nops);
	return id;
}
