/* NUMA placement from sysfs and mbind (see numa.h). Any thread. */
#include "workers/backend/numa.h"

#include <ctype.h>
#include <errno.h>
#include <linux/mempolicy.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NUMA_MAX_NODES 1024

/* Reads the first line of path into buf; 0, or -1. */
static int read_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	int rc = fgets(buf, (int)size, f) ? 0 : -1;
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
	return rc;
}

/* "0" is one node; "0-1" or "0,2" are several. */
static int several_nodes(void)
{
	char online[256];
	if (read_line("/sys/devices/system/node/online", online, sizeof online) < 0)
		return 0;
	return strpbrk(online, "-,") != NULL;
}

int numa_node_of_pci(const char *bus_id)
{
	char id[64], path[160], line[32];
	size_t n = strlen(bus_id);
	if (n == 0 || n >= sizeof id || !several_nodes())
		return -1;
	for (size_t i = 0; i <= n; i++)
		id[i] = (char)tolower((unsigned char)bus_id[i]);
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", id);
	if (read_line(path, line, sizeof line) < 0)
		return -1;
	int node = -1;
	if (sscanf(line, "%d", &node) != 1 || node < 0 || node >= NUMA_MAX_NODES)
		return -1;
	return node;
}

int numa_prefer_node(void *addr, size_t len, int node)
{
	unsigned long mask[NUMA_MAX_NODES / (8 * sizeof(unsigned long))];
	if (node < 0 || node >= NUMA_MAX_NODES) {
		errno = EINVAL;
		return -1;
	}
	memset(mask, 0, sizeof mask);
	mask[node / (8 * sizeof mask[0])] |= 1ul << (node % (8 * sizeof mask[0]));
	/* The kernel reads maxnode - 1 bits. */
	long rc = syscall(SYS_mbind, addr, len, MPOL_PREFERRED, mask,
			  (unsigned long)NUMA_MAX_NODES + 1, 0u);
	return rc == 0 ? 0 : -1;
}
