/*
 * What the benches measured by the daemon over a list of sizes share
 * (bench copy, bench d2d, bench alloc): --sizes read into a list, and the
 * job request with device, repeats and sizes, waited for.
 */
#ifndef GPUQ_BENCH_SIZED_H
#define GPUQ_BENCH_SIZED_H

#include <stdint.h>

#include "client/cli/cli.h"

#define BENCH_MAX_SIZES 8

/*
 * --sizes "256M,1G": up to BENCH_MAX_SIZES sizes into sizes; example is
 * the list the usage message suggests. How many, or -CLI_USAGE (printed).
 */
int bench_parse_sizes(const struct cli *cli, uint64_t *sizes, const char *example);
/* op as a waited job with --device, --requests as repeats, and the sizes (none: the daemon's). */
int bench_call_sized(struct cli *cli, const char *op, const uint64_t *sizes, int nsizes,
		     struct gpuq_reply **out);

#endif
