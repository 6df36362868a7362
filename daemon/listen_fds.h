/*
 * Socket activation: the listening socket a service manager passes
 * (sd_listen_fds' environment protocol, spoken directly; see notify.h for
 * why). Main thread, at start-up.
 */
#ifndef GPUQ_LISTEN_FDS_H
#define GPUQ_LISTEN_FDS_H

#include <stddef.h>

/* The first descriptor passed (SD_LISTEN_FDS_START). */
#define LISTEN_FDS_START 3

/*
 * The listening socket passed to this process, if any: LISTEN_PID must be
 * this process and LISTEN_FDS must be 1; descriptor 3 must be a listening
 * AF_UNIX stream socket. Returns the descriptor (made close-on-exec), -1
 * when none was passed, or -2 with msg when what was passed cannot be
 * served. Unsets the variables, so that no child takes them for its own.
 */
int listen_fds_take(char *msg, size_t msgsize);

#endif
