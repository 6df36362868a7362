/*
 * The host versions of the device kernels (fill, iota, random, checksum),
 * written from the same definitions in protocol/hash.h. The host backend runs
 * them, and GPU tests use them as the reference. Any thread.
 */
#ifndef GPUQ_HOST_PATTERNS_H
#define GPUQ_HOST_PATTERNS_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/protocol.h"

void host_fill_pattern(void *dst, size_t bytes, uint64_t pattern, size_t elem_size);
void host_fill_iota(void *dst, size_t count, enum gpuq_dtype dtype);
void host_fill_random(void *dst, size_t bytes, enum gpuq_dtype dtype, uint64_t seed);
uint64_t host_checksum(const void *src, size_t bytes);

#endif
