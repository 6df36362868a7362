"""The clock of the asyncio connections: one thread that tells each loop when to look.

An AsyncConnection has two things to do on time: fail a request the daemon
answers at once when it outlives its deadline, and check liveness every
quarter timeout while a wait for a job is pending. Loop timers did both
once; but an asyncio loop with any timer armed computes a timeout at every
turn and polls with it, and a connection with a request in flight always had
one: on the development machine about 2 µs of the ~35 µs of CPU a ping took,
and 4 of ~42 for a waited noop (its liveness timer as well;
docs/PERFORMANCE.md). So this thread keeps the time instead. It sleeps until
the earliest deadline of any watched connection, or a quarter of the
shortest timeout, and then hands each connection that has something due a
check on its own loop (``call_soon_threadsafe``). The checks run on the
loop, as the timers' did; this thread only reads how many requests are due
and the oldest deadline.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Optional, Protocol


class Watched(Protocol):
    """What the thread asks of a connection (aio.AsyncConnection)."""

    @property
    def timeout(self) -> float:
        """Seconds; the connection is looked at at least every quarter of it."""

    def watch_due(self, now: float) -> Optional[float]:
        """Called on the watch thread: schedules the connection's checks that are due
        at ``now`` on its loop; returns when it next needs a look (None: not before
        the thread's next round)."""


class _Watch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.conns: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.thread: Optional[threading.Thread] = None

    def add(self, conn: Watched) -> None:
        with self.lock:
            self.conns.add(conn)
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name="gpuq-aio-clock",
                                               daemon=True)
                self.thread.start()
        self.changed.set()  # a shorter timeout may have come

    def discard(self, conn: Watched) -> None:
        with self.lock:
            self.conns.discard(conn)

    def run(self) -> None:
        while True:
            wake = self.round(time.monotonic())
            self.changed.wait(None if wake is None else max(0.0, wake - time.monotonic()))
            self.changed.clear()

    def round(self, now: float) -> Optional[float]:
        """Lets every watched connection schedule what is due; the next time to look.
        Holds the connections only while it runs: one dropped unclosed goes."""
        with self.lock:
            conns = list(self.conns)
        wake: Optional[float] = None
        for conn in conns:
            for t in (now + conn.timeout / 4, conn.watch_due(now)):
                if t is not None and (wake is None or t < wake):
                    wake = t
        return wake


_watch = _Watch()


def watch(conn: Watched) -> None:
    """Keeps ``conn``'s time from now until :func:`unwatch` (or until it is dropped)."""
    _watch.add(conn)


def unwatch(conn: Watched) -> None:
    _watch.discard(conn)


def _after_fork_in_child() -> None:
    # The thread did not come along, and its lock may have been held at the fork.
    global _watch
    _watch = _Watch()


os.register_at_fork(after_in_child=_after_fork_in_child)
