"""Every request of docs/protocol.md as a method, written once for both clients.

Each method builds a *plan*: a generator that yields the requests it needs
(:class:`~gpuq.dispatch.Call`) and receives their replies, and returns the
method's result. :class:`gpuq.Client` runs plans by blocking on each reply,
:class:`gpuq.AsyncClient` by awaiting it, so the two have the same methods
with the same arguments and documentation; on the async client each returns
an awaitable of what the sync one returns. A reply that is not ``ok`` is
raised into the plan as the :class:`~gpuq.GpuqError` its code names, so a
plan can catch one (``put_array`` catches :class:`~gpuq.Exists`).

A method for a new op is a few lines over :meth:`Api.request` (replies) or
:meth:`Api.job` (jobs). Named methods take ``**fields`` too: keys the method
does not name are sent as they are, so a field that a newer daemon accepts
(``owner`` for root, ``ephemeral``, ...) needs no client change.

Units: ``timeout`` arguments are seconds, as in Python's own APIs; fields
that the protocol names ``*_ms`` keep their names and unit.
"""

from __future__ import annotations

import operator
import os
from dataclasses import replace
from typing import (Any, Callable, Dict, Generator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

from . import arrays, buffer_rows, device_arrays, endpoints, kept_leases, memfd, share
from .buffer import Buffer
from .dtypes import gpuq_dtype
from .ops import ComputeOps
from .staging import Staging
from .dispatch import Call, close_all
from .errors import BadRequest, GpuqError, error_from_map
from .job import Job, timeout_ms

__all__ = ["Api", "Plan", "parse_ops"]

Plan = Generator[Call, Any, Any]
ProgressHandler = Callable[[Dict[str, Any]], None]
JobRef = Union[int, Job]
Ops = Union[str, Sequence[Any]]


def parse_ops(ops: Ops) -> List[Any]:
    """A chain for ``run``: ``"sin | add 1 | mul 2"`` or a list of ops, as the protocol's list.

    In a string, ops are separated by ``|`` and arguments by spaces, as the
    CLI writes them; numbers become ints or floats. A list is sent as it is,
    each op a name, ``[name, args...]`` or ``{"op": name, "args": [...]}``.
    """
    if not isinstance(ops, str):
        return [[op] if isinstance(op, str) else op for op in ops]
    chain: List[Any] = []
    for stage in ops.split("|"):
        words = stage.split()
        if words:
            chain.append([words[0]] + [_number(w) for w in words[1:]])
    return chain


def _number(word: str) -> Any:
    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return word  # not a number: the daemon names the argument in its refusal


def _job_id(job: JobRef) -> int:
    return job.id if isinstance(job, Job) else int(job)


def _job_call(op: str, fields: Mapping[str, Any], fds: Sequence[int],
              priority: Optional[str], detach: bool, timeout: Optional[float],
              on_progress: Optional[ProgressHandler]) -> Call:
    """The request that submits a job (and waits for it unless ``detach``)."""
    req = dict(fields)
    if priority is not None:
        req["priority"] = priority
    if not detach:
        req["wait"] = True
        req["timeout_ms"] = None if timeout is None else timeout_ms(timeout)
        req["progress"] = True if on_progress else None
    elif timeout is not None or on_progress is not None:
        raise ValueError("timeout and on_progress apply to waiting; with detach=True "
                         "pass them to job.wait()")
    return Call(op, req, fds, waits=not detach, wait_s=timeout, on_event=on_progress)


def _job_request(op: str, *, priority: Optional[str] = None, detach: bool = False,
                 timeout: Optional[float] = None,
                 on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Call:
    """The request of ``_job_kw(op, ...)``, from the same arguments: what the
    one-request job methods of AsyncClient send (aio_methods.py)."""
    return _job_call(op, fields, (), priority, detach, timeout, on_progress)


def _body(reply: Mapping[str, Any]) -> Dict[str, Any]:
    """A reply without the envelope (``id``, ``ok``)."""
    return {k: v for k, v in reply.items() if k not in ("id", "ok")}



def _split_device(name: str, device: Optional[int]) -> Tuple[str, Optional[int]]:
    """``"w@1"`` is ``("w", 1)``, as the CLI reads ``gpuq alloc w@1``; given
    both ways, they must agree."""
    base, at, digits = name.rpartition("@")
    if not at or not digits.isdigit():
        return name, device
    if device is not None and device != int(digits):
        raise ValueError(f"'{name}' says device {digits} but device={device}; give one")
    return base, int(digits)

class Api(ComputeOps):
    """The methods shared by :class:`gpuq.Client` and :class:`gpuq.AsyncClient`."""

    def __init__(self, staging: Optional[Staging] = None) -> None:
        # Shapes of the arrays put_array stored, by NAME@GPU, for daemons
        # that keep none (see arrays.py).
        self._shapes: Dict[str, Tuple[int, ...]] = {}
        # What ``buffers`` said of the buffers put_array and get_array used, by
        # (NAME, GPU or None): one lookup per buffer, not one per call (buffer_rows.py).
        self._rows: Dict[Tuple[str, Optional[int]], Dict[str, Any]] = {}
        # Mappings of shareable buffers kept across put_array/get_array calls of
        # device arrays, by NAME@GPU (device_arrays.py), and those to unmap at close.
        self._mappings: Dict[str, Any] = {}
        self._stale_mappings: List[Any] = []
        # Attachments this client holds (attach until release or a broken lease),
        # by lease: put_array/get_array of a device array copy through one
        # that covers their buffer, with no attach or release (device_arrays.py).
        self._held: Dict[int, "share.Attachment"] = {}
        # Revocable leases kept between those copies (kept_leases.py).
        self._kept = kept_leases.KeptLeases()
        # The pinned ring ordinary arrays travel through (staging.py).
        self._staging = staging if staging is not None else Staging()

    # Subclasses run plans (blocking or awaiting) ------------------------------

    def _drive(self, plan: Plan) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _lease_abandoned(self, reply: Dict[str, Any]) -> None:  # pragma: no cover - abstract
        """Gives back the lease of an attach whose caller stopped waiting (client.py)."""
        raise NotImplementedError

    def _release_apart(self, lease: int) -> None:  # pragma: no cover - abstract
        """Ends ``lease`` on a connection and a thread of their own (client.py)."""
        raise NotImplementedError

    def _region_free_apart(self, name: str) -> None:  # pragma: no cover - abstract
        """Frees region ``name`` on a connection and a thread of their own (client.py)."""
        raise NotImplementedError

    def _region_abandoned(self, reply: Dict[str, Any]) -> None:  # pragma: no cover - abstract
        """Frees the region of a region_create whose caller stopped waiting (client.py)."""
        raise NotImplementedError

    def _uid(self) -> int:
        """Whose buffers ``put_array``/``get_array`` look for: this process's."""
        return os.geteuid()

    def _refusal(self, reply: Mapping[str, Any]) -> GpuqError:
        """The exception for a reply that is not ``ok``, with its job if it names one."""
        record = reply.get("job")
        job = Job(self, record) if isinstance(record, Mapping) and "job" in record else None
        return error_from_map(reply.get("error"), job=job, reply=reply)

    # Plans ----------------------------------------------------------------

    def _request_plan(self, op: str, fields: Mapping[str, Any],
                      fds: Sequence[int] = ()) -> Plan:
        reply = yield Call(op, fields, fds)
        return reply

    def _job_plan(self, op: str, fields: Mapping[str, Any], fds: Sequence[int] = (),
                  priority: Optional[str] = None, detach: bool = False,
                  timeout: Optional[float] = None,
                  on_progress: Optional[ProgressHandler] = None) -> Plan:
        """Submits a job; waits for it unless ``detach``; returns its :class:`Job`."""
        reply = yield _job_call(op, fields, fds, priority, detach, timeout, on_progress)
        return Job(self, reply["job"])

    def _transfer_plan(self, op: str, what: Any, fields: Dict[str, Any],
                       job: Dict[str, Any]) -> Plan:
        """A put or get: the descriptor is opened here, inside the plan, so that
        whatever happens to the request (even a coroutine never awaited) it
        is closed."""
        # A range in the name has a length this client does not parse: then
        # only descriptors bounded by their own end (or checked after) are used.
        share = "[" not in str(fields.get("buffer"))
        end = (endpoints.source if op == "put" else endpoints.sink)(what, share)
        try:
            if end.copy_back is not None and job.get("detach"):
                raise ValueError("get into a bytes-like object must wait (detach=False)")
            if end.limit is not None and share:
                length = fields.get("length")
                if length is not None and length > end.limit:
                    raise ValueError(f"{op}: length {length} is more than the {end.limit} "
                                     "bytes of the object given")
                fields = dict(fields, length=end.limit if length is None else length)
            done = yield from self._job_plan(op, fields, fds=end.fds, **job)
            if op == "get" and done.result is not None:
                end.finish(int(done.result.get("bytes", 0)))
            return done
        finally:
            end.close()

    # Generic requests ---------------------------------------------------------

    def request(self, op: str, *, fds: Sequence[int] = (), **fields: Any) -> Dict[str, Any]:
        """Sends any request and returns its reply (without ``id`` and ``ok``).

        ``fields`` are the request's keys (None values are left out); ``fds``
        are descriptors to pass with it. Raises the :class:`GpuqError` of the
        reply's code when it is not ``ok``. For a job op whose reply you want
        as a :class:`Job`, use :meth:`job`.
        """
        return self._drive(self._body_plan(op, fields, fds))

    def _body_plan(self, op: str, fields: Mapping[str, Any], fds: Sequence[int]) -> Plan:
        reply = yield from self._request_plan(op, fields, fds)
        return _body(reply)

    def job(self, op: str, *, fds: Sequence[int] = (), priority: Optional[str] = None,
            detach: bool = False, timeout: Optional[float] = None,
            on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Submits any job op and returns its :class:`Job` (see :meth:`noop` for the options).

        ``client.job("bench_copy", sizes=[1 << 30])`` runs the copy benchmark.
        """
        return self._drive(self._job_plan(op, fields, fds, priority, detach, timeout,
                                          on_progress))

    # The methods' own ways to send, without the public methods' layer (on the
    # async client every public method is a coroutine of its own).

    def _request_kw(self, op: str, **fields: Any) -> Any:
        return self._drive(self._body_plan(op, fields, ()))

    def _job_kw(self, op: str, *, priority: Optional[str] = None, detach: bool = False,
                timeout: Optional[float] = None,
                on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Any:
        return self._drive(self._job_plan(op, fields, (), priority, detach, timeout,
                                          on_progress))

    # Answered by the main thread ---------------------------------------------

    def ping(self, **fields: Any) -> Dict[str, Any]:
        """The daemon's ``server``, protocol ``version``, ``backend``, ``devices``,
        ``uptime_s`` and ``pid``."""
        return self._request_kw("ping", **fields)

    def devices(self, **fields: Any) -> List[Dict[str, Any]]:
        """One map per device: name, memory, health, queue, peer access and paths, counters."""
        return self._drive(self._key_plan("devices", "devices", fields))

    def absent(self, **fields: Any) -> List[Dict[str, Any]]:
        """Buffers the daemon keeps for GPUs it does not serve (``--devices``
        left them out, or they did not open), one map per GPU: ``uuid``,
        ``buffers``, ``bytes``. They come back, with their bytes, under a
        gpuqd that serves that GPU. Empty when there are none (``devices``'
        ``absent``)."""
        return self._drive(self._absent_plan(fields))

    def _absent_plan(self, fields: Mapping[str, Any]) -> Plan:
        reply = yield from self._request_plan("devices", fields)
        return list(reply.get("absent", []))

    def buffers(self, device: Optional[int] = None, **fields: Any) -> List[Dict[str, Any]]:
        """Your buffers (everyone's for root), each a map: ``name``, ``device``,
        ``dtype``, ``count``, ``bytes``, ``owner``, ``age_s``, ``state``."""
        return self._drive(self._key_plan("buffers", "buffers", dict(fields, device=device)))

    def stats(self, device: Optional[int] = None, **fields: Any) -> List[Dict[str, Any]]:
        """Per device: ``index``, ``healthy``, ``queue_depth``, ``counters`` and the
        kernel chains' ``chain`` counters."""
        return self._drive(self._key_plan("stats", "devices", dict(fields, device=device)))

    def quota(self, uid: Optional[int] = None, **fields: Any) -> List[Dict[str, Any]]:
        """Quota limits beside usage, one map per uid: ``uid``, ``groups_known``,
        ``limits`` (``device_memory``, ``host_pinned``, ``queued_jobs``,
        ``devices``, ``max_priority``, ``weight``, ``benchmarks``,
        ``connections``, ``parked_fds``, ``pending_frame_bytes``,
        ``reply_bytes``; ``None`` is unlimited) and ``used`` (the same counted
        limits; ``device_memory`` a list of bytes per device). The caller's own;
        root and the admin group get every uid with a rule or usage, or ``uid``'s."""
        return self._drive(self._key_plan("quota", "users", dict(fields, uid=uid)))

    def metrics(self, **fields: Any) -> str:
        """The Prometheus text that ``gpuq metrics`` prints."""
        return self._drive(self._key_plan("metrics", "text", fields))

    def shutdown(self, **fields: Any) -> Dict[str, Any]:
        """Stops the daemon as SIGTERM does (root and the admin group only):
        ``stopping``, ``jobs_active``, ``shutdown_timeout_ms``."""
        return self._request_kw("shutdown", **fields)

    def restart(self, binary: Optional[str] = None, **fields: Any) -> Dict[str, Any]:
        """Re-executes the daemon in place (root and the admin group only), its
        own binary or ``binary`` (an upgrade), keeping every buffer and this
        connection: requests sent meanwhile are answered after a pause.
        Running jobs get ``--restart-drain`` to finish, and those cut short fail
        with :class:`Restarted`; queued ones run in the new image under their
        ids (those that passed a file or pipe fail instead). Returns at once:
        ``restarting``, ``binary``, ``jobs_active``, ``restart_drain_ms``,
        ``restarts`` (the count before this one); :meth:`ping` counts it."""
        return self._request_kw("restart", binary=binary, **fields)

    def reset_device(self, device: int, **fields: Any) -> Dict[str, Any]:
        """Resets one device and serves it again, as gpuqd does by itself after a
        fault (root and the admin group only): its running jobs are cancelled and
        its buffers lost. Returns at once: ``device``, ``reset_requested``,
        ``resets`` (the count before this one); :meth:`devices` shows the reset."""
        return self._request_kw("reset_device", device=device, **fields)

    def drop_absent(self, uuid: str, **fields: Any) -> Dict[str, Any]:
        """Frees the buffers the daemon keeps for a GPU it does not serve
        (:meth:`absent` lists them), for good: a GPU removed, or given to other
        work (root and the admin group only). Returns ``uuid``, ``buffers``,
        ``bytes``: what was dropped."""
        return self._request_kw("drop_absent", uuid=uuid, **fields)

    def _key_plan(self, op: str, key: str, fields: Mapping[str, Any]) -> Plan:
        reply = yield from self._request_plan(op, fields)
        return reply.get(key)

    # Jobs and their records ----------------------------------------------------

    def jobs(self, **fields: Any) -> List[Job]:
        """Your jobs (everyone's for root and the admin group), newest last, without results."""
        return self._drive(self._jobs_plan(fields))

    def _jobs_plan(self, fields: Mapping[str, Any]) -> Plan:
        reply = yield from self._request_plan("jobs", fields)
        return [Job(self, record) for record in reply.get("jobs", [])]

    def status(self, job: JobRef) -> Job:
        """The job's record as it stands now."""
        return Job(self, {"job": _job_id(job)}).refresh()

    def wait(self, job: JobRef, timeout: Optional[float] = None,
             on_progress: Optional[ProgressHandler] = None) -> Job:
        """Waits for a job (an id or a :class:`Job`) to end; see :meth:`Job.wait`."""
        return Job(self, {"job": _job_id(job)}).wait(timeout, on_progress)

    def cancel(self, job: JobRef) -> bool:
        """Asks for a job to be cancelled; False when it had already finished."""
        return Job(self, {"job": _job_id(job)}).cancel()

    # Job requests --------------------------------------------------------------

    def noop(self, device: Optional[int] = None, *, devices: Optional[Sequence[int]] = None,
             priority: Optional[str] = None, detach: bool = False,
             timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
             **fields: Any) -> Job:
        """An empty job through a device's worker (``devices``: a gang, one part on each).

        Every job method takes these options:

        - ``priority``: ``"high"``, ``"normal"`` or ``"low"`` (sent only when
          given; daemons without a scheduler ignore it).
        - ``detach``: return the job as soon as it is queued, rather than
          when it has ended (then ``job.wait()``).
        - ``timeout``: seconds to wait for the job; when they run out
          :class:`~gpuq.Timeout` is raised with the job, which goes on.
        - ``on_progress``: called with each progress event while waiting.

        Waiting, a job that fails raises the :class:`~gpuq.GpuqError` of its
        code, with ``error.job``; a finished job is returned.
        """
        return self._job_kw("noop", device=device, devices=devices, priority=priority,
                            detach=detach, timeout=timeout, on_progress=on_progress, **fields)

    def alloc(self, name: str, shape: Any = None, dtype: Any = None, *,
              bytes: Optional[int] = None, count: Optional[int] = None,
              device: Optional[int] = None, wait_memory_ms: Optional[int] = None,
              ephemeral: Optional[bool] = None, shareable: Optional[bool] = None,
              priority: Optional[str] = None, detach: bool = False,
              timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
              nbytes: Optional[int] = None, **fields: Any) -> Any:
        """Allocates a buffer ``name`` on ``device`` (default 0) and returns it as a
        :class:`~gpuq.Buffer` (with ``detach=True``: the alloc's :class:`Job`).

        Its size: ``shape`` and ``dtype`` as numpy's (``alloc("w", (1024,
        1024), np.float32)``; gpuqd keeps the shape), or ``count`` elements
        of ``dtype``, or ``bytes`` bytes. ``dtype`` is any spelling:
        ``np.float32``, ``"float32"``, ``"f4"``, ``torch.float32`` or gpuq's
        ``f32`` (gpuq has ``u8 i32 i64 f16 bf16 f32 f64``). ``"NAME@GPU"``
        names the device too, as ``gpuq alloc NAME@GPU`` does.

        ``wait_memory_ms``: how long to wait for memory other jobs free
        instead of :class:`~gpuq.OutOfMemory` at once. ``ephemeral``: the
        buffer goes with this client's connection (gpuqd frees it when the
        connection closes, however the process ends, once no job and no lease
        holds it); otherwise it stays until freed. ``shareable``: allocated on
        its own so that processes may :meth:`attach` it. ``nbytes`` is the
        older name of ``bytes``.
        """
        name, device = _split_device(name, device)
        if nbytes is not None:
            if bytes is not None and bytes != nbytes:
                raise ValueError("give bytes or nbytes (its older name), not both")
            bytes = nbytes
        dims: Optional[List[int]] = None
        if shape is not None:
            dims = [int(shape)] if isinstance(shape, int) else [int(n) for n in shape]
            total = 1
            for n in dims:
                total *= n
            if count is not None and count != total:
                raise ValueError(f"shape {tuple(dims)} holds {total} elements, not "
                                 f"count={count}")
            count = total
        gd = gpuq_dtype(dtype) if dtype is not None else None
        if dims is not None and gd is None:
            raise ValueError("a shape needs a dtype: alloc(name, shape, np.float32)")
        if count == 0 or bytes == 0:
            what = (f"shape {tuple(dims)} holds no elements" if dims is not None
                    else "count=0" if count == 0 else "bytes=0")
            raise BadRequest(f"alloc '{name}': {what}, and buffers cannot be empty")
        return self._drive(self._alloc_plan(dict(
            fields, name=name, bytes=bytes, count=count, dtype=gd, shape=dims, device=device,
            wait_memory_ms=wait_memory_ms, ephemeral=ephemeral, shareable=shareable),
            dict(priority=priority, detach=detach, timeout=timeout, on_progress=on_progress)))

    def _alloc_plan(self, fields: Dict[str, Any], job: Dict[str, Any]) -> Plan:
        buffer_rows.forget(self, str(fields["name"]))
        done = yield from self._job_plan("alloc", fields, **job)
        if job.get("detach"):
            return done
        row = dict(name=fields["name"], device=fields.get("device") or 0,
                   dtype=fields.get("dtype") or "bytes", bytes=fields.get("bytes"),
                   count=fields.get("count"))
        row.update(done.result or {})
        return Buffer(self, dict(row, shape=fields.get("shape")), job=done)

    def buffer(self, name: str) -> Buffer:
        """Your buffer ``NAME`` or ``NAME@GPU`` as a :class:`~gpuq.Buffer` (its
        dtype, the shape gpuqd keeps, its size); :class:`~gpuq.NotFound` lists
        your buffers when there is none."""
        return self._drive(self._buffer_plan(name))

    def _buffer_plan(self, spec: str) -> Plan:
        name, device = buffer_rows.split_name(spec)
        row = yield from buffer_rows.lookup_plan(self, name, device)
        if row is None:
            raise (yield from buffer_rows.not_found_plan(self, spec))
        return Buffer(self, row)

    def free(self, buffer: str, *, priority: Optional[str] = None, detach: bool = False,
             timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
             **fields: Any) -> Job:
        """Frees a buffer (``NAME`` or ``NAME@GPU``). Result: ``bytes`` freed."""
        return self._drive(self._free_plan(buffer, fields, dict(
            priority=priority, detach=detach, timeout=timeout, on_progress=on_progress)))

    def _free_plan(self, buffer: str, fields: Dict[str, Any], job: Dict[str, Any]) -> Plan:
        buffer_rows.forget(self, buffer_rows.base_name(buffer))
        done = yield from self._job_plan("free", dict(fields, buffer=buffer), **job)
        self._shapes.pop(done.record.get("buffer", buffer), None)
        # Its leases have ended (free waited for them, revoking kept ones): no copy
        # uses a kept mapping. Kept leases of its name on other GPUs go too.
        for lease in device_arrays.drop_mappings(self, buffer_rows.base_name(buffer), unmap=True):
            yield Call("release", {"lease": lease}, await_reply=False)
        return done

    def put(self, src: Any, buffer: str, *, offset: Optional[int] = None,
            length: Optional[int] = None, verify: Optional[bool] = None,
            path: Optional[str] = None, scratch: Optional[bool] = None,
            seed: Optional[int] = None, priority: Optional[str] = None, detach: bool = False,
            timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
            **fields: Any) -> Job:
        """Copies bytes from ``src`` into ``buffer`` (``NAME``, ``NAME@GPU``, with an
        optional range ``NAME[START:STOP]``, bytes START up to STOP as a Python slice).

        ``src``: a path (opened here and passed), a descriptor (read from its
        current offset), a file object (its descriptor), a bytes-like object
        (through a memfd), or None with ``scratch=True``. ``offset``/``length``
        place the bytes in the buffer; ``verify`` checksums both sides;
        ``path``: ``auto``, ``staged`` or ``registered``. Result: ``bytes``,
        ``seconds``, ``gbps``, ``path`` (and ``verified``, ``checksum``).
        """
        req = dict(fields, buffer=buffer, offset=offset, length=length, verify=verify,
                   path=path, scratch=scratch, seed=seed)
        return self._drive(self._transfer_plan("put", src, req, dict(
            priority=priority, detach=detach, timeout=timeout, on_progress=on_progress)))

    def get(self, buffer: str, dst: Any, *, offset: Optional[int] = None,
            length: Optional[int] = None, verify: Optional[bool] = None,
            path: Optional[str] = None, scratch: Optional[bool] = None,
            priority: Optional[str] = None, detach: bool = False,
            timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
            **fields: Any) -> Job:
        """Copies ``buffer`` (or a range of it) into ``dst``.

        ``dst``: a path (created or truncated), a descriptor (written from its
        current offset), a file object, a writable bytes-like object (filled
        from its start), or None with ``scratch=True``. Otherwise as :meth:`put`.
        """
        req = dict(fields, buffer=buffer, offset=offset, length=length, verify=verify,
                   path=path, scratch=scratch)
        return self._drive(self._transfer_plan("get", dst, req, dict(
            priority=priority, detach=detach, timeout=timeout, on_progress=on_progress)))

    def copy(self, src: str, dst: str, *, engine: Optional[str] = None,
             path: Optional[str] = None, verify: Optional[bool] = None,
             chunk_bytes: Optional[int] = None, peer_timeout_ms: Optional[int] = None,
             priority: Optional[str] = None, detach: bool = False,
             timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
             **fields: Any) -> Job:
        """Copies one buffer range to another, on one GPU or between two.

        ``engine``: ``ce`` or ``sm`` within a GPU; ``path``: ``auto``, ``peer`` or
        ``host-staged`` between GPUs. Result: ``src``, ``dst``, ``bytes``,
        ``seconds``, ``gbps``, ``path``, ``engine``, ``verified``.
        """
        return self._job_kw("copy", src=src, dst=dst, engine=engine, path=path, verify=verify,
                            chunk_bytes=chunk_bytes, peer_timeout_ms=peer_timeout_ms,
                            priority=priority, detach=detach, timeout=timeout,
                            on_progress=on_progress, **fields)

    def fill(self, buffer: str, pattern: str, *, value: Optional[float] = None,
             seed: Optional[int] = None, priority: Optional[str] = None, detach: bool = False,
             timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
             **fields: Any) -> Job:
        """Fills a buffer on its device: ``"zero"``, ``"value"`` (with ``value``),
        ``"iota"`` or ``"random"`` (with ``seed``). Result: ``bytes``."""
        return self._job_kw("fill", buffer=buffer, pattern=pattern, value=value, seed=seed,
                            priority=priority, detach=detach, timeout=timeout,
                            on_progress=on_progress, **fields)

    def checksum(self, buffer: str, *, priority: Optional[str] = None, detach: bool = False,
                 timeout: Optional[float] = None,
                 on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """The buffer's 64-bit hash, computed on its device: result ``checksum``, ``bytes``."""
        return self._job_kw("checksum", buffer=buffer, priority=priority, detach=detach,
                            timeout=timeout, on_progress=on_progress, **fields)

    def run(self, buffer: str, ops: Optional[Ops] = None, *, mode: Optional[str] = None,
            repeat: Optional[int] = None, out: Optional[str] = None,
            priority: Optional[str] = None, detach: bool = False,
            timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
            **fields: Any) -> Job:
        """Applies a chain of elementwise ops to every element of a float buffer.

        ``ops``: ``"sin | add 1 | sqrt"`` or a list (see :func:`parse_ops`);
        ``mode``: ``fused`` (default), ``graph`` or ``eager``; ``repeat`` the
        whole chain; ``out``: another buffer of the same shape (default in place).
        Without ``ops``, ``buffer`` may be an expression (``run("y = a*x + 1")``),
        as :meth:`expr` takes it.
        """
        if ops is None:
            if "=" not in buffer:
                raise ValueError(f"run('{buffer}') needs ops ('sin | add 1'), or give an "
                                 "expression such as 'y = 2*x + 1' (see expr)")
            return self._job_kw("run", expr=buffer, mode=mode, repeat=repeat,
                                priority=priority, detach=detach, timeout=timeout,
                                on_progress=on_progress, **fields)
        return self._job_kw("run", buffer=buffer, ops=parse_ops(ops), mode=mode, repeat=repeat,
                            out=out, priority=priority, detach=detach, timeout=timeout,
                            on_progress=on_progress, **fields)

    # numpy ---------------------------------------------------------------------

    def put_array(self, buffer: Any, array: Any, *, dtype: Any = None,
                  priority: Optional[str] = None, timeout: Optional[float] = None,
                  on_progress: Optional[ProgressHandler] = None) -> Job:
        """Stores an array in ``buffer`` (``NAME`` or ``NAME@GPU``) and waits.

        ``array``: a numpy array (any layout), a torch tensor on the CPU, or
        (on a GPU) a torch CUDA tensor or CuPy array, copied device to device
        through an attachment. A buffer that does not exist is allocated
        with the array's dtype and shape (on the ``@GPU`` named, default 0;
        shareable for a device array); one that exists must hold exactly
        that dtype and count, or :class:`~gpuq.BadRequest` says what it holds
        and nothing is sent. ``dtype``: store as this dtype instead
        (``"bf16"`` for a ``uint16`` array of bfloat16 bits, ``"bytes"`` for
        any array's raw bytes). gpuqd keeps the array's shape for
        :meth:`get_array` in any process.

        Large ordinary arrays go through this client's pinned staging ring
        (gpuq/staging.py), at close to pinned speed; the returned :class:`Job`
        is then the last chunk's, its ``result`` the whole transfer's.
        ``timeout`` (seconds) bounds the wait for the transfer: past it
        :class:`~gpuq.Timeout`; a transfer through the ring is then cancelled
        (its job cannot go on without this client), any other goes on.
        The older order ``put_array(array, name)`` still works, with a
        DeprecationWarning.
        """
        buffer, array = arrays.name_first(buffer, array, "put_array")
        return self._drive(arrays.put_array_plan(self, buffer, array, dtype, dict(
            priority=priority, timeout=timeout, on_progress=on_progress)))

    def get_array(self, buffer: str, out: Any = None, *, dtype: Any = None,
                  shape: Optional[Sequence[int]] = None, priority: Optional[str] = None,
                  timeout: Optional[float] = None,
                  on_progress: Optional[ProgressHandler] = None) -> Any:
        """Reads a whole buffer into a numpy array, bit for bit, and returns it.

        The dtype is the buffer's (``bytes`` reads as ``uint8``, ``bf16`` as
        ml_dtypes' ``bfloat16`` when installed, else ``uint16``), or
        ``dtype`` (any spelling, or a numpy dtype gpuq lacks) to read its
        bytes as another; bytes are stored in the machine's order, so a
        dtype of the other order (``">u4"``) gets them byteswapped into it.
        The shape is ``shape`` (one dimension may be -1, as in numpy's
        ``reshape``), else the one gpuqd keeps for the buffer (read as
        another dtype, its last axis in that dtype's elements, as numpy's
        ``view`` has it), else 1-D. ``out``: fill this array instead and
        return it: a writable C-contiguous numpy array (or torch CPU tensor)
        of that dtype (in either byte order) and size, or on a GPU a torch
        CUDA tensor or CuPy array of its size (a device-to-device copy from a
        shareable buffer).
        Large reads go through the pinned staging ring (see :meth:`put_array`,
        also for ``timeout``).
        """
        return self._drive(arrays.get_array_plan(self, buffer, out, dtype, shape, dict(
            priority=priority, timeout=timeout, on_progress=on_progress)))

    # Zero-copy sharing (gpuq/share.py) ----------------------------------------

    def region_create(self, name: str, nbytes: int, *, device: int = 0,
                      ephemeral: bool = False, timeout: Optional[float] = None) -> "share.Region":
        """Makes a host region of ``nbytes`` (a multiple of 4096) that gpuqd pins once.

        A sealed memfd is made here, handed to gpuqd (which maps it, places
        it on ``device``'s NUMA node and pins it) and mapped here: the
        returned :class:`~gpuq.share.Region` reads and writes the same
        memory. ``put(None, buf, region=r.ref(0, n))`` and ``get(buf, None,
        region=...)`` then move bytes by DMA alone. ``ephemeral``: gpuqd
        frees it when this connection closes.
        """
        return self._drive(self._region_create_plan(name, nbytes, device, ephemeral, timeout))

    def _region_create_plan(self, name: str, nbytes: int, device: int, ephemeral: bool,
                            timeout: Optional[float], free_if_abandoned: bool = False) -> Plan:
        """``free_if_abandoned``: a region made after the caller stopped waiting (Ctrl-C
        while it was pinned) is freed, not left to the connection (the staging ring's)."""
        fd = memfd.create(nbytes, name)
        try:
            call = _job_call("region_create", dict(name=name, bytes=nbytes, device=device,
                                                   ephemeral=ephemeral),
                             (fd,), None, False, timeout, None)
            if free_if_abandoned:
                call = replace(call, on_abandoned=self._region_abandoned)
            yield call
            region = share.Region(name, fd, nbytes)
            region._client = self
            call.claimed = True  # its caller stores it as it is returned
        except BaseException:
            os.close(fd)
            raise
        return region

    def region_open(self, name: str, **fields: Any) -> "share.Region":
        """Maps an existing region of the caller's (gpuqd sends its memfd)."""
        return self._drive(self._region_open_plan(name, fields))

    def _region_open_plan(self, name: str, fields: Dict[str, Any]) -> Plan:
        reply = yield from self._request_plan("region_open", dict(fields, name=name))
        fds = reply.get("_fds") or []
        try:
            return share.Region(name, fds[0], int(reply["bytes"]))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise

    def region_free(self, name: str, *, timeout: Optional[float] = None, **fields: Any) -> Job:
        """Lets gpuqd unpin a region, after the jobs that use it."""
        return self._job_kw("region_free", name=name, timeout=timeout, **fields)

    def regions(self, **fields: Any) -> Dict[str, Any]:
        """The caller's regions (every user's for root), ``pinned_bytes`` and ``memlock_limit``."""
        return self._request_kw("regions", **fields)

    def attach(self, buffer: str, *, mode: str = "read-write",
               timeout: Optional[float] = None, **fields: Any) -> "share.Attachment":
        """Maps a shareable buffer here and holds a lease on it (``mode``: ``read-write`` or ``read``).

        Waits until the jobs before it on the buffer are done. On a GPU the
        :class:`~gpuq.share.Attachment` is a device pointer in this process's
        CUDA context, with ``__cuda_array_interface__`` (``cupy.asarray(a)``);
        on the host backend ``a.array()`` is a numpy array over it. gpuqd's
        jobs on the buffer wait until :meth:`release`. ``timeout`` (seconds)
        bounds the wait: when it runs out the attach is given up, no lease is
        granted, and :class:`~gpuq.Timeout` is raised.
        """
        return self._drive(self._attach_plan(buffer, mode, timeout, fields))

    def _attach_plan(self, buffer: str, mode: str, timeout: Optional[float],
                     fields: Dict[str, Any]) -> Plan:
        req = dict(fields, buffer=buffer, mode=mode, wait=True, timeout_ms=timeout_ms(timeout))
        call = Call("attach", req, (), waits=True, wait_s=timeout,
                    on_abandoned=self._lease_abandoned)
        reply = yield call
        fds = reply.get("_fds") or []
        try:
            att = share.Attachment(reply["job"]["result"], fds[0])
            att.record = dict(reply["job"])
            att._client = self
            close_all(fds)  # before the claim: nothing is left to call after it
            self._held[att.lease] = att
            call.claimed = True  # in hand: no call between these two lines
            return att
        except BaseException:
            call.claimed = True  # released here
            yield Call("release", {"lease": reply["job"]["result"]["lease"]})
            raise
        finally:
            if fds:  # no call once claimed and closed
                close_all(fds)

    def release(self, attachment: Union["share.Attachment", int]) -> Dict[str, Any]:
        """Unmaps an attachment here, then ends its lease (gpuqd's jobs on it go on).

        ``attachment`` may be a lease id too (``leases()``'s ``lease``): this
        client's attachment of that lease is unmapped first, and any other
        lease of yours just ends (one whose attachment was dropped, say).
        """
        if not isinstance(attachment, share.Attachment):
            try:
                if isinstance(attachment, bool):
                    raise TypeError
                lease = operator.index(attachment)
            except TypeError:
                raise TypeError(f"release takes an Attachment or a lease id (an int), not "
                                f"{attachment!r}") from None
            held = self._held.get(lease)
            if held is None:
                return self._drive(self._release_plan(None, lease))
            attachment = held
        return self._drive(self._release_plan(attachment, attachment.lease))

    def _release_plan(self, attachment: Optional["share.Attachment"], lease: int) -> Plan:
        """Unmaps ``attachment`` (None: none here), then ends ``lease``. Broken off
        (Ctrl-C) before its release surely went out, it sends it again apart
        (:meth:`_release_apart`), so that no lease is left held by nobody (a
        release of a lease already ended is refused, and changes nothing)."""
        call = Call("release", {"lease": lease})
        try:
            self._held.pop(lease, None)
            if attachment is not None:
                attachment.unmap("released by client.release() (as the end of its `with` "
                                 "block does)")
            reply = yield call
        except (GpuqError, ConnectionError):
            raise  # gpuqd answered, or is gone with what it held
        except BaseException:  # GeneratorExit too: its driver was interrupted
            if call.reply is None:  # set as the reply comes (a sync client's)
                self._release_apart(lease)
            raise
        return _body(reply)

    def leases(self, **fields: Any) -> List[Dict[str, Any]]:
        """Leases on the caller's buffers and its own (every lease for root and the admin group)."""
        return self._drive(self._key_plan("leases", "leases", fields))

    def lease_break(self, lease: int, **fields: Any) -> Dict[str, Any]:
        """Ends a lease (root and the admin group); its holder gets a ``lease_broken`` event."""
        return self._request_kw("lease_break", lease=lease, **fields)
