/*
 * Jobs queued at a re-exec, replayed by the next image (docs/ARCHITECTURE.md,
 * Durable state, "The re-exec"; docs/protocol.md, `restarted`).
 *
 * At the restart request, replay_hold takes every queued job out of the
 * workers' queues. One that can be carried over is *held*: it stays in
 * the table, queued, in no worker's queue (no worker starts it; `status`
 * shows it, `wait` waits for it, `cancel` ends it). One that cannot fails
 * at once with `restarted`, saying why. After the drain, just before the
 * execve, replay_hand_over writes the held jobs into a memfd of their own
 * and ends them in this image without a word to anyone; the next image's
 * replay_run submits each again, in submission order, on its connection
 * through the normal request path (admission, quotas and validation apply
 * again) under its old job id and submission time: its replies go to the
 * same request id, and the waiters it had (`wait` on other requests) wait
 * on. A job the next image refuses, or one that could not be carried,
 * is recorded there as failed under its id, and its waiters are answered.
 *
 * What is carried over: a job a client's request made, whose request
 * passed no descriptor (put/get from a file or pipe: the descriptor does
 * not outlive the image), whose connection goes to the next image (the
 * restart's `survives`: not closed, nothing half read, no reply unsent),
 * and that is not queued behind a job sharing a buffer with it that was
 * not carried (jobs on a buffer keep their order, or fail together).
 * gpuqd's own jobs (the free of an orphaned buffer) and requests that
 * passed descriptors fail at the request; the rest at the execve, the
 * next image's record of them saying why.
 *
 * The memfd holds one msgpack map: `v` (REPLAY_VERSION) and `jobs`, a list
 * of maps in submission order: `job` (id), `op`, `conn` (the connection's
 * serial), `id` (the request id), `uid`, `gid`, `pid` (the connection's
 * credentials), `submitted` (CLOCK_MONOTONIC seconds, the same clock
 * across an execve), `replied` (the client had its answer: the queued
 * record of a request without `wait`, or a wait's timeout), `waiters`
 * (list of {conn, id, progress, timeout_ms}), and either `request` (bin:
 * the request's frame payload as it arrived) or `fail` (why it was not
 * carried: it fails with `restarted`). GPUQ_INHERIT names it `queue:FD`.
 *
 * Main thread only.
 */
#ifndef GPUQ_REPLAY_H
#define GPUQ_REPLAY_H

#include <stdbool.h>

#define REPLAY_VERSION 1

struct conn;
struct daemon;

/* The restart request: holds every queued job that can be carried over, fails the rest (logged). */
void replay_hold(struct daemon *d);
/* How many jobs are held now. */
unsigned replay_held(const struct daemon *d);
/*
 * Just before the execve: writes the held jobs into a new memfd (*fd,
 * close-on-exec until the caller hands it over; -1 when none are held)
 * and ends them here. A job whose
 * connection does not survive (survives(c) false, or closed) is written
 * to fail. -1 when the memfd cannot be written (logged): every held job
 * then failed here with `restarted`, its waiters answered.
 */
int replay_hand_over(struct daemon *d, bool (*survives)(const struct conn *c), int *fd);
/*
 * Once the connections are served again (the next image, or this one
 * after a failed execve): submits again every job fd names, and closes
 * fd (-1: nothing to do). Logs "`what`: M queued jobs replayed, K failed".
 */
void replay_run(struct daemon *d, int fd, const char *what);

#endif
