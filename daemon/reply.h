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
void reply_to(struct conn *c, uint64_t id, bool ok, struct mp_map *body);
/*
 * The reply a finished job gives: its record, and its error if it did not
 * succeed. The request the job's descriptor is for (attach) gets it too.
 */
void reply_outcome(struct conn *c, uint64_t id, const struct job *job);

#endif
