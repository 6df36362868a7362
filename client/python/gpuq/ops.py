"""Expressions, reductions, collectives and benchmarks as methods.

These are the protocol's ops that compute rather than store: ``run``'s
expression form (:meth:`ComputeOps.expr`), ``reduce_expr`` (:meth:`ComputeOps.reduce`,
which returns the number itself), the NCCL collectives and ``group``, and
the benchmarks, which return their result tables as data (the job's
``result`` map) rather than a :class:`~gpuq.Job` to dig into.

Like every method of the client they are written once, as plans (see
api.py), so :class:`gpuq.Client` and :class:`gpuq.AsyncClient` share them.
The collective ``reduce`` is :meth:`ComputeOps.reduce_collective`: the name
``reduce`` goes to the reduction of an expression, which is what a Python
user reaches for (``c.reduce("sum(x)")``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .job import Job

if TYPE_CHECKING:  # pragma: no cover
    from .api import Plan

__all__ = ["ComputeOps", "OP_METHODS"]

ProgressHandler = Callable[[Dict[str, Any]], None]

#: Every op of docs/protocol.md and the method that sends it, where the two
#: names differ or the op has several methods (a test checks every op has one).
OP_METHODS: Dict[str, str] = {
    "run": "expr", "reduce_expr": "reduce", "reduce": "reduce_collective",
    "region_create": "region_create", "quota": "quota",
}


class ComputeOps:
    """The computing ops, mixed into :class:`gpuq.api.Api` (see the module doc)."""

    # Provided by Api.
    _drive: Callable[..., Any]
    _job_plan: Callable[..., "Plan"]
    _request_plan: Callable[..., "Plan"]

    def _result_plan(self, op: str, fields: Mapping[str, Any],
                     job: Dict[str, Any]) -> "Plan":
        """Runs a job and returns its result map (the benchmarks' tables)."""
        done = yield from self._job_plan(op, fields, **job)
        return done.result

    def _compute(self, op: str, fields: Dict[str, Any], job: Dict[str, Any],
                 result_only: bool = False) -> Any:
        if result_only:
            if job.get("detach"):
                raise ValueError(f"{op} returns its result; it cannot be detached "
                                 "(use client.job(...) for a Job)")
            job = {k: v for k, v in job.items() if k != "detach"}
            return self._drive(self._result_plan(op, fields, job))
        return self._drive(self._job_plan(op, fields, **job))

    # Expressions ---------------------------------------------------------------

    def expr(self, expr: str, *, device: Optional[int] = None, repeat: Optional[int] = None,
             kernel: Optional[str] = None, math: Optional[str] = None,
             priority: Optional[str] = None, detach: bool = False,
             timeout: Optional[float] = None, on_progress: Optional[ProgressHandler] = None,
             **fields: Any) -> Job:
        """Evaluates elementwise statements over buffers on their device, in one kernel.

        ``expr``: ``"y = a * x + y"``, several statements separated by ``;``
        (docs/protocol.md, ``run``: the grammar). Buffers are named as
        everywhere (``x``, ``x@1``); ``device`` says where names without
        ``@GPU`` are. ``kernel``: ``auto``, ``compiled`` or ``interpreted``;
        ``math``: ``ieee`` or ``fast``. Returns the finished :class:`Job`
        (its ``result`` says how the kernel ran).
        """
        return self._compute("run", dict(fields, expr=expr, device=device, repeat=repeat,
                                         kernel=kernel, math=math),
                             dict(priority=priority, detach=detach, timeout=timeout,
                                  on_progress=on_progress))

    def reduce(self, expr: str, *, count: Optional[int] = None,
               device: Optional[int] = None, kernel: Optional[str] = None,
               math: Optional[str] = None, priority: Optional[str] = None,
               timeout: Optional[float] = None, **fields: Any) -> Union[float, int]:
        """Reduces an expression over buffers to one number, computed on their device.

        ``"sum(abs(x - y))"``, ``"dot(a, b)"``, ``"norm2(x)"``, ``"mean(x)"``,
        ``"min(x)"``, ``"max(x)"``, ``"count_nonzero(relu(x))"`` (the
        positive elements: the expressions have no comparisons),
        ``"argmax(x)"``: sums and means are floats (added in double in a
        fixed order: the same bits every run), counts and indices ints.
        The expression is ``run``'s right-hand side (docs/protocol.md,
        ``reduce_expr``: the grammar).
        ``count``: the first N elements only. For the job record, use
        ``client.job("reduce_expr", expr=...)``. The NCCL collective is
        :meth:`reduce_collective`.
        """
        return self._drive(self._reduce_plan(dict(fields, expr=expr, count=count,
                                                  device=device, kernel=kernel, math=math),
                                             priority, timeout))

    def _reduce_plan(self, fields: Dict[str, Any], priority: Optional[str],
                     timeout: Optional[float]) -> "Plan":
        done = yield from self._job_plan("reduce_expr", fields, priority=priority,
                                         timeout=timeout)
        value = (done.result or {}).get("value")
        if (done.result or {}).get("value_dtype") == "i64" and value is not None:
            return int(value)
        return float("nan") if value is None else float(value)

    # Collectives ----------------------------------------------------------------

    def _collective(self, op: str, fields: Dict[str, Any], devices: Optional[Sequence[int]],
                    collective_timeout_ms: Optional[int], job: Dict[str, Any]) -> Job:
        fields = dict(fields, devices=None if devices is None else list(devices),
                      collective_timeout_ms=collective_timeout_ms)
        return self._compute(op, fields, job)

    def allreduce(self, buffer: str, *, devices: Optional[Sequence[int]] = None,
                  reduce: Optional[str] = None, out: Optional[str] = None,
                  count: Optional[int] = None, collective_timeout_ms: Optional[int] = None,
                  priority: Optional[str] = None, detach: bool = False,
                  timeout: Optional[float] = None,
                  on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Reduces the buffers called ``buffer`` on ``devices`` (default: every device
        holding it) and leaves the result in each (or in ``out``).

        ``reduce``: ``sum`` (default), ``prod``, ``min``, ``max`` or ``avg``.
        Every collective takes ``devices`` (the ranks, in order),
        ``collective_timeout_ms``, ``count`` (NCCL's) and the job options of
        :meth:`noop`; its result has ``algbw_gbps`` and ``busbw_gbps``.
        """
        return self._collective("allreduce", dict(fields, buffer=buffer, reduce=reduce,
                                                  out=out, count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def reduce_scatter(self, buffer: str, out: Optional[str] = None, *,
                       devices: Optional[Sequence[int]] = None, reduce: Optional[str] = None,
                       count: Optional[int] = None,
                       collective_timeout_ms: Optional[int] = None,
                       priority: Optional[str] = None, detach: bool = False,
                       timeout: Optional[float] = None,
                       on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Reduces ``buffer`` (n x count elements per rank) and leaves block r of the
        result in rank r's ``out`` (in place: block r of ``buffer``)."""
        return self._collective("reduce_scatter", dict(fields, buffer=buffer, out=out,
                                                       reduce=reduce, count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def all_gather(self, buffer: str, out: Optional[str] = None, *,
                   devices: Optional[Sequence[int]] = None, count: Optional[int] = None,
                   collective_timeout_ms: Optional[int] = None,
                   priority: Optional[str] = None, detach: bool = False,
                   timeout: Optional[float] = None,
                   on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Gathers every rank's ``buffer`` into each rank's ``out`` (n x count,
        block k from rank k)."""
        return self._collective("all_gather", dict(fields, buffer=buffer, out=out,
                                                   count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def broadcast(self, buffer: str, out: Optional[str] = None, *, root: int = 0,
                  devices: Optional[Sequence[int]] = None, count: Optional[int] = None,
                  collective_timeout_ms: Optional[int] = None,
                  priority: Optional[str] = None, detach: bool = False,
                  timeout: Optional[float] = None,
                  on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Copies the root rank's ``buffer`` into every rank's ``out`` (default in place).
        ``root`` is a rank: an index into ``devices``, as NCCL's."""
        return self._collective("broadcast", dict(fields, buffer=buffer, out=out, root=root,
                                                  count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def reduce_collective(self, buffer: str, out: Optional[str] = None, *, root: int = 0,
                          devices: Optional[Sequence[int]] = None,
                          reduce: Optional[str] = None, count: Optional[int] = None,
                          collective_timeout_ms: Optional[int] = None,
                          priority: Optional[str] = None, detach: bool = False,
                          timeout: Optional[float] = None,
                          on_progress: Optional[ProgressHandler] = None,
                          **fields: Any) -> Job:
        """The protocol's ``reduce`` (NCCL's): reduces every rank's ``buffer`` into the
        root rank's ``out``. (:meth:`reduce` reduces an expression to a number.)"""
        return self._collective("reduce", dict(fields, buffer=buffer, out=out, root=root,
                                               reduce=reduce, count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def sendrecv(self, src: str, dst: str, *, devices: Optional[Sequence[int]] = None,
                 count: Optional[int] = None, collective_timeout_ms: Optional[int] = None,
                 priority: Optional[str] = None, detach: bool = False,
                 timeout: Optional[float] = None,
                 on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Sends ``src`` (``NAME@GPU``, optionally with a range) to ``dst`` over NCCL."""
        return self._collective("sendrecv", dict(fields, src=src, dst=dst, count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def all_to_all(self, buffer: str, out: str, *, devices: Optional[Sequence[int]] = None,
                   count: Optional[int] = None, collective_timeout_ms: Optional[int] = None,
                   priority: Optional[str] = None, detach: bool = False,
                   timeout: Optional[float] = None,
                   on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Block j of each rank's ``buffer`` goes to rank j's ``out`` (never in place)."""
        return self._collective("all_to_all", dict(fields, buffer=buffer, out=out,
                                                   count=count),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    def group(self, ops: Sequence[Mapping[str, Any]], *, devices: Sequence[int],
              collective_timeout_ms: Optional[int] = None, priority: Optional[str] = None,
              detach: bool = False, timeout: Optional[float] = None,
              on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Job:
        """Runs several primitives as one NCCL group, one job: ``ops`` is a list of maps,
        each ``{"op": "sendrecv", "src": ..., "dst": ...}`` (any of the seven
        primitives with its fields); ``devices`` is required."""
        return self._collective("group", dict(fields, ops=[dict(o) for o in ops]),
                                devices, collective_timeout_ms,
                                dict(priority=priority, detach=detach, timeout=timeout,
                                     on_progress=on_progress))

    # Benchmarks: their result tables as data ------------------------------------

    def bench_copy(self, *, device: Optional[int] = None,
                   sizes: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
                   timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """Host<->device copy paths: the result map, whose ``rows`` are maps of
        ``group``, ``bytes``, ``method``, ``role``, ``path``, ``gbps``."""
        return self._compute("bench_copy", dict(fields, device=device, sizes=sizes,
                                                repeats=repeats),
                             dict(timeout=timeout), result_only=True)

    def bench_d2d(self, *, device: Optional[int] = None,
                  sizes: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
                  peers: Optional[bool] = None, timeout: Optional[float] = None,
                  **fields: Any) -> Dict[str, Any]:
        """Device-to-device and peer paths: the result map (``rows`` as :meth:`bench_copy`'s)."""
        return self._compute("bench_d2d", dict(fields, device=device, sizes=sizes,
                                               repeats=repeats, peers=peers),
                             dict(timeout=timeout), result_only=True)

    def bench_alloc(self, *, device: Optional[int] = None,
                    sizes: Optional[Sequence[int]] = None, repeats: Optional[int] = None,
                    timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """Alloc and free latency, from the pool and from exportable slabs in one run:
        the result map, whose ``rows`` give each size and memory's percentiles."""
        return self._compute("bench_alloc", dict(fields, device=device, sizes=sizes,
                                                 repeats=repeats),
                             dict(timeout=timeout), result_only=True)

    def bench_chain(self, *, device: Optional[int] = None, bytes: Optional[int] = None,
                    repeat: Optional[int] = None, reps: Optional[int] = None,
                    timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """The kernel-chain benchmark: the result map (``launch``, ``bandwidth``,
        ``expressions``, ``compile``)."""
        return self._compute("bench_chain", dict(fields, device=device, bytes=bytes,
                                                 repeat=repeat, reps=reps),
                             dict(timeout=timeout), result_only=True)

    def bench_allreduce(self, buffer: str, *, devices: Optional[Sequence[int]] = None,
                        out: Optional[str] = None, warmup: Optional[int] = None,
                        iters: Optional[int] = None, repeats: Optional[int] = None,
                        timeout: Optional[float] = None, **fields: Any) -> Dict[str, Any]:
        """The raw all-reduce loop: the result map (``us``, ``rank_us``, ``busbw_gbps``...)."""
        return self._compute("bench_allreduce", dict(fields, buffer=buffer, devices=devices,
                                                     out=out, warmup=warmup, iters=iters,
                                                     repeats=repeats),
                             dict(timeout=timeout), result_only=True)

    def bench_collective(self, ops: Sequence[Mapping[str, Any]], *, devices: Sequence[int],
                         warmup: Optional[int] = None, iters: Optional[int] = None,
                         repeats: Optional[int] = None, timeout: Optional[float] = None,
                         **fields: Any) -> Dict[str, Any]:
        """The raw loop of any collectives (``ops`` as :meth:`group`'s): the result map."""
        return self._compute("bench_collective", dict(fields, ops=[dict(o) for o in ops],
                                                      devices=list(devices), warmup=warmup,
                                                      iters=iters, repeats=repeats),
                             dict(timeout=timeout), result_only=True)

    def bench_sched(self, *, device: Optional[int] = None, bytes: Optional[int] = None,
                    reps: Optional[int] = None, timeout: Optional[float] = None,
                    **fields: Any) -> Dict[str, Any]:
        """The engines' ceiling alone and together: the result map (``h2d``, ``d2h``,
        ``kernel``, ``together_s``, ...)."""
        return self._compute("bench_sched", dict(fields, device=device, bytes=bytes,
                                                 reps=reps),
                             dict(timeout=timeout), result_only=True)

    # Quotas ------------------------------------------------------------------

    def my_quota(self, **fields: Any) -> Dict[str, Any]:
        """What this user may use and uses now: a map of ``limits`` and ``used``
        (docs/protocol.md, ``quota``; ``None`` in limits is unlimited)."""
        return self._drive(self._my_quota_plan(fields))

    def _my_quota_plan(self, fields: Mapping[str, Any]) -> "Plan":
        reply = yield from self._request_plan("quota", fields)
        users: List[Dict[str, Any]] = reply.get("users") or []
        return users[0] if users else {}
