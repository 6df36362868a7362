/*
 * Where a GPU sits on a NUMA machine, and placing host memory there, from
 * what the kernel says in sysfs. No libnuma: two sysfs reads and one mbind
 * system call. Any thread.
 */
#ifndef GPUQ_NUMA_H
#define GPUQ_NUMA_H

#include <stddef.h>

/*
 * The NUMA node of the PCI device bus_id ("0000:1B:00.0", any case), or -1
 * when the machine has a single node or does not say.
 */
int numa_node_of_pci(const char *bus_id);

/*
 * Asks the kernel to place the pages of [addr, addr + len) (page-aligned,
 * not yet touched) on node, preferring it rather than insisting. 0, or -1
 * with errno.
 */
int numa_prefer_node(void *addr, size_t len, int node);

#endif
