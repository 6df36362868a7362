"""Ordinary memory at pinned speed: a client's staging ring, filled while the daemon moves.

gpuqd runs without capabilities, so it cannot read a client's memory: the
bytes of an ordinary numpy array must reach memory the daemon maps. Making
a fresh memfd per call (the plain path) costs a full copy into pages that
are new every time, and the daemon then copies them again through its own
staging; on the H200 that ran at 0.05 of pinned ``cudaMemcpy``.

Instead each client keeps a ring: one host region (docs/protocol.md, "Host
regions"), a memfd that gpuqd pinned once, mapped here too and reused by
every call, cut into slots. A transfer is cut into chunks of one slot
each; chunk i uses slot i mod slots. The copies between the array and the
slots run on persistent copy threads (copier.py), one task per chunk
(numpy's copy releases the GIL). Jobs are per group of neighbouring slots
(``group``, a few chunks): one ``put`` or ``get`` per group, so that the
round trips cost a few percent of the DMA they start, and the first group
is a single chunk, so that the first DMA starts after one chunk's copy.

Where gpuqd lists ``ring`` in ``ping``'s ``features`` (docs/protocol.md,
"Rings"), a transfer is one job: the region's first page holds the ring's
counters, and this thread raises ``posted`` as the copies into (put) or
out of (get) the slots finish, in order, while gpuqd raises ``moved`` as
its DMAs end; nothing goes over the socket until the job is waited for.
A put copies at most :data:`PUT_AHEAD_BYTES` ahead of gpuqd's DMAs.
Otherwise (an older gpuqd) jobs go per group of slots: a put copies
chunks up to half the ring ahead (the window; the other half is gpuqd's),
submits a group's ``put`` once all its copies are done, in order, and
reuses a slot only after the job that last read it is done; a get mirrors
it. Jobs on one buffer keep their order in gpuqd where their ranges meet;
chunks' ranges are disjoint, so only the slots need the waits above.

Slots of 2 MiB: on the H200 host twelve threads copied 2-4 MiB chunks at
70 GB/s into pinned memory and 55 GB/s out of it, 8 MiB chunks at 48,
and a slot just written is still in the caches when the DMA reads it.
Per group, what set the pace was the calling thread's round trips (two
per job), which is why a job moved several slots and why a ring's one job
replaced them (docs/PERFORMANCE.md).

The ring is made on first use, sized to fit what gpuqd may still pin
(its ``RLIMIT_MEMLOCK``, the ``host_pinned`` quota); when no ring can be
made the transfer takes the plain path, and :attr:`Staging.unavailable`
says why (a warning says it once). Transfers then take the plain path
without asking gpuqd until :attr:`Staging.retry_at`, a second later at
first and twice as long after each failure in a row, up to about a minute
(memory freed meanwhile, by this process or another, is not announced), or
until the client connects anew; then one tries again.

A ring transfer reads no socket while the counters move. Once gpuqd's
counter has stood still for :data:`_POLL_FOR_S`, this thread stops polling
it and waits on gpuqd instead: ``wait`` requests for the ring job, each
bounded by the stall so far (at most :data:`_WAIT_MAX_S`). So a job queued
behind others costs no CPU, and the call's ``timeout`` and the
connection's liveness ping (dispatch.py) apply as to any wait for a job.
The job cannot go on without this thread, so a transfer whose ``timeout``
runs out cancels it (:meth:`Staging._guarded`) and raises
:class:`~gpuq.Timeout`.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Tuple

from .copier import Copier, CopyTask
from .dispatch import YIELD, Call
from .errors import GpuqError, Timeout
from .job import timeout_ms

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api
    from .job import Job
    from .share import Region

__all__ = ["Staging", "DEFAULT_SLOTS", "DEFAULT_SLOT_BYTES", "DEFAULT_GROUP",
           "MIN_STAGED_BYTES"]

Plan = Generator[Call, Any, Any]
#: (first chunk, chunk count) of one job.
Group = Tuple[int, int]

#: Slots in the ring: enough that every copy thread has chunks queued while
#: gpuqd moves a few groups. 64 x 2 MiB pins 128 MiB, as rings before it.
DEFAULT_SLOTS = 64
#: Bytes per slot, which is one copy task: 2-4 MiB copies ran fastest on the
#: H200 host (module doc), and the first DMA waits for one of them.
DEFAULT_SLOT_BYTES = 2 << 20
#: Slots per job: a job costs the calling thread two round trips (its
#: submission and its wait), 50-100 us each on the H200 host while twelve
#: copy threads take turns at the GIL; 16 MiB moves in about 300 us. (At 1
#: GiB, 4 slots per job ran at 0.62 of pinned, 8 at 0.74-0.88.)
DEFAULT_GROUP = 8
#: Arrays smaller than this take the plain path: a few round trips would
#: cost more than the one copy they save.
MIN_STAGED_BYTES = 4 << 20
#: The smallest slot worth making when memory is short.
_MIN_SLOT_BYTES = 1 << 20
#: The bytes a ring put copies ahead of gpuqd's DMAs, at most (two slots at
#: least): the copy threads outrun the DMAs, and the further ahead they run,
#: the more of the host's memory they take from the DMA while it reads the
#: slots. gpuqd holds its own staged puts to the same (``XFER_READ_AHEAD_BYTES``,
#: docs/PERFORMANCE.md, "Polling the device"), where 256 MiB puts moved at
#: 0.55-0.66 of pinned with its whole 128 MiB ring ahead and 0.75-0.82 with
#: 64 MiB.
PUT_AHEAD_BYTES = 64 << 20
_PAGE = 4096
#: The region's first page: the ring's counters (posted, moved, status), then nothing.
_HEADER = _PAGE
_POSTED, _MOVED, _STATUS = 0, 1, 2
#: How long this thread waits for a copy or for gpuqd's counter before it looks again.
_POLL_S = 50e-6
#: How long a ring transfer waits so before it lets an AsyncClient's event loop turn.
_YIELD_S = 2e-3
#: How long gpuqd's counter may stand still before this thread stops polling it
#: and waits on gpuqd. gpuqd itself looks at the counters every 10 ms once the
#: client has been slow for 2 ms (transfer_ring.c), so a loaded host stalls a
#: moving transfer for that long now and then. A wait on gpuqd then would make
#: this thread slow to post in turn, and gpuqd sleep in turn: at 2 ms here,
#: 64 MiB puts on the host backend ran 3-4x slower. Stalls ten times that
#: long are a job that has not started (or stopped), where a wait costs nothing.
_POLL_FOR_S = 0.05
#: The longest of those waits: a job that moves again after a stall is noticed
#: within as long again as the stall lasted, and at most this much later.
_WAIT_MAX_S = 0.1
#: After the ring could not be made, transfers take the plain path for this long
#: before one tries again: a try costs round trips (and gpuqd a refused pin),
#: so not every transfer pays for one. Doubled by each failure in a row.
_RETRY_S = 1.0
_RETRY_MAX_S = 64.0
_names = itertools.count(1)
#: ``posted`` that no transfer reaches: gpuqd fails a ring job that reads it.
_NO_CHUNK = (1 << 64) - 1


def copy_threads() -> int:
    """Threads that copy between an array and the slots, a chunk at a time: the
    CPUs this process may use, up to 12 (on the 16-core H200 host 12 threads
    copied fastest; more only contend for the memory)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cpus = os.cpu_count() or 1
    return max(1, min(12, cpus))


class Staging:
    """One client's ring of pinned slots (see the module doc); made on first use.

    ``slots`` and ``slot_bytes`` size it (0 slots: never staged); ``threads``
    copy, a chunk each at a time; ``group`` slots go in one job where a
    transfer is not one ring job (``use_rings``). Only one
    transfer at a time uses it: another thread's transfer meanwhile takes
    the plain path rather than wait.
    """

    def __init__(self, slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES,
                 threads: Optional[int] = None, group: int = DEFAULT_GROUP,
                 use_rings: bool = True) -> None:
        if slots < 0 or slots == 1 or slot_bytes < _PAGE or slot_bytes % _PAGE:
            raise ValueError("staging needs slots 0 (none) or 2 or more (one filled while "
                             f"others move) and slot_bytes a positive multiple of {_PAGE}")
        if group < 1:
            raise ValueError("staging needs group 1 or more (slots per job)")
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.threads = threads or copy_threads()
        self.group = group
        #: The ring's region once made, and how many slots it holds.
        self.region: Optional["Region"] = None
        self.slot_count = 0
        self.unavailable: Optional[str] = None if slots else "staging is off (slots=0)"
        #: When (``time.monotonic()``) a transfer tries again to make the ring that
        #: could not be made (:attr:`unavailable`); until then, the plain path.
        self.retry_at = 0.0 if slots else math.inf
        self._retry_s = _RETRY_S
        self._lock = threading.Lock()
        self._copier = Copier(self.threads)
        self._ring: Any = None  # the region as one uint8 array
        self._counters: Any = None  # its first 24 bytes as the ring's three counters
        #: Whether a transfer through the ring is one job: ``use_rings`` and gpuqd
        #: has rings (``ring`` in ``ping``'s ``features``); else a job per group
        #: of slots. Known once the ring is made. ``use_rings=False`` keeps to
        #: groups (to compare the two).
        self.use_rings = use_rings
        self.rings = False
        #: Where the last transfer's time went, as this thread saw it: ``copy_wait_s``
        #: waiting for the copy threads, ``submit_s`` for gpuqd to take the job (or
        #: the groups' jobs), ``daemon_wait_s`` for gpuqd (its counter, the jobs to
        #: end), ``first_copy_s`` the copy that nothing overlaps (a put's first
        #: chunk, a get's last); ``jobs`` submitted.
        self.timing: Dict[str, float] = {}
        self._warned = False
        self._paused = 0.0  # seconds of _pause since the plan last yielded
        #: The transfer under way, or the one broken off before it could be settled
        #: (see :meth:`_guarded`); None between transfers.
        self._left: Optional[_Left] = None

    def __repr__(self) -> str:
        jobs = "one job per transfer" if self.rings else f"{self._group()} per job"
        state = (f"{self.slot_count} x {self.slot_bytes >> 20} MiB, {jobs}"
                 if self.region is not None else (self.unavailable or "not made yet"))
        return f"<gpuq.Staging {state}, {self.threads} copy threads>"

    # Making the ring ------------------------------------------------------------

    def _ready_plan(self, api: "Api", device: int) -> Plan:
        """Settles what a transfer broken off left (:meth:`_settle_plan`), then makes
        the ring if it is not there: True when it can be used."""
        if self._left is not None:
            yield from self._settle_plan(api)
        if self.region is not None:
            return True
        if self.unavailable is not None and time.monotonic() < self.retry_at:
            return False
        try:
            count, size = yield from self._size_plan(api)
            name = f"gpuq-stage-{os.getpid()}-{next(_names)}"
            self.region = yield from api._region_create_plan(name, _HEADER + count * size,
                                                             device, True, None,
                                                             free_if_abandoned=True)
            self.slot_count, self.slot_bytes = count, size
            self._ring = self.region.array("u1")
            self._counters = self.region.array("<u8", count=3)
            ping = yield Call("ping", {})
            self.rings = self.use_rings and "ring" in (ping.get("features") or ())
            self.unavailable, self._retry_s = None, _RETRY_S
            return True
        except ConnectionError:
            # The connection's end, not the ring's: this transfer takes the plain
            # path (on the new connection, with set_reconnect); the next tries the
            # ring again.
            self._unmap()
            return False
        except (_NoRoom, GpuqError, OSError) as exc:
            self._give_up(f"no pinned staging ring ({exc}); ordinary arrays go "
                          "through a memfd copy at a fraction of pinned speed")
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
        budget = room * 3 // 4 - _HEADER
        count = min(self.slots, budget // max(_MIN_SLOT_BYTES, self.slot_bytes))
        if count < self.slots:  # short of memory: smaller slots first, then fewer
            count = min(self.slots, budget // _MIN_SLOT_BYTES)
        if count < 2:
            raise _NoRoom(f"gpuqd may pin only {max(room, 0)} more bytes, and the ring "
                          f"needs two slots of at least {_MIN_SLOT_BYTES} bytes")
        return count, min(self.slot_bytes, budget // count // _PAGE * _PAGE)

    def _give_up(self, why: str) -> None:
        """No ring for now: the plain path until :attr:`retry_at`, which each failure
        in a row puts twice as far off."""
        self._unmap()
        self.unavailable = why
        self.retry_at = time.monotonic() + self._retry_s
        self._retry_s = min(2 * self._retry_s, _RETRY_MAX_S)
        if not self._warned:
            self._warned = True
            warnings.warn(f"gpuq: {why}", RuntimeWarning, stacklevel=6)

    def _unmap(self) -> None:
        self._ring = self._counters = None
        if self.region is not None:
            self.region.unmap()
        self.region = None
        self.slot_count = 0

    def close(self) -> None:
        """Unmaps the ring here (gpuqd frees its ephemeral region with the connection)
        and ends the copy threads. A ring that could not be made is tried again
        at the next transfer: that is on a new connection (a reconnect), maybe
        to a new gpuqd."""
        self._unmap()
        self._copier.close()
        if self.slots:
            self.retry_at, self._retry_s = 0.0, _RETRY_S

    # Pieces of a transfer ------------------------------------------------------

    def _group(self) -> int:
        """Slots per job: at most half the ring, so that one group is copied while
        gpuqd moves another."""
        return max(1, min(self.group, self.slot_count // 2))

    def _window(self) -> int:
        """Chunks a put copies ahead of the group it submits next: half the ring,
        the other half the daemon's. Copies further ahead would leave gpuqd
        one group at a time, each waited for before the next slot is filled
        (on the H200: 27 GB/s with all but one group's slots copied ahead)."""
        return max(1, min(self.slot_count - self._group(), self.slot_count // 2))

    def _put_ahead(self) -> int:
        """Chunks a ring put copies ahead of the last one gpuqd moved: the ring's, up
        to :data:`PUT_AHEAD_BYTES`' worth, two at least."""
        return max(2, min(self.slot_count, PUT_AHEAD_BYTES // self.slot_bytes))

    def _chunks(self, nbytes: int) -> List[Tuple[int, int]]:
        """(offset, length) of each chunk of a transfer: one slot each."""
        size = self.slot_bytes
        return [(off, min(size, nbytes - off)) for off in range(0, nbytes, size)]

    def _groups(self, chunks: int) -> List[Group]:
        """The jobs of a transfer of ``chunks`` chunks: the first a single chunk (the
        first DMA waits for no more), then :meth:`_group` each, cut where the
        ring wraps (a job's slots are one range of the region)."""
        size, slots = self._group(), self.slot_count
        groups: List[Group] = []
        first = 0
        while first < chunks:
            n = 1 if first == 0 else min(size, chunks - first, slots - first % slots)
            groups.append((first, n))
            first += n
        return groups

    def _range(self, chunks: List[Tuple[int, int]], group: Group) -> Dict[str, Any]:
        """A group's job fields: the buffer range and the region range it moves."""
        first, n = group
        off = chunks[first][0]
        length = sum(c[1] for c in chunks[first:first + n])
        at = _HEADER + (first % self.slot_count) * self.slot_bytes
        return dict(offset=off, length=length,
                    region=f"{self.region.name}[{at}:{at + length}]")  # type: ignore[union-attr]

    def _slot(self, chunk: int, n: int) -> Any:
        """The first n bytes of chunk's slot, as a uint8 array over the region."""
        at = _HEADER + (chunk % self.slot_count) * self.slot_bytes
        return self._ring[at:at + n]

    def _start_copy(self, dst: Any, src: Any) -> CopyTask:
        """Starts dst[:] = src (uint8 arrays of one length, a whole chunk) on a copy
        thread and returns at once."""
        return self._copier.submit(_copy, dst, src)

    def _clock(self) -> Any:
        """A fresh :attr:`timing` and its stopwatch: ``clock()`` is now; ``clock(key,
        since)`` adds the time since ``since`` to ``timing[key]``."""
        timing = self.timing = dict.fromkeys(
            ("copy_wait_s", "submit_s", "daemon_wait_s", "first_copy_s"), 0.0)
        timing["jobs"] = 0
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

    # Pipelines -----------------------------------------------------------------

    def put_plan(self, api: "Api", label: str, data: Any, fields: Dict[str, Any],
                 job: Dict[str, Any]) -> Plan:
        """Puts ``data`` (a flat uint8 array) into buffer ``label`` from byte 0 through
        the ring; ``fields`` go with the (first) job (``shape``). Returns the
        (last) job's :class:`Job`. The ring must be ready and held."""
        plan = (self._ring_put_plan if self.rings else self._group_put_plan)(
            api, label, data, fields, job)
        return (yield from self._guarded(api, plan, job.get("timeout")))

    def get_plan(self, api: "Api", label: str, out: Any, job: Dict[str, Any]) -> Plan:
        """Fills ``out`` (a flat uint8 array) from buffer ``label``'s bytes from 0
        through the ring. Returns the (last) job's :class:`Job`. The ring must
        be ready and held."""
        plan = (self._ring_get_plan if self.rings else self._group_get_plan)(
            api, label, out, job)
        return (yield from self._guarded(api, plan, job.get("timeout")))

    # A transfer broken off ------------------------------------------------------

    def _guarded(self, api: "Api", plan: Plan, timeout: Optional[float]) -> Plan:
        """Runs one transfer's ``plan``, within ``timeout`` seconds (None: no limit).
        When it ends in any other way than its own return (an error, a job
        that failed, its timeout, Ctrl-C, a cancelled task), nothing of it may
        touch the ring afterwards: its copies are waited for and its jobs
        stopped (:meth:`_settle_plan`) before the exception goes on. A plan
        being closed may not send anything: its ring job is then made to fail
        at once through the counters, and the next transfer settles the rest."""
        self._left = _Left(timeout)
        try:
            result = yield from plan
        except GeneratorExit:
            self._copier.drain()
            self._fail_ring_job()
            raise
        except BaseException:
            yield from self._settle_plan(api)
            raise
        self._left = None
        return result

    def _submit_plan(self, api: "Api", op: str, fields: Dict[str, Any],
                     priority: Optional[str]) -> Plan:
        """Submits one job of the transfer, detached, and keeps it in :attr:`_left`.
        Until its reply is here the job is in doubt: it may run with no one
        to stop it by its id (a refusal, a :class:`GpuqError`, says there is none)."""
        left = self._left
        assert left is not None
        left.in_doubt = True
        try:
            done = yield from api._job_plan(op, fields, priority=priority, detach=True)
        except GpuqError:
            left.in_doubt = False
            raise
        left.jobs.append(done)
        left.in_doubt = False
        return done

    def _settle_plan(self, api: "Api") -> Plan:
        """Makes sure nothing of the transfer in :attr:`_left` touches the ring again:
        waits for its copies, then cancels and waits for each of its jobs. A
        job in doubt has no id to cancel: it is made to fail through the
        counters, and the ring is given up (``region_free`` waits for every
        job that uses the region; the next transfer makes a new ring). Broken
        off itself, this leaves :attr:`_left` to the next transfer."""
        left = self._left
        assert left is not None
        self._copier.drain()
        if self.region is None:  # gone with its connection: nothing can touch a new one
            self._left = None
            return
        if left.in_doubt:
            self._fail_ring_job()
            region, self._left = self.region, None
            self._unmap()
            try:
                yield from api._job_plan("region_free", {"name": region.name})
            except Exception:
                pass  # then it goes with the connection
            return
        while left.jobs:
            yield from _stop(left.jobs[0])
            left.jobs.pop(0)
        self._left = None

    def _fail_ring_job(self) -> None:
        """Fails a ring job that this thread can no longer stop by its id: a
        ``posted`` above the transfer's chunks fails it at gpuqd's next look
        at the counters (docs/protocol.md, "Rings")."""
        if self.rings and self._counters is not None:
            self._counters[_POSTED] = _NO_CHUNK

    def _ring_fields(self, label: str, nbytes: int) -> Dict[str, Any]:
        """A ring transfer's request fields: the whole buffer range, the slots, the counters."""
        end = _HEADER + self.slot_count * self.slot_bytes
        return dict(buffer=label, offset=0, length=nbytes,
                    region=f"{self.region.name}[{_HEADER}:{end}]",  # type: ignore[union-attr]
                    ring={"slot_bytes": self.slot_bytes, "counters": 0})

    def _ring_put_plan(self, api: "Api", label: str, data: Any, fields: Dict[str, Any],
                       job: Dict[str, Any]) -> Plan:
        """One ``put`` through the ring (docs/protocol.md, "Rings"): chunk j is copied
        into its slot once gpuqd has moved the chunk before it there (all
        slots are free at first) and is at most :meth:`_put_ahead` chunks
        ahead of gpuqd, and ``posted`` rises as copies finish, in order;
        gpuqd moves each posted chunk and raises ``moved``."""
        chunks = self._chunks(len(data))

        def copy(j: int) -> CopyTask:
            off, n = chunks[j]
            return self._start_copy(self._slot(j, n), data[off:off + n])
        return (yield from self._ring_plan(api, "put", dict(fields, **self._ring_fields(
            label, len(data))), len(chunks), self._put_ahead(), copy, job))

    def _ring_get_plan(self, api: "Api", label: str, out: Any, job: Dict[str, Any]) -> Plan:
        """One ``get`` through the ring: each chunk gpuqd has moved is copied out of its
        slot, and ``posted`` rises as those copies finish, in order, giving
        gpuqd the slot for the chunk ``slots`` later."""
        chunks = self._chunks(len(out))

        def copy(j: int) -> CopyTask:
            off, n = chunks[j]
            return self._start_copy(out[off:off + n], self._slot(j, n))
        return (yield from self._ring_plan(api, "get", self._ring_fields(label, len(out)),
                                           len(chunks), 0, copy, job))

    def _ring_plan(self, api: "Api", op: str, fields: Dict[str, Any], count: int, ahead: int,
                   copy: Any, job: Dict[str, Any]) -> Plan:
        """The one job of a ring transfer of ``count`` chunks, and this thread's side of
        it: ``copy(j)`` starts chunk j's copy once ``moved`` + ``ahead`` > j
        (put: its slot is free; get: its bytes are there), and ``posted`` rises
        as the copies end, in order. Returns the job once it has ended."""
        counters, left = self._counters, self._left
        assert left is not None
        clock = self._clock()
        counters[:] = 0
        t0 = clock()
        # A put's first slots are free: one copy per thread starts before the job
        # is submitted, so that the submit's round trip overlaps the first copy,
        # which the first DMA waits for (the rest start once it is submitted).
        copies = [copy(j) for j in range(min(count, ahead, self.threads))]
        t = clock()
        done = yield from self._submit_plan(api, op, fields, job.get("priority"))
        clock("submit_s", t)
        self.timing["jobs"] = 1
        posted, last_moved = 0, 0.0
        seen, still_since = (-1, -1), 0.0  # (moved, posted) last looked at, and since when
        while posted < count:
            moved = int(counters[_MOVED])
            ready = min(count, moved + ahead)
            while len(copies) < ready:
                copies.append(copy(len(copies)))
            if not last_moved and len(copies) == count:
                last_moved = clock()  # what follows overlaps no DMA
            before = posted
            while posted < len(copies) and copies[posted].done():
                copies[posted].wait()  # raises what the copy raised
                posted += 1
            if posted > before:
                counters[_POSTED] = posted
                if before == 0 and op == "put":
                    clock("first_copy_s", t0)  # a put's first copy: no DMA overlaps it
            elif counters[_STATUS] == 2:
                break  # the job failed: its wait says why
            else:  # nothing changed: the oldest copy's turn, or gpuqd's
                now = clock()
                if (moved, posted) != seen:
                    seen, still_since = (moved, posted), now
                if left.deadline is not None and now >= left.deadline:
                    raise self._timed_out(done)
                if posted == len(copies) and now - still_since >= _POLL_FOR_S:
                    failed = yield from self._stall_plan(done, now - still_since)
                    clock("daemon_wait_s", now)
                    if failed:
                        break
                elif self._pause(copies, posted, clock):
                    yield YIELD
        if op == "get" and last_moved:
            clock("first_copy_s", last_moved)  # a get's last copies: likewise
        t = clock()
        yield from self._await_plan(done)
        clock("daemon_wait_s", t)
        return done

    def _stall_plan(self, done: "Job", stalled: float) -> Plan:
        """gpuqd has moved nothing for ``stalled`` seconds, and the next move is its
        own: waits on it with a ``wait`` for the ring job, bounded by as long
        again (the job may be queued behind others, or gpuqd stopped), by
        :data:`_WAIT_MAX_S` and by what is left of the transfer's timeout
        (:class:`~gpuq.Timeout` when nothing is). The request has no limit of
        the client's own (``wait_s``): gpuqd answers when the job ends or at
        ``timeout_ms``, and a gpuqd that answers nothing meanwhile is found by
        the liveness ping as for any wait for a job, which closes the
        connection. True once the job has failed (its wait says how); one
        that is done may still have slots to be copied out (a get's last)."""
        left = self._left
        assert left is not None
        seconds = min(stalled, _WAIT_MAX_S)
        if left.deadline is not None:
            seconds = min(seconds, left.deadline - time.perf_counter())
            if seconds <= 0:
                raise self._timed_out(done)
        try:
            reply = yield Call("wait", {"job": done.id, "timeout_ms": timeout_ms(seconds)},
                               waits=True)
        except GpuqError as exc:
            self._check_same_connection()
            if self._ended_before_a_reexec(done, exc):
                return False  # done: its last slots may still be copied out (a get's)
            if exc.job is None:
                raise
            done.record = exc.job.record  # how it stands, for a timeout's message
            return done.finished  # else gpuqd's timeout_ms ran out: the job goes on
        self._check_same_connection()
        done.record = dict(reply["job"])
        return False

    def _ended_before_a_reexec(self, done: "Job", exc: GpuqError) -> bool:
        """A wait for the ring job answered ``not_found``: the job ended as gpuqd
        re-executed itself (restart, SIGUSR2), whose new image keeps the
        connection and the ring's region but no job record. The ring's status
        counter, in that region, says how it ended: True when it succeeded
        (``done`` then reads ``done``); a failure stays the not_found, whose
        message says the record is gone."""
        counters = self._counters
        if exc.code != "not_found" or counters is None or int(counters[_STATUS]) != 1:
            return False
        done.record = dict(done.record, state="done")
        return True

    def _check_same_connection(self) -> None:
        """After a wait mid-transfer: ConnectionError if the client connected anew
        meanwhile (set_reconnect), which ended the ring (:meth:`close`) and its
        job with the old connection, and sent the wait again (it reads and
        changes nothing) to a gpuqd that never had the job."""
        if self.region is None:
            raise ConnectionError("the connection to gpuqd was lost during a transfer "
                                  "through the staging ring; its job and the ring went "
                                  "with it")

    def _await_plan(self, done: "Job") -> Plan:
        """Waits for one of the transfer's jobs to end, within what is left of its
        timeout; one that does not is the transfer's :meth:`_timed_out`."""
        left = self._left
        assert left is not None
        wait = None if left.deadline is None else max(0.0, left.deadline - time.perf_counter())
        try:
            return (yield from done._wait_plan(wait, None))
        except Timeout:
            if done.finished:  # the job's own failure (gpuqd's idle timeout)
                raise
            raise self._timed_out(done) from None
        except GpuqError as exc:
            if not self._ended_before_a_reexec(done, exc):
                raise
            return done

    def _timed_out(self, done: "Job") -> Timeout:
        """The transfer's timeout ran out with ``done`` not ended: the job cannot go on
        without this thread (a ring's waits for its counters), so it is
        cancelled (:meth:`_guarded` does it as this propagates)."""
        left = self._left
        assert left is not None
        waiting = done.record.get("waiting")
        how = f"{done.state}, {waiting}" if waiting else done.state
        return Timeout(f"{done.op} job {done.id} through the staging ring had not ended at "
                       f"timeout={left.timeout:g} s ({how}); it is cancelled, since a "
                       "transfer through the ring cannot go on without its client",
                       job=done, reply=done.record)

    def _pause(self, copies: List[CopyTask], posted: int, clock: Any) -> bool:
        """Nothing moved: waits a little for the oldest copy, or for gpuqd's counter.
        True once such waits have lasted :data:`_YIELD_S` since the last True: the
        plan then yields, so that an AsyncClient's other tasks run meanwhile."""
        t = clock()
        if posted < len(copies):
            copies[posted].wait_for(_POLL_S)
            clock("copy_wait_s", t)
        else:
            time.sleep(_POLL_S)
            clock("daemon_wait_s", t)
        self._paused += clock() - t
        if self._paused < _YIELD_S:
            return False
        self._paused = 0.0
        return True

    def _group_put_plan(self, api: "Api", label: str, data: Any, fields: Dict[str, Any],
                        job: Dict[str, Any]) -> Plan:
        """put_plan with a job per group of slots (a gpuqd without rings).

        Chunks are copied up to :meth:`_window` ahead of the group being
        submitted. Chunk j's copy starts once the job that last read its slot
        (chunk j - slots's) is done; a group's ``put`` is submitted once its
        copies are done, in order.
        """
        slots = self.slot_count
        chunks = self._chunks(len(data))
        window = self._window()
        readers: List[Optional["Job"]] = [None] * slots  # the job that last read each slot
        copies: List[CopyTask] = []  # chunk j's copy, for every chunk started
        submitted: List["Job"] = []
        clock = self._clock()

        def start_until(end: int) -> Plan:
            """Starts the copies of every chunk before ``end``, each once its slot is free."""
            while len(copies) < min(end, len(chunks)):
                j = len(copies)
                reader = readers[j % slots]
                if reader is not None and not reader.finished:
                    t = clock()
                    yield from self._await_plan(reader)
                    clock("daemon_wait_s", t)
                off, n = chunks[j]
                copies.append(self._start_copy(self._slot(j, n), data[off:off + n]))

        t0 = clock()
        last = None
        for first, n in self._groups(len(chunks)):
            yield from start_until(first + n + window)
            t = clock()
            for j in range(first, first + n):
                copies[j].wait()
            clock("copy_wait_s", t)
            if first == 0:
                clock("first_copy_s", t0)
            t = clock()
            req = dict(fields if first == 0 else {}, buffer=label,
                       **self._range(chunks, (first, n)))
            last = yield from self._submit_plan(api, "put", req, job.get("priority"))
            clock("submit_s", t)
            submitted.append(last)
            self.timing["jobs"] += 1
            for j in range(first, first + n):
                readers[j % slots] = last
        t = clock()
        for done in submitted:
            yield from self._await_plan(done)
        clock("daemon_wait_s", t)
        return last

    def _group_get_plan(self, api: "Api", label: str, out: Any, job: Dict[str, Any]) -> Plan:
        """get_plan with a job per group of slots (a gpuqd without rings): gpuqd
        fills groups of slots ahead while finished ones are copied out.

        A group's ``get`` is submitted once the copies out of the chunks that
        last used its slots are done: three groups at once, the rest of the
        first ring's worth after the first wait, then as copies finish, always
        keeping gpuqd at least two groups ahead when there are that many. This thread waits for the groups' jobs in order
        and hands each one's chunks to the copy threads.
        """
        slots = self.slot_count
        chunks = self._chunks(len(out))
        groups = self._groups(len(chunks))
        copies: List[CopyTask] = []  # chunk i's copy out, for every chunk started
        jobs: List["Job"] = []  # group g's job, for every group submitted
        clock = self._clock()

        def slots_free(g: int) -> bool:
            first, n = groups[g]
            return all(j < slots or (j - slots < len(copies) and copies[j - slots].done())
                       for j in range(first, first + n))

        def submit(g: int) -> Plan:
            first, n = groups[g]
            t = clock()
            for j in range(max(first, slots), first + n):
                copies[j - slots].wait()
            clock("copy_wait_s", t)
            t = clock()
            req = dict(buffer=label, **self._range(chunks, groups[g]))
            jobs.append((yield from self._submit_plan(api, "get", req, job.get("priority"))))
            clock("submit_s", t)
            self.timing["jobs"] += 1

        last = None
        # Three groups before the first wait (the first is one slot), the rest
        # of the first ring's worth once the first group's copies out have
        # started: each submission is a round trip the copies need not wait for.
        while len(jobs) < min(3, len(groups)):
            yield from submit(len(jobs))
        for g, (first, n) in enumerate(groups):
            t = clock()
            last = yield from self._await_plan(jobs[g])
            clock("daemon_wait_s", t)
            for i in range(first, first + n):
                off, size = chunks[i]
                copies.append(self._start_copy(out[off:off + size], self._slot(i, size)))
            while len(jobs) < len(groups) and (len(jobs) <= g + 2 or slots_free(len(jobs))):
                yield from submit(len(jobs))
        t = clock()
        for c in copies:
            c.wait()
        clock("first_copy_s", t)
        return last


def _copy(dst: Any, src: Any) -> None:
    """One copy task, on a copy thread."""
    import numpy as np
    np.copyto(dst, src)


def _stop(job: "Job") -> Plan:
    """Cancels a job of a transfer broken off (a ring's would wait for counters
    no one raises any more) and waits for it, so that no slot is reused while
    gpuqd still reads or writes it. Its own error is dropped: the transfer's
    first failure is the one raised."""
    if job.finished:
        return
    try:
        yield from job._cancel_plan()
    except Exception:
        pass
    try:
        yield from job._wait_plan(None, None)
    except Exception:
        pass


class _Left:
    """A transfer's jobs (the ones it knows the ids of), whether one more is in
    doubt (sent, its reply not come), and its ``timeout`` (seconds, None for
    none) and the ``deadline`` that makes (``time.perf_counter()``, the ring's
    stopwatch); kept until the transfer ends or is settled."""

    __slots__ = ("jobs", "in_doubt", "timeout", "deadline")

    def __init__(self, timeout: Optional[float] = None) -> None:
        self.jobs: List["Job"] = []
        self.in_doubt = False
        self.timeout = timeout
        self.deadline = None if timeout is None else time.perf_counter() + timeout


class _NoRoom(Exception):
    """Not enough pinnable memory left for a useful ring."""
