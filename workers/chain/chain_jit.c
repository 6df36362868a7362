/*
 * Each device's compiled chain kernels (workers/chain/chain_jit.h). Worker thread
 * only; the NVRTC library itself is the process's (chain_nvrtc.c).
 */
#include "workers/chain/chain_jit.h"
#include "workers/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "workers/chain/chain_codegen.h"
#include "workers/chain/chain_diskcache.h"
#include "workers/clock.h"

/* The format of the key text: bump it when what a kernel computes changes without the text changing. */
#define JIT_KEY_FORMAT 1

struct chain_jit_entry {
	uint64_t hash;
	char *key; /* everything NVRTC compiled: options, headers, source */
	size_t key_len;
	char arch[24];
	void *loaded;
	unsigned refs;
	uint64_t used;
};

struct chain_jit {
	struct chain_jit_entry **entries;
	unsigned n, size, cap; /* cap: entries no plan uses that are kept */
	uint64_t clock;
};

struct chain_jit *chain_jit_new(unsigned capacity)
{
	struct chain_jit *j = calloc(1, sizeof *j);
	if (j)
		j->cap = capacity ? capacity : 1;
	return j;
}

static void entry_free(struct device *dev, const struct chain_jit_loader *l, struct chain_jit_entry *e)
{
	if (e->loaded && l->unload)
		l->unload(dev, e->loaded);
	free(e->key);
	free(e);
}

static void jit_count_entries(struct device *dev, const struct chain_jit *j)
{
	atomic_store(&dev->chain_counters[CHAIN_COUNTER_kernel_entries], j->n);
}

void chain_jit_free(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l)
{
	if (!j)
		return;
	for (unsigned i = 0; i < j->n; i++)
		entry_free(dev, l, j->entries[i]);
	j->n = 0;
	jit_count_entries(dev, j);
	free(j->entries);
	free(j);
}

void chain_jit_release(struct chain_jit *j, struct chain_jit_entry *e)
{
	(void)j;
	if (e && e->refs > 0)
		e->refs--;
}

void *chain_jit_loaded(const struct chain_jit_entry *e)
{
	return e->loaded;
}

/* What a compile of the body for arch in math mode is made of, as one text: the cache's key. */
static char *jit_key(const char *body, const char *arch, enum chain_math math, size_t *len)
{
	const char *names[CHAIN_CODEGEN_HEADERS], *texts[CHAIN_CODEGEN_HEADERS];
	chain_codegen_headers(names, texts);
	size_t n = strlen(body) + 256;
	for (int i = 0; i < CHAIN_CODEGEN_HEADERS; i++)
		n += strlen(names[i]) + strlen(texts[i]) + 32;
	char *key = malloc(n);
	if (!key)
		return NULL;
	int used = snprintf(key, n, "gpuq chain kernel %d\narch %s\nmath %s\n", JIT_KEY_FORMAT, arch,
			    chain_math_name(math));
	for (int i = 0; i < CHAIN_CODEGEN_HEADERS; i++)
		used += snprintf(key + used, n - (size_t)used, "--- %s\n%s", names[i], texts[i]);
	used += snprintf(key + used, n - (size_t)used, "--- source\n%s", body);
	*len = (size_t)used;
	return key;
}

static struct chain_jit_entry *jit_find(struct chain_jit *j, uint64_t hash, const char *key,
					size_t len)
{
	for (unsigned i = 0; i < j->n; i++) {
		struct chain_jit_entry *e = j->entries[i];
		if (e->hash == hash && e->key_len == len && memcmp(e->key, key, len) == 0)
			return e;
	}
	return NULL;
}

/* Drops the least recently used entries no plan holds until at most keep are unheld. */
static void jit_trim(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		     unsigned keep)
{
	for (;;) {
		unsigned unheld = 0, lru = j->n;
		for (unsigned i = 0; i < j->n; i++) {
			if (j->entries[i]->refs)
				continue;
			unheld++;
			if (lru == j->n || j->entries[i]->used < j->entries[lru]->used)
				lru = i;
		}
		if (unheld <= keep)
			return;
		entry_free(dev, l, j->entries[lru]);
		j->entries[lru] = j->entries[--j->n];
	}
}

/* Adds e (held by its caller), first making room for it among the cap unheld entries kept. */
static int jit_insert(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		      struct chain_jit_entry *e, struct gpuq_error *err)
{
	jit_trim(dev, j, l, j->cap - 1);
	if (j->n == j->size) {
		unsigned size = j->size ? j->size * 2 : 8;
		struct chain_jit_entry **more = realloc(j->entries, size * sizeof *more);
		if (!more)
			return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY,
					 "[gpu %d] no host memory for the kernel cache", dev->index);
		j->entries = more;
		j->size = size;
	}
	j->entries[j->n++] = e;
	jit_count_entries(dev, j);
	return 0;
}

/* Where a kernel is looked for and compiled: NVRTC, the arch, the disk's file name. */
struct jit_target {
	const struct chain_nvrtc_status *nvrtc;
	char arch[24];
	bool ptx;
	char toolkit[16];
	char disk_name[CHAIN_DISKCACHE_NAME_MAX];
};

/* 0, or 1 with note when this device cannot have compiled kernels. */
static int jit_target(struct device *dev, struct jit_target *t, char *note, size_t n)
{
	int major = dev->info.cc_major, minor = dev->info.cc_minor;
	if (major == 0) { /* the host backend: compile for sm_90, the GPU gpuq is built for */
		major = 9;
		minor = 0;
	}
	t->nvrtc = chain_nvrtc_load(dev->config.nvrtc);
	if (!t->nvrtc->available) {
		snprintf(note, n, "no NVRTC: %.280s", t->nvrtc->why);
		return 1;
	}
	snprintf(t->toolkit, sizeof t->toolkit, "%d.%d", t->nvrtc->major, t->nvrtc->minor);
	char why[256];
	if (chain_nvrtc_arch(major, minor, t->arch, sizeof t->arch, &t->ptx, why, sizeof why) < 0) {
		snprintf(note, n, "%s", why);
		return 1;
	}
	return 0;
}

/* The image from disk: 0 (a hit), or 1 (compile it), logging a rejected or unreadable file. */
static int jit_from_disk(struct device *dev, const struct jit_target *t, const char *key,
			 size_t len, struct chain_image *img)
{
	char why[400];
	const char *dir = dev->config.kernel_cache_dir;
	if (!dir[0])
		return 1;
	switch (chain_diskcache_load(dir, t->disk_name, key, len, t->arch, t->toolkit, img, why,
				     sizeof why)) {
	case CHAIN_DISK_HIT:
		chain_counter_add(dev, CHAIN_COUNTER_kernel_disk_hits, 1);
		return 0;
	case CHAIN_DISK_REJECTED:
		chain_counter_add(dev, CHAIN_COUNTER_kernel_disk_rejects, 1);
		log_warn("[gpu %d] kernel cache: %s; compiling it again", dev->index, why);
		return 1;
	case CHAIN_DISK_ERROR:
		log_warn("[gpu %d] kernel cache: %s; compiling instead", dev->index, why);
		return 1;
	case CHAIN_DISK_MISS:
		break;
	}
	return 1;
}

/* Compiles the body with NVRTC and stores the image on disk. 0, or 1 with note. */
static int jit_compile(struct device *dev, const struct jit_target *t, const char *body,
		       enum chain_math math, const char *key, size_t len, struct chain_image *img,
		       char *note, size_t n)
{
	const char *names[CHAIN_CODEGEN_HEADERS], *texts[CHAIN_CODEGEN_HEADERS];
	char why[400];
	chain_codegen_headers(names, texts);
	if (chain_nvrtc_compile(body, CHAIN_CODEGEN_HEADERS, names, texts, t->arch, t->ptx,
				math == CHAIN_MATH_FAST, img, why, sizeof why) < 0) {
		log_error("[gpu %d] the generated chain kernel did not compile (a bug in gpuqd): %s",
			  dev->index, why);
		snprintf(note, n, "the compiled kernel failed to build: %.260s", why);
		return 1;
	}
	chain_counter_add(dev, CHAIN_COUNTER_kernel_compiles, 1);
	const char *dir = dev->config.kernel_cache_dir;
	if (dir[0] && chain_diskcache_store(dir, t->disk_name, key, len, t->toolkit, img,
					    CHAIN_DISKCACHE_MAX_FILES, why, sizeof why) < 0)
		log_warn("[gpu %d] kernel cache: %s (the kernel runs; it is not kept on disk)",
			 dev->index, why);
	return 0;
}

/* A new entry for key, its image from disk or NVRTC, loaded by the backend. */
static int jit_make(struct device *dev, const struct chain_jit_loader *l, const struct jit_target *t,
		    const char *body, enum chain_math math, char *key, size_t len, uint64_t hash,
		    struct chain_jit_entry **out, struct chain_kernel_info *info, struct gpuq_error *err)
{
	struct chain_image img;
	struct gpuq_error lerr;
	info->source = CHAIN_SOURCE_DISK;
	if (jit_from_disk(dev, t, key, len, &img) != 0) {
		info->source = CHAIN_SOURCE_NVRTC;
		if (jit_compile(dev, t, body, math, key, len, &img, info->note, sizeof info->note) != 0)
			return 1;
	}
	struct chain_jit_entry *e = calloc(1, sizeof *e);
	if (!e) {
		free(img.data);
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a kernel",
				 dev->index);
	}
	int rc = l->load ? l->load(dev, img.data, img.size, &e->loaded, &lerr) : 0;
	free(img.data);
	if (rc != 0) {
		free(e);
		if (dev->faulted) { /* a sticky error: the device is gone, not just this kernel */
			*err = lerr;
			return -1;
		}
		snprintf(info->note, sizeof info->note, "the driver did not load the compiled kernel: %.250s",
			 lerr.message);
		return 1;
	}
	e->hash = hash;
	e->key = key;
	e->key_len = len;
	snprintf(e->arch, sizeof e->arch, "%s", img.arch);
	*out = e;
	return 0;
}

/* Finds or makes the entry for body; 0, 1 (note) or -1. The key is the entry's, or freed. */
static int jit_lookup(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		      const struct jit_target *t0, const char *body, enum chain_math math,
		      struct chain_jit_entry **out, struct chain_kernel_info *info,
		      struct gpuq_error *err)
{
	struct jit_target t = *t0;
	size_t len;
	char *key = jit_key(body, t.arch, math, &len);
	if (!key)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a kernel",
				 dev->index);
	uint64_t hash = chain_diskcache_hash(CHAIN_DISKCACHE_HASH_SEED, key, len);
	struct chain_jit_entry *e = jit_find(j, hash, key, len);
	if (e) {
		free(key);
		info->source = CHAIN_SOURCE_MEMORY;
		chain_counter_add(dev, CHAIN_COUNTER_kernel_memory_hits, 1);
	} else {
		chain_diskcache_name(t.disk_name, hash, t.arch, t.toolkit);
		int rc = jit_make(dev, l, &t, body, math, key, len, hash, &e, info, err);
		if (rc != 0) {
			free(key);
			return rc;
		}
		if (jit_insert(dev, j, l, e, err) != 0) {
			entry_free(dev, l, e);
			return -1;
		}
	}
	e->refs++;
	e->used = ++j->clock;
	snprintf(info->arch, sizeof info->arch, "%s", e->arch);
	*out = e;
	return 0;
}

int chain_jit_get(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		  const chain_prog *prog, enum chain_math math, struct chain_jit_entry **entry,
		  struct chain_kernel_info *info, struct gpuq_error *err)
{
	double start = monotonic_seconds();
	struct jit_target t;
	*entry = NULL;
	if (jit_target(dev, &t, info->note, sizeof info->note) != 0)
		return 1;
	char *body = chain_codegen_source(prog);
	if (!body)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a kernel",
				 dev->index);
	int rc = jit_lookup(dev, j, l, &t, body, math, entry, info, err);
	free(body);
	info->compile_s = monotonic_seconds() - start;
	return rc;
}

/* The entry e out of the cache, unloaded, and its file off the disk (the benchmark's). */
static void jit_drop(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		     struct chain_jit_entry *e, bool unlink_file)
{
	for (unsigned i = 0; i < j->n; i++) {
		if (j->entries[i] != e)
			continue;
		j->entries[i] = j->entries[--j->n];
		break;
	}
	if (unlink_file && dev->config.kernel_cache_dir[0]) {
		char name[CHAIN_DISKCACHE_NAME_MAX], path[512];
		const struct chain_nvrtc_status *s = chain_nvrtc_load(dev->config.nvrtc);
		char toolkit[16];
		snprintf(toolkit, sizeof toolkit, "%d.%d", s->major, s->minor);
		chain_diskcache_name(name, e->hash, e->arch, toolkit);
		snprintf(path, sizeof path, "%s/%s", dev->config.kernel_cache_dir, name);
		unlink(path);
	}
	entry_free(dev, l, e);
	jit_count_entries(dev, j);
}

/* One timed get of body; the entry is given back at once. */
static int jit_timed(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		     const struct jit_target *t, const char *body, struct chain_jit_entry **e,
		     double *seconds, char *note, size_t n, struct gpuq_error *err)
{
	struct chain_kernel_info info;
	memset(&info, 0, sizeof info);
	double start = monotonic_seconds();
	int rc = jit_lookup(dev, j, l, t, body, CHAIN_MATH_IEEE, e, &info, err);
	*seconds = monotonic_seconds() - start;
	if (rc == 1)
		snprintf(note, n, "%s", info.note);
	if (rc == 0)
		chain_jit_release(j, *e);
	return rc;
}

int chain_jit_measure(struct device *dev, struct chain_jit *j, const struct chain_jit_loader *l,
		      const chain_prog *prog, struct chain_jit_costs *out, struct gpuq_error *err)
{
	struct jit_target t;
	struct chain_jit_entry *e;
	memset(out, 0, sizeof *out);
	if (jit_target(dev, &t, out->note, sizeof out->note) != 0)
		return 1;
	out->load_s = t.nvrtc->load_s;
	char *gen = chain_codegen_source(prog), *body = NULL;
	if (gen && asprintf(&body, "// benchmark %d.%.0f\n%s", (int)getpid(),
			    monotonic_seconds() * 1e9, gen) < 0)
		body = NULL;
	free(gen);
	if (!body)
		return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "[gpu %d] no host memory for a kernel",
				 dev->index);
	int rc = jit_timed(dev, j, l, &t, body, &e, &out->nvrtc_s, out->note, sizeof out->note, err);
	if (rc == 0 && !dev->config.kernel_cache_dir[0]) {
		snprintf(out->note, sizeof out->note, "no disk cache (--kernel-cache none)");
	} else if (rc == 0) { /* off the memory, kept on disk: the next get reads it as a new daemon would */
		jit_drop(dev, j, l, e, false);
		rc = jit_timed(dev, j, l, &t, body, &e, &out->disk_s, out->note, sizeof out->note, err);
	}
	if (rc == 0)
		rc = jit_timed(dev, j, l, &t, body, &e, &out->memory_s, out->note, sizeof out->note, err);
	if (rc == 0)
		jit_drop(dev, j, l, e, true);
	free(body);
	return rc;
}
