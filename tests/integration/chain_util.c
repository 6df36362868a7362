#include "tests/integration/chain_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "protocol/dtype.h"
#include "protocol/hash.h"

const struct tdtype tdtype_f32 = { "f32", GPUQ_DTYPE_F32, 4, 23, -149 };
const struct tdtype tdtype_f64 = { "f64", GPUQ_DTYPE_F64, 8, 52, -1074 };
const struct tdtype tdtype_f16 = { "f16", GPUQ_DTYPE_F16, 2, 10, -24 };
const struct tdtype tdtype_bf16 = { "bf16", GPUQ_DTYPE_BF16, 2, 7, -133 };

long double tload(const struct tdtype *t, const void *p, size_t i)
{
	switch (t->dtype) {
	case GPUQ_DTYPE_F16: return gpuq_f16_bits_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_BF16: return gpuq_bf16_bits_to_f32(((const uint16_t *)p)[i]);
	case GPUQ_DTYPE_F32: return ((const float *)p)[i];
	default: return ((const double *)p)[i];
	}
}

void tstore(const struct tdtype *t, void *p, size_t i, long double v)
{
	switch (t->dtype) {
	case GPUQ_DTYPE_F16: ((uint16_t *)p)[i] = gpuq_f32_to_f16_bits((float)v); break;
	case GPUQ_DTYPE_BF16: ((uint16_t *)p)[i] = gpuq_f32_to_bf16_bits((float)v); break;
	case GPUQ_DTYPE_F32: ((float *)p)[i] = (float)v; break;
	default: ((double *)p)[i] = (double)v; break;
	}
}

long double tround(const struct tdtype *t, long double v)
{
	unsigned char buf[8];
	tstore(t, buf, 0, v);
	return tload(t, buf, 0);
}

long double tulp(const struct tdtype *t, long double v)
{
	int e = v == 0 || !isfinite(v) ? t->min_exp + t->mant : ilogbl(v);
	int p = e - t->mant < t->min_exp ? t->min_exp : e - t->mant;
	return ldexpl(1.0L, p);
}

void talloc(struct gpuq_client *c, const char *name, const struct tdtype *t, uint64_t count,
	    int device)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "alloc");
	mp_put_str(&req, "name", name);
	mp_put_u64(&req, "device", (uint64_t)device);
	mp_put_u64(&req, "count", count);
	mp_put_str(&req, "dtype", t->name);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "alloc");
	gpuq_reply_free(r);
}

void tput(struct gpuq_client *c, const char *name, const void *data, size_t bytes)
{
	int fd = memfd_create("chain-in", MFD_CLOEXEC);
	CHECK(fd >= 0);
	CHECK_EQ(pwrite(fd, data, bytes, 0), bytes);
	CHECK_EQ(do_put(c, name, fd), bytes);
	close(fd);
}

void *tget(struct gpuq_client *c, const char *name, size_t bytes)
{
	int fd = memfd_create("chain-out", MFD_CLOEXEC);
	size_t n;
	CHECK(fd >= 0);
	CHECK_EQ(do_get(c, name, fd), bytes);
	void *out = fd_slurp(fd, &n);
	CHECK_EQ(n, bytes);
	close(fd);
	return out;
}

void tfill_value(struct gpuq_client *c, const char *name, double v)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, "fill");
	mp_put_str(&req, "buffer", name);
	mp_put_str(&req, "pattern", "value");
	mp_put_f64(&req, "value", v);
	mp_put_bool(&req, "wait", true);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "fill value");
	gpuq_reply_free(r);
}

void *trandom(const struct tdtype *t, size_t n, double lo, double hi, uint64_t seed)
{
	void *p = malloc(n * t->size);
	CHECK(p);
	for (size_t i = 0; i < n; i++)
		tstore(t, p, i, lo + (hi - lo) * gpuq_uniform_f64(gpuq_random_word(seed, i)));
	return p;
}

/* 'add 1 | sqrt' as [["add", 1.0], ["sqrt"]]. */
static void put_ops(struct mp_map *req, const char *chain)
{
	char text[1024], *save = NULL;
	struct mp_array ops;
	snprintf(text, sizeof text, "%s", chain);
	mp_array_init(&ops);
	for (char *seg = strtok_r(text, "|", &save); seg; seg = strtok_r(NULL, "|", &save)) {
		struct mp_array op;
		char *wsave = NULL, *w = strtok_r(seg, " ", &wsave);
		mp_array_init(&op);
		mp_array_str(&op, w ? w : "");
		while ((w = strtok_r(NULL, " ", &wsave)) != NULL)
			mp_array_f64(&op, strtod(w, NULL));
		mp_array_array(&ops, &op);
	}
	mp_put_array(req, "ops", &ops);
}

struct gpuq_reply *run_chain(struct gpuq_client *c, const char *buffer, const char *chain,
			     const char *mode, uint64_t repeat, const char *out)
{
	return run_chain_kernel(c, buffer, chain, mode, repeat, out, NULL);
}

/* A `run` request of chain on buffer; mode, repeat (0) and out are left out when not given. */
static void begin_run(struct gpuq_client *c, struct mp_map *req, const char *buffer,
		      const char *chain, const char *mode, uint64_t repeat, const char *out)
{
	gpuq_request_begin(c, req, "run");
	mp_put_str(req, "buffer", buffer);
	put_ops(req, chain);
	if (mode)
		mp_put_str(req, "mode", mode);
	if (repeat)
		mp_put_u64(req, "repeat", repeat);
	if (out)
		mp_put_str(req, "out", out);
}

struct gpuq_reply *run_chain_kernel(struct gpuq_client *c, const char *buffer, const char *chain,
				    const char *mode, uint64_t repeat, const char *out,
				    const char *kernel)
{
	struct mp_map req;
	begin_run(c, &req, buffer, chain, mode, repeat, out);
	if (kernel)
		mp_put_str(&req, "kernel", kernel);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

uint64_t run_chain_detached(struct gpuq_client *c, const char *buffer, const char *chain,
			    const char *mode, uint64_t repeat, const char *out)
{
	struct mp_map req;
	begin_run(c, &req, buffer, chain, mode, repeat, out);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "run (not waited for)");
	uint64_t job = reply_u64(r, "job.job");
	gpuq_reply_free(r);
	return job;
}

void run_ok(struct gpuq_client *c, const char *buffer, const char *chain, const char *mode,
	    uint64_t repeat, const char *out)
{
	struct gpuq_reply *r = run_chain(c, buffer, chain, mode, repeat, out);
	char what[256];
	snprintf(what, sizeof what, "run %s '%s' (%s)", buffer, chain, mode ? mode : "fused");
	expect_ok(r, what);
	gpuq_reply_free(r);
}

struct gpuq_reply *expr_call(struct gpuq_client *c, const char *op, const char *text,
			     const struct expr_opts *o)
{
	struct mp_map req;
	gpuq_request_begin(c, &req, op);
	mp_put_str(&req, "expr", text);
	if (o->mode)
		mp_put_str(&req, "mode", o->mode);
	if (o->kernel)
		mp_put_str(&req, "kernel", o->kernel);
	if (o->math)
		mp_put_str(&req, "math", o->math);
	if (o->repeat)
		mp_put_u64(&req, "repeat", o->repeat);
	if (o->device >= 0)
		mp_put_u64(&req, "device", (uint64_t)o->device);
	if (o->count >= 0)
		mp_put_u64(&req, "count", (uint64_t)o->count);
	mp_put_bool(&req, "wait", true);
	return call(c, &req, NULL, 0);
}

struct gpuq_reply *expr_ok(struct gpuq_client *c, const char *text, const struct expr_opts *o)
{
	struct gpuq_reply *r = expr_call(c, "run", text, o);
	char what[300];
	snprintf(what, sizeof what, "run '%s'", text);
	expect_ok(r, what);
	return r;
}

double reduce_ok(struct gpuq_client *c, const char *text, const char *kernel, int64_t count)
{
	struct expr_opts o = EXPR_OPTS_DEFAULT;
	char what[300];
	o.kernel = kernel;
	o.count = count;
	struct gpuq_reply *r = expr_call(c, "reduce_expr", text, &o);
	snprintf(what, sizeof what, "reduce '%s'", text);
	expect_ok(r, what);
	if (!kernel)
		expect_compiled(r);
	const msgpack_object *v = reply_path(r, "job.result.value");
	CHECKF(v, "reduce '%s' has no value", text);
	double d = v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32
			   ? v->via.f64
		   : v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (double)v->via.i64
								 : (double)v->via.u64;
	gpuq_reply_free(r);
	return d;
}

void reply_kernel(const struct gpuq_reply *r, char *out, size_t size)
{
	reply_str(r, "job.result.kernel", out, size);
}

void expect_compiled(const struct gpuq_reply *r)
{
	char kernel[32], note[400] = "";
	reply_kernel(r, kernel, sizeof kernel);
	if (strcmp(kernel, "compiled") == 0)
		return;
	const msgpack_object *n = reply_path(r, "job.result.kernel_note");
	if (n && n->type == MSGPACK_OBJECT_STR)
		snprintf(note, sizeof note, "%.*s", (int)n->via.str.size, n->via.str.ptr);
	const char *require = getenv("GPUQ_REQUIRE_GPU");
	CHECKF(strstr(note, "no NVRTC") && !(require && strcmp(require, "1") == 0),
	       "the fused run was not compiled: %s", note);
}

uint64_t chain_stat(struct gpuq_client *c, int device, const char *counter)
{
	struct mp_map req;
	char path[96];
	gpuq_request_begin(c, &req, "stats");
	mp_put_u64(&req, "device", (uint64_t)device);
	struct gpuq_reply *r = call(c, &req, NULL, 0);
	expect_ok(r, "stats");
	const msgpack_object *devs = reply_path(r, "devices");
	CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && devs->via.array.size == 1);
	snprintf(path, sizeof path, "%s", counter);
	const msgpack_object *chain = msg_map_get(&devs->via.array.ptr[0], "chain");
	const msgpack_object *v = msg_map_get(chain, path);
	CHECKF(v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER, "stats has no chain.%s", counter);
	uint64_t n = v->via.u64;
	gpuq_reply_free(r);
	return n;
}

/* Constant k of an op's text, as gpuqd uses it for t. */
static long double op_const(const struct tdtype *t, const char *args, int k)
{
	const char *p = args;
	double v = 0;
	for (int i = 0; i <= k; i++)
		v = strtod(p, (char **)&p);
	return t->dtype == GPUQ_DTYPE_F64 ? (long double)v : (long double)(float)v;
}

long double ref_op(const struct tdtype *t, const char *op, long double x)
{
	char name[16];
	size_t len = strcspn(op, " ");
	snprintf(name, sizeof name, "%.*s", (int)len, op);
	const char *args = op + len;
	long double a = strchr(args, ' ') ? op_const(t, args, 0) : 0;
	if (!strcmp(name, "sin")) return sinl(x);
	if (!strcmp(name, "cos")) return cosl(x);
	if (!strcmp(name, "tan")) return tanl(x);
	if (!strcmp(name, "exp")) return expl(x);
	if (!strcmp(name, "log")) return logl(x);
	if (!strcmp(name, "log2")) return log2l(x);
	if (!strcmp(name, "sqrt")) return sqrtl(x);
	if (!strcmp(name, "rsqrt")) return 1.0L / sqrtl(x);
	if (!strcmp(name, "abs")) return fabsl(x);
	if (!strcmp(name, "neg")) return -x;
	if (!strcmp(name, "relu")) return x > 0 ? x : 0;
	if (!strcmp(name, "sigmoid")) return 1.0L / (1.0L + expl(-x));
	if (!strcmp(name, "tanh")) return tanhl(x);
	if (!strcmp(name, "floor")) return floorl(x);
	if (!strcmp(name, "ceil")) return ceill(x);
	if (!strcmp(name, "round")) return roundl(x);
	if (!strcmp(name, "add")) return x + a;
	if (!strcmp(name, "sub")) return x - a;
	if (!strcmp(name, "mul")) return x * a;
	if (!strcmp(name, "div")) return x / a;
	if (!strcmp(name, "pow")) return powl(x, a);
	if (!strcmp(name, "min")) return fminl(x, a);
	if (!strcmp(name, "max")) return fmaxl(x, a);
	if (!strcmp(name, "clamp")) return fminl(fmaxl(x, a), op_const(t, args, 1));
	if (!strcmp(name, "fma")) return x * a + op_const(t, args, 1);
	harness_fail(__FILE__, __LINE__, "no reference for op '%s'", op);
}

bool same_value(const struct tdtype *t, const void *a, const void *b, size_t i)
{
	const unsigned char *x = (const unsigned char *)a + i * t->size;
	const unsigned char *y = (const unsigned char *)b + i * t->size;
	if (memcmp(x, y, t->size) == 0)
		return true;
	return isnan(tload(t, a, i)) && isnan(tload(t, b, i));
}
