/*
 * Reading a collective request: its top-level fields as a table (the
 * owner, the ranks, the knobs), then into a plan each primitive's fields, every
 * rank's buffers checked against NCCL's layout (protocol/collective_layout.h:
 * which elements each rank reads and writes for the count), and a group's
 * primitives checked for ranges one writes and another uses. All of it
 * before anything is held or queued, so a refused request costs nothing;
 * a size error names the device's buffer and how many elements it lacks.
 * Main thread only.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/op_collective.h"

#define COLL_MAX_TIMEOUT_MS 3600000u
#define BENCH_DEFAULT_WARMUP 5u
#define BENCH_DEFAULT_ITERS 20u
#define BENCH_DEFAULT_REPEATS 5u
#define BENCH_MAX_WARMUP 10000u
#define BENCH_MAX_ITERS 100000u
#define BENCH_MAX_REPEATS 100u

/* One primitive being read: a request's top-level fields, or a group entry's. */
struct task_read {
	struct request *req;
	struct coll_plan *plan;
	const msgpack_object *map;
	struct coll_task *task;
	struct coll_names *names;
	int index; /* in plan->tasks */
};

/*
 * One primitive's own fields, decoded from its map (the request, or an
 * entry of a group's `ops`) by its table: the names of its buffers (NAME
 * only: `devices` says where), or a sendrecv's two ends (NAME@GPU with a
 * range), its count, and the reduction and the root where the primitive
 * has them. What they name is resolved against the ranks afterwards.
 */
struct prim_args {
	enum coll_prim prim; /* from the table's defaults */
	char in_text[BUFFER_NAME_MAX + 32], out_text[BUFFER_NAME_MAX + 32];
	char in[BUFFER_NAME_MAX + 1], out[BUFFER_NAME_MAX + 1];
	bool has_out;
	char src_text[BUFFER_NAME_MAX + 96], dst_text[BUFFER_NAME_MAX + 96];
	struct buffer_ref src, dst;
	uint64_t count;
	bool has_count;
	int op; /* enum coll_op */
	uint64_t root;
};

/* A buffer name field, NAME only: its text parsed into name. */
static int prim_name(const char *field, const char *text, char *name, struct gpuq_error *err)
{
	int device;
	if (buffer_ref_parse(text, field, name, &device, err) < 0)
		return -1;
	if (device >= 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field '%s': give the buffer's NAME ('%s'), not NAME@GPU: "
				 "'devices' says which GPUs take part",
				 field, name);
	return 0;
}

static int prim_check_in(struct request *req, void *args, struct gpuq_error *err)
{
	struct prim_args *a = args;
	(void)req;
	return prim_name("buffer", a->in_text, a->in, err);
}

static int prim_check_out(struct request *req, void *args, struct gpuq_error *err)
{
	struct prim_args *a = args;
	(void)req;
	return a->has_out ? prim_name("out", a->out_text, a->out, err) : 0;
}

/* `count` when given: 1 or more; all_to_all runs out of place. */
static int prim_check_count(struct request *req, void *args, struct gpuq_error *err)
{
	const struct prim_args *a = args;
	(void)req;
	if (a->has_count && a->count == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'count': give 1 or more elements");
	if (a->prim == COLL_ALL_TO_ALL && (!a->has_out || strcmp(a->out, a->in) == 0))
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "all_to_all cannot run in place (a rank would overwrite blocks it "
				 "has yet to send): give 'out', another buffer");
	return 0;
}

static int prim_check_src(struct request *req, void *args, struct gpuq_error *err)
{
	struct prim_args *a = args;
	(void)req;
	return buffer_ref_parse_range(a->src_text, "src", &a->src, err);
}

static int prim_check_dst(struct request *req, void *args, struct gpuq_error *err)
{
	struct prim_args *a = args;
	(void)req;
	return buffer_ref_parse_range(a->dst_text, "dst", &a->dst, err);
}

static bool prim_reduces(const void *args)
{
	return coll_prim_reduces(((const struct prim_args *)args)->prim);
}

static bool prim_has_root(const void *args)
{
	return coll_prim_has_root(((const struct prim_args *)args)->prim);
}

/* The reductions, in enum coll_op's order (ARGS_ENUM gives the index). */
static const char *const coll_op_names[] = { "sum", "prod", "min", "max", "avg", NULL };

static const struct args_field named_fields[] = {
	{ "buffer", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct prim_args, in_text),
	  .missing = "field 'buffer' (a buffer NAME) is required", .then = prim_check_in },
	{ "out", ARGS_STR, 0, ARGS_AT(struct prim_args, out_text),
	  ARGS_GIVEN(struct prim_args, has_out), .then = prim_check_out },
	{ "count", ARGS_U64, 0, ARGS_AT(struct prim_args, count),
	  ARGS_GIVEN(struct prim_args, has_count), .then = prim_check_count },
	{ "reduce", ARGS_ENUM, 0, ARGS_AT(struct prim_args, op), .names = coll_op_names,
	  .strsize = 16, .bad_name = "field 'reduce': '%s' is not one of " COLL_OP_LIST,
	  .when = prim_reduces },
	{ "root", ARGS_U64, 0, ARGS_AT(struct prim_args, root), .when = prim_has_root },
};

static const struct args_field sendrecv_fields[] = {
	{ "src", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct prim_args, src_text),
	  .missing = "field 'src' (NAME@GPU, optionally [START:STOP]) is required",
	  .then = prim_check_src },
	{ "dst", ARGS_STR, ARGS_REQUIRED, ARGS_AT(struct prim_args, dst_text),
	  .missing = "field 'dst' (NAME@GPU, optionally [START:STOP]) is required",
	  .then = prim_check_dst },
	{ "count", ARGS_U64, 0, ARGS_AT(struct prim_args, count),
	  ARGS_GIVEN(struct prim_args, has_count), .then = prim_check_count },
};

/* Each primitive's defaults: which it is, and the reduction (sum) when it has one. */
static const struct prim_args prim_defaults[] = {
	[COLL_ALLREDUCE] = { .prim = COLL_ALLREDUCE, .op = COLL_SUM },
	[COLL_REDUCE_SCATTER] = { .prim = COLL_REDUCE_SCATTER, .op = COLL_SUM },
	[COLL_ALL_GATHER] = { .prim = COLL_ALL_GATHER, .op = COLL_SUM },
	[COLL_BROADCAST] = { .prim = COLL_BROADCAST, .op = COLL_SUM },
	[COLL_REDUCE] = { .prim = COLL_REDUCE, .op = COLL_SUM },
	[COLL_SENDRECV] = { .prim = COLL_SENDRECV, .op = COLL_SUM },
	[COLL_ALL_TO_ALL] = { .prim = COLL_ALL_TO_ALL, .op = COLL_SUM },
};

#define PRIM_SPEC(prim_, fields_) ARGS_SPEC(struct prim_args, fields_, &prim_defaults[prim_])

/* Each primitive's table, by enum coll_prim. */
static const struct args_spec prim_specs[] = {
	[COLL_ALLREDUCE] = PRIM_SPEC(COLL_ALLREDUCE, named_fields),
	[COLL_REDUCE_SCATTER] = PRIM_SPEC(COLL_REDUCE_SCATTER, named_fields),
	[COLL_ALL_GATHER] = PRIM_SPEC(COLL_ALL_GATHER, named_fields),
	[COLL_BROADCAST] = PRIM_SPEC(COLL_BROADCAST, named_fields),
	[COLL_REDUCE] = PRIM_SPEC(COLL_REDUCE, named_fields),
	[COLL_SENDRECV] = PRIM_SPEC(COLL_SENDRECV, sendrecv_fields),
	[COLL_ALL_TO_ALL] = PRIM_SPEC(COLL_ALL_TO_ALL, named_fields),
};

/* The primitive's fields from its map, decoded as a request's are (the map stands in for it). */
static int prim_decode(const struct task_read *tr, enum coll_prim prim, struct prim_args *a,
		       struct gpuq_error *err)
{
	struct request sub = *tr->req;
	sub.map = tr->map;
	return args_decode(&sub, &prim_specs[prim], a, err);
}

/* No `devices`: every device that has the buffer, in index order. */
static int devices_holding(struct task_read *tr, const char *name, struct gpuq_error *err)
{
	struct coll_plan *p = tr->plan;
	struct daemon *d = tr->req->d;
	p->n = 0;
	for (int dev = 0; dev < d->pool.count; dev++)
		if (buffer_find(&d->buffers, p->owner, name, dev))
			p->devices[p->n++] = dev;
	if (p->n > 0)
		return 0;
	buffer_resolve(&d->buffers, p->owner, tr->req->conn->uid, name, -1, err); /* for its message */
	return -1;
}

static int rank_of(const struct coll_plan *p, int device)
{
	for (int r = 0; r < p->n; r++)
		if (p->devices[r] == device)
			return r;
	return -1;
}

static void *element_at(const struct buffer *b, uint64_t element)
{
	return (char *)b->dptr + element * gpuq_dtype_size(b->dtype);
}

static void add_region(struct task_read *tr, struct buffer *b, uint64_t lo, uint64_t hi, bool write)
{
	struct coll_plan *p = tr->plan;
	p->regions[p->nregions++] = (struct coll_region){
		.buffer = b, .lo = lo, .hi = hi, .task = tr->index, .write = write
	};
}

/* The root, a rank: an index into `devices`. */
static int check_root(const struct task_read *tr, uint64_t root, struct gpuq_error *err)
{
	if (root >= (uint64_t)tr->plan->n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'root': rank %" PRIu64 ", but there %s %d rank%s (0-%d); root "
				 "is a rank, an index into 'devices'",
				 root, tr->plan->n == 1 ? "is" : "are", tr->plan->n,
				 tr->plan->n == 1 ? "" : "s", tr->plan->n - 1);
	tr->task->layout.root = (int)root;
	return 0;
}

/* A buffer of the primitive on one device: it exists, is usable and takes this dtype. */
static struct buffer *resolve_on(struct task_read *tr, const char *name, int device,
				 struct gpuq_error *err)
{
	enum coll_prim prim = tr->task->layout.prim;
	struct buffer *b = buffer_resolve(&tr->req->d->buffers, tr->plan->owner, tr->req->conn->uid,
					  name, device, err);
	if (!b || buffer_check_usable(b, err) < 0)
		return NULL;
	if (!coll_dtype_supported(prim, b->dtype)) {
		gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			  "buffer '%s@%d' is untyped (%s); %s reduces elements: allocate it with "
			  "--count N --dtype T (T one of " COLL_DTYPE_LIST ")",
			  b->name, b->device, gpuq_dtype_name(b->dtype), coll_prim_name(prim));
		return NULL;
	}
	return b;
}

/* Every buffer of a primitive has the dtype of the first one found. */
static int check_dtype(const struct buffer *b, const struct buffer *first, enum coll_prim prim,
		       struct gpuq_error *err)
{
	if (b->dtype == first->dtype)
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "buffer '%s@%d' is %" PRIu64 " x %s but '%s@%d' is %" PRIu64
			 " x %s; %s needs one dtype on every device",
			 b->name, b->device, b->count, gpuq_dtype_name(b->dtype), first->name,
			 first->device, first->count, gpuq_dtype_name(first->dtype),
			 coll_prim_name(prim));
}

/* Whether b holds need elements; if not, the error says whose it is and how many it lacks. */
static int check_holds(const struct task_read *tr, const struct buffer *b, uint64_t need,
		       int rank, const char *role, struct gpuq_error *err)
{
	const struct coll_layout *l = &tr->task->layout;
	if (b->count >= need)
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "buffer '%s@%d' (rank %d's %s) holds %" PRIu64 " %s elements, but %s of "
			 "count %" PRIu64 " over %d rank%s needs %" PRIu64 " there: %" PRIu64
			 " too few; give a smaller count or a larger buffer",
			 b->name, b->device, rank, role, b->count, gpuq_dtype_name(b->dtype),
			 coll_prim_name(l->prim), l->count, l->nranks, l->nranks == 1 ? "" : "s", need,
			 need - b->count);
}

/* The default count, NCCL's meaning, from the buffer that defines it. */
static uint64_t default_count(const struct coll_layout *l, bool in_place, uint64_t held)
{
	uint64_t n = (uint64_t)l->nranks;
	switch (l->prim) {
	case COLL_REDUCE_SCATTER:
	case COLL_ALL_TO_ALL: return held / n;
	case COLL_ALL_GATHER: return in_place ? held / n : held;
	default: return held;
	}
}

/*
 * Finds the buffers each rank needs, as the layout says (in place: the one
 * buffer wherever the rank reads or writes), all of one dtype.
 */
static int resolve_ranks(struct task_read *tr, const char *in, const char *out,
			 struct buffer **bin, struct buffer **bout, struct gpuq_error *err)
{
	struct coll_layout shape = tr->task->layout;
	const struct buffer *first = NULL;
	shape.count = 1; /* who reads and writes does not depend on the count */
	for (int r = 0; r < tr->plan->n; r++) {
		int dev = tr->plan->devices[r];
		bool need_in = coll_in_count(&shape, r) > 0, need_out = coll_out_count(&shape, r) > 0;
		if (!out && (need_in || need_out) && !(bin[r] = bout[r] = resolve_on(tr, in, dev, err)))
			return -1;
		if (out && need_in && !(bin[r] = resolve_on(tr, in, dev, err)))
			return -1;
		if (out && need_out && !(bout[r] = resolve_on(tr, out, dev, err)))
			return -1;
		for (int k = 0; k < 2; k++) {
			const struct buffer *b = k ? bout[r] : bin[r];
			if (b && first && check_dtype(b, first, shape.prim, err) < 0)
				return -1;
			first = first ? first : b;
		}
	}
	tr->task->dtype = first->dtype;
	return 0;
}

/* Checks rank r's buffers against the layout and points the task at them. */
static int place_rank(struct task_read *tr, int r, bool in_place, struct buffer *bin,
		      struct buffer *bout, struct gpuq_error *err)
{
	struct coll_task *t = tr->task;
	size_t elt = gpuq_dtype_size(t->dtype);
	uint64_t ic = coll_in_count(&t->layout, r), oc = coll_out_count(&t->layout, r);
	uint64_t in_at = 0, out_at = 0;
	if (in_place) {
		coll_in_place_offsets(&t->layout, r, &in_at, &out_at);
		uint64_t need = ic ? in_at + ic : 0;
		if (oc && out_at + oc > need)
			need = out_at + oc;
		if (need && check_holds(tr, bin, need, r, "input and output, in place", err) < 0)
			return -1;
	} else if ((ic && check_holds(tr, bin, ic, r, "input", err) < 0) ||
		   (oc && check_holds(tr, bout, oc, r, "output", err) < 0)) {
		return -1;
	}
	if (ic) {
		t->in[r] = element_at(bin, in_at);
		add_region(tr, bin, in_at * elt, (in_at + ic) * elt, false);
	}
	if (oc) {
		t->out[r] = element_at(bout, out_at);
		add_region(tr, bout, out_at * elt, (out_at + oc) * elt, true);
	}
	return 0;
}

/* A primitive over named buffers (`buffer`, `out`): every one but sendrecv. */
static int read_named(struct task_read *tr, const struct prim_args *a, struct gpuq_error *err)
{
	struct coll_task *t = tr->task;
	struct coll_plan *p = tr->plan;
	struct buffer *bin[GPUQ_MAX_DEVICES] = { NULL }, *bout[GPUQ_MAX_DEVICES] = { NULL };
	bool in_place = !a->has_out || strcmp(a->out, a->in) == 0;
	bool by_out = t->layout.prim == COLL_BROADCAST && !in_place; /* only the root has `buffer` */
	if (p->n == 0 && devices_holding(tr, by_out ? a->out : a->in, err) < 0)
		return -1;
	t->layout.nranks = p->n;
	t->op = (enum coll_op)a->op;
	if (check_root(tr, a->root, err) < 0 ||
	    resolve_ranks(tr, a->in, in_place ? NULL : a->out, bin, bout, err) < 0)
		return -1;
	const struct buffer *ref = bin[t->layout.prim == COLL_BROADCAST ? t->layout.root : 0];
	t->layout.count = a->has_count ? a->count : default_count(&t->layout, in_place, ref->count);
	if (t->layout.count == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "buffer '%s@%d' holds %" PRIu64 " elements, fewer than the %d ranks "
				 "%s splits it among; give 'count' or a larger buffer",
				 ref->name, ref->device, ref->count, p->n, coll_prim_name(t->layout.prim));
	for (int r = 0; r < p->n; r++)
		if (place_rank(tr, r, in_place, bin[r], in_place ? bin[r] : bout[r], err) < 0)
			return -1;
	snprintf(tr->names->in, sizeof tr->names->in, "%s", a->in);
	snprintf(tr->names->out, sizeof tr->names->out, "%s", in_place ? a->in : a->out);
	tr->names->in_place = in_place;
	return 0;
}

/* One end of a sendrecv, parsed: its buffer, with a range of whole elements. */
static struct buffer *resolve_end(struct task_read *tr, const char *field,
				  const struct buffer_ref *ref, uint64_t *length, struct gpuq_error *err)
{
	struct buffer *b = args_resolve(tr->req, tr->plan->owner, ref->name, ref->device, err);
	if (!b || buffer_check_usable(b, err) < 0 ||
	    buffer_range_check(b, ref->offset, ref->has_length, ref->length, length, err) < 0)
		return NULL;
	size_t elt = gpuq_dtype_size(b->dtype);
	if (ref->offset % elt == 0 && *length % elt == 0)
		return b;
	gpuq_fail(err, GPUQ_E_BAD_REQUEST,
		  "field '%s': the range [%" PRIu64 ":%" PRIu64 "] of '%s@%d' is not whole %s "
		  "elements (%zu bytes each)",
		  field, ref->offset, ref->offset + *length, b->name, b->device, gpuq_dtype_name(b->dtype), elt);
	return NULL;
}

/* The range a sendrecv end uses, for its result: NAME@GPU[START:STOP]. */
static void name_end(char *out, size_t size, const struct buffer *b, uint64_t offset, uint64_t bytes)
{
	snprintf(out, size, "%s@%d[%" PRIu64 ":%" PRIu64 "]", b->name, b->device, offset,
		 offset + bytes);
}

/* Whether a sendrecv end holds count elements; if not, by how many it falls short. */
static int check_end(const char *field, const struct buffer *b, uint64_t length, uint64_t count,
		     struct gpuq_error *err)
{
	uint64_t have = length / gpuq_dtype_size(b->dtype);
	if (have >= count)
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "%s: the range of '%s@%d' holds %" PRIu64 " %s elements, but sendrecv of "
			 "count %" PRIu64 " needs %" PRIu64 " there: %" PRIu64 " too few",
			 field, b->name, b->device, have, gpuq_dtype_name(b->dtype), count, count,
			 count - have);
}

/* The ranks of a sendrecv's two ends; without `devices`, the two devices in ascending order. */
static int sendrecv_ranks(struct task_read *tr, const struct buffer *src, const struct buffer *dst,
			  struct gpuq_error *err)
{
	struct coll_plan *p = tr->plan;
	if (p->n == 0) {
		int lo = src->device < dst->device ? src->device : dst->device;
		int hi = src->device < dst->device ? dst->device : src->device;
		p->devices[p->n++] = lo;
		if (hi != lo)
			p->devices[p->n++] = hi;
	}
	struct coll_layout *l = &tr->task->layout;
	l->nranks = p->n;
	l->root = rank_of(p, src->device);
	l->peer = rank_of(p, dst->device);
	const struct buffer *off = l->root < 0 ? src : dst;
	if (l->root >= 0 && l->peer >= 0)
		return 0;
	return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
			 "%s '%s@%d' is on device %d, which is not one of the ranks in 'devices'",
			 l->root < 0 ? "src" : "dst", off->name, off->device, off->device);
}

/* sendrecv: `src` (on the sending rank) to `dst` (on the receiving one). */
static int read_sendrecv(struct task_read *tr, const struct prim_args *a, struct gpuq_error *err)
{
	struct coll_task *t = tr->task;
	const struct buffer_ref *sref = &a->src, *dref = &a->dst;
	uint64_t slen, dlen, count = a->has_count ? a->count : 0;
	struct buffer *src = resolve_end(tr, "src", sref, &slen, err), *dst = NULL;
	if (!src || !(dst = resolve_end(tr, "dst", dref, &dlen, err)))
		return -1;
	if (src->dtype != dst->dtype)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "src '%s@%d' is %s but dst '%s@%d' is %s; sendrecv moves elements "
				 "of one dtype",
				 src->name, src->device, gpuq_dtype_name(src->dtype), dst->name,
				 dst->device, gpuq_dtype_name(dst->dtype));
	size_t elt = gpuq_dtype_size(src->dtype);
	t->dtype = src->dtype;
	t->layout.count = count ? count : slen / elt;
	if (t->layout.count == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "src: the range of '%s@%d' is empty",
				 src->name, src->device);
	uint64_t bytes = t->layout.count * elt;
	if (check_end("src", src, slen, t->layout.count, err) < 0 ||
	    check_end("dst", dst, dlen, t->layout.count, err) < 0 || sendrecv_ranks(tr, src, dst, err) < 0)
		return -1;
	if (src == dst && sref->offset < dref->offset + bytes && dref->offset < sref->offset + bytes)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "src and dst overlap in '%s@%d' (bytes %" PRIu64 " and %" PRIu64
				 ", %" PRIu64 " each); give ranges apart",
				 src->name, src->device, sref->offset, dref->offset, bytes);
	t->in[t->layout.root] = (char *)src->dptr + sref->offset;
	t->out[t->layout.peer] = (char *)dst->dptr + dref->offset;
	add_region(tr, src, sref->offset, sref->offset + bytes, false);
	add_region(tr, dst, dref->offset, dref->offset + bytes, true);
	name_end(tr->names->in, sizeof tr->names->in, src, sref->offset, bytes);
	name_end(tr->names->out, sizeof tr->names->out, dst, dref->offset, bytes);
	return 0;
}

/* One primitive: its fields decoded from its map, then what they name resolved on the ranks. */
static int read_task(struct task_read *tr, enum coll_prim prim, struct gpuq_error *err)
{
	struct prim_args a;
	tr->task->layout.prim = prim;
	tr->task->op = COLL_SUM;
	if (prim_decode(tr, prim, &a, err) < 0)
		return -1;
	return prim == COLL_SENDRECV ? read_sendrecv(tr, &a, err) : read_named(tr, &a, err);
}

/* "ops[2] (sendrecv): " before a group entry's error (its end may be cut). */
static int prefix_error(struct gpuq_error *err, unsigned index, const char *op)
{
	char message[sizeof err->message];
	snprintf(message, sizeof message, "%s", err->message);
	snprintf(err->message, sizeof err->message, "ops[%u] (%.20s): %.440s", index, op, message);
	return -1;
}

static int read_group_entry(struct task_read *tr, unsigned i, struct gpuq_error *err)
{
	char op[32];
	enum coll_prim prim;
	if (tr->map->type != MSGPACK_OBJECT_MAP)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "ops[%u] is not a map; each entry is one collective: {op, buffer, ...}", i);
	int rc = msg_get_str(tr->map, "op", op, sizeof op, err);
	if (rc == 0)
		gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'op' (one of " COLL_PRIM_LIST ") is required");
	if (rc <= 0)
		return prefix_error(err, i, "?");
	if (coll_prim_from_name(op, &prim) < 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "ops[%u]: 'op' '%s' is not one of " COLL_PRIM_LIST, i, op);
	return read_task(tr, prim, err) < 0 ? prefix_error(err, i, op) : 0;
}

/* The entries of `ops`, the group's count first (the arrays are sized from it). */
static int group_size(struct request *req, const msgpack_object **ops, struct gpuq_error *err)
{
	int rc = msg_get_array(req->map, "ops", ops, err);
	if (rc == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ops' (an array of 1 to %d collectives) is required",
				 COLL_GROUP_MAX);
	if (rc < 0)
		return -1;
	uint32_t n = (*ops)->via.array.size;
	if (n == 0 || n > COLL_GROUP_MAX)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'ops': %u collectives; a group holds 1 to %d", n, COLL_GROUP_MAX);
	return (int)n;
}

static int plan_alloc(struct coll_plan *p, int ntasks, struct gpuq_error *err)
{
	p->ntasks = ntasks;
	p->tasks = calloc((size_t)ntasks, sizeof *p->tasks);
	p->names = calloc((size_t)ntasks, sizeof *p->names);
	p->regions = calloc((size_t)ntasks * 2 * GPUQ_MAX_DEVICES, sizeof *p->regions);
	if (p->tasks && p->names && p->regions)
		return 0;
	return gpuq_fail(err, GPUQ_E_OUT_OF_MEMORY, "gpuqd has no memory for %d collectives", ntasks);
}

static int compare_regions(const void *a, const void *b)
{
	const struct coll_region *x = a, *y = b;
	if (x->buffer != y->buffer)
		return (uintptr_t)x->buffer < (uintptr_t)y->buffer ? -1 : 1;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/*
 * A group's primitives run at once, in no set order, so none may write a
 * range another one reads or writes. Sorted by buffer and start, a region
 * can only overlap the ones after it that start before it ends.
 */
static int check_overlaps(struct coll_plan *p, struct gpuq_error *err)
{
	qsort(p->regions, (size_t)p->nregions, sizeof *p->regions, compare_regions);
	for (int i = 0; i < p->nregions; i++) {
		const struct coll_region *a = &p->regions[i];
		for (int j = i + 1; j < p->nregions && p->regions[j].buffer == a->buffer &&
				    p->regions[j].lo < a->hi; j++) {
			const struct coll_region *b = &p->regions[j];
			if (b->task == a->task || !(a->write || b->write))
				continue;
			const struct coll_region *w = a->write ? a : b, *o = a->write ? b : a;
			return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
					 "ops[%d] (%s) writes bytes %" PRIu64 "-%" PRIu64 " of '%s@%d', "
					 "which ops[%d] (%s) %s; a group's collectives run at once, in "
					 "no set order: give them separate buffers or ranges",
					 w->task, coll_prim_name(p->tasks[w->task].layout.prim), w->lo,
					 w->hi, w->buffer->name, w->buffer->device, o->task,
					 coll_prim_name(p->tasks[o->task].layout.prim),
					 o->write ? "also writes" : "reads");
		}
	}
	return 0;
}

/* A knob given outside [lo, hi]: the refusal names the field and the range. */
static int knob_range(const char *field, uint64_t v, uint64_t lo, uint64_t hi,
		      struct gpuq_error *err)
{
	if (v < lo || v > hi)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field '%s': %" PRIu64 " is not in %" PRIu64
				 " to %" PRIu64, field, v, lo, hi);
	return 0;
}

static int check_devices(struct request *req, void *args, struct gpuq_error *err)
{
	const struct coll_args *a = args;
	(void)req;
	if (a->group && a->devices.n == 0)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST,
				 "field 'devices' (the ranks, in order) is required: every collective "
				 "of a group runs on the same ranks");
	return 0;
}

static int check_timeout(struct request *req, void *args, struct gpuq_error *err)
{
	struct coll_args *a = args;
	if (!a->has_timeout)
		a->timeout_ms = req->d->opt.collective_timeout_ms;
	return a->has_timeout ? knob_range("collective_timeout_ms", a->timeout_ms, 1,
					   COLL_MAX_TIMEOUT_MS, err) : 0;
}

static int check_warmup(struct request *req, void *args, struct gpuq_error *err)
{
	(void)req;
	return knob_range("warmup", ((const struct coll_args *)args)->warmup, 0, BENCH_MAX_WARMUP, err);
}

static int check_iters(struct request *req, void *args, struct gpuq_error *err)
{
	(void)req;
	return knob_range("iters", ((const struct coll_args *)args)->iters, 1, BENCH_MAX_ITERS, err);
}

static int check_repeats(struct request *req, void *args, struct gpuq_error *err)
{
	(void)req;
	return knob_range("repeats", ((const struct coll_args *)args)->repeats, 1, BENCH_MAX_REPEATS,
			  err);
}

static bool is_bench(const void *args)
{
	return ((const struct coll_args *)args)->bench;
}

static const struct args_field coll_fields[] = {
	{ "owner", ARGS_OWNER, 0, ARGS_AT(struct coll_args, owner) },
	{ "devices", ARGS_DEVICES, 0, ARGS_AT(struct coll_args, devices), .then = check_devices },
	{ "collective_timeout_ms", ARGS_U64, 0, ARGS_AT(struct coll_args, timeout_ms),
	  ARGS_GIVEN(struct coll_args, has_timeout), .then = check_timeout },
	{ "warmup", ARGS_U64, 0, ARGS_AT(struct coll_args, warmup), .when = is_bench,
	  .then = check_warmup },
	{ "iters", ARGS_U64, 0, ARGS_AT(struct coll_args, iters), .when = is_bench,
	  .then = check_iters },
	{ "repeats", ARGS_U64, 0, ARGS_AT(struct coll_args, repeats), .when = is_bench,
	  .then = check_repeats },
#ifdef GPUQ_FAULT_INJECTION
	{ "inject_hang_rank", ARGS_U64, 0, ARGS_AT(struct coll_args, hang_rank),
	  ARGS_GIVEN(struct coll_args, has_hang) },
#endif
};

/* One spec per op: the same fields, and defaults that say which op it is. */
#define COLL_ARGS(name, group_, bench_, prim_)                                                 \
	static const struct coll_args name##_defaults = {                                     \
		.op = #name, .group = group_, .bench = bench_, .prim = prim_,                   \
		.warmup = BENCH_DEFAULT_WARMUP, .iters = BENCH_DEFAULT_ITERS,                   \
		.repeats = BENCH_DEFAULT_REPEATS,                                               \
	};                                                                                      \
	const struct args_spec op_##name##_args =                                               \
		ARGS_SPEC(struct coll_args, coll_fields, &name##_defaults)

COLL_ARGS(allreduce, false, false, COLL_ALLREDUCE);
COLL_ARGS(reduce_scatter, false, false, COLL_REDUCE_SCATTER);
COLL_ARGS(all_gather, false, false, COLL_ALL_GATHER);
COLL_ARGS(broadcast, false, false, COLL_BROADCAST);
COLL_ARGS(reduce, false, false, COLL_REDUCE);
COLL_ARGS(sendrecv, false, false, COLL_SENDRECV);
COLL_ARGS(all_to_all, false, false, COLL_ALL_TO_ALL);
COLL_ARGS(group, true, false, COLL_ALLREDUCE);
COLL_ARGS(bench_allreduce, false, true, COLL_ALLREDUCE);
COLL_ARGS(bench_collective, true, true, COLL_ALLREDUCE);

/* The knobs into the plan, once its ranks are known (a hang names one). */
static int plan_knobs(const struct coll_args *a, struct coll_plan *p, struct gpuq_error *err)
{
	p->timeout_ms = a->timeout_ms;
	p->warmup = a->warmup;
	p->iters = a->iters;
	p->repeats = a->repeats;
	if (a->has_hang && a->hang_rank >= (uint64_t)p->n)
		return gpuq_fail(err, GPUQ_E_BAD_REQUEST, "field 'inject_hang_rank': %" PRIu64
				 " is not a rank (0-%d)", a->hang_rank, p->n - 1);
	if (a->has_hang)
		p->hang_rank = (int)a->hang_rank;
	return 0;
}

/* Every primitive of the request: the top-level one, or each entry of `ops`. */
static int read_tasks(struct request *req, struct coll_plan *p, enum coll_prim prim,
		      struct gpuq_error *err)
{
	const msgpack_object *ops = NULL;
	int n = p->group ? group_size(req, &ops, err) : 1;
	if (n < 0 || plan_alloc(p, n, err) < 0)
		return -1;
	for (int i = 0; i < n; i++) {
		struct task_read tr = { .req = req, .plan = p, .map = ops ? &ops->via.array.ptr[i] : req->map,
					.task = &p->tasks[i], .names = &p->names[i], .index = i };
		if (p->group ? read_group_entry(&tr, (unsigned)i, err) < 0 : read_task(&tr, prim, err) < 0)
			return -1;
	}
	return check_overlaps(p, err);
}

int op_collective_read(struct request *req, const struct coll_args *a, struct coll_plan *plan,
		       struct gpuq_error *err)
{
	memset(plan, 0, sizeof *plan);
	plan->group = a->group;
	plan->hang_rank = -1;
	plan->owner = a->owner;
	plan->n = a->devices.n;
	memcpy(plan->devices, a->devices.dev, sizeof plan->devices);
	if (read_tasks(req, plan, a->prim, err) == 0 && plan_knobs(a, plan, err) == 0)
		return 0;
	op_collective_plan_free(plan);
	return -1;
}

void op_collective_plan_free(struct coll_plan *plan)
{
	free(plan->tasks);
	free(plan->names);
	free(plan->regions);
	plan->tasks = NULL;
	plan->names = NULL;
	plan->regions = NULL;
}
