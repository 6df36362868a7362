/*
 * The listening socket (server.c) and client connections (conn.c). Main
 * thread only.
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

#include "workers/log.h"
#include "daemon/parked_fds.h"
#include "daemon/quota.h"
#include "protocol/frame.h"

/* A client that leaves this much unread is dropped. */
#define CONN_MAX_OUTPUT (64u << 20)

struct conn;
struct daemon;
struct mp_map;
struct waiter;
struct outbuf;

/*
 * What a connection's end lets go of (its ephemeral buffers and regions,
 * its waiters, its leases). The families that tie things to a connection
 * are registered once at start-up (main.c) and run in the order of that
 * table. A CONN_CLOSING hook runs in conn_close itself; a CONN_CLOSED hook
 * from the poll handle's close callback, in the loop's close phase, outside
 * every walk over a job's waiters or the leases that the code which closed
 * the connection may be in.
 */
enum conn_hook_when { CONN_CLOSING, CONN_CLOSED };

struct conn_hook {
	enum conn_hook_when when;
	void (*run)(struct daemon *d, struct conn *c);
};

/* Handles one complete frame from c (request.c's request_handle). */
typedef void (*server_frame_fn)(struct daemon *d, struct conn *c, const uint8_t *payload,
				size_t len);

struct conn {
	struct server *server;
	uv_poll_t poll;
	int fd;
	uint64_t serial; /* for logs */
	uid_t uid;
	gid_t gid;
	pid_t pid;
	struct frame_reader reader;
	struct parked_fds parked; /* received, not yet taken by a request */
	uint64_t stream_in;       /* bytes received so far */
	uint64_t frame_at;        /* stream offset of the next frame's first byte */
	uint64_t partial_at;      /* the frame_at that frame_since is about */
	double frame_since;       /* when that incomplete frame began to arrive; 0: none */
	struct quota_conn_held held; /* what it holds against its uid's limits */
	struct outbuf *out_head, *out_tail;
	size_t out_bytes;
	int poll_events;
	bool close_after_flush; /* stop reading; close when the output is written */
	bool closed;            /* conn_close ran: nothing more is read or sent */
	struct waiter *waiters;
	struct conn *prev, *next;
};

struct server {
	struct daemon *daemon;
	uv_loop_t *loop;
	uv_poll_t listen_poll;
	uv_timer_t accept_timer; /* restarts accepting after a pause at the descriptor limit */
	uv_timer_t scan_timer;   /* --frame-timeout over every connection */
	bool timers;             /* the two timers are initialised */
	struct log_every fd_log, accept_log;
	int listen_fd;
	/*
	 * A descriptor kept in reserve (/dev/null): at the descriptor limit it
	 * is given up for a moment to accept each waiting client and refuse it
	 * with `busy`, instead of leaving it in the backlog. -1 when none.
	 */
	int reserve_fd;
	bool listening;
	bool adopted; /* the socket came from the service manager: never unlink it */
	char path[108];
	size_t max_frame;
	uint64_t next_serial;
	struct conn *conns;
	/* The layers above, set once at start-up (main.c) before the loop runs. */
	server_frame_fn on_frame;
	const struct conn_hook *conn_hooks;
	size_t nconn_hooks;
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
/* Closes every connection (what the sockets do not take at once is dropped). */
void server_close_all(struct server *s);
/* The open connection of this serial (a re-exec keeps serials), or NULL. */
struct conn *server_conn_of_serial(struct server *s, uint64_t serial);
/*
 * Whether gpuqd is out of descriptors now (a probe dup fails with EMFILE or
 * ENFILE); if so logs it, at most every few seconds, naming the cause.
 * `doing` says what failed ("receiving a client's descriptors").
 */
bool server_out_of_descriptors(struct server *s, const char *doing);

/* conn.c: a new connection on fd, just accepted; refused with a reply when over its uid's limit. */
void conn_open(struct server *s, int fd);
/*
 * A connection the previous gpuqd image served (a re-exec: daemon/recover.h),
 * served again under its old serial; new connections number after it.
 */
void conn_adopt(struct server *s, int fd, uint64_t serial);
/*
 * Closes c, deferred and idempotent: from here on nothing is read from or
 * sent to it (conn_send drops what it is given); its CONN_CLOSING hooks run
 * at once (its ephemeral buffers are orphaned); its CONN_CLOSED hooks (its
 * waiters detached, its regions orphaned, its leases ended) and the struct's
 * free wait for the loop's close phase, outside every walk over jobs,
 * waiters and leases that the caller may be in.
 */
void conn_close(struct conn *c);
/* Writes what the socket takes at once, then conn_close. */
void conn_close_now(struct conn *c);
/* Queues frame bytes for the client; copies them. Drops a client over CONN_MAX_OUTPUT. */
void conn_send(struct conn *c, const void *data, size_t len);
/* The same with a descriptor (fd >= 0: duplicated; the caller keeps fd) passed with its first byte. */
void conn_send_fd(struct conn *c, const void *data, size_t len, int fd);
/*
 * Sends a reply: body with the request's id and ok added, as one frame,
 * with descriptor fd (-1: none) as conn_send_fd passes it. reply.c answers
 * requests with it; conn.c refuses frames with it.
 */
void conn_send_reply(struct conn *c, uint64_t id, bool ok, struct mp_map *body, int fd);
/* The error reply: {error: {code, message}, id, ok: false}. */
void conn_send_error(struct conn *c, uint64_t id, const struct gpuq_error *err);
/* Stops reading; closes once queued output is written. */
void conn_close_after_flush(struct conn *c);
/* Logs why, answers err (with request id, 0 if none) and closes once it is written. */
void conn_refuse(struct conn *c, uint64_t id, const struct gpuq_error *err);
/*
 * Takes n descriptors for the frame being handled: those that arrived with
 * its first byte, in arrival order. 0, or -1 taking none when fewer than n
 * did (*arrived says how many).
 */
int conn_take_fds(struct conn *c, int n, int *out, int *arrived);
/* Refuses and closes c if its incomplete frame began over timeout_ms ago (0: never). */
void conn_check_frame_timeout(struct conn *c, double now, unsigned timeout_ms);

#endif
