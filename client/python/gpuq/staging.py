"""Ordinary memory at pinned speed: a client's staging ring, filled while the daemon moves.

gpuqd runs without capabilities, so it cannot read a client's memory: the
bytes of an ordinary numpy array must reach memory the daemon maps. Making
a fresh memfd per call (the plain path) costs a full copy into pages that
are new every time, and the daemon then copies them again through its own
staging; on the H200 that ran at 0.05 of pinned ``cudaMemcpy``.

Instead each client keeps a small ring of host regions (docs/protocol.md,
"Host regions"): memfds that gpuqd pinned once, mapped here too, reused by
every call. A put copies chunk i of the array into a free slot with several
threads (numpy's copy releases the GIL), then submits a ``put`` of that
slot into the buffer at the chunk's offset and goes on filling the next
slot while the daemon moves the previous one with one DMA. A slot is
refilled only after its job is done. A get mirrors it: the daemon fills
slots ahead while the client copies finished ones out. Jobs on one buffer
keep their order in gpuqd, so chunks land as written.

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
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional

from .dispatch import Call
from .errors import GpuqError

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api
    from .job import Job
    from .share import Region

__all__ = ["Staging", "DEFAULT_SLOTS", "DEFAULT_SLOT_BYTES", "MIN_STAGED_BYTES"]

Plan = Generator[Call, Any, Any]

#: Slots in the ring: one being filled, the others in flight in the daemon
#: (four, so that a late reply or a slow copy part does not stall the others).
DEFAULT_SLOTS = 4
#: Bytes per slot: large enough that a request's round trip is noise beside
#: its DMA, small enough that the first chunk's copy, which nothing overlaps,
#: stays short.
DEFAULT_SLOT_BYTES = 32 << 20
#: Arrays smaller than this take the plain path: a few round trips would
#: cost more than the one copy they save.
MIN_STAGED_BYTES = 4 << 20
#: The smallest slot worth making when memory is short.
_MIN_SLOT_BYTES = 1 << 20
_PAGE = 4096
_names = itertools.count(1)


def copy_threads() -> int:
    """Threads that copy between an array and a slot: the CPUs this process may
    use, up to 12 (on a 16-core H200 host 12 threads copy pageable memory into
    pinned at 53-62 GB/s, 8 at well under; memory bandwidth, not cores, bounds
    a copy beyond that)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cpus = os.cpu_count() or 1
    return max(1, min(12, cpus))


class Staging:
    """One client's ring of pinned slots (see the module doc); made on first use.

    ``slots`` and ``slot_bytes`` size it (0 slots: never staged); ``threads``
    copy. Only one transfer at a time uses it: another thread's transfer
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
            size = yield from self._size_plan(api)
            if size < _MIN_SLOT_BYTES:
                raise _NoRoom(f"gpuqd may pin only {size} more bytes per slot")
            tag = f"gpuq-stage-{os.getpid()}-{next(_names)}"
            for k in range(self.slots):
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
        """The slot size that fits gpuqd's RLIMIT_MEMLOCK and the caller's quota."""
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
        size = self.slot_bytes
        if room is not None:
            # Leave a quarter of what is left to others (and to the user's own regions).
            size = min(size, (room * 3 // 4) // self.slots // _PAGE * _PAGE)
        return size

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

    def _start_copy(self, dst: Any, src: Any) -> List["Future[Any]"]:
        """Starts dst[:] = src (uint8 arrays of one length) on the copy threads and
        returns at once; :func:`_finish` waits. A small copy is done here, now."""
        import numpy as np
        n = len(dst)
        parts = self.threads if n >= (1 << 20) * self.threads else 1
        if parts == 1:
            np.copyto(dst, src)
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gpuq-copy")
        step = (n // parts + _PAGE - 1) // _PAGE * _PAGE
        return [self._pool.submit(np.copyto, dst[a:a + step], src[a:a + step])
                for a in range(0, n, step)]

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

    def put_plan(self, api: "Api", label: str, data: Any, fields: Dict[str, Any],
                 job: Dict[str, Any]) -> Plan:
        """Puts ``data`` (a flat uint8 array) into buffer ``label`` from byte 0, chunk by
        chunk through the ring; ``fields`` go with the first chunk (``shape``).
        Returns the last chunk's :class:`Job`. The ring must be ready and held.

        The copy threads fill slot i+1 while this thread submits chunk i and
        waits for the job that last used slot i+1, so that round trips to
        gpuqd overlap the copies rather than come between them.
        """
        size, nslots = self.slot_bytes, len(self.regions)
        chunks = [(off, min(size, len(data) - off)) for off in range(0, len(data), size)]
        pending: List[Optional["Job"]] = [None] * nslots
        copying: List["Future[Any]"] = []
        last = None

        clock = self._clock()

        def slot_free(i: int) -> Plan:
            """Waits for the job that used chunk i's slot before it, if any."""
            k = i % nslots
            done, pending[k] = pending[k], None
            if done is not None:
                t = clock()
                yield from done._wait_plan(job.get("timeout"), None)
                clock("daemon_wait_s", t)

        try:
            t0 = clock()
            copying = self._start_copy(self._slot(0, chunks[0][1]), data[:chunks[0][1]])
            for i, (off, n) in enumerate(chunks):
                if i + 1 < len(chunks):
                    yield from slot_free(i + 1)  # while chunk i is being copied
                t = clock()
                _finish(copying)
                clock("copy_wait_s", t)
                if i == 0:
                    clock("first_copy_s", t0)
                copying = []
                if i + 1 < len(chunks):
                    noff, nn = chunks[i + 1]
                    copying = self._start_copy(self._slot((i + 1) % nslots, nn),
                                               data[noff:noff + nn])
                req = dict(fields if i == 0 else {}, buffer=label, offset=off, length=n,
                           region=f"{self.regions[i % nslots].name}[0:{n}]")
                t = clock()
                last = pending[i % nslots] = yield from api._job_plan(
                    "put", req, priority=job.get("priority"), detach=True)
                clock("submit_s", t)
            for k in range(nslots):
                yield from slot_free(k)
        except Exception:
            _finish(copying, quiet=True)
            yield from _drain(pending)
            raise
        return last

    def get_plan(self, api: "Api", label: str, out: Any, job: Dict[str, Any]) -> Plan:
        """Fills ``out`` (a flat uint8 array) from buffer ``label``'s bytes from 0: the
        daemon fills slots ahead while finished ones are copied out. The ring
        must be ready and held. Returns the last chunk's :class:`Job`.

        While the copy threads empty chunk i's slot, this thread asks for the
        chunk that slot takes next and waits for chunk i+1, as put does.
        """
        size, nslots = self.slot_bytes, len(self.regions)
        chunks = [(off, min(size, len(out) - off)) for off in range(0, len(out), size)]
        pending: List["Job"] = []
        copying: List["Future[Any]"] = []

        clock = self._clock()

        def submit(i: int) -> Plan:
            off, n = chunks[i]
            req = dict(buffer=label, offset=off, length=n,
                       region=f"{self.regions[i % nslots].name}[0:{n}]")
            t = clock()
            started = yield from api._job_plan("get", req, priority=job.get("priority"),
                                               detach=True)
            clock("submit_s", t)
            return started

        last = None
        try:
            for i in range(min(nslots, len(chunks))):
                pending.append((yield from submit(i)))
            for i, (off, n) in enumerate(chunks):
                t = clock()
                last = yield from pending[i]._wait_plan(job.get("timeout"), None)
                clock("daemon_wait_s", t)
                t = clock()
                _finish(copying)  # chunk i-1 is out of its slot
                clock("copy_wait_s", t)
                copying = self._start_copy(out[off:off + n], self._slot(i % nslots, n))
                if i - 1 + nslots < len(chunks) and i >= 1:
                    pending.append((yield from submit(i - 1 + nslots)))
            t = clock()
            _finish(copying)
            clock("copy_wait_s", t)
            clock("first_copy_s", t)
        except Exception:
            _finish(copying, quiet=True)
            yield from _drain([p for p in pending if not p.finished])
            raise
        return last


def _finish(futures: List["Future[Any]"], quiet: bool = False) -> None:
    """Waits for the copies ``futures`` stand for; their error is raised unless ``quiet``."""
    for f in futures:
        try:
            f.result()
        except Exception:
            if not quiet:
                raise


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
