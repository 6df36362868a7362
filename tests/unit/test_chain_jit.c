/*
 * Unit tests for compiled chain kernels without a GPU: the generated source
 * of programs of every op, dtype, shape and reduction compiles with NVRTC
 * for sm_90 (IEEE and fast math); the disk cache stores atomically, rejects
 * truncated, corrupted and colliding files, and stays whole while processes
 * race on one directory; a device's kernel cache finds kernels in memory,
 * on disk (as a new daemon would) and compiles them, counting each.
 * Loading and running the kernels needs a GPU: tests/gpu/kernels_selftest.cu.
 * Without NVRTC here the compiling tests say so and skip.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "workers/chain/chain_codegen.h"
#include "workers/chain/chain_diskcache.h"
#include "workers/chain/chain_expr.h"
#include "workers/chain/chain_jit.h"

static const struct chain_nvrtc_status *need_nvrtc(void)
{
	const struct chain_nvrtc_status *s = chain_nvrtc_load("");
	if (!s->available)
		SKIP("no NVRTC here: %s", s->why);
	return s;
}

/* text bound with every variable of dtype t (count 64; `s` one element). */
static void program(const char *text, bool reduce, enum gpuq_dtype t, chain_prog *out)
{
	static struct chain_expr x;
	static char ids[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_error e;
	struct chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	uint64_t n;
	CHECKF(chain_expr_parse(text, reduce, &x, &e) == 0, "'%s': %s", text, e.msg);
	for (unsigned v = 0; v < x.nvars; v++) {
		enum gpuq_dtype vt = t;
		if (x.vars[v].name[0] == 'h')
			vt = GPUQ_DTYPE_F16; /* h*: another dtype, for mixed programs */
		b[v] = (struct chain_expr_binding){ vt, strcmp(x.vars[v].name, "s") ? 64 : 1, 0, &ids[v] };
	}
	CHECKF(chain_expr_bind(&x, b, &n, &e) == 0, "'%s': %s", text, e.msg);
	*out = x.prog;
}

static void compile_ok(const chain_prog *p, bool fast, const char *what)
{
	const char *names[CHAIN_CODEGEN_HEADERS], *texts[CHAIN_CODEGEN_HEADERS];
	char why[2048];
	struct chain_image img;
	char *src = chain_codegen_source(p);
	CHECK(src);
	chain_codegen_headers(names, texts);
	int rc = chain_nvrtc_compile(src, CHAIN_CODEGEN_HEADERS, names, texts, "sm_90", false, fast,
				     &img, why, sizeof why);
	CHECKF(rc == 0, "%s (%s) did not compile: %s\n--- source ---\n%s", what,
	       fast ? "fast" : "ieee", why, src);
	CHECK(img.size > 1000 && !img.ptx && strcmp(img.arch, "sm_90") == 0);
	CHECK(strstr(src, chain_codegen_entry(p)));
	free(img.data);
	free(src);
}

TEST(chain_codegen_compiles_every_op_dtype_and_shape)
{
	need_nvrtc();
	static const enum gpuq_dtype types[] = { GPUQ_DTYPE_F16, GPUQ_DTYPE_BF16, GPUQ_DTYPE_F32,
						 GPUQ_DTYPE_F64 };
	struct kernels_chain_op ops[KERNELS_CHAIN_KINDS];
	chain_prog p;
	for (unsigned k = 0; k < KERNELS_CHAIN_KINDS; k++)
		ops[k] = (struct kernels_chain_op){ k, 0.5, 2 };
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		chain_prog_from_ops(&p, ops, KERNELS_CHAIN_KINDS, types[t]);
		compile_ok(&p, false, "every op");
		if (types[t] == GPUQ_DTYPE_F32)
			compile_ok(&p, true, "every op");
	}
	program("y = s * x + y; z = relu(f16(x) * 0.5 + h) ; w = clamp(y, -1, z)", false,
		GPUQ_DTYPE_F32, &p);
	compile_ok(&p, false, "mixed statements");
	program("y = f64(x) / 3 + bf16(s)", false, GPUQ_DTYPE_F32, &p);
	compile_ok(&p, false, "casts");
	program("y = 1.5", false, GPUQ_DTYPE_F64, &p);
	compile_ok(&p, false, "a constant");
	static const char *const reductions[] = { "sum(abs(x - y))", "min(x)", "max(x * s)",
						  "mean(h)", "norm2(x)", "dot(x, h + 1)",
						  "count_nonzero(x)", "argmax(sin(x))" };
	for (size_t i = 0; i < sizeof reductions / sizeof reductions[0]; i++) {
		program(reductions[i], true, GPUQ_DTYPE_BF16, &p);
		compile_ok(&p, false, reductions[i]);
	}
}

TEST(chain_codegen_depends_on_shape_not_constants)
{
	chain_prog a, b, c;
	program("y = x * 2 + 1", false, GPUQ_DTYPE_F32, &a);
	program("y = x * 7 + 3", false, GPUQ_DTYPE_F32, &b);
	program("y = x * 2 + 1", false, GPUQ_DTYPE_F16, &c);
	char *sa = chain_codegen_source(&a), *sb = chain_codegen_source(&b), *sc = chain_codegen_source(&c);
	CHECK(sa && sb && sc);
	CHECK_STR(sa, sb);
	CHECK(strcmp(sa, sc) != 0);
	CHECK(strstr(sa, "p.prog.c[0]") && !strstr(sa, "7"));
	free(sa);
	free(sb);
	free(sc);
}

/* ---- The disk cache ---- */

static char *tmp_dir(void)
{
	static char dir[64];
	snprintf(dir, sizeof dir, "/tmp/gpuq-unit-kc.XXXXXX");
	CHECK(mkdtemp(dir));
	return dir;
}

/* Removes dir and the files in it. */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];
	while (d && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || strcmp(e->d_name, "..") == 0))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		unlink(path);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

static unsigned files_in(const char *dir, unsigned *temporaries)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	unsigned n = 0;
	*temporaries = 0;
	while (d && (e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		n++;
		*temporaries += e->d_name[0] == '.';
	}
	if (d)
		closedir(d);
	return n;
}

static const char k_source[] = "the source NVRTC compiled, byte for byte";
static const unsigned char k_image[] = "\x7f" "ELF pretend cubin with some bytes in it";

static struct chain_image image_of(void)
{
	struct chain_image img = { (void *)k_image, sizeof k_image, false, "sm_90" };
	return img;
}

static enum chain_disk_result load(const char *dir, const char *source, struct chain_image *out)
{
	char why[400];
	return chain_diskcache_load(dir, "k.kernel", source, strlen(source), "sm_90", "13.0", out, why,
				    sizeof why);
}

/* Rewrites dir/k.kernel with byte at `at` flipped, or cut to `keep` bytes. */
static void damage(const char *dir, long at, long keep)
{
	char path[512];
	snprintf(path, sizeof path, "%s/k.kernel", dir);
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	if (keep >= 0) {
		CHECK(ftruncate(fd, keep) == 0);
	} else {
		unsigned char c;
		CHECK(pread(fd, &c, 1, at) == 1);
		c ^= 0x20;
		CHECK(pwrite(fd, &c, 1, at) == 1);
	}
	close(fd);
}

TEST(chain_diskcache_detects_damage_and_mismatch)
{
	char *dir = tmp_dir(), why[400], sub[128];
	struct chain_image img = image_of(), got;
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_MISS);
	snprintf(sub, sizeof sub, "%s/deeper/kernels", dir); /* made, 0700 */
	CHECK(chain_diskcache_store(sub, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64, why,
				    sizeof why) == 0);
	struct stat st;
	CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700);
	CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64, why,
				    sizeof why) == 0);
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_HIT);
	CHECK(got.size == sizeof k_image && memcmp(got.data, k_image, got.size) == 0 && !got.ptx);
	free(got.data);
	/* Another source under the same name: a collision, never loaded. */
	CHECK_EQ(load(dir, "the source NVRTC compiled, byte for bytE", &got), CHAIN_DISK_REJECTED);
	/* Another arch or toolkit. */
	CHECK_EQ(chain_diskcache_load(dir, "k.kernel", k_source, strlen(k_source), "sm_80", "13.0",
				      &got, why, sizeof why), CHAIN_DISK_REJECTED);
	CHECK(strstr(why, "another architecture"));
	CHECK_EQ(chain_diskcache_load(dir, "k.kernel", k_source, strlen(k_source), "sm_90", "12.9",
				      &got, why, sizeof why), CHAIN_DISK_REJECTED);
	/* A flipped byte in the image, in the header, in the source; a cut file. */
	struct stat fst;
	char path[512];
	snprintf(path, sizeof path, "%s/k.kernel", dir);
	CHECK(stat(path, &fst) == 0);
	damage(dir, fst.st_size - 3, -1);
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_REJECTED);
	const long spots[] = { 2, 20, fst.st_size - (long)sizeof k_image - 5 };
	for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
		CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64,
					    why, sizeof why) == 0);
		damage(dir, spots[i], -1);
		CHECKF(load(dir, k_source, &got) == CHAIN_DISK_REJECTED, "flipped byte %ld loaded", spots[i]);
	}
	const long cuts[] = { 0, 5, 60, fst.st_size - 1 };
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64,
					    why, sizeof why) == 0);
		damage(dir, 0, cuts[i]);
		CHECKF(load(dir, k_source, &got) == CHAIN_DISK_REJECTED, "cut at %ld loaded", cuts[i]);
	}
	/* Files and directories others could write are never loaded. */
	CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64, why,
				    sizeof why) == 0);
	CHECK(chmod(path, 0666) == 0);
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_REJECTED);
	CHECK(chmod(path, 0600) == 0 && chmod(dir, 0777) == 0);
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_REJECTED);
	CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64, why,
				    sizeof why) < 0 && strstr(why, "writable by others"));
	CHECK(chmod(dir, 0700) == 0);
	/* Stored again, it loads: nothing else is left behind. */
	CHECK(chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64, why,
				    sizeof why) == 0);
	CHECK_EQ(load(dir, k_source, &got), CHAIN_DISK_HIT);
	free(got.data);
	unsigned tmps;
	CHECK_EQ(files_in(dir, &tmps), 2); /* k.kernel and deeper/ */
	CHECK_EQ(tmps, 0);
	snprintf(path, sizeof path, "%s/k.kernel", sub);
	unlink(path);
	snprintf(path, sizeof path, "%s/deeper", dir);
	rmdir(sub);
	rmdir(path);
	remove_dir(dir);
}

/* Stored beyond the bound, the least recently used kernels go; temporaries of dead writers too. */
TEST(chain_diskcache_keeps_the_most_recently_used)
{
	char *dir = tmp_dir(), why[400], name[32], path[512];
	struct chain_image img = image_of(), got;
	unsigned tmps;
	for (int i = 0; i < 12; i++) {
		snprintf(name, sizeof name, "k%02d.kernel", i);
		CHECK(chain_diskcache_store(dir, name, k_source, strlen(k_source), "13.0", &img, 8, why,
					    sizeof why) == 0);
		snprintf(path, sizeof path, "%s/%s", dir, name);
		struct timespec t[2] = { { 1000 + i, 0 }, { 1000 + i, 0 } }; /* stored in this order */
		CHECK(utimensat(AT_FDCWD, path, t, 0) == 0);
		if (i == 1) { /* k00 is loaded after k01 was stored: it is used more recently than any */
			CHECK(chain_diskcache_load(dir, "k00.kernel", k_source, strlen(k_source), "sm_90",
						   "13.0", &got, why, sizeof why) == CHAIN_DISK_HIT);
			free(got.data);
		}
	}
	CHECK_EQ(files_in(dir, &tmps), 8);
	CHECK(access((snprintf(path, sizeof path, "%s/k00.kernel", dir), path), F_OK) == 0);
	CHECK(access((snprintf(path, sizeof path, "%s/k01.kernel", dir), path), F_OK) != 0);
	CHECK(access((snprintf(path, sizeof path, "%s/k11.kernel", dir), path), F_OK) == 0);
	/* A temporary two hours old goes at the next store; a fresh one stays. */
	snprintf(path, sizeof path, "%s/.old.kernel.AAAAAA", dir);
	FILE *f = fopen(path, "w");
	CHECK(f && fclose(f) == 0);
	struct timespec old[2] = { { time(NULL) - 7200, 0 }, { time(NULL) - 7200, 0 } };
	CHECK(utimensat(AT_FDCWD, path, old, 0) == 0);
	snprintf(path, sizeof path, "%s/.new.kernel.BBBBBB", dir);
	f = fopen(path, "w");
	CHECK(f && fclose(f) == 0);
	CHECK(chain_diskcache_store(dir, "k12.kernel", k_source, strlen(k_source), "13.0", &img, 8,
				    why, sizeof why) == 0);
	CHECK_EQ(files_in(dir, &tmps), 9);
	CHECK_EQ(tmps, 1);
	remove_dir(dir);
}

/* One racer: stores and loads the same kernel; exits 1 on anything but a whole kernel. */
static void race(const char *dir, int rounds)
{
	struct chain_image img = image_of(), got;
	char why[400];
	for (int r = 0; r < rounds; r++) {
		if (chain_diskcache_store(dir, "k.kernel", k_source, strlen(k_source), "13.0", &img, 64,
					  why, sizeof why) != 0)
			_exit(2);
		enum chain_disk_result res = load(dir, k_source, &got);
		if (res != CHAIN_DISK_HIT || got.size != sizeof k_image ||
		    memcmp(got.data, k_image, got.size) != 0)
			_exit(1);
		free(got.data);
	}
	_exit(0);
}

TEST(chain_diskcache_processes_racing_on_one_directory)
{
	char *dir = tmp_dir();
	pid_t pids[6];
	for (int i = 0; i < 6; i++) {
		pids[i] = fork();
		CHECK(pids[i] >= 0);
		if (pids[i] == 0)
			race(dir, 200);
	}
	for (int i = 0; i < 6; i++) {
		int status;
		CHECK(waitpid(pids[i], &status, 0) == pids[i]);
		CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		       "racer %d saw a partial or failed kernel (status 0x%x)", i, status);
	}
	unsigned tmps;
	CHECK_EQ(files_in(dir, &tmps), 1);
	CHECK_EQ(tmps, 0);
	remove_dir(dir);
}

/* ---- A device's kernel cache: memory, disk, NVRTC ---- */

static struct chain_jit_entry *jit_get(struct device *dev, struct chain_jit *j, const chain_prog *p,
				       enum chain_source want)
{
	struct chain_jit_loader none = { NULL, NULL };
	struct chain_jit_entry *e;
	struct chain_kernel_info info;
	struct gpuq_error err;
	memset(&info, 0, sizeof info);
	int rc = chain_jit_get(dev, j, &none, p, CHAIN_MATH_IEEE, &e, &info, &err);
	CHECKF(rc == 0, "chain_jit_get: %d: %s %s", rc, info.note, err.message);
	CHECKF(info.source == want, "the kernel came from %s, not %s", chain_source_name(info.source),
	       chain_source_name(want));
	CHECK_STR(info.arch, "sm_90");
	chain_jit_release(j, e);
	return e;
}

#define KCOUNT(dev, name) chain_counter_get((dev), CHAIN_COUNTER_kernel_##name)

TEST(chain_jit_memory_disk_and_nvrtc)
{
	need_nvrtc();
	static struct device dev;
	char *dir = tmp_dir();
	chain_prog p, q;
	struct chain_jit_loader none = { NULL, NULL };
	memset(&dev, 0, sizeof dev);
	snprintf(dev.config.kernel_cache_dir, sizeof dev.config.kernel_cache_dir, "%s", dir);
	program("y = a * x + y", false, GPUQ_DTYPE_F32, &p);
	program("y = a * x + y", false, GPUQ_DTYPE_F64, &q);
	struct chain_jit *j = chain_jit_new(4);
	CHECK(j);
	jit_get(&dev, j, &p, CHAIN_SOURCE_NVRTC);
	jit_get(&dev, j, &p, CHAIN_SOURCE_MEMORY);
	jit_get(&dev, j, &q, CHAIN_SOURCE_NVRTC);
	CHECK_EQ(KCOUNT(&dev, compiles), 2);
	CHECK_EQ(KCOUNT(&dev, memory_hits), 1);
	CHECK_EQ(KCOUNT(&dev, entries), 2);
	chain_jit_free(&dev, j, &none);
	/* A new daemon: the disk has both. */
	j = chain_jit_new(4);
	jit_get(&dev, j, &p, CHAIN_SOURCE_DISK);
	jit_get(&dev, j, &q, CHAIN_SOURCE_DISK);
	CHECK_EQ(KCOUNT(&dev, disk_hits), 2);
	chain_jit_free(&dev, j, &none);
	/* Damage every file: each is rejected, compiled again, stored whole. */
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];
	int damaged = 0;
	while (d && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		CHECK(truncate(path, damaged++ ? 100 : 0) == 0);
	}
	closedir(d);
	CHECK_EQ(damaged, 2);
	j = chain_jit_new(4);
	jit_get(&dev, j, &p, CHAIN_SOURCE_NVRTC);
	jit_get(&dev, j, &q, CHAIN_SOURCE_NVRTC);
	CHECK_EQ(KCOUNT(&dev, disk_rejects), 2);
	CHECK_EQ(KCOUNT(&dev, compiles), 4);
	chain_jit_free(&dev, j, &none);
	j = chain_jit_new(4);
	jit_get(&dev, j, &p, CHAIN_SOURCE_DISK);
	chain_jit_free(&dev, j, &none);
	/* The benchmark's costs leave nothing behind. */
	j = chain_jit_new(4);
	struct chain_jit_costs costs;
	struct gpuq_error err;
	CHECK(chain_jit_measure(&dev, j, &none, &p, &costs, &err) == 0);
	CHECK(costs.nvrtc_s > 0 && costs.disk_s > 0 && costs.memory_s > 0);
	CHECK(costs.memory_s < costs.nvrtc_s);
	CHECK_EQ(KCOUNT(&dev, entries), 0);
	chain_jit_free(&dev, j, &none);
	unsigned tmps;
	CHECK_EQ(files_in(dir, &tmps), 2);
	remove_dir(dir);
}

TEST(chain_jit_keeps_capacity_unheld_entries)
{
	need_nvrtc();
	static struct device dev;
	struct chain_jit_loader none = { NULL, NULL };
	struct chain_jit_entry *held;
	struct chain_kernel_info info;
	struct gpuq_error err;
	chain_prog p[3];
	memset(&dev, 0, sizeof dev); /* no disk cache */
	program("y = x + 1", false, GPUQ_DTYPE_F32, &p[0]);
	program("y = x - 1", false, GPUQ_DTYPE_F32, &p[1]);
	program("y = x * x", false, GPUQ_DTYPE_F32, &p[2]);
	struct chain_jit *j = chain_jit_new(1);
	memset(&info, 0, sizeof info);
	CHECK(chain_jit_get(&dev, j, &none, &p[0], CHAIN_MATH_IEEE, &held, &info, &err) == 0);
	jit_get(&dev, j, &p[1], CHAIN_SOURCE_NVRTC);
	jit_get(&dev, j, &p[2], CHAIN_SOURCE_NVRTC); /* evicts p[1], the unheld one */
	CHECK_EQ(KCOUNT(&dev, entries), 2);
	jit_get(&dev, j, &p[0], CHAIN_SOURCE_MEMORY); /* held: still there */
	jit_get(&dev, j, &p[1], CHAIN_SOURCE_NVRTC);
	chain_jit_release(j, held);
	chain_jit_free(&dev, j, &none);
	CHECK_EQ(KCOUNT(&dev, entries), 0);
}
