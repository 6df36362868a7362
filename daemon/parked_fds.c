/* Descriptors received and not yet taken (see parked_fds.h). Main thread only. */
#include "daemon/parked_fds.h"

#include <string.h>
#include <unistd.h>

int parked_keep(struct parked_fds *p, const int *fds, int n, uint64_t from, uint64_t to)
{
	int lost = 0;
	for (int i = 0; i < n; i++) {
		if (p->count == PARKED_MAX) {
			close(fds[i]);
			lost++;
			continue;
		}
		p->fd[p->count++] = (struct parked_fd){ fds[i], from, to };
	}
	return lost;
}

/* Removes entries [at, at + n). */
static void parked_remove(struct parked_fds *p, int at, int n)
{
	memmove(&p->fd[at], &p->fd[at + n], sizeof p->fd[0] * (size_t)(p->count - at - n));
	p->count -= n;
}

int parked_take(struct parked_fds *p, uint64_t start, int n, int *out, int *have)
{
	int first = -1, avail = 0;
	for (int i = 0; i < p->count; i++) {
		if (p->fd[i].from <= start && start < p->fd[i].to) {
			if (first < 0)
				first = i;
			avail++;
		}
	}
	*have = avail;
	if (avail < n)
		return -1;
	for (int i = 0; i < n; i++)
		out[i] = p->fd[first + i].fd;
	if (n > 0)
		parked_remove(p, first, n);
	return 0;
}

int parked_drop_through(struct parked_fds *p, uint64_t end)
{
	int kept = 0, dropped = 0;
	for (int i = 0; i < p->count; i++) {
		if (p->fd[i].to <= end) {
			close(p->fd[i].fd);
			dropped++;
		} else {
			p->fd[kept++] = p->fd[i];
		}
	}
	p->count = kept;
	return dropped;
}

void parked_close_all(struct parked_fds *p)
{
	for (int i = 0; i < p->count; i++)
		close(p->fd[i].fd);
	p->count = 0;
}
