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
