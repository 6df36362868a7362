#include <stddef.h>
#include <string.h>

#include "workers/backend/backend.h"

const struct backend_ops *backend_by_name(const char *name)
{
	if (strcmp(name, "cuda") == 0)
		return &backend_cuda;
	if (strcmp(name, "host") == 0)
		return &backend_host;
	return NULL;
}

unsigned backend_slot_span(const struct device *dev, unsigned slot, size_t n)
{
	size_t each = dev->config.staging_slot_bytes;
	size_t k = n <= each ? 1 : (n + each - 1) / each;
	bool back_to_back =
		k == 1 || (const char *)dev->staging[1] - (const char *)dev->staging[0] == (ptrdiff_t)each;
	if (slot >= dev->config.staging_slots || k > dev->config.staging_slots - slot || !back_to_back)
		return 0;
	return (unsigned)k;
}
