/*
 * Compiled kernels across daemons, both tiers: a kernel compiled once is
 * found in memory by the same daemon and on disk by the next; a damaged
 * file is rejected and compiled again; two daemons sharing the directory at
 * once leave whole files and nothing else; without NVRTC (--nvrtc off) the
 * interpreted kernel runs and says why, and kernel compiled fails; with
 * --kernel-cache none nothing is kept. `stats` counts every path.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/integration/chain_util.h"

#define N 1000

static char cache[64];

static void cache_make(void)
{
	snprintf(cache, sizeof cache, "/tmp/gpuq-kc.XXXXXX");
	CHECK(mkdtemp(cache));
}

/* Files in the cache directory; *tmps counts temporaries (dot files). */
static unsigned cache_files(unsigned *tmps, char names[][256], unsigned max)
{
	DIR *d = opendir(cache);
	struct dirent *e;
	unsigned n = 0;
	*tmps = 0;
	while (d && (e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (e->d_name[0] == '.')
			(*tmps)++;
		else if (n < max)
			snprintf(names[n++], 256, "%s", e->d_name);
	}
	if (d)
		closedir(d);
	return n;
}

static void cache_remove(void)
{
	char names[64][256], path[512];
	unsigned tmps, n = cache_files(&tmps, names, 64);
	for (unsigned i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/%.200s", cache, names[i]);
		unlink(path);
	}
	rmdir(cache);
}

/* A daemon on the cache directory, with x and y of N f32 each. */
static struct gpuq_client *start(struct daemon_proc *d, const char *nvrtc, const char *dir)
{
	if (nvrtc)
		daemon_start(d, "--kernel-cache", dir, "--nvrtc", nvrtc, NULL);
	else
		daemon_start(d, "--kernel-cache", dir, NULL);
	struct gpuq_client *c = client_open(d);
	talloc(c, "x", &tdtype_f32, N, 0);
	talloc(c, "y", &tdtype_f32, N, 0);
	do_fill_random(c, "x", 7);
	return c;
}

static void stop(struct daemon_proc *d, struct gpuq_client *c)
{
	gpuq_close(c);
	daemon_stop(d);
}

/* Runs text; the kernel must have come from `source` (nvrtc, disk, memory, graph). */
static void run_from(struct gpuq_client *c, const char *text, const char *source)
{
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	char got[32];
	struct gpuq_reply *r = expr_ok(c, text, &o);
	expect_compiled(r);
	reply_str(r, "job.result.kernel_source", got, sizeof got);
	CHECKF(strcmp(got, source) == 0, "'%s': its kernel came from %s, not %s", text, got, source);
	gpuq_reply_free(r);
}

/* Skips the test where this machine cannot compile (and gpu-check does not insist). */
static void need_compiling(struct gpuq_client *c)
{
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	char kernel[32];
	o.kernel = NULL;
	struct gpuq_reply *r = expr_ok(c, "y = x", &o);
	reply_kernel(r, kernel, sizeof kernel);
	bool compiled = strcmp(kernel, "compiled") == 0;
	if (!compiled)
		expect_compiled(r); /* fails under make gpu-check */
	gpuq_reply_free(r);
	if (!compiled)
		SKIP("no NVRTC on this machine: kernels are not compiled here");
}

TEST(chain_kernels_memory_disk_and_damaged_files)
{
	struct daemon_proc d;
	char names[8][256], path[512];
	unsigned tmps;
	cache_make();
	struct gpuq_client *c = start(&d, NULL, cache);
	need_compiling(c);
	run_from(c, "y = x * 3 + 1", "nvrtc");
	run_from(c, "y = x * 3 + 1", "graph");  /* its plan holds it */
	run_from(c, "y = x * 5 + 2", "memory"); /* another plan, the same kernel */
	CHECK_EQ(chain_stat(c, 0, "kernel_compiles"), 2); /* y = x, and this one */
	CHECK_EQ(chain_stat(c, 0, "kernel_memory_hits"), 1);
	CHECK_EQ(chain_stat(c, 0, "kernel_entries"), 2);
	stop(&d, c);
	CHECK_EQ(cache_files(&tmps, names, 8), 2);
	CHECK_EQ(tmps, 0);
	/* A new daemon reads them from disk. */
	c = start(&d, NULL, cache);
	run_from(c, "y = x * 3 + 1", "disk");
	run_from(c, "y = x", "disk");
	CHECK_EQ(chain_stat(c, 0, "kernel_disk_hits"), 2);
	CHECK_EQ(chain_stat(c, 0, "kernel_compiles"), 0);
	stop(&d, c);
	/* Damaged: one cut short, one with a byte flipped in its middle. */
	for (unsigned i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/%.200s", cache, names[i]);
		FILE *f = fopen(path, "r+b");
		CHECK(f && fseek(f, 0, SEEK_END) == 0);
		long size = ftell(f);
		if (i == 0) {
			CHECK(ftruncate(fileno(f), size / 2) == 0);
		} else {
			CHECK(fseek(f, size / 2, SEEK_SET) == 0);
			int ch = fgetc(f);
			CHECK(fseek(f, size / 2, SEEK_SET) == 0 && fputc(ch ^ 1, f) != EOF);
		}
		fclose(f);
	}
	c = start(&d, NULL, cache);
	run_from(c, "y = x * 3 + 1", "nvrtc");
	run_from(c, "y = x", "nvrtc");
	CHECK_EQ(chain_stat(c, 0, "kernel_disk_rejects"), 2);
	CHECK_EQ(chain_stat(c, 0, "kernel_compiles"), 2);
	stop(&d, c);
	c = start(&d, NULL, cache); /* stored whole again */
	run_from(c, "y = x * 3 + 1", "disk");
	run_from(c, "y = x", "disk");
	stop(&d, c);
	cache_remove();
}

static const char *const shared[] = {
	"y = x + 1", "y = x * x", "y = sin(x)", "y = relu(x - 0.5)", "y = abs(x) / 3", "y = x - x * x",
};
#define NSHARED (sizeof shared / sizeof shared[0])

TEST(chain_kernels_two_daemons_share_the_directory)
{
	struct daemon_proc a, b;
	char names[16][256];
	unsigned tmps;
	cache_make();
	struct gpuq_client *ca = start(&a, NULL, cache), *cb = start(&b, NULL, cache);
	need_compiling(ca);
	/* Both compile and store the same kernels at the same time, in opposite orders. */
	for (size_t i = 0; i < NSHARED; i++) {
		struct expr_opts o = EXPR_OPTS_DEFAULT;
		o.count = -1;
		struct gpuq_reply *ra = expr_call(ca, "run", shared[i], &o);
		struct gpuq_reply *rb = expr_call(cb, "run", shared[NSHARED - 1 - i], &o);
		expect_ok(ra, shared[i]);
		expect_ok(rb, shared[NSHARED - 1 - i]);
		expect_compiled(ra);
		expect_compiled(rb);
		gpuq_reply_free(ra);
		gpuq_reply_free(rb);
	}
	stop(&a, ca);
	stop(&b, cb);
	CHECK_EQ(cache_files(&tmps, names, 16), NSHARED + 1); /* with need_compiling's */
	CHECK_EQ(tmps, 0);
	/* A third daemon finds every one whole on disk. */
	struct gpuq_client *c = start(&a, NULL, cache);
	for (size_t i = 0; i < NSHARED; i++)
		run_from(c, shared[i], "disk");
	CHECK_EQ(chain_stat(c, 0, "kernel_disk_rejects"), 0);
	stop(&a, c);
	cache_remove();
}

TEST(chain_kernels_without_nvrtc_or_disk)
{
	struct daemon_proc d;
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	char kernel[32], note[400];
	cache_make();
	struct gpuq_client *c = start(&d, "off", cache);
	struct gpuq_reply *r = expr_ok(c, "y = x * 2", &o);
	reply_kernel(r, kernel, sizeof kernel);
	reply_str(r, "job.result.kernel_note", note, sizeof note);
	CHECK_STR(kernel, "interpreted");
	CHECK(strstr(note, "NVRTC is turned off (--nvrtc off)"));
	gpuq_reply_free(r);
	o.math = "fast";
	r = expr_ok(c, "y = x * 3", &o);
	reply_str(r, "job.result.kernel_note", note, sizeof note);
	CHECK(strstr(note, "it computes IEEE"));
	gpuq_reply_free(r);
	o = EXPR_OPTS_DEFAULT;
	o.kernel = "compiled";
	r = expr_call(c, "run", "y = x * 4", &o);
	expect_error(r, GPUQ_E_DEVICE_ERROR, "kernel compiled was asked for and cannot be had");
	gpuq_reply_free(r);
	CHECK_EQ(chain_stat(c, 0, "kernel_fallbacks"), 3);
	CHECK_EQ(chain_stat(c, 0, "kernel_compiles"), 0);
	stop(&d, c);
	/* --kernel-cache none: compiled each time a daemon starts, nothing on disk. */
	c = start(&d, NULL, "none");
	need_compiling(c);
	run_from(c, "y = x * 2", "nvrtc");
	stop(&d, c);
	c = start(&d, NULL, "none");
	run_from(c, "y = x * 2", "nvrtc");
	stop(&d, c);
	unsigned tmps;
	char names[4][256];
	CHECK_EQ(cache_files(&tmps, names, 4), 0);
	cache_remove();
}

/*
 * A kernel cache gpuqd refuses (writable by others) is said in gpuqd's
 * log, as a warning with its prefix, and not at --log-level error.
 */
TEST(chain_kernels_cache_refusal_is_a_logged_warning)
{
	struct daemon_proc d;
	cache_make();
	CHECK(chmod(cache, 0777) == 0);
	for (int quiet = 0; quiet < 2; quiet++) {
		if (quiet)
			daemon_start(&d, "--kernel-cache", cache, "--log-level", "error", NULL);
		else
			daemon_start(&d, "--kernel-cache", cache, NULL);
		struct gpuq_client *c = client_open(&d);
		talloc(c, "x", &tdtype_f32, N, 0);
		talloc(c, "y", &tdtype_f32, N, 0);
		need_compiling(c);
		char warned[64];
		snprintf(warned, sizeof warned, "gpuqd[%d]: warn: [gpu 0] kernel cache: ", (int)d.pid);
		int lines = daemon_log_count(&d, "kernel cache");
		if (quiet) {
			CHECKF(lines == 0, "%d kernel cache lines at --log-level error", lines);
		} else {
			CHECKF(lines > 0 && daemon_log_count(&d, warned) == lines,
			       "%d kernel cache lines, %d of them \"%s...\"", lines,
			       daemon_log_count(&d, warned), warned);
		}
		stop(&d, c);
	}
	rmdir(cache);
}
