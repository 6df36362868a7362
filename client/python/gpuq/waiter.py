"""A thread that waits for a sync client's jobs, so that the thread that submits
them does not.

A ring transfer (staging.py) used to cost its calling thread two round
trips per job: the submission and, later, the ``wait`` before the job's
slots could be used again. On the H200 host those round trips, made by a
thread that takes turns at the GIL with a dozen copy threads, set the
pace. A :class:`Waiter` takes the waits: it sends each job's ``wait`` on
the same connection (a sync client's threads each read their own replies)
in submission order, and releases the job's :class:`Task` when the reply
comes; the calling thread blocks on that lock only when it needs the
slots, and by then the reply has usually come.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any, Optional

from .copier import Task

if TYPE_CHECKING:  # pragma: no cover
    from .job import Job

__all__ = ["Waiter"]


class Waiter:
    """Waits for jobs in the order given, on one thread started on first use."""

    def __init__(self, drive: Any) -> None:
        self._drive = drive  # a sync client's plan runner (Client._drive)
        self._jobs: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def submit(self, job: "Job", timeout: Optional[float]) -> Task:
        """A task released once ``job`` has finished (with its error if it failed)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="gpuq-waiter",
                                            daemon=True)
            self._thread.start()
        task = Task()
        self._jobs.put((job, timeout, task))
        return task

    def _serve(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, timeout, task = item
            try:
                self._drive(job._wait_plan(timeout, None))
            except BaseException as exc:  # handed to the one who needs the slots
                task._finish(exc)
            else:
                task._finish(None)

    def close(self) -> None:
        """Ends the thread once the jobs already given are waited for (does not wait)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
