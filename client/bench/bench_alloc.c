/*
 * gpuq bench alloc: the daemon measures alloc and free latency on one
 * device, from the memory pool and from exportable slabs in the same run (a
 * job, bench_alloc), and this prints one table: per size, p50 and p99 of
 * each, the slab/pool ratio of the p50s, and the device memory one buffer
 * took from each.
 */
#include <inttypes.h>
#include <string.h>

#include "client/bench/bench_sized.h"
#include "client/cli/cli.h"

/* The row of `memory` for bytes, or NULL. */
static const msgpack_object *find_row(const msgpack_object *rows, uint64_t bytes, const char *memory)
{
	char m[16];
	for (uint32_t i = 0; rows && i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		if (row->type == MSGPACK_OBJECT_MAP && field_u64(row, "bytes", 0) == bytes &&
		    strcmp(field_str(row, "memory", m, sizeof m, ""), memory) == 0)
			return row;
	}
	return NULL;
}

static void add_row(struct table *t, const msgpack_object *row, const msgpack_object *pool)
{
	char size[32], held[32], m[16];
	double p50 = field_f64(row, "alloc_p50_us", 0), base = pool ? field_f64(pool, "alloc_p50_us", 0) : 0;
	table_cell(t, "%s", human_bytes(size, sizeof size, field_u64(row, "bytes", 0), 0));
	table_cell(t, "%s", field_str(row, "memory", m, sizeof m, "-"));
	table_cell(t, "%.1f", p50);
	table_cell(t, "%.1f", field_f64(row, "alloc_p99_us", 0));
	table_cell(t, "%.1f", field_f64(row, "free_p50_us", 0));
	table_cell(t, "%.1f", field_f64(row, "free_p99_us", 0));
	if (row != pool && base > 0)
		table_cell(t, "%.2f", p50 / base);
	else
		table_cell(t, "-");
	table_cell(t, "%s", human_bytes(held, sizeof held, field_u64(row, "held_bytes", 0), 1));
}

static void print_table(const msgpack_object *res)
{
	static const struct table_col cols[] = {
		{ "SIZE", true },     { "MEMORY", false },  { "ALLOC p50 µs", true },
		{ "ALLOC p99 µs", true }, { "FREE p50 µs", true }, { "FREE p99 µs", true },
		{ "p50/POOL", true }, { "HELD/BUFFER", true },
	};
	const msgpack_object *rows = msg_map_get(res, "rows"), *notes = msg_map_get(res, "notes");
	char how[16], s[256];
	struct table t;
	if (rows && rows->type != MSGPACK_OBJECT_ARRAY)
		rows = NULL;
	printf("bench alloc: device %" PRIu64 " (its buffers: %s), p50/p99 of %" PRIu64
	       " timed alloc/free pairs after a warm-up, the pool then slabs; p50/POOL is the "
	       "slabs' alloc p50 over the pool's, measured in the same run\n",
	       field_u64(res, "device", 0), field_str(res, "buffer_memory", how, sizeof how, "-"),
	       field_u64(res, "repeats", 0));
	table_init(&t, cols, (int)(sizeof cols / sizeof cols[0]));
	for (uint32_t i = 0; rows && i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		if (row->type != MSGPACK_OBJECT_MAP)
			continue;
		add_row(&t, row, find_row(rows, field_u64(row, "bytes", 0), "pool"));
	}
	table_print(&t, stdout);
	table_free(&t);
	for (uint32_t i = 0; notes && notes->type == MSGPACK_OBJECT_ARRAY && i < notes->via.array.size; i++) {
		const msgpack_object *n = &notes->via.array.ptr[i];
		if (n->type != MSGPACK_OBJECT_STR)
			continue;
		snprintf(s, sizeof s, "%.*s", (int)n->via.str.size, n->via.str.ptr);
		printf("note: %s\n", s);
	}
}

int bench_alloc(struct cli *cli)
{
	uint64_t sizes[BENCH_MAX_SIZES];
	struct gpuq_reply *r = NULL;
	int nsizes = 0, rc;
	if (cli->sizes && (nsizes = bench_parse_sizes(cli, sizes, "4K,1M,64M,1G")) < 0)
		return -nsizes;
	if (cli->has_requests && (cli->requests == 0 || cli->requests > 1000))
		return cli_usage(cli, "--requests %" PRIu64 " (timed alloc/free pairs) is out of "
				      "range; give 1 to 1000", cli->requests);
	if ((rc = bench_call_sized(cli, "bench_alloc", sizes, nsizes, &r)) != 0)
		return rc;
	if (!gpuq_reply_ok(r)) {
		rc = cli_report_refusal(r);
		gpuq_reply_free(r);
		return rc;
	}
	const msgpack_object *job = gpuq_reply_get(r, "job");
	const msgpack_object *res = job && job->type == MSGPACK_OBJECT_MAP ? msg_map_get(job, "result") : NULL;
	if (cli->json_out) {
		fprintf(cli->json_out, "{\"bench\":\"alloc\",\"bench_alloc\":");
		msg_print_json(cli->json_out, r->root);
		fprintf(cli->json_out, "}\n");
	}
	if (!cli->json)
		print_table(res && res->type == MSGPACK_OBJECT_MAP ? res : r->root);
	gpuq_reply_free(r);
	return 0;
}
