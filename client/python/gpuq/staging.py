"""Ordinary memory at pinned speed: a client's staging ring, filled while the daemon moves.

gpuqd runs without capabilities, so it cannot read a client's memory: the
bytes of an ordinary numpy array must reach memory the daemon maps. Making
a fresh memfd per call (the plain path) costs a full copy into pages that
are new every time, and the daemon then copies them again through its own
staging; on the H200 that ran at 0.05 of pinned ``cudaMemcpy``.

Instead each client keeps a ring of host regions (docs/protocol.md, "Host
regions"): memfds that gpuqd pinned once, mapped here too, reused by every
call; each slot holds one chunk of a transfer. A put hands chunk i to a
copy thread as one task (numpy's copy releases the GIL), several chunks at
once into different slots, and submits a ``put`` of chunk i's slot into the
buffer at the chunk's offset as soon as its copy is done, in order; a slot
is refilled only after its job is done. Copies never wait for each other:
an earlier design split each slot among all the threads and waited for
every part before the next slot, so every slot cost a barrier at the
slowest part and a dozen short tasks' hand-offs under the GIL. A get
mirrors the put: the daemon fills every slot not being copied out, and
finished slots are copied out by whole-slot tasks in parallel. Jobs on one
buffer keep their order in gpuqd where their ranges meet; chunks' ranges
are disjoint, so only the slots need the waits above.

The ring is made on first use, sized to fit what gpuqd may still pin
(its ``RLIMIT_MEMLOCK``, the ``host_pinned`` quota); when no ring can be
made the transfer takes the plain path, and :attr:`Staging.unavailable`
says why (a warning says it once).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Deque, Dict, Generator, List, Optional, Tuple

from .dispatch import Call
from .errors import GpuqError

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api
    from .job import Job
    from .share import Region

__all__ = ["Staging", "DEFAULT_SLOTS", "DEFAULT_SLOT_BYTES", "MIN_STAGED_BYTES"]

Plan = Generator[Call, Any, Any]

#: Slots in the ring: up to one per copy thread being filled (or emptied),
#: the others the daemon's, so that its DMA never waits for the copies.
DEFAULT_SLOTS = 16
#: Bytes per slot, which is one copy task: long enough (about 1 ms of one
#: thread's copying) that handing a task to a thread is a few percent of it,
#: short enough that a transfer has many chunks to copy at once and the
#: first chunk's copy, which nothing overlaps, stays short. 16 x 8 MiB pins
#: the same 128 MiB as the 4 x 32 MiB ring before it.
DEFAULT_SLOT_BYTES = 8 << 20
#: Arrays smaller than this take the plain path: a few round trips would
#: cost more than the one copy they save.
MIN_STAGED_BYTES = 4 << 20
#: The smallest slot worth making when memory is short.
_MIN_SLOT_BYTES = 1 << 20
_PAGE = 4096
_names = itertools.count(1)


def copy_threads() -> int:
    """Threads that copy between an array and the slots, each a whole slot at a
    time: the CPUs this process may use, up to 12 (on a 16-core H200 host 8-12
    threads copying pageable memory into pinned came closest to its memory
    bandwidth; more only contend for it)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cpus = os.cpu_count() or 1
    return max(1, min(12, cpus))


class Staging:
    """One client's ring of pinned slots (see the module doc); made on first use.

    ``slots`` and ``slot_bytes`` size it (0 slots: never staged); ``threads``
    copy, each a whole slot at a time, up to one copy per thread at once.
    Only one transfer at a time uses it: another thread's transfer
    meanwhile takes the plain path rather than wait.
    """

    def __init__(self, slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES,
                 threads: Optional[int] = None) -> None:
        if slots < 0 or slots == 1 or slot_bytes < _PAGE or slot_bytes % _PAGE:
            raise ValueError("staging needs slots 0 (none) or 2 or more (one filled while "
                             f"others move) and slot_bytes a positive multiple of {_PAGE}")
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.threads = threads or copy_threads()
        self.regions: List["Region"] = []
        self.unavailable: Optional[str] = None if slots else "staging is off (slots=0)"
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None
        #: Where the last transfer's time went, as this thread saw it: ``copy_wait_s``
        #: waiting for the copy threads, ``submit_s`` for gpuqd to take chunks,
        #: ``daemon_wait_s`` for chunks' jobs to end, ``first_copy_s`` the copy that
        #: nothing overlaps (a put's first chunk, a get's last).
        self.timing: Dict[str, float] = {}
        self._warned = False

    def __repr__(self) -> str:
        state = (f"{len(self.regions)} x {self.slot_bytes >> 20} MiB" if self.regions
                 else (self.unavailable or "not made yet"))
        return f"<gpuq.Staging {state}, {self.threads} copy threads>"

    # Making the ring ------------------------------------------------------------

    def _ready_plan(self, api: "Api", device: int) -> Plan:
        """Makes the ring if it is not there: True when it can be used."""
        if self.regions:
            return True
        if self.unavailable is not None:
            return False
        try:
            count, size = yield from self._size_plan(api)
            tag = f"gpuq-stage-{os.getpid()}-{next(_names)}"
            for k in range(count):
                region = yield from api._region_create_plan(f"{tag}-{k}", size, device, True,
                                                            None)
                self.regions.append(region)
            self.slot_bytes = size
            return True
        except (_NoRoom, GpuqError, OSError) as exc:
            made = [r.name for r in self.regions]
            self._give_up(api, f"no pinned staging ring ({exc}); ordinary arrays go "
                               "through a memfd copy at a fraction of pinned speed")
            for name in made:  # a part of a ring is no use: let gpuqd unpin it now
                try:
                    yield from api._job_plan("region_free", {"name": name}, detach=True)
                except GpuqError:
                    pass
            return False

    def _size_plan(self, api: "Api") -> Plan:
        """(slots, slot bytes) that fit gpuqd's RLIMIT_MEMLOCK and the caller's quota.

        Slots shrink to what fits, down to :data:`_MIN_SLOT_BYTES`; below that the
        ring has fewer slots (at least two) rather than none. Raises
        :class:`_NoRoom` when not even two such slots fit.
        """
        reply = yield Call("regions", {})
        room: Optional[int] = None
        limit = reply.get("memlock_limit")
        if isinstance(limit, int):
            room = limit - int(reply.get("pinned_bytes") or 0)
        quota = yield Call("quota", {})
        users = quota.get("users") or [{}]
        pinned = (users[0].get("limits") or {}).get("host_pinned")
        if isinstance(pinned, int):
            used = (users[0].get("used") or {}).get("host_pinned") or 0
            left = pinned - int(used)
            room = left if room is None else min(room, left)
        if room is None:
            return self.slots, self.slot_bytes
        # Leave a quarter of what is left to others (and to the user's own regions).
        budget = room * 3 // 4
        count = min(self.slots, budget // max(_MIN_SLOT_BYTES, self.slot_bytes))
        if count < self.slots:  # short of memory: smaller slots first, then fewer
            count = min(self.slots, budget // _MIN_SLOT_BYTES)
        if count < 2:
            raise _NoRoom(f"gpuqd may pin only {max(room, 0)} more bytes, and the ring "
                          f"needs two slots of at least {_MIN_SLOT_BYTES} bytes")
        return count, min(self.slot_bytes, budget // count // _PAGE * _PAGE)

    def _give_up(self, api: "Api", why: str) -> None:
        for region in self.regions:
            region.unmap()
        self.regions = []
        self.unavailable = why
        if not self._warned:
            self._warned = True
            warnings.warn(f"gpuq: {why}", RuntimeWarning, stacklevel=6)

    def close(self) -> None:
        """Unmaps the ring here (gpuqd frees its ephemeral regions with the connection)."""
        for region in self.regions:
            region.unmap()
        self.regions = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # Copies ----------------------------------------------------------------

    def _window(self) -> int:
        """Copies in flight at once: one per copy thread, and never every slot, so
        that gpuqd always has a slot to move while the others are copied."""
        return max(1, min(self.threads, len(self.regions) - 1))

    def _start_copy(self, dst: Any, src: Any) -> "Future[Any]":
        """Starts dst[:] = src (uint8 arrays of one length, a whole chunk) on a copy
        thread and returns at once. One task per slot: a task costs tens of
        microseconds of hand-offs under the GIL, so a few long ones beat many
        short ones, and no copy waits for another."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gpuq-copy")
        return self._pool.submit(_copy, dst, src)

    def _slot(self, k: int, n: int) -> Any:
        """The first n bytes of slot k, as a uint8 array over the region (no copy)."""
        return self.regions[k].array("u1", n)

    # Pipelines -----------------------------------------------------------------

    def _clock(self) -> Any:
        """A fresh :attr:`timing` and its stopwatch: ``clock()`` is now; ``clock(key,
        since)`` adds the time since ``since`` to ``timing[key]``."""
        timing = self.timing = dict.fromkeys(
            ("copy_wait_s", "submit_s", "daemon_wait_s", "first_copy_s"), 0.0)
        now = time.perf_counter

        def clock(key: Optional[str] = None, since: float = 0.0) -> float:
            t = now()
            if key is not None:
                timing[key] += t - since
            return t
        return clock

    def try_acquire(self) -> bool:
        """Takes the ring for one transfer; False while another transfer has it."""
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    def _chunks(self, nbytes: int) -> List[Tuple[int, int]]:
        """(offset, length) of each chunk of a transfer: one slot each."""
        size = self.slot_bytes
        return [(off, min(size, nbytes - off)) for off in range(0, nbytes, size)]

    def put_plan(self, api: "Api", label: str, data: Any, fields: Dict[str, Any],
                 job: Dict[str, Any]) -> Plan:
        """Puts ``data`` (a flat uint8 array) into buffer ``label`` from byte 0, chunk by
        chunk through the ring; ``fields`` go with the first chunk (``shape``).
        Returns the last chunk's :class:`Job`. The ring must be ready and held.

        Up to :meth:`_window` chunks are copied at once, each into its own slot
        by one task. This thread submits chunk i's ``put`` as soon as its copy
        is done (in order), then starts the copy of the chunk the window now
        has room for, once the job that last used that chunk's slot is done.
        """
        nslots = len(self.regions)
        chunks = self._chunks(len(data))
        pending: List[Optional["Job"]] = [None] * nslots  # each slot's job in gpuqd
        copying: Deque[Tuple[int, "Future[Any]"]] = deque()  # (chunk, copy), in order
        last = None
        clock = self._clock()

        def copy(j: int) -> Plan:
            """Starts chunk j's copy once gpuqd is done with its slot."""
            k = j % nslots
            before = pending[k]
            if before is not None:
                t = clock()
                yield from before._wait_plan(job.get("timeout"), None)
                clock("daemon_wait_s", t)
                pending[k] = None  # only now: a wait that fails leaves it to _drain
            off, n = chunks[j]
            copying.append((j, self._start_copy(self._slot(k, n), data[off:off + n])))

        try:
            t0 = clock()
            for j in range(min(self._window(), len(chunks))):
                yield from copy(j)
            for i, (off, n) in enumerate(chunks):
                t = clock()
                copying.popleft()[1].result()
                clock("copy_wait_s", t)
                if i == 0:
                    clock("first_copy_s", t0)
                req = dict(fields if i == 0 else {}, buffer=label, offset=off, length=n,
                           region=f"{self.regions[i % nslots].name}[0:{n}]")
                t = clock()
                last = pending[i % nslots] = yield from api._job_plan(
                    "put", req, priority=job.get("priority"), detach=True)
                clock("submit_s", t)
                j = i + self._window()
                if j < len(chunks):
                    yield from copy(j)
            for k in range(nslots):
                done = pending[k]
                if done is not None:
                    t = clock()
                    yield from done._wait_plan(job.get("timeout"), None)
                    clock("daemon_wait_s", t)
                    pending[k] = None
        except Exception:
            _finish([f for _, f in copying])
            yield from _drain(pending)
            raise
        return last

    def get_plan(self, api: "Api", label: str, out: Any, job: Dict[str, Any]) -> Plan:
        """Fills ``out`` (a flat uint8 array) from buffer ``label``'s bytes from 0: the
        daemon fills slots ahead while finished ones are copied out. The ring
        must be ready and held. Returns the last chunk's :class:`Job`.

        Every slot not being copied out is the daemon's: a ``get`` into it is
        submitted as soon as the copy out of its previous chunk is done. This
        thread waits for chunk i's job, then starts its copy out, with up to
        :meth:`_window` copies out in flight.
        """
        nslots = len(self.regions)
        chunks = self._chunks(len(out))
        pending: List["Job"] = []  # chunk i's job, in order
        copying: Deque[Tuple[int, "Future[Any]"]] = deque()  # (chunk, copy out), in order
        clock = self._clock()

        def submit(i: int) -> Plan:
            off, n = chunks[i]
            req = dict(buffer=label, offset=off, length=n,
                       region=f"{self.regions[i % nslots].name}[0:{n}]")
            t = clock()
            pending.append((yield from api._job_plan("get", req,
                                                     priority=job.get("priority"),
                                                     detach=True)))
            clock("submit_s", t)

        def retire() -> Plan:
            """Waits for the oldest copy out; its slot then takes the chunk nslots on."""
            j, f = copying[0]
            t = clock()
            f.result()
            clock("copy_wait_s", t)
            copying.popleft()
            if j + nslots < len(chunks):
                yield from submit(j + nslots)

        last = None
        try:
            for i in range(min(nslots, len(chunks))):
                yield from submit(i)
            for i, (off, n) in enumerate(chunks):
                while copying and (len(copying) >= self._window() or copying[0][1].done()):
                    yield from retire()
                t = clock()
                last = yield from pending[i]._wait_plan(job.get("timeout"), None)
                clock("daemon_wait_s", t)
                copying.append((i, self._start_copy(out[off:off + n],
                                                    self._slot(i % nslots, n))))
            t = clock()
            while copying:
                yield from retire()
            clock("first_copy_s", t)
        except Exception:
            _finish([f for _, f in copying])
            yield from _drain([p for p in pending if not p.finished])
            raise
        return last


def _copy(dst: Any, src: Any) -> None:
    """One copy task, on a copy thread."""
    import numpy as np
    np.copyto(dst, src)


def _finish(futures: List["Future[Any]"]) -> None:
    """After a failure: waits for the copies still in flight, so that none writes a
    slot the next transfer uses; their own errors are dropped."""
    for f in futures:
        try:
            f.result()
        except Exception:
            pass


def _drain(jobs: List[Any]) -> Plan:
    """After a failure: waits for the chunks still in flight, so that no slot is
    reused while gpuqd still reads or writes it; their own errors are dropped
    (the first failure is the one raised)."""
    for j in jobs:
        if j is None:
            continue
        try:
            yield from j._wait_plan(None, None)
        except Exception:
            pass


class _NoRoom(Exception):
    """Not enough pinnable memory left for a useful ring."""
