/*
 * One row of a copy benchmark: bench_copy (host <-> device) and bench_d2d
 * (device <-> device, peer) report the same shape, and `gpuq bench copy`
 * prints both in one table.
 */
#ifndef GPUQ_BENCH_ROW_H
#define GPUQ_BENCH_ROW_H

#include <stdbool.h>
#include <stdint.h>

struct bench_row {
	char group[32];   /* "H2D", "D2H", "D2D", "peer 0->1" */
	uint64_t bytes;
	char method[48];  /* "cudaMemcpy pinned", "gpuq memfd", "gpuq CE", ... */
	const char *role; /* "baseline", "ceiling" or "gpuq" (static) */
	const char *path; /* gpuq rows: the path the bytes took (static), else NULL */
	double gbps;      /* median of the timed repeats */
	double ceiling;   /* GB/s of the group's ceiling in this run */
	double host_ceiling; /* gets: GB/s of the host alone into that kind of destination; 0: none */
	/* Staged rows: medians of the time to the first DMA issued, and from the last one to the end; 0: none. */
	double first_dma_ms, after_last_dma_ms;
	bool verified;    /* the destination's checksum matched the source's */
};

#endif
