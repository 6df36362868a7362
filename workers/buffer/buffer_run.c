/*
 * The runners of the kinds that act on one buffer as a whole (rows NOOP,
 * ALLOC, FREE, FILL, CHECKSUM of workers/work_kinds.h). Worker thread
 * only, on a fiber of the device's scheduler; every device operation goes
 * through the backend table, so this file serves the CUDA and the host
 * backend alike.
 */
#include <stdio.h>
#include <unistd.h>

#include "workers/buffer/buffer_run.h"

#include "workers/buffer/slab.h"

#include "workers/clock.h"
#include "workers/sched/sched.h"

int buffer_run_noop(struct device *dev, struct work *work)
{
	(void)dev;
	(void)work;
	return 0;
}

struct memory_wait {
	struct work *work;
	struct device *dev;
	uint64_t epoch;
	double deadline;
};

/* Memory was released since the last try, the time is up, or the job was cancelled. */
static bool memory_wait_over(void *arg)
{
	struct memory_wait *m = arg;
	return sched_memory_epoch(m->dev) != m->epoch || monotonic_seconds() >= m->deadline ||
	       atomic_load(&m->work->cancel);
}

/*
 * One try: from the device's buffer memory, or a slab of its own with a
 * handle to export (a shareable buffer); then where it lives.
 */
static int alloc_once(struct device *dev, struct work *work)
{
	struct slab_place p;
	int rc = !work->shareable
			 ? dev->ops->mem.alloc(dev, work->length, &work->dptr, &work->error)
			 : dev->ops->mem.alloc_shareable(dev, work->length, &work->dptr,
							 &work->result.share_fd, &work->error);
	if (rc == 0 && work->dptr && dev->ops->mem.place(dev, work->dptr, &p) == 0) {
		work->result.slab = p.slab;
		work->result.slab_offset = p.offset;
		work->result.slab_bytes = p.slab_bytes;
		work->result.slab_fd = p.fd;
	}
	return rc;
}

/*
 * A new buffer reads as zeros. Its memory may have held a freed buffer's
 * bytes, anyone's (the pool and the slabs hand memory out again), and
 * those must not show through to the new owner. A failure gives the
 * memory back, since no buffer will hold it.
 */
static int zero_new_buffer(struct device *dev, struct work *work)
{
	static const struct fill_spec zeros = { .pattern = FILL_ZERO, .dtype = GPUQ_DTYPE_BYTES };
	if (dev->ops->mem.fill(dev, work->dptr, work->length, &zeros, &work->error) == 0)
		return 0;
	char why[sizeof work->error.message];
	snprintf(why, sizeof why, "%s", work->error.message);
	struct gpuq_error ignored;
	if (work->result.share_fd >= 0) {
		close(work->result.share_fd);
		work->result.share_fd = -1;
	}
	if (dev->ops->mem.release(dev, work->dptr, &ignored) == 0)
		sched_memory_released(dev);
	work->dptr = NULL;
	return gpuq_fail(&work->error, work->error.code, "zeroing the new buffer: %s", why);
}

/*
 * An allocation, waiting up to wait_memory_ms for memory that other jobs
 * release (each release lets every waiting allocation try again, the more
 * urgent first, since the scheduler resumes jobs in that order).
 */
int buffer_run_alloc(struct device *dev, struct work *work)
{
	struct memory_wait m = { .work = work, .dev = dev,
				 .deadline = monotonic_seconds() + work->wait_memory_ms / 1e3 };
	work->result.bytes = work->length;
	work->result.share_fd = -1;
	work->result.slab_fd = -1;
	for (;;) {
		m.epoch = sched_memory_epoch(dev);
		if (alloc_once(dev, work) == 0)
			return zero_new_buffer(dev, work);
		if (work->error.code != GPUQ_E_OUT_OF_MEMORY || work->wait_memory_ms == 0 ||
		    !sched_in_job())
			return -1;
		if (dev->info.mem_total && work->length > dev->info.mem_total)
			return -1; /* more than the whole device: no free can make room, so no wait */
		if (atomic_load(&work->cancel))
			return gpuq_fail(&work->error, GPUQ_E_CANCELLED,
					 "alloc cancelled while it waited for memory");
		if (monotonic_seconds() >= m.deadline) {
			/* The message is formatted into the error that holds it: copy it first. */
			char why[sizeof work->error.message];
			snprintf(why, sizeof why, "%s", work->error.message);
			return gpuq_fail(&work->error, GPUQ_E_OUT_OF_MEMORY,
					 "%s; waited %llu ms (wait_memory_ms) without enough being freed",
					 why, (unsigned long long)work->wait_memory_ms);
		}
		sched_wait_host(memory_wait_over, &m, SCHED_WAIT_MEMORY);
	}
}

int buffer_run_free(struct device *dev, struct work *work)
{
	work->result.bytes = work->length;
	if (dev->ops->mem.release(dev, work->dptr, &work->error) != 0)
		return -1;
	sched_memory_released(dev);
	return 0;
}

int buffer_run_fill(struct device *dev, struct work *work)
{
	work->result.bytes = work->length;
	return dev->ops->mem.fill(dev, work->dptr, work->length, &work->fill, &work->error);
}

int buffer_run_checksum(struct device *dev, struct work *work)
{
	work->result.bytes = work->length;
	return dev->ops->mem.checksum(dev, work->dptr, work->length, &work->result.checksum,
				  &work->error);
}
