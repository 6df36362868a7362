/*
 * The listening socket and client connections. Main thread only.
 *
 * Connections are read with recvmsg on a uv_poll_t rather than a uv_pipe_t,
 * because requests carry regular-file, memfd and pipe descriptors as
 * SCM_RIGHTS, and libuv's pipes pass only stream handles. Replies are
 * written directly while the socket accepts them and queued otherwise.
 */
#ifndef GPUQ_SERVER_H
#define GPUQ_SERVER_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "protocol/frame.h"

#define CONN_MAX_PENDING_FDS 64
/* A client that leaves this much unread is dropped. */
#define CONN_MAX_OUTPUT (64u << 20)

struct daemon;
struct waiter;
struct outbuf;

struct conn {
	struct server *server;
	uv_poll_t poll;
	int fd;
	uint64_t serial; /* for logs */
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct frame_reader reader;
	int fds[CONN_MAX_PENDING_FDS]; /* received, not yet taken by a request */
	int nfds;
	struct outbuf *out_head, *out_tail;
	size_t out_bytes;
	int poll_events;
	bool close_after_flush; /* stop reading; close when the output is written */
	bool closed;
	struct waiter *waiters;
	struct conn *prev, *next;
};

struct server {
	struct daemon *daemon;
	uv_loop_t *loop;
	uv_poll_t listen_poll;
	int listen_fd;
	bool listening;
	bool adopted; /* the socket came from the service manager: never unlink it */
	char path[108];
	size_t max_frame;
	uint64_t next_serial;
	struct conn *conns;
};

/*
 * Binds path (mode 0660, group if given), replacing a stale socket file but
 * never a live daemon's, and starts accepting. 0, or -1 with msg filled.
 */
int server_listen(struct server *s, struct daemon *d, uv_loop_t *loop, const char *path,
		  const char *group, size_t max_frame, char *msg, size_t msgsize);
/*
 * Serves a listening socket passed by the service manager (socket
 * activation): the path is the manager's, so stopping leaves it in place and
 * connections that arrive while gpuqd restarts wait in its backlog.
 * 0, or -1 with msg filled.
 */
int server_adopt(struct server *s, struct daemon *d, uv_loop_t *loop, int fd,
		 size_t max_frame, char *msg, size_t msgsize);
/* Stops accepting and removes the socket file (unless it was adopted). */
void server_stop_listening(struct server *s);
/* Closes every connection (their unsent output is dropped). */
void server_close_all(struct server *s);

/* Queues frame bytes for the client; copies them. Drops a client over CONN_MAX_OUTPUT. */
void conn_send(struct conn *c, const void *data, size_t len);
/* The same with a descriptor (fd >= 0: duplicated; the caller keeps fd) passed with its first byte. */
void conn_send_fd(struct conn *c, const void *data, size_t len, int fd);
/* Stops reading; closes once queued output is written. */
void conn_close_after_flush(struct conn *c);
/* Takes n received descriptors in arrival order; -1 if fewer are pending. */
int conn_take_fds(struct conn *c, int n, int *out);

/* request.c: handles one complete frame from c. */
void request_handle(struct daemon *d, struct conn *c, const uint8_t *payload, size_t len);
/* request.c: a frame over the limit; replies bad_frame and closes c. */
void request_refuse_oversize(struct conn *c, size_t len, size_t max_frame);
/* op_jobs.c: unlinks and frees every waiter of c. */
void waiters_drop_conn(struct conn *c);
/* op_region.c: c's leases end and its ephemeral regions go once idle (zero-copy sharing). */
void share_conn_closed(struct daemon *d, struct conn *c);

#endif
