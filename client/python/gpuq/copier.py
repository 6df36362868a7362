"""The staging ring's copy threads: persistent, fed through one queue.

A copy between an ordinary array and a pinned slot is numpy's (it releases
the GIL), so several threads copy at memory speed; what limits them is
what each task costs under the GIL around the copy. On the H200 host,
twelve threads that each took 2-4 MiB copies from a queue moved 70 GB/s,
where a ``ThreadPoolExecutor`` handing out the same copies (a future, a
work item and condition variables per task) topped out at 28-31 GB/s. So a
task here is a tuple on a ``SimpleQueue`` (C, one lock) and its completion
is a plain lock the thread releases: no futures, no per-task conditions.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, List, Optional

__all__ = ["Copier", "CopyTask"]


class CopyTask:
    """One copy given to the threads: :meth:`wait` for it, :meth:`done` to ask."""

    __slots__ = ("_lock", "error")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released by the thread that ran the copy
        self.error: Optional[BaseException] = None

    def done(self) -> bool:
        return not self._lock.locked()

    def wait(self) -> None:
        """Blocks until the copy ran; raises what it raised. May be called again."""
        self._lock.acquire()
        self._lock.release()
        if self.error is not None:
            raise self.error

    def wait_for(self, seconds: float) -> bool:
        """Blocks until the copy ran or ``seconds`` passed: whether it ran (its error,
        if any, is :meth:`wait`'s to raise)."""
        if not self._lock.acquire(timeout=seconds):
            return False
        self._lock.release()
        return True

    def _finish(self, error: Optional[BaseException]) -> None:
        self.error = error
        self._lock.release()


class Copier:
    """``threads`` copy threads, started on first use, ended by :meth:`close`.

    Tasks run in the order given, up to ``threads`` at once.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._tasks: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._running: List[threading.Thread] = []
        self._pid = os.getpid()

    def submit(self, fn: Callable[[Any, Any], None], dst: Any, src: Any) -> CopyTask:
        """Runs ``fn(dst, src)`` on a copy thread; returns at once."""
        if self._pid != os.getpid():  # a forked child has none of its parent's threads
            self._tasks, self._running, self._pid = queue.SimpleQueue(), [], os.getpid()
        if not self._running:
            self._start()
        task = CopyTask()
        self._tasks.put((fn, dst, src, task))
        return task

    def _start(self) -> None:
        for k in range(self.threads):
            t = threading.Thread(target=self._serve, name=f"gpuq-copy-{k}", daemon=True)
            t.start()
            self._running.append(t)

    def _serve(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, dst, src, task = item
            try:
                fn(dst, src)
            except BaseException as exc:  # handed to the waiter, never lost here
                task._finish(exc)
            else:
                task._finish(None)

    def drain(self) -> None:
        """Blocks until every task given so far has run. Each thread takes one
        task at a time, in order, so once every thread is inside one of the
        barrier tasks given last, none of the earlier ones is still running."""
        if not self._running or self._pid != os.getpid():
            return
        barrier = threading.Barrier(len(self._running) + 1)
        for _ in self._running:
            self._tasks.put((_meet, barrier, None, CopyTask()))
        try:
            barrier.wait()
        except BaseException:
            barrier.abort()  # interrupted here: the threads must not wait for this one
            raise

    def close(self) -> None:
        """Ends the threads once the tasks already given have run (does not wait)."""
        for _ in self._running:
            self._tasks.put(None)
        self._running = []


def _meet(barrier: threading.Barrier, _: Any) -> None:
    """A :meth:`Copier.drain` task: holds its thread until every thread holds one."""
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass  # the drain was interrupted
