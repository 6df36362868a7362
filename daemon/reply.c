/* Building and sending replies. Main thread only. */
#include "daemon/reply.h"

#include "daemon/daemon.h"

/* The request reply_watch watches: one at a time, on the main thread. */
static struct {
	const struct conn *conn; /* NULL: none */
	uint64_t id;
	bool mute;
	struct gpuq_error *refused;
} watched;

void reply_watch(const struct conn *c, uint64_t id, bool mute, struct gpuq_error *refused)
{
	gpuq_error_clear(refused);
	watched.conn = c;
	watched.id = id;
	watched.mute = mute;
	watched.refused = refused;
}

void reply_watch_end(void)
{
	watched.conn = NULL;
}

static bool reply_is_watched(const struct conn *c, uint64_t id)
{
	return watched.conn && watched.conn == c && watched.id == id;
}

void reply_to_fd(struct conn *c, uint64_t id, bool ok, struct mp_map *body, int fd)
{
	if (reply_is_watched(c, id) && watched.mute) {
		mp_map_destroy(body);
		return;
	}
	conn_send_reply(c, id, ok, body, fd);
}

void reply_to(struct conn *c, uint64_t id, bool ok, struct mp_map *body)
{
	reply_to_fd(c, id, ok, body, -1);
}

void reply_ok_fd(struct request *req, struct mp_map *body, int fd)
{
	reply_to_fd(req->conn, req->id, true, body, fd);
}

void reply_error_to(struct conn *c, uint64_t id, const struct gpuq_error *err)
{
	if (reply_is_watched(c, id)) {
		*watched.refused = *err;
		if (watched.mute)
			return;
	}
	conn_send_error(c, id, err);
}

void reply_error_text(struct request *req, enum gpuq_errc code, const char *message)
{
	struct mp_map body, e;
	if (reply_is_watched(req->conn, req->id)) {
		gpuq_fail(watched.refused, code, "%s", message);
		if (watched.mute)
			return;
	}
	mp_map_init(&body);
	mp_map_init(&e);
	mp_put_str(&e, "code", gpuq_errc_name(code));
	mp_put_str(&e, "message", message);
	mp_put_map(&body, "error", &e);
	conn_send_reply(req->conn, req->id, false, &body, -1);
}

void reply_ok(struct request *req, struct mp_map *body)
{
	reply_to(req->conn, req->id, true, body);
}

void reply_error(struct request *req, const struct gpuq_error *err)
{
	reply_error_to(req->conn, req->id, err);
}

void reply_outcome(struct conn *c, uint64_t id, const struct job *job)
{
	struct mp_map body, record;
	mp_map_init(&body);
	mp_map_init(&record);
	job_render(job, true, &record);
	mp_put_map(&body, "job", &record);
	bool ok = job->state == GPUQ_JOB_DONE;
	bool fd = ok && job->reply_fd >= 0 && c == job->reply_conn && id == job->reply_id;
	if (!ok)
		error_render(&job->error, &body);
	if (fd)
		mp_put_u64(&body, "fds", 1);
	reply_to_fd(c, id, ok, &body, fd ? job->reply_fd : -1);
}
