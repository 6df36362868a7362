"""Job: a handle on one job of gpuqd, as its record describes it."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Mapping, Optional

from .dispatch import Call
from .errors import GpuqError, error_from_map

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api

__all__ = ["Job", "FINISHED", "timeout_ms"]

#: The states in which a job has ended.
FINISHED = frozenset({"done", "failed", "cancelled"})

ProgressHandler = Callable[[Dict[str, Any]], None]


def timeout_ms(timeout: Optional[float]) -> Optional[int]:
    """A wait's limit in seconds as the protocol's ``timeout_ms`` (whose 0 means none).

    ``None`` is no limit; 0 becomes 1 ms, the shortest wait the protocol has.
    """
    if timeout is None:
        return None
    if not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
    return max(1, math.ceil(timeout * 1000))


class Job:
    """One job of gpuqd: its id, state and result, and what can be done with it.

    Job methods of the client return one: finished, when they waited (the
    default), or as queued with ``detach=True``. Its ``record`` is the job
    record of the latest reply, as the daemon sent it (docs/protocol.md,
    "Job records"); every key of it is also an attribute, so keys that
    newer daemons add (``priority``, ``waiting``, ...) show up as
    ``job.priority`` without a client change::

        job = client.put("model.bin", "weights", detach=True)
        job.wait(timeout=60)         # raises the job's error if it failed
        print(job.state, job.result["gbps"])

    On an :class:`~gpuq.AsyncClient`, ``wait``, ``refresh`` and ``cancel``
    return awaitables.

    Pickled (a worker's result or error on its way to a
    ``ProcessPoolExecutor``'s parent), a job is its record: it arrives bound
    to no client, its attributes as they were; ``client.wait(job)``,
    ``client.status(job)`` or ``client.cancel(job)`` in the other process
    act on it. ``copy.copy`` and ``copy.deepcopy`` keep the client.
    """

    def __init__(self, client: Optional["Api"], record: Mapping[str, Any]) -> None:
        self._client = client
        self.record: Dict[str, Any] = dict(record)

    def __reduce__(self) -> Any:
        return (Job, (None, self.record))

    def __copy__(self) -> "Job":
        return Job(self._client, self.record)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Job":
        return Job(self._client, copy.deepcopy(self.record, memo))

    def _bound(self) -> "Api":
        """The client this job's methods go through; a job that came through
        pickle has none, and RuntimeError says what to call instead."""
        if self._client is None:
            raise RuntimeError(f"job {self.record.get('job')} came through pickle and "
                               "belongs to no client: use a client of this process, "
                               "client.wait(job), client.status(job) or "
                               "client.cancel(job)")
        return self._client

    @property
    def id(self) -> int:
        """The job id (never reused while the daemon lives)."""
        return int(self.record["job"])

    @property
    def op(self) -> Optional[str]:
        return self.record.get("op")

    @property
    def state(self) -> Optional[str]:
        """``queued``, ``running``, ``done``, ``failed`` or ``cancelled``, as last seen."""
        return self.record.get("state")

    @property
    def finished(self) -> bool:
        """Whether the job had ended when its record was taken."""
        return self.state in FINISHED

    @property
    def result(self) -> Optional[Dict[str, Any]]:
        """The op's result once ``done`` (docs/protocol.md, under each op), else None."""
        return self.record.get("result")

    @property
    def error(self) -> Optional[GpuqError]:
        """The job's error when it failed or was cancelled, else None."""
        err = self.record.get("error")
        return error_from_map(err, job=self, reply=self.record) if err is not None else None

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not attributes: the record's keys.
        record = self.__dict__.get("record", {})
        if name in record:
            return record[name]
        raise AttributeError(f"job record has no {name!r} (it has: {', '.join(record)})")

    def __repr__(self) -> str:
        return f"<gpuq.Job {self.record.get('job')} {self.op} {self.state}>"

    def wait(self, timeout: Optional[float] = None,
             on_progress: Optional[ProgressHandler] = None) -> "Job":
        """Waits for the job to end and returns it; raises its error if it did not succeed.

        ``timeout``: seconds; when it runs out :class:`~gpuq.Timeout` is
        raised and the job goes on. ``on_progress`` is called with each
        progress event (docs/protocol.md, "Progress events") meanwhile.
        """
        return self._bound()._drive(self._wait_plan(timeout, on_progress))

    def refresh(self) -> "Job":
        """Asks the daemon for the job's record as it stands now (``status``)."""
        return self._bound()._drive(self._refresh_plan())

    def cancel(self) -> bool:
        """Asks the daemon to cancel the job; False when it had already finished.

        A queued job is cancelled at once, a running one at its next chunk
        (a job not cut into chunks, such as a fill, ends first); ``wait``
        then raises :class:`~gpuq.Cancelled` unless it had ended.
        """
        return self._bound()._drive(self._cancel_plan())

    def _wait_plan(self, timeout: Optional[float],
                   on_progress: Optional[ProgressHandler]) -> Generator[Call, Any, "Job"]:
        if self.finished:
            if self.state != "done":
                raise self.error  # type: ignore[misc]
            return self
        fields = {"job": self.id, "timeout_ms": timeout_ms(timeout),
                  "progress": True if on_progress else None}
        try:
            reply = yield Call("wait", fields, waits=True, wait_s=timeout,
                               on_event=on_progress)
        except GpuqError as exc:
            if exc.job is not None:
                self.record = exc.job.record
                exc.job = self
            raise
        self.record = dict(reply["job"])
        return self

    def _refresh_plan(self) -> Generator[Call, Any, "Job"]:
        reply = yield Call("status", {"job": self.id})
        self.record = dict(reply["job"])
        return self

    def _cancel_plan(self) -> Generator[Call, Any, bool]:
        reply = yield Call("cancel", {"job": self.id})
        if isinstance(reply.get("job"), Mapping):
            self.record = dict(reply["job"])
        return bool(reply.get("cancel_requested"))
