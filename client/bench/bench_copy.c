/*
 * gpuq bench copy: the daemon measures its copy paths (a job, so it runs on
 * live servers too) and this prints them as one table. bench_copy gives the
 * host<->device rows; bench_d2d, where the daemon has it, the device<->device
 * and peer rows, in the same form. Each row: group, size, method, the path
 * taken, GB/s, the ratio to the group's ceiling measured in the same run,
 * a get's ratio to its own ceiling (get_ratio) and whether the
 * destination's checksum matched.
 */
#include <inttypes.h>
#include <string.h>

#include "client/bench/bench_sized.h"
#include "client/cli/cli.h"

/* The result map of a waited job's reply (or the reply itself, if it carries rows). */
static const msgpack_object *result_of(const struct gpuq_reply *r)
{
	const msgpack_object *job = gpuq_reply_get(r, "job");
	const msgpack_object *res = job && job->type == MSGPACK_OBJECT_MAP ?
					    msg_map_get(job, "result") : NULL;

	if (res && res->type == MSGPACK_OBJECT_MAP)
		return res;
	return r->root;
}

static const msgpack_object *array_of(const msgpack_object *map, const char *key)
{
	const msgpack_object *o = map ? msg_map_get(map, key) : NULL;

	return o && o->type == MSGPACK_OBJECT_ARRAY ? o : NULL;
}

static void add_rows(struct table *t, const msgpack_object *res)
{
	const msgpack_object *rows = array_of(res, "rows");
	char s[64], group[32], method[64], path[32];

	for (uint32_t i = 0; rows && i < rows->via.array.size; i++) {
		const msgpack_object *row = &rows->via.array.ptr[i];
		double ratio = field_f64(row, "ratio", -1);
		double get = field_f64(row, "get_ratio", -1);
		double first = field_f64(row, "first_dma_ms", -1);

		if (row->type != MSGPACK_OBJECT_MAP)
			continue;
		table_cell(t, "%s", field_str(row, "group", group, sizeof(group), "-"));
		table_cell(t, "%s", human_bytes(s, sizeof(s), field_u64(row, "bytes", 0), 0));
		table_cell(t, "%s", field_str(row, "method", method, sizeof(method), "-"));
		table_cell(t, "%s", field_str(row, "path", path, sizeof(path), "-"));
		table_cell(t, "%.2f", field_f64(row, "gbps", 0));
		if (ratio >= 0)
			table_cell(t, "%.2f", ratio);
		else
			table_cell(t, "-");
		if (get >= 0)
			table_cell(t, "%.2f", get);
		else
			table_cell(t, "-");
		if (first >= 0)
			table_cell(t, "%.2f/%.2f", first, field_f64(row, "after_last_dma_ms", 0));
		else
			table_cell(t, "-");
		table_cell(t, "%s", field_bool(row, "verified", false) ? "yes" : "NO");
	}
}

static void print_notes(const msgpack_object *res)
{
	const msgpack_object *notes = array_of(res, "notes");
	char s[256];

	for (uint32_t i = 0; notes && i < notes->via.array.size; i++) {
		const msgpack_object *n = &notes->via.array.ptr[i];

		if (n->type == MSGPACK_OBJECT_STR) {
			snprintf(s, sizeof(s), "%.*s", (int)n->via.str.size, n->via.str.ptr);
			printf("note: %s\n", s);
		}
	}
}

/* Each size's one-time cost of a region, and from what transfer size it pays for itself. */
static void print_pins(const msgpack_object *res)
{
	const msgpack_object *pins = array_of(res, "region_pin");
	char size[32], h2d[32], d2h[32];
	for (uint32_t i = 0; pins && i < pins->via.array.size; i++) {
		const msgpack_object *p = &pins->via.array.ptr[i];
		uint64_t be[2] = { field_u64(p, "break_even_h2d", 0), field_u64(p, "break_even_d2h", 0) };
		printf("region pinning of %s: %.1f ms once; pinning and one region copy beat one staged "
		       "memfd copy from %s (H2D), %s (D2H)\n",
		       human_bytes(size, sizeof size, field_u64(p, "bytes", 0), 0),
		       field_f64(p, "pin_s", 0) * 1e3,
		       be[0] ? human_bytes(h2d, sizeof h2d, be[0], 1) : "never",
		       be[1] ? human_bytes(d2h, sizeof d2h, be[1], 1) : "never");
	}
}

static void print_table(const msgpack_object *copy, const msgpack_object *d2d)
{
	static const struct table_col cols[] = {
		{ "GROUP", false }, { "SIZE", true },   { "METHOD", false },  { "PATH", false },
		{ "GB/s", true },   { "RATIO", true },  { "GET", true },
		{ "ENDS ms", true }, { "VERIFIED", false },
	};
	struct table t;
	char slot[32];

	printf("bench copy: device %" PRIu64 ", medians of %" PRIu64 " timed repeats after a "
	       "warm-up; %" PRIu64 " copy threads, %" PRIu64 " staging slots of %s; RATIO is to "
	       "the group's ceiling, GET a get's to the slower of its two halves: that ceiling and the "
	       "host alone writing that kind of destination (the best 'host' row), all measured in "
	       "the same run; ENDS: ms to the first DMA issued / after the last one\n",
	       field_u64(copy, "device", 0), field_u64(copy, "repeats", 0),
	       field_u64(copy, "copy_threads", 0), field_u64(copy, "slots", 0),
	       human_bytes(slot, sizeof(slot), field_u64(copy, "slot_bytes", 0), 0));
	table_init(&t, cols, (int)(sizeof(cols) / sizeof(cols[0])));
	add_rows(&t, copy);
	if (d2d)
		add_rows(&t, d2d);
	table_print(&t, stdout);
	table_free(&t);
	print_pins(copy);
	print_notes(copy);
	if (d2d)
		print_notes(d2d);
}

/* bench_d2d, if the daemon knows it: *out NULL (with a note) when it does not. */
static int call_d2d(struct cli *cli, const uint64_t *sizes, int nsizes, struct gpuq_reply **out)
{
	struct gpuq_error err;
	int rc = bench_call_sized(cli, "bench_d2d", sizes, nsizes, out);

	if (rc || gpuq_reply_ok(*out))
		return rc;
	gpuq_reply_error(*out, &err);
	if (err.code == GPUQ_E_UNKNOWN_OP) {
		printf("note: this gpuqd has no bench_d2d; device<->device rows skipped\n");
		gpuq_reply_free(*out);
		*out = NULL;
		return 0;
	}
	rc = cli_report_refusal(*out);
	gpuq_reply_free(*out);
	*out = NULL;
	return rc;
}

int bench_copy(struct cli *cli)
{
	uint64_t sizes[BENCH_MAX_SIZES];
	struct gpuq_reply *copy = NULL, *d2d = NULL;
	int nsizes = 0, rc;

	if (cli->sizes && (nsizes = bench_parse_sizes(cli, sizes, "256M,1G,4G")) < 0)
		return -nsizes;
	if (cli->has_requests && (cli->requests == 0 || cli->requests > 100))
		return cli_usage(cli, "--requests %" PRIu64 " (timed repeats per measurement) "
				      "is out of range; give 1 to 100", cli->requests);
	if ((rc = bench_call_sized(cli, "bench_copy", sizes, nsizes, &copy)) != 0)
		return rc;
	if (!gpuq_reply_ok(copy)) {
		rc = cli_report_refusal(copy);
		gpuq_reply_free(copy);
		return rc;
	}
	rc = call_d2d(cli, sizes, nsizes, &d2d);
	if (cli->json_out) {
		FILE *j = cli->json_out;
		fprintf(j, "{\"bench\":\"copy\",\"bench_copy\":");
		msg_print_json(j, copy->root);
		fprintf(j, ",\"bench_d2d\":");
		if (d2d)
			msg_print_json(j, d2d->root);
		else
			fprintf(j, "null");
		fprintf(j, "}\n");
	}
	if (!cli->json)
		print_table(result_of(copy), d2d ? result_of(d2d) : NULL);
	gpuq_reply_free(copy);
	gpuq_reply_free(d2d);
	return rc;
}
