/*
 * Expressions over buffers, the main thread's part: `run` with `expr`
 * ('y = a * x + y') and `reduce` ('sum(abs(x - y))'). It parses the
 * expression (workers/chain/chain_expr.h), resolves each variable to one of the
 * caller's buffers (or `owner`'s, for root; on `device` when the name says
 * no @GPU and the request gives one), binds them (one device, one count or
 * one element, float dtypes, no buffer named twice), checks what the
 * options allow, holds every buffer until the job ends, and hands the
 * worker a struct chain_spec. A refusal names the column it is about and
 * shows it:
 *
 *   expression column 9: buffer 'q' not found on gpu 0 (buffers there: a, x, y)
 *     y = a * q + y
 *             ^
 *
 * Main thread only. The job owns a struct expr_job (the spec, the buffers
 * it holds, the text) until it is freed; its kind's finish hook lets the
 * buffers go, when the job ends or is abandoned.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/chain_request.h"
#include "daemon/op_expr.h"
#include "workers/chain/chain_expr.h"

struct expr_job {
	struct chain_spec spec; /* first: work.spec points here */
	struct buffer *held[KERNELS_EXPR_MAX_VARS];
	unsigned nheld;
	char *text;
};

/*
 * err with code and "expression column C: msg", then the text (a window of
 * it around C when it is long) and a caret under column C.
 */
static int expr_fail(struct gpuq_error *err, enum gpuq_errc code, const char *text, unsigned col,
		     const char *msg)
{
	const int window = 60;
	size_t len = strlen(text);
	if (col == 0)
		return gpuq_fail(err, code, "expression: %s", msg);
	size_t at = col - 1 > len ? len : col - 1, from = at > (size_t)window / 2 ? at - window / 2 : 0;
	int shown = (int)(len - from < (size_t)window ? len - from : (size_t)window);
	bool cut_left = from > 0, cut_right = from + (size_t)shown < len;
	return gpuq_fail(err, code, "expression column %u: %s\n  %s%.*s%s\n  %*s^", col, msg,
			 cut_left ? "..." : "", shown, text + from, cut_right ? "..." : "",
			 (int)(at - from) + (cut_left ? 3 : 0), "");
}

/* The variable's buffer: NAME@GPU, or NAME on `device` when given, else wherever it is. */
static struct buffer *expr_resolve(struct request *req, const struct chain_expr_var *v,
				   uid_t owner, int device, struct gpuq_error *err)
{
	struct buffer *b = args_resolve(req, owner, v->name, v->device >= 0 ? v->device : device,
					err);
	if (b && buffer_check_usable(b, err) < 0)
		return NULL;
	return b;
}

/* Every variable's buffer, bound; the spec's program and buffers set. */
static int expr_bind(struct request *req, struct expr_job *ej, struct chain_expr *x, int device,
		     struct gpuq_error *err)
{
	struct chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	void *var[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_error e;
	struct gpuq_error found;
	uid_t owner;
	if (read_owner(req, &owner, err) < 0)
		return -1;
	for (unsigned v = 0; v < x->nvars; v++) {
		struct buffer *buf = expr_resolve(req, &x->vars[v], owner, device, &found);
		if (!buf)
			return expr_fail(err, found.code, ej->text, x->vars[v].col, found.message);
		ej->held[v] = buf;
		var[v] = buf->dptr;
		b[v] = (struct chain_expr_binding){ buf->dtype, buf->count, buf->device, buf };
	}
	if (chain_expr_bind(x, b, &ej->spec.count, &e) < 0)
		return expr_fail(err, GPUQ_E_BAD_REQUEST, ej->text, e.col, e.msg);
	chain_spec_set_program(&ej->spec, &x->prog, var);
	return 0;
}

/* `count` (reduce): the first N elements, at most the expression's. */
static int expr_read_count(struct request *req, struct chain_spec *s, struct gpuq_error *err)
{
	uint64_t n = s->count;
	if (msg_get_u64(req->map, "count", &n, err) < 0)
		return -1;
	if (n > s->count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'count': %" PRIu64 " is more than the expression's %" PRIu64
				 " elements", n, s->count);
	s->count = n;
	return 0;
}

/* Whether the request gives key (nil is absent). */
static bool given(const struct request *req, const char *key)
{
	const msgpack_object *o = msg_map_get(req->map, key);
	return o && o->type != MSGPACK_OBJECT_NIL;
}

/*
 * The request into ej: text, program, buffers, options. A reduction runs
 * fused once, so giving `mode` or `repeat` at all is refused, even their
 * defaults (docs/protocol.md, reduce_expr).
 */
static int expr_read(struct request *req, bool reduce, struct expr_job *ej, struct gpuq_error *err)
{
	char *text = malloc(CHAIN_EXPR_TEXT_MAX + 2);
	struct chain_expr *x = malloc(sizeof *x);
	struct chain_expr_error e;
	uint64_t device = 0;
	int rc = -1;
	ej->text = text;
	if (!text || !x) {
		gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for an expression");
		goto out;
	}
	int has = msg_get_str(req->map, "expr", text, CHAIN_EXPR_TEXT_MAX + 1, err);
	if (has == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'expr' (an expression such as %s) is required",
			  reduce ? "'sum(abs(x - y))'" : "'y = a * x + y'");
	if (has <= 0 || (has = msg_get_u64(req->map, "device", &device, err)) < 0)
		goto out;
	if (has > 0 && device >= (uint64_t)req->d->pool.count) {
		gpuq_fail(err, GPUQ_E_NOT_FOUND, "device %" PRIu64 " does not exist (devices: 0-%d)",
			  device, req->d->pool.count - 1);
		goto out;
	}
	if (chain_expr_parse(text, reduce, x, &e) < 0) {
		expr_fail(err, GPUQ_E_BAD_REQUEST, text, e.col, e.msg);
		goto out;
	}
	if (expr_bind(req, ej, x, has > 0 ? (int)device : -1, err) < 0 ||
	    chain_request_read_options(req, &ej->spec, err) < 0 || (reduce && expr_read_count(req, &ej->spec, err) < 0))
		goto out;
	if (reduce && (given(req, "mode") || given(req, "repeat"))) {
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "a reduction runs fused once: leave out 'mode' and 'repeat'");
		goto out;
	}
	rc = chain_request_check(&ej->spec, err);
out:
	free(x);
	return rc;
}

static void expr_release(struct job *job)
{
	struct expr_job *ej = job->work.spec;
	if (ej)
		free(ej->text);
	free(ej);
	job->work.spec = NULL;
}

/* The buffers but the job's own (job->buffer, which op_jobs.c lets go). */
static void expr_finish(struct daemon *d, struct job *job)
{
	struct expr_job *ej = job->work.spec;
	(void)d;
	for (unsigned i = 0; ej && i < ej->nheld; i++)
		if (ej->held[i] != job->buffer)
			buffer_unhold(ej->held[i]);
	if (ej)
		ej->nheld = 0;
}

/* The output buffers, in statement order ("y@0"). */
static void render_outputs(const struct expr_job *ej, struct mp_map *out)
{
	struct mp_array list;
	char label[BUFFER_NAME_MAX + 16];
	mp_array_init(&list);
	for (unsigned s = 0; s < ej->spec.prog.nstmts; s++) {
		const struct buffer *b = ej->held[ej->spec.prog.stmt_var[s]];
		snprintf(label, sizeof label, "%s@%d", b->name, b->device);
		mp_array_str(&list, label);
	}
	mp_put_array(out, "outputs", &list);
}

static void render_expr_run(const struct job *job, struct mp_map *out)
{
	const struct expr_job *ej = job->work.spec;
	if (!ej)
		return;
	mp_put_str(out, "expr", ej->text);
	chain_request_render(&ej->spec, job->work.result.bytes, out);
	if (ej->held[0])
		render_outputs(ej, out);
}

static void render_reduce(const struct job *job, struct mp_map *out)
{
	const struct expr_job *ej = job->work.spec;
	if (!ej)
		return;
	const struct chain_spec *s = &ej->spec;
	unsigned kind = s->prog.reduce;
	mp_put_str(out, "expr", ej->text);
	mp_put_str(out, "reduce", chain_prog_reduce_name(kind));
	chain_request_render(s, job->work.result.bytes, out);
	if (job->state != GPUQ_JOB_DONE)
		return;
	double v = chain_reduce_finish(kind, &s->result.value, s->count);
	if (chain_prog_reduce_is_int(kind)) {
		mp_put_i64(out, "value", (int64_t)v);
		mp_put_str(out, "value_dtype", "i64");
	} else {
		mp_put_f64(out, "value", v);
		mp_put_str(out, "value_dtype", "f64");
	}
	if (kind == KERNELS_REDUCE_ARGMAX && s->count > 0)
		mp_put_f64(out, "max", s->result.value.v);
}

static const struct job_kind kind_expr_run = {
	.op = "run", .finish = expr_finish, .render = render_expr_run
};
static const struct job_kind kind_reduce = {
	.op = "reduce_expr", .finish = expr_finish, .render = render_reduce
};

static bool expr_stores(const struct chain_spec *spec, unsigned var)
{
	for (unsigned s = 0; s < spec->prog.nstmts; s++)
		if (spec->prog.stmt_var[s] == var)
			return true;
	return false;
}

/* The job for ej on its buffers' device; it holds them all. NULL when req was answered. */
static struct job *expr_job(struct request *req, const struct job_kind *kind, struct expr_job *ej,
			    unsigned nvars)
{
	struct buffer *first = ej->held[ej->spec.prog.nstmts ? ej->spec.prog.stmt_var[0] : 0];
	struct job *job = new_job(req, kind, WORK_CHAIN, first->device);
	if (!job)
		return NULL;
	job_attach_buffer(job, first);
	job->work.naccess = 0; /* each variable's buffer, written only when a statement stores it */
	for (unsigned v = 0; v < nvars; v++) {
		work_add_access(&job->work, ej->held[v], 0, ej->held[v]->bytes, expr_stores(&ej->spec, v));
		if (ej->held[v] == first)
			continue;
		ej->held[v]->users++;
		ej->held[v]->last_job = job->id;
	}
	ej->nheld = nvars;
	job->work.spec = ej;
	job->work.length = first->bytes;
	job->release = expr_release;
	return job;
}

static void expr_op(struct request *req, bool reduce)
{
	struct gpuq_error err;
	struct expr_job *ej = calloc(1, sizeof *ej);
	if (!ej) {
		gpuq_fail(&err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for an expression");
		reply_error(req, &err);
		return;
	}
	if (!reduce && (msg_map_get(req->map, "ops") || msg_map_get(req->map, "buffer") ||
			msg_map_get(req->map, "out"))) {
		gpuq_fail(&err, GPUQ_E_BAD_REQUEST, "run takes either 'expr', or 'buffer' with 'ops' "
			  "(and 'out'), not both");
		goto refuse;
	}
	if (expr_read(req, reduce, ej, &err) < 0)
		goto refuse;
	unsigned nvars = ej->spec.prog.nvars;
	memset(ej->held + nvars, 0, sizeof ej->held - nvars * sizeof ej->held[0]);
	struct job *job = expr_job(req, reduce ? &kind_reduce : &kind_expr_run, ej, nvars);
	if (!job) {
		free(ej->text);
		free(ej);
		return;
	}
	job_submit(req, job);
	return;
refuse:
	free(ej->text);
	free(ej);
	reply_error(req, &err);
}

void op_run_expr(struct request *req)
{
	expr_op(req, false);
}

void op_reduce_expr(struct request *req)
{
	expr_op(req, true);
}
