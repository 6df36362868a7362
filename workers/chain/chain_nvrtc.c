/*
 * NVRTC through dlopen (workers/chain/chain_nvrtc.h). nvrtc.h supplies the types
 * and prototypes only; every function is looked up in the opened library.
 */
#include "workers/chain/chain_nvrtc.h"

#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/clock.h"

/* The functions gpuqd calls, looked up by name. */
#define NVRTC_FUNCTIONS(X)                                                     \
	X(nvrtcVersion)                                                        \
	X(nvrtcGetErrorString)                                                 \
	X(nvrtcGetNumSupportedArchs)                                           \
	X(nvrtcGetSupportedArchs)                                              \
	X(nvrtcCreateProgram)                                                  \
	X(nvrtcDestroyProgram)                                                 \
	X(nvrtcCompileProgram)                                                 \
	X(nvrtcGetProgramLogSize)                                              \
	X(nvrtcGetProgramLog)                                                  \
	X(nvrtcGetCUBINSize)                                                   \
	X(nvrtcGetCUBIN)                                                       \
	X(nvrtcGetPTXSize)                                                     \
	X(nvrtcGetPTX)

static struct {
#define NVRTC_POINTER(name) __typeof__(&name) name;
	NVRTC_FUNCTIONS(NVRTC_POINTER)
#undef NVRTC_POINTER
	int archs[64];
	int narchs;
} nv;

static struct chain_nvrtc_status status;
static char load_option[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* The library itself: the --nvrtc path, or the versioned then the plain name. */
static void *nvrtc_open(void)
{
	static const char *const names[] = { "libnvrtc.so.13", "libnvrtc.so" };
	size_t used = 0;
	if (load_option[0]) {
		void *h = dlopen(load_option, RTLD_NOW | RTLD_LOCAL);
		if (!h)
			snprintf(status.why, sizeof status.why, "--nvrtc %s: %s", load_option, dlerror());
		else
			snprintf(status.library, sizeof status.library, "%s", load_option);
		return h;
	}
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (h) {
			snprintf(status.library, sizeof status.library, "%s", names[i]);
			return h;
		}
		if (used < sizeof status.why)
			used += (size_t)snprintf(status.why + used, sizeof status.why - used, "%s%s",
						 used ? "; " : "", dlerror());
	}
	return NULL;
}

static void nvrtc_load_library(void);

static bool nvrtc_symbols(void *h)
{
#define NVRTC_LOOKUP(name)                                                             \
	*(void **)&nv.name = dlsym(h, #name);                                          \
	if (!nv.name) {                                                                \
		snprintf(status.why, sizeof status.why, "%s has no %s: not an NVRTC of "   \
			 "CUDA 12 or later", status.library, #name);                       \
		return false;                                                          \
	}
	NVRTC_FUNCTIONS(NVRTC_LOOKUP)
#undef NVRTC_LOOKUP
	return true;
}

static void nvrtc_load_once(void)
{
	double start = monotonic_seconds();
	nvrtc_load_library();
	status.load_s = monotonic_seconds() - start;
}

static void nvrtc_load_library(void)
{
	if (strcmp(load_option, "off") == 0) {
		snprintf(status.why, sizeof status.why, "NVRTC is turned off (--nvrtc off)");
		return;
	}
	void *h = nvrtc_open();
	if (!h)
		return;
	if (!nvrtc_symbols(h) || nv.nvrtcVersion(&status.major, &status.minor) != NVRTC_SUCCESS ||
	    nv.nvrtcGetNumSupportedArchs(&nv.narchs) != NVRTC_SUCCESS || nv.narchs < 1 ||
	    nv.narchs > (int)(sizeof nv.archs / sizeof nv.archs[0]) ||
	    nv.nvrtcGetSupportedArchs(nv.archs) != NVRTC_SUCCESS) {
		if (!status.why[0])
			snprintf(status.why, sizeof status.why, "%s does not answer its version and "
				 "architectures", status.library);
		dlclose(h);
		return;
	}
	status.available = true; /* the library stays open for the process's life */
}

const struct chain_nvrtc_status *chain_nvrtc_load(const char *option)
{
	static pthread_mutex_t option_lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&option_lock);
	if (!load_option[0] && option)
		snprintf(load_option, sizeof load_option, "%s", option);
	pthread_mutex_unlock(&option_lock);
	pthread_once(&load_once, nvrtc_load_once);
	return &status;
}

int chain_nvrtc_arch(int major, int minor, char *arch, size_t size, bool *ptx, char *why,
		     size_t whysize)
{
	int want = major * 10 + minor, best = 0;
	if (!status.available) {
		snprintf(why, whysize, "%s", status.why);
		return -1;
	}
	for (int i = 0; i < nv.narchs; i++) {
		if (nv.archs[i] == want) {
			snprintf(arch, size, "sm_%d", want);
			*ptx = false;
			return 0;
		}
		if (nv.archs[i] < want && nv.archs[i] > best)
			best = nv.archs[i];
	}
	if (best == 0) {
		snprintf(why, whysize, "NVRTC %d.%d compiles for sm_%d and newer; this GPU is sm_%d",
			 status.major, status.minor, nv.archs[0], want);
		return -1;
	}
	snprintf(arch, size, "compute_%d", best);
	*ptx = true;
	return 0;
}

/* NVRTC's log into why, its first lines: where the generated source failed. */
static void nvrtc_log(nvrtcProgram prog, nvrtcResult rc, char *why, size_t whysize)
{
	size_t n = 0;
	int used = snprintf(why, whysize, "NVRTC: %s: ", nv.nvrtcGetErrorString(rc));
	if (used < 0 || (size_t)used >= whysize || nv.nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS)
		return;
	char *log = malloc(n + 1);
	if (log && nv.nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
		log[n] = '\0';
		snprintf(why + used, whysize - (size_t)used, "%s", log);
	}
	free(log);
}

/* The compiled code out of prog. */
static int nvrtc_take(nvrtcProgram prog, bool ptx, struct chain_image *out, char *why,
		      size_t whysize)
{
	size_t n = 0;
	nvrtcResult rc = ptx ? nv.nvrtcGetPTXSize(prog, &n) : nv.nvrtcGetCUBINSize(prog, &n);
	if (rc == NVRTC_SUCCESS && n == 0)
		rc = NVRTC_ERROR_INTERNAL_ERROR;
	if (rc == NVRTC_SUCCESS && !(out->data = malloc(n))) {
		snprintf(why, whysize, "no host memory for a %zu-byte kernel image", n);
		return -1;
	}
	if (rc == NVRTC_SUCCESS)
		rc = ptx ? nv.nvrtcGetPTX(prog, out->data) : nv.nvrtcGetCUBIN(prog, out->data);
	if (rc != NVRTC_SUCCESS) {
		free(out->data);
		out->data = NULL;
		snprintf(why, whysize, "NVRTC: %s while taking the %s", nv.nvrtcGetErrorString(rc),
			 ptx ? "PTX" : "CUBIN");
		return -1;
	}
	out->size = n;
	out->ptx = ptx;
	return 0;
}

int chain_nvrtc_compile(const char *source, int nheaders, const char *const *names,
			const char *const *texts, const char *arch, bool ptx, bool fast,
			struct chain_image *out, char *why, size_t whysize)
{
	char arch_opt[40];
	const char *opts[5] = { arch_opt, "-std=c++17", "-default-device" };
	int nopts = 3;
	nvrtcProgram prog;
	memset(out, 0, sizeof *out);
	if (!status.available) {
		snprintf(why, whysize, "%s", status.why);
		return -1;
	}
	snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
	if (fast) {
		opts[nopts++] = "-use_fast_math";
		opts[nopts++] = "-DGPUQ_FAST_MATH";
	}
	nvrtcResult rc = nv.nvrtcCreateProgram(&prog, source, "gpuq_chain.cu", nheaders, texts, names);
	if (rc != NVRTC_SUCCESS) {
		snprintf(why, whysize, "NVRTC: %s creating the program", nv.nvrtcGetErrorString(rc));
		return -1;
	}
	rc = nv.nvrtcCompileProgram(prog, nopts, opts);
	int result = -1;
	if (rc != NVRTC_SUCCESS)
		nvrtc_log(prog, rc, why, whysize);
	else
		result = nvrtc_take(prog, ptx, out, why, whysize);
	if (result == 0)
		snprintf(out->arch, sizeof out->arch, "%s", arch);
	nv.nvrtcDestroyProgram(&prog);
	return result;
}
