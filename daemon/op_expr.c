/*
 * Expressions over buffers, the main thread's part: `run` with `expr`
 * ('y = a * x + y') and `reduce` ('sum(abs(x - y))'). It parses the
 * expression (workers/chain/chain_expr.h) as its arguments decode (the
 * rows of op_expr.h: the text is parsed once `device` is known, and each
 * variable is resolved to one of the caller's buffers, or `owner`'s for
 * root, on `device` when the name says no @GPU and the request gives one,
 * and bound: one device, one count or one element, float dtypes, no buffer
 * named twice); the job then checks what the options allow, holds every
 * buffer until it ends, and hands the worker a struct chain_spec. A
 * refusal names the column it is about and shows it:
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

#include "daemon/op_expr.h"

struct expr_job {
	struct chain_spec spec; /* first: work.spec points here */
	struct buffer *held[KERNELS_EXPR_MAX_VARS];
	unsigned nheld;
	char text[CHAIN_EXPR_TEXT_MAX + 1];
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

bool expr_form(const void *args)
{
	return ((const struct expr_args *)args)->form;
}

int expr_check_alone(struct request *req, void *args, struct gpuq_error *err)
{
	const struct expr_args *a = args;
	(void)req;
	if (!a->reduce && (a->has_ops || a->has_buffer || a->has_out))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "run takes either 'expr', or 'buffer' with "
				 "'ops' (and 'out'), not both");
	return 0;
}

int expr_parse(struct request *req, void *args, struct gpuq_error *err)
{
	struct expr_args *a = args;
	struct chain_expr_error e;
	(void)req;
	if (chain_expr_parse(a->text, a->reduce, &a->x, &e) < 0)
		return expr_fail(err, GPUQ_E_BAD_REQUEST, a->text, e.col, e.msg);
	return 0;
}

/* The variable's buffer: NAME@GPU, or NAME on `device` when given, else wherever it is. */
static struct buffer *expr_resolve(struct request *req, const struct expr_args *a,
				   const struct chain_expr_var *v, struct gpuq_error *err)
{
	int device = v->device >= 0 ? v->device : a->has_device ? a->device : -1;
	struct buffer *b = args_resolve(req, a->owner, v->name, device, err);
	if (b && buffer_check_usable(b, err) < 0)
		return NULL;
	return b;
}

/* Every variable's buffer, resolved, and the program bound to them (typed); a->count set. */
int expr_bind(struct request *req, void *args, struct gpuq_error *err)
{
	struct expr_args *a = args;
	struct chain_expr *x = &a->x;
	struct chain_expr_binding b[KERNELS_EXPR_MAX_VARS];
	struct chain_expr_error e;
	struct gpuq_error found;
	for (unsigned v = 0; v < x->nvars; v++) {
		struct buffer *buf = expr_resolve(req, a, &x->vars[v], &found);
		if (!buf)
			return expr_fail(err, found.code, a->text, x->vars[v].col, found.message);
		a->held[v] = buf;
		b[v] = (struct chain_expr_binding){ buf->dtype, buf->count, buf->device, buf };
	}
	if (chain_expr_bind(x, b, &a->count, &e) < 0)
		return expr_fail(err, GPUQ_E_BAD_REQUEST, a->text, e.col, e.msg);
	return 0;
}

static void expr_release(struct job *job)
{
	free(job->work.spec);
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

/* The spec from the decoded expression, checked against the options; the text kept for the result. */
static int expr_fill(struct request *req, const void *args, void *spec, int *device,
		     struct gpuq_error *err)
{
	const struct expr_args *a = args;
	struct expr_job *ej = spec;
	void *var[KERNELS_EXPR_MAX_VARS];
	unsigned nvars = a->x.prog.nvars;
	(void)req;
	for (unsigned v = 0; v < nvars; v++) {
		ej->held[v] = a->held[v];
		var[v] = a->held[v]->dptr;
	}
	chain_spec_set_program(&ej->spec, &a->x.prog, var);
	ej->spec.count = a->count;
	chain_request_apply(&a->opts, &ej->spec);
	if (chain_request_check(&ej->spec, err) < 0)
		return -1;
	memcpy(ej->text, a->text, sizeof ej->text);
	*device = ej->held[ej->spec.prog.nstmts ? ej->spec.prog.stmt_var[0] : 0]->device;
	return 0;
}

/* The job holds every variable's buffer; it is aimed at the first output (reduce: the first input). */
static int expr_shape(struct request *req, const void *args, struct job *job,
		      struct gpuq_error *err)
{
	struct expr_job *ej = job->work.spec;
	unsigned nvars = ((const struct expr_args *)args)->x.prog.nvars;
	struct buffer *first = ej->held[ej->spec.prog.nstmts ? ej->spec.prog.stmt_var[0] : 0];
	(void)req;
	(void)err;
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
	job->work.length = first->bytes;
	return 0;
}

static const struct spec_job expr_run_job = {
	.kind = &kind_expr_run,
	.work_kind = WORK_CHAIN,
	.spec_size = sizeof(struct expr_job),
	.what = "an expression",
	.fill = expr_fill,
	.shape = expr_shape,
	.release = expr_release,
};

static const struct spec_job expr_reduce_job = {
	.kind = &kind_reduce,
	.work_kind = WORK_CHAIN,
	.spec_size = sizeof(struct expr_job),
	.what = "an expression",
	.fill = expr_fill,
	.shape = expr_shape,
	.release = expr_release,
};

void expr_submit(struct request *req, const struct expr_args *a)
{
	spec_job_submit(req, a->reduce ? &expr_reduce_job : &expr_run_job, a);
}

/* reduce_expr's arguments: the expression's, and `count`. */
struct reduce_args {
	struct expr_args e; /* first: the rows' checks find it */
	uint64_t want;      /* `count` */
};

/*
 * reduce_expr's `count`: the first N elements, at most the expression's.
 * A reduction runs fused once, so giving `mode` or `repeat` at all is
 * refused, even their defaults (docs/protocol.md, reduce_expr).
 */
static int reduce_check_count(struct request *req, void *args, struct gpuq_error *err)
{
	struct reduce_args *a = args;
	(void)req;
	if (a->e.has_count && a->want > a->e.count)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'count': %" PRIu64 " is more than the expression's %" PRIu64
				 " elements", a->want, a->e.count);
	if (a->e.has_count)
		a->e.count = a->want;
	if (a->e.opts.has_mode || a->e.opts.has_repeat)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "a reduction runs fused once: leave out 'mode' and 'repeat'");
	return 0;
}

static const struct args_field reduce_fields[] = {
	EXPR_FIELDS(struct reduce_args, e,
		    "field 'expr' (an expression such as 'sum(abs(x - y))') is required"),
	CHAIN_OPTION_FIELDS(struct reduce_args, e.opts),
	{ "count", ARGS_U64, 0, ARGS_AT(struct reduce_args, want),
	  ARGS_GIVEN(struct reduce_args, e.has_count), .then = reduce_check_count },
};
static const struct reduce_args reduce_defaults = {
	.e = { .opts = CHAIN_OPTION_DEFAULTS, .form = true, .reduce = true },
};
const struct args_spec op_reduce_expr_args =
	ARGS_SPEC(struct reduce_args, reduce_fields, &reduce_defaults);

void op_reduce_expr(struct request *req, void *args)
{
	expr_submit(req, &((const struct reduce_args *)args)->e);
}
