/*
 * NVLink detection through NVML, loaded with dlopen (see peer_link.h). The
 * few NVML declarations needed are written out here, as NVML's header is not
 * part of every CUDA toolkit; their values are NVML's documented ABI.
 */
#include "workers/backend/peer_link.h"

#include <dlfcn.h>
#include <stdio.h>

typedef int nvml_return;                  /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct nvml_device *nvml_device;  /* nvmlDevice_t */
#define NVML_P2P_CAPS_INDEX_NVLINK 2      /* nvmlGpuP2PCapsIndex_t */
#define NVML_P2P_STATUS_OK 0              /* nvmlGpuP2PStatus_t */

struct nvml_api {
	void *lib;
	nvml_return (*init)(void);
	nvml_return (*shutdown)(void);
	const char *(*error_string)(nvml_return);
	nvml_return (*by_bus_id)(const char *bus_id, nvml_device *out);
	nvml_return (*p2p_status)(nvml_device a, nvml_device b, int index, int *status);
};

/* dlsym's void * to a function pointer, as POSIX allows. */
#define NVML_SYM(api, field, name) (*(void **)&(api)->field = dlsym((api)->lib, (name)))

static int nvml_load(struct nvml_api *api, char *note, size_t note_size)
{
	api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!api->lib) {
		snprintf(note, note_size,
			 "NVML (libnvidia-ml.so.1) could not be loaded, so NVLink and PCIe "
			 "peer links are not told apart");
		return -1;
	}
	if (!NVML_SYM(api, init, "nvmlInit_v2") || !NVML_SYM(api, shutdown, "nvmlShutdown") ||
	    !NVML_SYM(api, error_string, "nvmlErrorString") ||
	    !NVML_SYM(api, by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") ||
	    !NVML_SYM(api, p2p_status, "nvmlDeviceGetP2PStatus")) {
		snprintf(note, note_size, "NVML lacks nvmlDeviceGetP2PStatus or a function it needs");
		dlclose(api->lib);
		return -1;
	}
	return 0;
}

static int nvml_ask(struct nvml_api *api, const char *bus_a, const char *bus_b, char *note,
		    size_t note_size)
{
	nvml_device a, b;
	int status = -1;
	nvml_return r = api->by_bus_id(bus_a, &a);
	if (r == 0)
		r = api->by_bus_id(bus_b, &b);
	if (r == 0)
		r = api->p2p_status(a, b, NVML_P2P_CAPS_INDEX_NVLINK, &status);
	if (r != 0) {
		snprintf(note, note_size, "NVML could not tell the link between %s and %s: %s", bus_a,
			 bus_b, api->error_string(r));
		return -1;
	}
	return status == NVML_P2P_STATUS_OK ? 1 : 0;
}

int peer_link_nvlink(const char *bus_a, const char *bus_b, char *note, size_t note_size)
{
	struct nvml_api api;
	note[0] = '\0';
	if (nvml_load(&api, note, note_size) != 0)
		return -1;
	int rc = -1;
	nvml_return r = api.init();
	if (r != 0)
		snprintf(note, note_size, "nvmlInit failed: %s", api.error_string(r));
	else
		rc = nvml_ask(&api, bus_a, bus_b, note, note_size);
	if (r == 0)
		api.shutdown();
	dlclose(api.lib);
	return rc;
}
