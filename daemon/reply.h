/* Building and sending replies (reply.c). Main thread only. */
#ifndef GPUQ_REPLY_H
#define GPUQ_REPLY_H

#include <stdbool.h>
#include <stdint.h>

#include "protocol/msg.h"

struct conn;
struct job;
struct request;

/* Answers req: reply_ok adds id and ok to body and sends it. */
void reply_ok(struct request *req, struct mp_map *body);
/* reply_ok with descriptor fd attached (SCM_RIGHTS, with the frame's first byte); fd stays the caller's. */
void reply_ok_fd(struct request *req, struct mp_map *body, int fd);
void reply_to_fd(struct conn *c, uint64_t id, bool ok, struct mp_map *body, int fd);
void reply_error(struct request *req, const struct gpuq_error *err);
void reply_error_to(struct conn *c, uint64_t id, const struct gpuq_error *err);
/*
 * reply_error of a message longer than struct gpuq_error holds (unknown_op's
 * list of every op): the client gets it whole; a watcher, cut to its size.
 */
void reply_error_text(struct request *req, enum gpuq_errc code, const char *message);
void reply_to(struct conn *c, uint64_t id, bool ok, struct mp_map *body);
/*
 * The reply a finished job gives: its record, and its error if it did not
 * succeed. The request the job's descriptor is for (attach) gets it too.
 */
void reply_outcome(struct conn *c, uint64_t id, const struct job *job);
/*
 * While a held request is replayed (daemon/replay.h): the error replies
 * to c's request id are copied into *refused (its code stays GPUQ_OK when
 * none), and with mute every reply to it is kept back, the client having
 * had its answer before the re-exec. reply_watch_end stops watching.
 */
void reply_watch(const struct conn *c, uint64_t id, bool mute, struct gpuq_error *refused);
void reply_watch_end(void);

#endif
