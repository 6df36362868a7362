/* Progress events for waiters that asked (`progress: true`), progress.c. Main thread only. */
#ifndef GPUQ_PROGRESS_H
#define GPUQ_PROGRESS_H

#include <stdbool.h>

struct daemon;
struct waiter;

void progress_watch(struct daemon *d);
void progress_close(struct daemon *d);
/* Marks w (a waiter just registered) for progress events if the request asked (`progress: true`). */
void progress_request(struct daemon *d, struct waiter *w, bool wanted);

#endif
