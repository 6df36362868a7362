/* What the host can still give: read where gpuqd decides how much host memory to hold. Any thread. */
#ifndef GPUQ_HOST_MEMORY_H
#define GPUQ_HOST_MEMORY_H

#include <stdint.h>

/* /proc/meminfo's MemAvailable in bytes; 0 when it cannot be read. */
uint64_t host_memory_available(void);

#endif
