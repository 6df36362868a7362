/* The sized benches' shared request (see bench_sized.h). */
#include "client/bench/bench_sized.h"

#include <string.h>

int bench_parse_sizes(const struct cli *cli, uint64_t *sizes, const char *example)
{
	char copy[256], *tok, *save;
	int n = 0;
	snprintf(copy, sizeof copy, "%s", cli->sizes);
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == BENCH_MAX_SIZES)
			return -cli_usage(cli, "--sizes '%s' has more than %d sizes", cli->sizes,
					  BENCH_MAX_SIZES);
		if (gpuq_parse_size(tok, &sizes[n]) < 0 || sizes[n] == 0)
			return -cli_usage(cli, "--sizes '%s': '%s' is not a size; give a list "
					       "such as %s", cli->sizes, tok, example);
		n++;
	}
	if (n == 0)
		return -cli_usage(cli, "--sizes '%s' has no sizes; give a list such as %s",
				  cli->sizes, example);
	return n;
}

int bench_call_sized(struct cli *cli, const char *op, const uint64_t *sizes, int nsizes,
		     struct gpuq_reply **out)
{
	struct mp_array list;
	struct mp_map req;
	int rc = cli_begin(cli, &req, op);
	if (rc)
		return rc;
	mp_put_bool(&req, "wait", true);
	if (cli->has_device)
		mp_put_u64(&req, "device", cli->device);
	if (cli->has_requests)
		mp_put_u64(&req, "repeats", cli->requests);
	if (nsizes > 0) {
		mp_array_init(&list);
		for (int i = 0; i < nsizes; i++)
			mp_array_u64(&list, sizes[i]);
		mp_put_array(&req, "sizes", &list);
	}
	cli_put_timeout(cli, &req);
	return cli_call(cli, &req, NULL, 0, out);
}
