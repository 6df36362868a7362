/*
 * Readiness, status and watchdog notification to the service manager:
 * sd_notify's datagram protocol, spoken directly (listen_fds.c does the same
 * for socket activation).
 *
 * gpuq implements both from systemd's documented interface instead of
 * linking libsystemd: the binaries are linked statically so that one build
 * runs on GPU servers that have no libsystemd headers, and each protocol is
 * a few dozen lines (docs/ARCHITECTURE.md, "Running under systemd").
 *
 * Main thread only.
 */
#ifndef GPUQ_NOTIFY_H
#define GPUQ_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct notify {
	int fd;               /* datagram socket to $NOTIFY_SOCKET; -1 when there is none */
	char path[108];       /* as given ('@' for the abstract namespace) */
	uint64_t watchdog_usec; /* $WATCHDOG_USEC for this process; 0: no watchdog */
};

/*
 * Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID and opens the socket.
 * Without NOTIFY_SOCKET every send is a no-op. Returns 0, or -1 with msg
 * when the variable is malformed (the daemon goes on without it).
 */
int notify_open(struct notify *n, char *msg, size_t msgsize);
void notify_close(struct notify *n);
bool notify_enabled(const struct notify *n);

/*
 * Sends one notification datagram ("READY=1", "STATUS=...", several
 * assignments separated by newlines). 0, or -1 with errno: the daemon logs
 * and goes on, as a service manager that stopped listening is not fatal.
 */
int notify_send(const struct notify *n, const char *state);

#endif
