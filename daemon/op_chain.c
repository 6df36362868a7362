/*
 * Kernel chains, the main thread's part: `run` validates a chain (every op
 * and argument, naming the op and its position when one is wrong), holds its
 * buffers and hands a struct chain_spec to the device's worker (a run with
 * an expression goes to op_expr.c); `stats` shows each device's worker,
 * chain and kernel-cache counters; `bench_chain` runs the chain benchmark
 * as a job. Main thread only.
 *
 * A run job owns a struct run_job (the spec and what only the daemon needs)
 * from the request until the job is freed (job->release), so that its
 * result can be rendered for status and wait as long as the job is kept.
 * Its --out buffer is held as job->buffer2, which the job's end releases.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "daemon/chain_request.h"
#include "daemon/op_expr.h"
#include "workers/chain/chain.h"
#include "workers/bench/chain_bench.h"

#define BENCH_DEFAULT_BYTES (1ull << 30)
#define BENCH_LAUNCH_COUNT 1024
#define BENCH_DEFAULT_REPEAT 1000
#define BENCH_MAX_REPEAT (CHAIN_MAX_GRAPH_KERNELS / 20) /* the 20-op chain must fit one graph */
#define BENCH_DEFAULT_REPS 10

struct run_job {
	struct chain_spec spec; /* first: work.spec points here */
	char out_label[BUFFER_NAME_MAX + 16]; /* "y@0" for --out, "" in place */
};

/* How an op's arguments read in messages: "add C", "clamp LO HI". */
static const char *op_usage(unsigned kind)
{
	switch (kind) {
	case KERNELS_CHAIN_CLAMP: return "clamp LO HI";
	case KERNELS_CHAIN_FMA: return "fma A B (x*A+B)";
	default: break;
	}
	static char usage[32];
	snprintf(usage, sizeof usage, "%s%s", chain_op_name(kind), chain_op_nargs(kind) ? " C" : "");
	return usage;
}

/* Argument `arg` (1-based) of op `pos`: a finite number. */
static int read_op_arg(const msgpack_object *o, unsigned pos, unsigned kind, unsigned arg,
		       double *out, struct gpuq_error *err)
{
	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; break;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; break;
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; break;
	default:
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "op %u '%s': argument %u is not a number (%s)",
				 pos, chain_op_name(kind), arg, op_usage(kind));
	}
	if (!isfinite(*out))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "op %u '%s': argument %u is %g; give a finite number",
				 pos, chain_op_name(kind), arg, *out);
	return 0;
}

/*
 * An op entry: [name, args...] or {op: name, args: [...]}. Sets *name, and
 * *args (NULL or an array's elements) with *nargs.
 */
static int split_op_entry(const msgpack_object *o, unsigned pos, const msgpack_object **name,
			  const msgpack_object **args, uint32_t *nargs, struct gpuq_error *err)
{
	*args = NULL;
	*nargs = 0;
	if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size >= 1) {
		*name = &o->via.array.ptr[0];
		*args = o->via.array.ptr + 1;
		*nargs = o->via.array.size - 1;
	} else if (o->type == MSGPACK_OBJECT_MAP) {
		*name = msg_map_get(o, "op");
		const msgpack_object *a = msg_map_get(o, "args");
		if (a && a->type != MSGPACK_OBJECT_ARRAY && a->type != MSGPACK_OBJECT_NIL)
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "op %u: 'args' must be an array of numbers",
					 pos);
		if (a && a->type == MSGPACK_OBJECT_ARRAY) {
			*args = a->via.array.ptr;
			*nargs = a->via.array.size;
		}
	} else {
		*name = NULL;
	}
	if (!*name || (*name)->type != MSGPACK_OBJECT_STR)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "op %u: expected [\"name\", args...] or {\"op\": \"name\", \"args\": [...]}",
				 pos);
	return 0;
}

/* Op `pos` (1-based) of the list, for a buffer of dtype. */
static int read_op(const msgpack_object *o, unsigned pos, enum gpuq_dtype dtype,
		   struct kernels_chain_op *op, struct gpuq_error *err)
{
	const msgpack_object *name, *args;
	uint32_t nargs;
	if (split_op_entry(o, pos, &name, &args, &nargs, err) < 0)
		return -1;
	int kind = chain_op_find(name->via.str.ptr, name->via.str.size);
	if (kind < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "op %u: unknown op '%.*s' (ops: %s)", pos,
				 (int)(name->via.str.size > 64 ? 64 : name->via.str.size),
				 name->via.str.ptr, chain_op_list());
	op->kind = (uint32_t)kind;
	op->a = op->b = 0;
	if (!chain_dtype_supported(dtype))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "op %u '%s': dtype %s is not supported; chains run on f16, bf16, f32 "
				 "and f64 buffers",
				 pos, chain_op_name(op->kind), gpuq_dtype_name(dtype));
	int want = chain_op_nargs(op->kind);
	if (nargs != (uint32_t)want)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "op %u '%s' takes %d argument%s (%s), not %u", pos,
				 chain_op_name(op->kind), want, want == 1 ? "" : "s", op_usage(op->kind),
				 nargs);
	double *slot[2] = { &op->a, &op->b };
	for (uint32_t i = 0; i < nargs; i++) {
		if (read_op_arg(&args[i], pos, op->kind, i + 1, slot[i], err) < 0)
			return -1;
		/* constants are rounded to float but for f64 chains: one that overflows is refused */
		if (dtype != GPUQ_DTYPE_F64 && gpuq_f32_overflows(*slot[i])) {
			char text[32], limit[32];
			gpuq_format_number(text, sizeof text, *slot[i], false);
			gpuq_format_number(limit, sizeof limit, FLT_MAX, true);
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "op %u '%s': argument %u is %s, beyond float's range (%s), in which "
					 "%s chains take their constants",
					 pos, chain_op_name(op->kind), i + 1, text, limit,
					 gpuq_dtype_name(dtype));
		}
	}
	return 0;
}

/*
 * run's arguments: the expression form's (op_expr.h), or the op-list
 * form's: `buffer`, `ops` (parsed for the buffer's dtype as they decode)
 * and `out`. The options come between ops and out, as they always did.
 */
struct run_args {
	struct expr_args e; /* first: the expression rows' and options' checks find it */
	struct args_buffer buffer, out;
	const msgpack_object *list; /* `ops` */
	struct kernels_chain_op ops[KERNELS_CHAIN_MAX_OPS];
	unsigned nops;
};

static bool op_list_form(const void *args)
{
	return !expr_form(args);
}

/* `ops`: 1 to 64 ops for the buffer's dtype, each refusal naming the op's position. */
static int run_read_ops(struct request *req, void *args, struct gpuq_error *err)
{
	struct run_args *a = args;
	enum gpuq_dtype dtype = a->buffer.b->dtype;
	uint32_t n = a->list->via.array.size;
	(void)req;
	if (n == 0 || n > KERNELS_CHAIN_MAX_OPS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ops' has %u ops; a chain has 1 to %d", n, KERNELS_CHAIN_MAX_OPS);
	for (uint32_t i = 0; i < n; i++)
		if (read_op(&a->list->via.array.ptr[i], i + 1, dtype, &a->ops[i], err) < 0)
			return -1;
	a->nops = n;
	return 0;
}

/* The out buffer, which must match the input's device, dtype and count; the input itself is in place. */
static int run_check_out(struct request *req, void *args, struct gpuq_error *err)
{
	struct run_args *a = args;
	const struct buffer *in = a->buffer.b, *o = a->out.b;
	(void)req;
	if (!o)
		return 0;
	if (o->device != in->device)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "out '%s@%d' is on gpu %d but buffer '%s@%d' on gpu %d; a chain runs on "
				 "one device: allocate out on gpu %d",
				 o->name, o->device, o->device, in->name, in->device, in->device,
				 in->device);
	if (o->dtype != in->dtype || o->count != in->count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "out '%s@%d' is %" PRIu64 " x %s but buffer '%s@%d' is %" PRIu64
				 " x %s; out needs the same shape (alloc --count %" PRIu64 " --dtype %s)",
				 o->name, o->device, o->count, gpuq_dtype_name(o->dtype), in->name,
				 in->device, in->count, gpuq_dtype_name(in->dtype), in->count,
				 gpuq_dtype_name(in->dtype));
	if (o == in)
		a->out.b = NULL; /* naming the input is running in place */
	return 0;
}

static const struct args_field run_fields[] = {
	{ "expr", ARGS_PRESENT, 0, ARGS_AT(struct run_args, e.form) },
	{ "ops", ARGS_PRESENT, 0, ARGS_AT(struct run_args, e.has_ops), .when = expr_form },
	{ "buffer", ARGS_PRESENT, 0, ARGS_AT(struct run_args, e.has_buffer), .when = expr_form },
	{ "out", ARGS_PRESENT, 0, ARGS_AT(struct run_args, e.has_out), .when = expr_form,
	  .then = expr_check_alone },
	EXPR_FIELDS(struct run_args, e,
		    "field 'expr' (an expression such as 'y = a * x + y') is required"),
	{ "buffer", ARGS_BUFFER_NAME, ARGS_REQUIRED, ARGS_AT(struct run_args, buffer),
	  .when = op_list_form },
	{ "ops", ARGS_ARRAY, ARGS_REQUIRED, ARGS_AT(struct run_args, list),
	  .missing = "field 'ops' (a list of [name, args...]) is required", .when = op_list_form,
	  .then = run_read_ops },
	CHAIN_OPTION_FIELDS(struct run_args, e.opts),
	{ "out", ARGS_BUFFER_NAME, 0, ARGS_AT(struct run_args, out), .when = op_list_form,
	  .then = run_check_out },
};
static const struct run_args run_defaults = { .e = { .opts = CHAIN_OPTION_DEFAULTS } };
const struct args_spec op_run_args = ARGS_SPEC(struct run_args, run_fields, &run_defaults);

static void render_run(const struct job *job, struct mp_map *out)
{
	const struct run_job *rj = job->work.spec;
	if (!rj)
		return;
	chain_request_render(&rj->spec, job->work.result.bytes, out);
	if (rj->out_label[0])
		mp_put_str(out, "out", rj->out_label);
}

static void release_spec(struct job *job)
{
	free(job->work.spec);
	job->work.spec = NULL;
}

static const struct job_kind kind_run = { .op = "run", .render = render_run };

/* The op list's program on the buffer (to out), checked against the options. */
static int run_fill(struct request *req, const void *args, void *spec, int *device,
		    struct gpuq_error *err)
{
	const struct run_args *a = args;
	const struct buffer *b = a->buffer.b, *out = a->out.b;
	struct run_job *rj = spec;
	struct chain_spec *s = &rj->spec;
	(void)req;
	chain_request_apply(&a->e.opts, s);
	chain_spec_from_ops(s, a->ops, a->nops, b->dtype, b->dptr, out ? out->dptr : b->dptr);
	s->count = b->count;
	if (chain_request_check(s, err) < 0)
		return -1;
	if (out)
		snprintf(rj->out_label, sizeof rj->out_label, "%s@%d", out->name, out->device);
	*device = b->device;
	return 0;
}

/* The job holds the input, and its out buffer as job->buffer2 (which op_jobs.c releases). */
static int run_shape(struct request *req, const void *args, struct job *job,
		     struct gpuq_error *err)
{
	const struct run_args *a = args;
	struct buffer *b = a->buffer.b, *out = a->out.b;
	(void)req;
	(void)err;
	job_attach_buffer(job, b);
	job->work.length = b->bytes;
	if (out) {
		job->buffer2 = out;
		out->users++;
		out->last_job = job->id;
		work_narrow_access(&job->work, 0, b->bytes, false);
		work_add_access(&job->work, out, 0, out->bytes, true);
	}
	return 0;
}

static const struct spec_job run_job = {
	.kind = &kind_run,
	.work_kind = WORK_CHAIN,
	.spec_size = sizeof(struct run_job),
	.what = "another chain",
	.fill = run_fill,
	.shape = run_shape,
	.release = release_spec,
};

void op_run(struct request *req, void *args)
{
	const struct run_args *a = args;
	if (a->e.form)
		expr_submit(req, &a->e);
	else
		spec_job_submit(req, &run_job, a);
}

/* One device's counters: its worker's, and its chain cache's. */
static void render_device_stats(struct daemon *d, int index, struct mp_array *out)
{
	struct worker_snapshot s;
	const struct device *dev = &d->pool.workers[index].dev;
	struct mp_map m, counters, chain;
	worker_snapshot(&d->pool, index, &s);
	mp_map_init(&m);
	mp_map_init(&counters);
	mp_map_init(&chain);
	mp_put_i64(&m, "index", index);
	mp_put_bool(&m, "healthy", s.healthy);
	mp_put_u64(&m, "queue_depth", s.queue_depth);
#define PUT_WORKER_COUNTER(name) mp_put_u64(&counters, #name, s.counters.name);
	WORKER_COUNTERS(PUT_WORKER_COUNTER)
#undef PUT_WORKER_COUNTER
#define PUT_CHAIN_COUNTER(name) mp_put_u64(&chain, #name, chain_counter_get(dev, CHAIN_COUNTER_##name));
	CHAIN_COUNTERS(PUT_CHAIN_COUNTER)
#undef PUT_CHAIN_COUNTER
	mp_put_u64(&chain, "graph_capacity", d->opt.device.chain_graph_cache);
	mp_put_str(&chain, "kernel_cache", d->opt.device.kernel_cache_dir);
	mp_put_map(&m, "counters", &counters);
	mp_put_map(&m, "chain", &chain);
	render_scheduler(&s, &m);
	mp_array_map(out, &m);
}

struct stats_args {
	int device;
	bool has_device; /* absent: every device */
};

static const struct args_field stats_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct stats_args, device),
	  ARGS_GIVEN(struct stats_args, has_device) },
};
const struct args_spec op_stats_args = ARGS_SPEC(struct stats_args, stats_fields, NULL);

void op_stats(struct request *req, void *args)
{
	const struct stats_args *a = args;
	struct daemon *d = req->d;
	struct mp_map body;
	struct mp_array devices;
	mp_map_init(&body);
	mp_array_init(&devices);
	for (int i = 0; i < d->pool.count; i++)
		if (!a->has_device || i == a->device)
			render_device_stats(d, i, &devices);
	mp_put_str(&body, "backend", d->ops->name);
	mp_put_array(&body, "devices", &devices);
	reply_ok(req, &body);
}

static void render_bench_launch(const struct chain_bench *b, struct mp_map *out)
{
	struct mp_array list;
	mp_array_init(&list);
	for (unsigned i = 0; i < CHAIN_BENCH_LAUNCH_CHAINS; i++) {
		const struct chain_bench_launch *l = &b->launch[i];
		struct mp_map m;
		double k = l->kernels ? (double)l->kernels : 1;
		mp_map_init(&m);
		mp_put_u64(&m, "ops", l->nops);
		mp_put_u64(&m, "kernels", l->kernels);
		mp_put_f64(&m, "eager_us_per_kernel", l->eager_s / k * 1e6);
		mp_put_f64(&m, "graph_us_per_kernel", l->graph_s / k * 1e6);
		mp_put_f64(&m, "graph_over_eager", l->eager_s > 0 ? l->graph_s / l->eager_s : 0);
		mp_array_map(&list, &m);
	}
	mp_put_array(out, "launch", &list);
}

/* GB/s for passes over the buffer (read + write each) in seconds. */
static double bench_gbps(const struct chain_bench *b, unsigned passes, double seconds)
{
	return seconds > 0 ? 2.0 * (double)b->bytes * passes / seconds / 1e9 : 0;
}

static void render_bench_bandwidth(const struct chain_bench *b, struct mp_map *out)
{
	struct mp_map m;
	struct mp_array ops;
	double copy = bench_gbps(b, 1, b->copy_s);
	mp_map_init(&m);
	mp_array_init(&ops);
	mp_put_u64(&m, "bytes", b->bytes);
	mp_put_f64(&m, "memcpy_gbps", copy);
	for (unsigned i = 0; i < CHAIN_BENCH_OPS; i++) {
		struct mp_map o;
		double g = bench_gbps(b, 1, b->op_s[i]);
		mp_map_init(&o);
		mp_put_str(&o, "op", chain_bench_op_name(i));
		mp_put_f64(&o, "gbps", g);
		mp_put_f64(&o, "of_memcpy", copy > 0 ? g / copy : 0);
		mp_array_map(&ops, &o);
	}
	mp_put_array(&m, "per_op", &ops);
	mp_put_f64(&m, "eager_gbps", bench_gbps(b, CHAIN_BENCH_OPS, b->eager_s));
	mp_put_f64(&m, "graph_gbps", bench_gbps(b, CHAIN_BENCH_OPS, b->graph_s));
	mp_put_f64(&m, "fused_gbps", bench_gbps(b, 1, b->fused_s));
	mp_put_f64(&m, "fused_of_memcpy", copy > 0 ? bench_gbps(b, 1, b->fused_s) / copy : 0);
	mp_put_f64(&m, "compiled_gbps", bench_gbps(b, 1, b->compiled_s));
	mp_put_f64(&m, "compiled_of_memcpy", copy > 0 ? bench_gbps(b, 1, b->compiled_s) / copy : 0);
	mp_put_bool(&m, "compiled_same_bits", b->compiled_same_bits);
	mp_put_f64(&m, "eager_s", b->eager_s);
	mp_put_f64(&m, "graph_s", b->graph_s);
	mp_put_f64(&m, "fused_s", b->fused_s);
	mp_put_f64(&m, "compiled_s", b->compiled_s);
	mp_put_f64(&m, "fused_speedup_over_graph", b->fused_s > 0 ? b->graph_s / b->fused_s : 0);
	mp_put_map(out, "bandwidth", &m);
}

/* GB/s moving `streams` times the buffer's bytes in seconds. */
static double bench_stream_gbps(const struct chain_bench *b, unsigned streams, double seconds)
{
	return seconds > 0 ? (double)b->bytes * streams / seconds / 1e9 : 0;
}

/* y = a * x + y against the copy's rate; sum and norm2 against the read kernel's. */
static void render_bench_expressions(const struct chain_bench *b, struct mp_map *out)
{
	struct mp_map m;
	double copy = bench_gbps(b, 1, b->copy_s), read = bench_stream_gbps(b, 1, b->read_s);
	double axpy = bench_stream_gbps(b, 3, b->axpy_s), sum = bench_stream_gbps(b, 1, b->sum_s);
	double norm2 = bench_stream_gbps(b, 1, b->norm2_s);
	mp_map_init(&m);
	mp_put_f64(&m, "axpy_gbps", axpy);
	mp_put_f64(&m, "axpy_of_memcpy", copy > 0 ? axpy / copy : 0);
	mp_put_f64(&m, "read_gbps", read);
	mp_put_f64(&m, "sum_gbps", sum);
	mp_put_f64(&m, "sum_of_read", read > 0 ? sum / read : 0);
	mp_put_f64(&m, "norm2_gbps", norm2);
	mp_put_f64(&m, "norm2_of_read", read > 0 ? norm2 / read : 0);
	mp_put_f64(&m, "sum", b->sum);
	mp_put_f64(&m, "norm2", b->norm2);
	mp_put_bool(&m, "sum_same_bits", b->sum_same_bits);
	mp_put_map(out, "expressions", &m);
}

/* Whether the compiled rows were compiled, and what getting a kernel costs. */
static void render_bench_compile(const struct chain_bench *b, struct mp_map *out)
{
	struct mp_map m;
	mp_map_init(&m);
	mp_put_bool(&m, "compiled", b->compiled);
	if (b->note[0])
		mp_put_str(&m, "note", b->note);
	mp_put_f64(&m, "nvrtc_ms", b->compile.nvrtc_s * 1e3);
	mp_put_f64(&m, "disk_ms", b->compile.disk_s * 1e3);
	mp_put_f64(&m, "memory_ms", b->compile.memory_s * 1e3);
	mp_put_f64(&m, "nvrtc_load_ms", b->compile.load_s * 1e3);
	mp_put_map(out, "compile", &m);
}

static void render_bench_cache(const struct chain_bench *b, struct mp_map *out)
{
	static const char *const names[2] = { "graph", "fused" };
	struct mp_map m;
	mp_map_init(&m);
	for (unsigned i = 0; i < 2; i++) {
		struct mp_map c;
		mp_map_init(&c);
		mp_put_f64(&c, "instantiate_us", b->cache[i].instantiate_s * 1e6);
		mp_put_f64(&c, "update_us", b->cache[i].update_s * 1e6);
		mp_put_f64(&c, "hit_us", b->cache[i].hit_s * 1e6);
		mp_put_map(&m, names[i], &c);
	}
	mp_put_u64(&m, "cached_rerun_instantiations", b->cached_rerun_instantiations);
	mp_put_map(out, "cache", &m);
}

static void render_bench(const struct job *job, struct mp_map *out)
{
	const struct chain_bench *b = job->work.spec;
	if (!b)
		return;
	mp_put_u64(out, "reps", b->reps);
	mp_put_u64(out, "launch_count", b->launch_count);
	mp_put_u64(out, "launch_repeat", b->launch_repeat);
	render_bench_launch(b, out);
	render_bench_bandwidth(b, out);
	render_bench_expressions(b, out);
	render_bench_compile(b, out);
	render_bench_cache(b, out);
}

static const struct job_kind kind_bench_chain = { .op = "bench_chain", .render = render_bench };

/* bench_chain: device, bytes (f32, a multiple of 16), repeat and reps, each with its default. */
struct bench_chain_args {
	int device;
	uint64_t bytes, repeat, reps;
};

static int check_bench_bytes(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_chain_args *a = args;
	(void)req;
	if (a->bytes < 4096 || a->bytes % 16)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'bytes': %" PRIu64 " is not a multiple of 16 of at least 4096", a->bytes);
	return 0;
}

static int check_bench_repeat(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_chain_args *a = args;
	(void)req;
	if (a->repeat < 1 || a->repeat > BENCH_MAX_REPEAT)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'repeat': %" PRIu64 " is not 1 to %d",
				 a->repeat, BENCH_MAX_REPEAT);
	return 0;
}

static int check_bench_reps(struct request *req, void *args, struct gpuq_error *err)
{
	const struct bench_chain_args *a = args;
	(void)req;
	if (a->reps < 1 || a->reps > CHAIN_MAX_REPS)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'reps': %" PRIu64 " is not 1 to %d",
				 a->reps, CHAIN_MAX_REPS);
	return 0;
}

static const struct args_field bench_chain_fields[] = {
	{ "device", ARGS_DEVICE, 0, ARGS_AT(struct bench_chain_args, device) },
	{ "bytes", ARGS_U64, 0, ARGS_AT(struct bench_chain_args, bytes), .then = check_bench_bytes },
	{ "repeat", ARGS_U64, 0, ARGS_AT(struct bench_chain_args, repeat), .then = check_bench_repeat },
	{ "reps", ARGS_U64, 0, ARGS_AT(struct bench_chain_args, reps), .then = check_bench_reps },
};
static const struct bench_chain_args bench_chain_defaults = {
	.bytes = BENCH_DEFAULT_BYTES, .repeat = BENCH_DEFAULT_REPEAT, .reps = BENCH_DEFAULT_REPS
};
const struct args_spec op_bench_chain_args =
	ARGS_SPEC(struct bench_chain_args, bench_chain_fields, &bench_chain_defaults);

static int fill_bench_chain(struct request *req, const void *args, void *spec, int *device,
			    struct gpuq_error *err)
{
	const struct bench_chain_args *a = args;
	struct chain_bench *b = spec;
	(void)req;
	(void)err;
	b->bytes = a->bytes;
	b->launch_repeat = a->repeat;
	b->launch_count = BENCH_LAUNCH_COUNT;
	b->reps = (unsigned)a->reps;
	*device = a->device;
	return 0;
}

static const struct spec_job bench_chain_job = {
	.kind = &kind_bench_chain,
	.work_kind = WORK_BENCH_CHAIN,
	.spec_size = sizeof(struct chain_bench),
	.what = "a benchmark",
	.fill = fill_bench_chain,
	.release = release_spec,
};

void op_bench_chain(struct request *req, void *args)
{
	spec_job_submit(req, &bench_chain_job, args);
}
