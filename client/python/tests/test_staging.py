"""Large ordinary arrays through the pinned staging ring: bit-exact in chunks, into
new arrays and into ``out=``, falling back to the plain path with a reason."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings

import numpy as np
import pytest

import gpuq
import gpuq.staging as staging_mod
from gpuq.host_arrays import HUGE_PAGE, empty_aligned
from gpuq.staging import MIN_STAGED_BYTES


def _room(client) -> int:
    """Bytes gpuqd may still pin, or skip when it may not pin even a small ring."""
    info = client.regions()
    limit = info.get("memlock_limit")
    if limit is None:
        return 1 << 40
    room = limit - int(info.get("pinned_bytes") or 0)
    if room < 5 << 20:
        pytest.skip(f"gpuqd may pin only {room} more bytes here; the ring needs 5 MiB")
    return room


@pytest.mark.parametrize("slots,slot_bytes", [(2, 4 << 20), (3, 1 << 20)])
def test_a_large_array_goes_through_the_ring_bit_exact(private_daemon, slots, slot_bytes):
    d = private_daemon()  # 4 MiB slots (or what RLIMIT_MEMLOCK leaves) take two threads each
    with d.client(staging_slots=slots, staging_slot_bytes=slot_bytes, copy_threads=2) as c:
        _room(c)
        # Not a whole number of slots, and 2-D.
        a = np.random.default_rng(1).random((1031, 1283)).astype(np.float32)
        assert a.nbytes >= MIN_STAGED_BYTES
        job = c.put_array("big", a)
        assert job.result["path"] == "ring" and job.result["bytes"] == a.nbytes
        assert job.result["chunks"] == -(-a.nbytes // c.staging.slot_bytes) > 1
        back = c.get_array("big")
        assert back.shape == a.shape and np.array_equal(back, a)
        out = np.empty_like(a)
        assert c.get_array("big", out=out) is out and np.array_equal(out, a)
        # A strided view is made contiguous on the way.
        b = np.random.default_rng(2).random((1031, 2566)).astype(np.float32)[:, ::2]
        c.put_array("big", b)
        assert np.array_equal(c.get_array("big"), b)
        assert "MiB" in repr(c.staging)
        c.free("big")


def test_a_new_array_from_the_ring_starts_on_a_huge_page(private_daemon):
    """Each slot-sized copy then faults one huge page of its own (host_arrays.py)."""
    d = private_daemon()
    with d.client(staging_slots=2, staging_slot_bytes=1 << 20, copy_threads=2) as c:
        _room(c)
        a = np.random.default_rng(3).random((3, 1 << 20), dtype=np.float32)
        c.put_array("huge", a)
        back = c.get_array("huge")
        assert c.staging.region is not None  # it came through the ring
        assert back.ctypes.data % HUGE_PAGE == 0
        assert back.shape == a.shape and back.flags.c_contiguous and back.flags.writeable
        assert np.array_equal(back, a)
        c.free("huge")


@pytest.mark.parametrize("shape,dtype", [((3, 1 << 20), np.float32), (5 << 20, np.uint8),
                                         ((7, 9), np.float64), (0, np.int32)])
def test_empty_aligned_is_np_empty_on_a_huge_page_bound_from_one_huge_page(shape, dtype):
    a = empty_aligned(shape, dtype)
    want = np.empty(shape, dtype)
    assert a.shape == want.shape and a.dtype == want.dtype and a.flags.c_contiguous
    assert a.flags.writeable
    if a.nbytes >= HUGE_PAGE:
        assert a.ctypes.data % HUGE_PAGE == 0
        a[...] = 7  # all of it is the caller's
        assert (a == 7).all()


def test_without_room_to_pin_the_plain_path_says_why(private_daemon):
    d = private_daemon()
    with d.client() as c:
        region = _hog(c)
        try:
            a = np.arange(MIN_STAGED_BYTES // 4 + 7, dtype=np.int32)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                job = c.put_array("p", a)
            assert job.result["path"] != "ring"
            assert "no pinned staging ring" in (c.staging.unavailable or "")
            assert any("staging" in str(w.message) for w in caught)
            assert np.array_equal(c.get_array("p"), a)
            c.free("p")
        finally:
            if region is not None:
                region.unmap()
                c.region_free("hog")


def _hog(c, name: str = "hog"):
    """A region that leaves gpuqd too little to pin for a ring (skips where its
    RLIMIT_MEMLOCK is unlimited), or None where there is too little already."""
    info = c.regions()
    limit = info.get("memlock_limit")
    if limit is None:
        pytest.skip("gpuqd's RLIMIT_MEMLOCK is unlimited here: nothing to exhaust")
    size = (limit - int(info.get("pinned_bytes") or 0) - (512 << 10)) // 4096 * 4096
    return c.region_create(name, size) if size > 0 else None


class _Clock:
    """Stands in for staging.py's ``time``: ``monotonic()`` is what the test sets,
    so that it says when a retry is due without waiting for it."""

    perf_counter = staticmethod(time.perf_counter)
    sleep = staticmethod(time.sleep)

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


def test_a_ring_that_could_not_be_made_is_tried_again_later(private_daemon, monkeypatch):
    """Before, a client whose ring could not be made took the plain path until it
    was closed, though the memory was free again; now a transfer tries again a
    second later, then after twice as long at each failure, and the others in
    between do not ask gpuqd."""
    d = private_daemon()
    with d.client() as c:
        hog = _hog(c)
        if hog is None:
            pytest.skip("gpuqd may pin too little here for a ring, whatever is freed")
        clock = _Clock()
        monkeypatch.setattr(staging_mod, "time", clock)
        tries = []
        size = c.staging._size_plan

        def counted(api):
            tries.append(clock.now)
            return (yield from size(api))
        monkeypatch.setattr(c.staging, "_size_plan", counted)
        a = np.arange(MIN_STAGED_BYTES // 4 + 7, dtype=np.int32)

        def path() -> str:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return c.put_array("again", a).result["path"]
        assert path() != "ring" and len(tries) == 1
        assert "no pinned staging ring" in c.staging.unavailable
        assert c.staging.retry_at == clock.now + 1
        clock.now += 0.5
        assert path() != "ring" and len(tries) == 1  # not due yet: no request for it
        assert np.array_equal(c.get_array("again"), a) and len(tries) == 1
        clock.now += 0.5
        assert path() != "ring" and len(tries) == 2  # due, and still no room
        assert c.staging.retry_at == clock.now + 2  # twice as long after two in a row
        hog.unmap()
        c.region_free("hog")
        clock.now += 1
        assert path() != "ring" and len(tries) == 2
        clock.now += 1
        assert path() == "ring" and len(tries) == 3
        assert c.staging.unavailable is None
        assert np.array_equal(c.get_array("again"), a) and len(tries) == 3
        c.free("again")


def test_a_connection_lost_while_the_ring_is_made_does_not_give_the_ring_up(
        private_daemon, monkeypatch):
    """That transfer takes the plain path (on the new connection, with
    set_reconnect); the next one makes the ring: the connection's end says
    nothing of the room to pin one."""
    d = private_daemon()
    with d.client() as c:
        _room(c)
        size = c.staging._size_plan

        def lost(api):
            monkeypatch.setattr(c.staging, "_size_plan", size)
            raise ConnectionError("as if the connection ended here")
            yield  # a plan
        monkeypatch.setattr(c.staging, "_size_plan", lost)
        a = np.arange(MIN_STAGED_BYTES // 4 + 7, dtype=np.int32)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no warning of a ring given up
            assert c.put_array("lost", a).result["path"] != "ring"
        assert c.staging.unavailable is None and c.staging.region is None
        assert c.put_array("lost", a).result["path"] == "ring"
        c.free("lost")


def test_another_threads_transfer_takes_the_plain_path_meanwhile(private_daemon):
    d = private_daemon()
    with d.client(staging_slot_bytes=1 << 20) as c:
        _room(c)
        a = np.arange(MIN_STAGED_BYTES // 4 * 2, dtype=np.float32)
        assert c.staging.try_acquire()  # as if another thread were using the ring
        try:
            job = c.put_array("t", a)
        finally:
            c.staging.release()
        assert job.result["path"] != "ring"
        results = []

        def worker(i: int) -> None:
            back = c.get_array("t")
            results.append(np.array_equal(back, a))
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [True] * 3
        c.free("t")


def test_staging_can_be_turned_off(private_daemon):
    d = private_daemon()
    with d.client(staging_slots=0) as c:
        a = np.ones(MIN_STAGED_BYTES // 4, np.float32)
        assert c.put_array("off", a).result["path"] != "ring"
        assert c.staging.unavailable == "staging is off (slots=0)"
        c.free("off")
    with pytest.raises(ValueError, match="slot_bytes"):
        gpuq.Staging(3, 1000)
    with pytest.raises(ValueError, match="2 or more"):
        gpuq.Staging(1)


class _CopySpy:
    """Stands in for the ring's copy task: counts tasks, their sizes, and how many
    ran at once (the first lingers until a second has begun, up to 10 s, so
    that copies in flight together always meet), and raises in the task
    numbered ``fail_at`` (``error``, a RuntimeError unless given). Tasks after ``linger_after``
    linger, so that a caller that did not wait for the copies in flight
    would find them still running (with 3 copy threads, tasks 7 and 8 are
    under way when chunk 6's copy or submission fails)."""

    def __init__(self, fail_at: int = -1, linger_after: int = 1 << 30,
                 error: type = RuntimeError) -> None:
        self.linger_after = linger_after
        self.error = error
        self.lock = threading.Lock()
        self.sizes: list = []
        self.live = 0
        self.most = 0
        self.fail_at = fail_at
        self.second = threading.Event()

    def __call__(self, dst, src) -> None:
        with self.lock:
            index = len(self.sizes)
            self.sizes.append(len(dst))
            self.live += 1
            self.most = max(self.most, self.live)
        try:
            if index == 0:
                self.second.wait(10)
            else:
                self.second.set()
            time.sleep(0.3 if index > self.linger_after else 0.01)
            if index == self.fail_at:
                raise self.error(f"copy task {index} failed")
            np.copyto(dst, src)
        finally:
            with self.lock:
                self.live -= 1


def _ring_client(d, slots: int = 5, threads: int = 3, rings: bool = True, **kw):
    """A client whose ring has several 1 MiB slots and copies several at once;
    a transfer is one ring job, or (``rings`` False) a job per group of slots."""
    c = d.client(staging_slots=slots, staging_slot_bytes=1 << 20, copy_threads=threads, **kw)
    if _room(c) * 3 // 4 < (slots << 20) + 4096:
        c.close()
        pytest.skip(f"gpuqd may not pin {slots} slots of 1 MiB here")
    c.staging.use_rings = rings
    return c


@pytest.mark.parametrize("rings", [True, False], ids=["ring", "groups"])
def test_many_chunks_in_flight_are_all_written_whole_slot_per_task(private_daemon, monkeypatch,
                                                                   rings):
    d = private_daemon()
    with _ring_client(d, rings=rings) as c:
        spy = _CopySpy()
        monkeypatch.setattr(staging_mod, "_copy", spy)
        a = np.random.default_rng(3).integers(0, 1 << 30, (11 << 20) // 4 + 5, np.int32)
        chunks = -(-a.nbytes // (1 << 20))
        job = c.put_array("many", a)
        assert job.result["chunks"] == chunks == len(spy.sizes)
        # One task per chunk, each a whole slot but the last; several at once.
        assert spy.sizes == [1 << 20] * (chunks - 1) + [a.nbytes - ((chunks - 1) << 20)]
        assert spy.most >= 2 and spy.most <= c.staging.threads
        # get with out= of a size that is not a multiple of the slot, then a new array.
        out = np.zeros_like(a)
        assert c.get_array("many", out=out) is out and np.array_equal(out, a)
        assert len(spy.sizes) == 2 * chunks and spy.most >= 2
        assert np.array_equal(c.get_array("many"), a)
        assert set(c.staging.timing) == {"copy_wait_s", "submit_s", "daemon_wait_s",
                                         "first_copy_s", "jobs"}
        # One job (a ring), or two slots per job but the first (5 slots: at most
        # half the ring per job).
        assert c.staging.rings == rings
        assert c.staging.timing["jobs"] == (1 if rings else 7) < chunks
        c.free("many")


def test_a_ring_puts_first_copies_start_before_its_job_is_submitted(private_daemon,
                                                                   monkeypatch):
    """A put's first slots are free: their copies, one per copy thread, are under
    way while the job's submission makes its round trip (the first DMA waits
    for the first copy, and would wait for that round trip too). A get has
    nothing to copy before gpuqd has moved a chunk."""
    d = private_daemon()
    with _ring_client(d) as c:
        events = []
        started = c.staging._start_copy

        def start_copy(dst, src):
            events.append("copy")
            return started(dst, src)
        monkeypatch.setattr(c.staging, "_start_copy", start_copy)
        submit = c._job_plan

        def job_plan(op, fields, *args, **kw):
            if fields.get("ring"):
                events.append(f"submit {op}")
            return (yield from submit(op, fields, *args, **kw))
        monkeypatch.setattr(c, "_job_plan", job_plan)
        a = np.random.default_rng(5).random((11 << 20) // 8)
        assert c.put_array("early", a).result["path"] == "ring"
        assert events.index("submit put") == c.staging.threads == 3
        assert events.count("copy") == 11
        events.clear()
        assert np.array_equal(c.get_array("early", out=np.empty_like(a)), a)
        assert events[0] == "submit get" and events.count("copy") == 11
        c.free("early")


@pytest.mark.parametrize("rings", [True, False], ids=["ring", "groups"])
@pytest.mark.parametrize("where", ["put copy", "get copy", "put submit"])
def test_a_failure_in_the_middle_drains_every_chunk_in_flight(private_daemon, monkeypatch,
                                                              where, rings):
    d = private_daemon()
    with _ring_client(d, rings=rings) as c:
        a = np.random.default_rng(4).random((12 << 20) // 8).astype(np.float64)
        if where == "get copy":
            c.put_array("mid", a)
        spy = _CopySpy(fail_at=6 if "copy" in where else -1, linger_after=6)
        monkeypatch.setattr(staging_mod, "_copy", spy)
        jobs = []
        submit = c._job_plan

        def job_plan(op, fields, *args, **kw):
            if op == where.split()[0] and fields.get("region"):
                if where == "put submit" and len(jobs) == (0 if rings else 6):
                    fields = dict(fields, region="gpuq-no-such-region[0:1]")
                job = yield from submit(op, fields, *args, **kw)
                jobs.append(job)
                return job
            return (yield from submit(op, fields, *args, **kw))
        monkeypatch.setattr(c, "_job_plan", job_plan)
        with pytest.raises(RuntimeError if "copy" in where else gpuq.GpuqError) as caught:
            if where == "get copy":
                c.get_array("mid", out=np.empty_like(a))
            else:
                c.put_array("mid", a)
        assert ("copy task 6 failed" if "copy" in where else "gpuq-no-such-region") in str(
            caught.value)
        # Every chunk gpuqd was given had ended, and every copy, before the error
        # reached the caller: no slot was still in use. A ring's one job, which
        # would wait for counters no one raises, was cancelled.
        if not rings:
            assert len(jobs) >= 3
        elif where == "put submit":
            assert jobs == []
        else:
            assert [j.state for j in jobs] == ["cancelled"]
        assert all(j.finished for j in jobs), jobs
        assert spy.live == 0
        monkeypatch.undo()
        assert c.put_array("mid", a).result["path"] == "ring"
        assert np.array_equal(c.get_array("mid"), a)
        c.free("mid")


def _sized(limit, quota=None, slots=16, slot_bytes=8 << 20):
    """What the ring's sizing makes of gpuqd's ``regions`` and ``quota`` replies."""
    plan = gpuq.Staging(slots, slot_bytes)._size_plan(None)
    assert next(plan).op == "regions"
    assert plan.send({"memlock_limit": limit, "pinned_bytes": 0}).op == "quota"
    users = [{"limits": {"host_pinned": quota}, "used": {"host_pinned": 0}}] if quota else []
    with pytest.raises(StopIteration) as stop:
        plan.send({"users": users})
    return stop.value.value


def test_short_of_pinnable_memory_the_ring_shrinks_its_slots_then_their_count():
    mib = 1 << 20
    page = 4096  # the ring's counters come first
    assert _sized(None) == (16, 8 * mib)
    assert _sized(1 << 30) == (16, 8 * mib)
    assert _sized(128 * mib) == (16, 6 * mib - page)  # three quarters of it, in 16 slots
    # Slots no smaller than 1 MiB: fewer of them, sharing what there is.
    assert _sized(8 * mib) == (5, (6 * mib - page) // 5 // page * page)
    assert _sized(None, quota=16 * mib) == (11, (12 * mib - page) // 11 // page * page)
    assert _sized(1 << 30, quota=32 * mib) == (16, (1536 << 10) - page)
    with pytest.raises(Exception, match="needs two slots of at least 1048576 bytes"):
        _sized(2 * mib)


def test_async_client_runs_the_same_ring(private_daemon):
    d = private_daemon()
    with _ring_client(d):  # skips where gpuqd may not pin five 1 MiB slots
        pass
    a = np.random.default_rng(5).random((9 << 20) // 4 + 3, dtype=np.float32)

    async def main():
        async with gpuq.AsyncClient(d.socket, staging_slots=5, staging_slot_bytes=1 << 20,
                                    copy_threads=3) as c:
            job = await c.put_array("aring", a)
            assert job.result["path"] == "ring" and job.result["chunks"] == 10
            out = np.empty_like(a)
            assert await c.get_array("aring", out=out) is out
            assert np.array_equal(out, a)
            assert c.staging.slot_count == 5 and c.staging._group() == 2
            await c.free("aring")
    asyncio.run(main())


def test_jobs_cover_neighbouring_slots_the_first_alone_none_across_the_wrap():
    ring = gpuq.Staging(8, 1 << 20, threads=2, group=3)
    ring.slot_count = 8
    # The first job one chunk (the first DMA waits for one copy), then three
    # slots each, cut where the ring wraps (slot 7 is followed by slot 0).
    assert ring._groups(20) == [(0, 1), (1, 3), (4, 3), (7, 1), (8, 3), (11, 3), (14, 2),
                                (16, 3), (19, 1)]
    assert ring._groups(1) == [(0, 1)]
    ring.slot_count = 4  # never more than half the ring in one job
    assert ring._group() == 2 and ring._groups(6) == [(0, 1), (1, 2), (3, 1), (4, 2)]
    with pytest.raises(ValueError, match="group"):
        gpuq.Staging(4, 1 << 20, group=0)


def test_a_put_copies_at_most_half_the_ring_ahead_of_its_next_job(private_daemon, monkeypatch):
    d = private_daemon()
    with _ring_client(d, slots=5, threads=3, rings=False) as c:
        c.staging.group = 2
        started = []
        start = c.staging._start_copy
        monkeypatch.setattr(c.staging, "_start_copy",
                            lambda dst, src: started.append(len(dst)) or start(dst, src))
        submitted = []  # (first chunk's offset, chunks copied so far) at each put
        submit = c._job_plan

        def job_plan(op, fields, *args, **kw):
            if op == "put" and fields.get("region"):
                submitted.append((fields["offset"] >> 20, fields["length"] >> 20,
                                  len(started)))
            return (yield from submit(op, fields, *args, **kw))
        monkeypatch.setattr(c, "_job_plan", job_plan)
        a = np.arange((16 << 20) // 4, dtype=np.int32)
        c.put_array("half", a)
        assert c.staging._window() == 2 and len(started) == 16
        # Jobs: one chunk, then two, cut where the ring of five wraps.
        assert [(f, n) for f, n, _ in submitted] == [(0, 1), (1, 2), (3, 2), (5, 2), (7, 2),
                                                      (9, 1), (10, 2), (12, 2), (14, 1),
                                                      (15, 1)]
        for first, n, copied in submitted:
            assert first + n <= copied <= first + n + 2, submitted
        monkeypatch.undo()
        assert np.array_equal(c.get_array("half"), a)
        c.free("half")


def test_a_ring_put_copies_no_further_ahead_of_gpuqd_than_its_read_ahead(private_daemon,
                                                                          monkeypatch):
    """Copies far ahead of the DMAs take the host's memory from them (staging.py,
    PUT_AHEAD_BYTES). The first chunk's copy is held back, so gpuqd moves
    nothing meanwhile and the plan starts every copy its bound allows: with
    the whole ring as the bound it would start all five."""
    d = private_daemon()
    with _ring_client(d, slots=5, threads=3) as c:
        monkeypatch.setattr(staging_mod, "PUT_AHEAD_BYTES", 3 << 20)
        started = []  # (chunk, chunks gpuqd had moved) as each copy starts
        start = c.staging._start_copy

        def start_copy(dst, src):
            started.append((len(started), int(c.staging._counters[staging_mod._MOVED])))
            return start(dst, src)
        monkeypatch.setattr(c.staging, "_start_copy", start_copy)
        copy, held = staging_mod._copy, []

        def first_held(dst, src):
            if not held:
                held.append(True)
                end = time.monotonic() + 0.5
                while len(started) < 5 and time.monotonic() < end:
                    time.sleep(0.005)
            copy(dst, src)
        monkeypatch.setattr(staging_mod, "_copy", first_held)
        a = np.arange((16 << 20) // 4, dtype=np.int32)
        assert c.put_array("ahead", a).result["path"] == "ring"
        assert c.staging.slot_count == 5 and c.staging._put_ahead() == 3
        assert len(started) == 16 and held
        assert max(j for j, moved in started if moved == 0) == 2
        assert all(j < moved + 3 for j, moved in started), started
        monkeypatch.undo()
        assert np.array_equal(c.get_array("ahead"), a)
        c.free("ahead")


def test_copy_threads_run_every_task_and_hand_errors_to_the_waiter():
    from gpuq.copier import Copier
    copier = Copier(3)
    src = np.arange(1 << 16, dtype=np.uint8)
    outs = [np.zeros_like(src) for _ in range(8)]
    tasks = [copier.submit(np.copyto, out, src) for out in outs]
    for t in tasks:
        t.wait()
        assert t.done()
    assert all(np.array_equal(out, src) for out in outs)

    def fails(dst, src):
        raise OSError("copy refused")
    bad = copier.submit(fails, None, None)
    with pytest.raises(OSError, match="copy refused"):
        bad.wait()
    with pytest.raises(OSError):  # waiting again gives the same answer
        bad.wait()
    copier.close()  # the threads end; a later task starts them again
    again = np.zeros_like(src)
    copier.submit(np.copyto, again, src).wait()
    assert np.array_equal(again, src)
    copier.close()


@pytest.mark.parametrize("rings", [True, False], ids=["ring", "groups"])
def test_a_job_that_fails_fails_the_transfer_after_the_rest_ended(private_daemon,
                                                                  monkeypatch, rings):
    d = private_daemon()
    with _ring_client(d, rings=rings) as c:
        a = np.arange((12 << 20) // 4, dtype=np.int32)
        waited = []
        wait_plan = gpuq.Job._wait_plan

        def fails_third(job, timeout, on_progress):
            waited.append(job)
            done = yield from wait_plan(job, timeout, on_progress)
            if len(waited) == (1 if rings else 3):
                raise gpuq.DeviceError("the third group's job failed")
            return done
        monkeypatch.setattr(gpuq.Job, "_wait_plan", fails_third)
        with pytest.raises(gpuq.DeviceError, match="third group"):
            c.put_array("fails", a)
        # Every job submitted had ended before the error reached the caller.
        assert len(waited) >= (1 if rings else 3) and all(j.finished for j in waited)
        monkeypatch.undo()
        assert c.put_array("fails", a).result["path"] == "ring"
        assert np.array_equal(c.get_array("fails"), a)
        c.free("fails")


def test_a_forked_child_gets_copy_threads_of_its_own():
    import os
    from gpuq.copier import Copier
    copier = Copier(2)
    src = np.arange(4096, dtype=np.uint8)
    out = np.zeros_like(src)
    copier.submit(np.copyto, out, src).wait()  # the parent's threads are running
    pid = os.fork()
    if pid == 0:  # the child: its copy must still run, on threads of its own
        child = np.zeros_like(src)
        try:
            copier.submit(np.copyto, child, src).wait()
            os._exit(0 if np.array_equal(child, src) else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    copier.close()


# A transfer broken off: Ctrl-C, a cancelled task, a plan closed ----------------------

def _unfinished(c) -> list:
    return [j for j in c.jobs() if not j.finished]


@pytest.mark.parametrize("rings", [True, False], ids=["ring", "groups"])
@pytest.mark.parametrize("op", ["put", "get"])
def test_ctrl_c_in_a_transfer_leaves_no_job_or_copy_behind(private_daemon, monkeypatch,
                                                          rings, op):
    """Before, a ring job outlived its Ctrl-C: the buffer's other jobs waited for it
    (up to --transfer-idle-timeout), and the next transfer, sharing the
    ring's counters with it, read its failure as its own and stalled."""
    d = private_daemon()
    with _ring_client(d, rings=rings) as c:
        a = np.random.default_rng(6).random((12 << 20) // 8)
        b = np.random.default_rng(7).random((12 << 20) // 8)
        c.put_array("cut", a)
        # Copy 5 raises KeyboardInterrupt, and so does this thread's wait for it, as
        # a Ctrl-C there would; the copies after it are still running then.
        spy = _CopySpy(fail_at=5, linger_after=5, error=KeyboardInterrupt)
        monkeypatch.setattr(staging_mod, "_copy", spy)
        with pytest.raises(KeyboardInterrupt):
            if op == "put":
                c.put_array("cut", b)
            else:
                c.get_array("cut", out=np.empty_like(a))
        assert spy.live == 0  # no copy still writes a slot
        assert _unfinished(c) == []
        if rings:
            assert c.jobs()[-1].state == "cancelled"
        monkeypatch.undo()
        # The ring serves the next transfer as if nothing happened.
        assert c.put_array("next", b).result["path"] == "ring"
        assert np.array_equal(c.get_array("next"), b)
        if op == "get":
            assert np.array_equal(c.get_array("cut"), a)
        c.free("cut")
        c.free("next")


@pytest.mark.parametrize("rings", [True, False], ids=["ring", "groups"])
def test_ctrl_c_while_a_transfer_is_submitted_gives_the_ring_up(private_daemon,
                                                                monkeypatch, rings):
    """A job whose reply never came has no id to cancel: its ring job is failed
    through the counters and the region freed, which waits for it; the
    next transfer makes a new ring."""
    d = private_daemon()
    with _ring_client(d, rings=rings) as c:
        a = np.random.default_rng(8).random((12 << 20) // 8)
        c.put_array("doubt", np.zeros_like(a))
        old = c.staging.region.name
        call = c._call

        def interrupted(request):
            reply = call(request)
            if request.op == "put" and request.fields.get("region"):
                raise KeyboardInterrupt  # the job exists; its reply is lost
            return reply
        monkeypatch.setattr(c, "_call", interrupted)
        with pytest.raises(KeyboardInterrupt):
            c.put_array("doubt", a)
        monkeypatch.undo()
        assert c.staging.region is None
        assert _unfinished(c) == []
        orphan = [j for j in c.jobs() if j.op == "put"][-1]
        if rings:
            assert orphan.state == "failed" and "posted" in str(orphan.error)
        freed = [j for j in c.jobs() if j.op == "region_free"]
        assert freed and freed[-1].state == "done"
        assert c.put_array("doubt", a).result["path"] == "ring"
        assert c.staging.region.name != old
        assert np.array_equal(c.get_array("doubt"), a)
        c.free("doubt")


def test_a_ring_transfer_closed_mid_way_fails_its_job_and_the_next_one_settles(
        private_daemon, monkeypatch):
    """A plan closed at a yield (its driver gone) may not send anything: it waits for
    its copies and fails its ring job through the counters at once; the next
    transfer waits for that job before it uses the ring."""
    from gpuq import arrays
    from gpuq.dispatch import YIELD
    d = private_daemon()
    with _ring_client(d) as c:
        a = np.random.default_rng(9).random((12 << 20) // 8)
        spy = _CopySpy(linger_after=4)
        monkeypatch.setattr(staging_mod, "_copy", spy)
        plan = arrays.put_array_plan(c, "closed", a, None, {})
        call = next(plan)
        while call is not YIELD:  # the ring waits on lingering copies: it yields
            reply = c._call(call)
            call = c._advance(plan, reply)
        job = c.staging._left.jobs[0]
        plan.close()
        assert spy.live == 0
        with pytest.raises(gpuq.BadRequest, match="posted"):
            c.wait(job.id)
        monkeypatch.undo()
        assert c.put_array("closed", a).result["path"] == "ring"
        assert c.staging._left is None
        assert np.array_equal(c.get_array("closed"), a)
        c.free("closed")


def test_an_async_transfer_cancelled_cancels_its_job(private_daemon, monkeypatch):
    d = private_daemon()
    with _ring_client(d):  # skips where gpuqd may not pin five 1 MiB slots
        pass
    a = np.random.default_rng(10).random((12 << 20) // 8)
    spy = _CopySpy(linger_after=2)
    monkeypatch.setattr(staging_mod, "_copy", spy)

    async def main():
        async with gpuq.AsyncClient(d.socket, staging_slots=5, staging_slot_bytes=1 << 20,
                                    copy_threads=3) as c:
            task = asyncio.ensure_future(c.put_array("acut", a))
            while not (c.staging._left and c.staging._left.jobs):
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert spy.live == 0
            assert [j.state for j in await c.jobs() if j.op == "put"][-1] == "cancelled"
            monkeypatch.undo()
            assert (await c.put_array("acut", a)).result["path"] == "ring"
            assert np.array_equal(await c.get_array("acut"), a)
            await c.free("acut")
    asyncio.run(main())


def test_copy_threads_drain_waits_for_every_task_given():
    from gpuq.copier import Copier
    copier = Copier(3)
    copier.drain()  # no threads yet: nothing to wait for
    ran = []

    def slow(i, _):
        time.sleep(0.05 if i % 2 else 0.0)
        ran.append(i)
    tasks = [copier.submit(slow, i, None) for i in range(10)]
    copier.drain()
    assert sorted(ran) == list(range(10)) and all(t.done() for t in tasks)
    copier.close()


_KILLED = """
import sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np, gpuq, gpuq.staging as st
copy = st._copy
st._copy = lambda dst, src: (time.sleep(0.05), copy(dst, src))  # a transfer that lasts
a = np.ones((12 << 20) // 4, np.float32)
with gpuq.Client(sys.argv[1], staging_slots=5, staging_slot_bytes=1 << 20, copy_threads=2) as c:
    c.put_array(sys.argv[3], np.zeros_like(a))
    print("ready", flush=True)
    c.put_array(sys.argv[3], a)
"""


def test_a_client_killed_mid_transfer_does_not_hold_its_buffer(private_daemon, name):
    """Its ring job (the ring is its connection's ephemeral region) is cancelled as
    the connection closes, not left to --transfer-idle-timeout (60 s here)."""
    import os
    import subprocess
    import sys
    d = private_daemon()
    with _ring_client(d) as c:  # skips where gpuqd may not pin five 1 MiB slots
        package = os.path.dirname(os.path.dirname(gpuq.__file__))
        p = subprocess.Popen([sys.executable, "-c", _KILLED, d.socket, package, name],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
            deadline = time.monotonic() + 30
            while not any(j.op == "put" and j.state == "running" for j in c.jobs()):
                assert time.monotonic() < deadline, "the killed client's put never ran"
                time.sleep(0.01)
        finally:
            p.kill()
            p.wait()
        assert c.checksum(name, timeout=20).state == "done"
        assert [j.state for j in c.jobs() if j.op == "put"][-1] == "cancelled"
        c.free(name)


def test_ctrl_c_while_the_ring_is_made_frees_the_region_made_after(private_daemon,
                                                                   monkeypatch, name):
    """The ring's region_create given up before its reply (Ctrl-C while gpuqd pins
    it): the region gpuqd makes is freed when that reply comes, not left
    pinned as long as the connection lives beside the next transfer's ring."""
    import threading
    d = private_daemon()
    with _ring_client(d) as c:
        conn = c._conn
        read = conn._read_once

        def interrupted(deadline, slot):  # sent, and given up before its reply is read
            if "region_create" in conn._d.ops.values():
                monkeypatch.undo()
                raise KeyboardInterrupt
            return read(deadline, slot)
        monkeypatch.setattr(conn, "_read_once", interrupted)
        a = np.random.default_rng(11).random((6 << 20) // 8)
        with pytest.raises(KeyboardInterrupt):
            c.put_array(name, a)
        assert c.staging.region is None
        c.ping()  # reads the late reply: the region goes
        for t in threading.enumerate():
            if t.name == "gpuq-apart":
                t.join(10)
        deadline = time.monotonic() + 30
        while c.regions()["regions"]:
            assert time.monotonic() < deadline, "the ring's first region stayed"
            time.sleep(0.02)
        assert c.put_array(name, a).result["path"] == "ring"
        assert len(c.regions()["regions"]) == 1  # the new ring's alone
        assert np.array_equal(c.get_array(name), a)
        c.free(name)


# Time limits: a ring transfer's waits on gpuqd --------------------------------------

class _Call:
    """``fn()`` run on a thread of its own, so that a call that hangs fails the test
    instead of hanging it."""

    def __init__(self, fn) -> None:
        self.caught = []

        def run() -> None:
            try:
                fn()
                self.caught.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.caught.append(exc)
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def outcome(self, seconds: float, unstick) -> BaseException:
        """What the call raised (None: it returned); when it has not returned within
        ``seconds`` (it hangs), ``unstick()`` lets it end and the test fails."""
        self.thread.join(seconds)
        if self.thread.is_alive():
            unstick()
            self.thread.join(30)
            pytest.fail(f"the call had not returned after {seconds} s")
        return self.caught[0]


def _bounded(fn, seconds: float, unstick) -> BaseException:
    """What ``fn()`` raised, within ``seconds`` (see :class:`_Call`)."""
    return _Call(fn).outcome(seconds, unstick)


def _log_waits_on_gpuqd(c, monkeypatch) -> list:
    """The ring loop's waits for gpuqd, in order: ``"poll"`` for each look at its
    counter (not the waits for copies), the op of each request sent."""
    log = []
    pause = c.staging._pause
    call = c._call

    def polled(copies, posted, clock):
        if posted == len(copies):
            log.append("poll")
        return pause(copies, posted, clock)

    def sent(request):
        log.append(request.op)
        return call(request)
    monkeypatch.setattr(c.staging, "_pause", polled)
    monkeypatch.setattr(c, "_call", sent)
    return log


@pytest.mark.parametrize("op", ["put", "get"])
def test_a_ring_transfer_behind_a_lease_times_out_and_is_cancelled(private_daemon,
                                                                   monkeypatch, op):
    """Before, the ring's loop polled gpuqd's counter every 50 us for ever: a
    transfer queued behind another client's lease ignored timeout= and
    burnt a CPU until the lease ended."""
    d = private_daemon()
    a = np.random.default_rng(12).random((12 << 20) // 8)
    with d.client(staging_slots=0) as holder, _ring_client(d) as c:
        holder.alloc("held", a.shape, a.dtype, shareable=True)
        holder.put_array("held", a)
        att = holder.attach("held")  # the lease: jobs on the buffer wait
        log = _log_waits_on_gpuqd(c, monkeypatch)
        if op == "put":
            def call():
                c.put_array("held", a[::-1].copy(), timeout=0.5)
        else:
            def call():
                c.get_array("held", timeout=0.5)
        error = _bounded(call, 20, lambda: holder.release(att))
        assert isinstance(error, gpuq.Timeout), error
        assert "timeout=0.5" in str(error) and "cancelled" in str(error)
        # The ring job is cancelled (it cannot go on without this client), and
        # waited for: nothing of the transfer is left in gpuqd.
        assert error.job.op == op and error.job.state == "cancelled"
        assert _unfinished(c) == []
        # It waited on gpuqd (wait requests, each bounded), not by polling the
        # counter: only the stall's first moments were polled.
        first = log.index("wait")
        assert log.count("wait") >= 2 and "poll" not in log[first:], log
        holder.release(att)
        monkeypatch.undo()
        assert c.put_array("held", a).result["path"] == "ring"
        assert np.array_equal(c.get_array("held"), a)
        c.free("held")


def test_an_async_ring_transfer_behind_a_lease_times_out(private_daemon):
    d = private_daemon()
    with _ring_client(d):  # skips where gpuqd may not pin five 1 MiB slots
        pass
    a = np.random.default_rng(13).random((12 << 20) // 8)
    holder = d.client(staging_slots=0)
    holder.alloc("aheld", a.shape, a.dtype, shareable=True)
    holder.put_array("aheld", a)
    att = holder.attach("aheld")

    async def main():
        async with gpuq.AsyncClient(d.socket, staging_slots=5, staging_slot_bytes=1 << 20,
                                    copy_threads=3) as c:
            with pytest.raises(gpuq.Timeout) as caught:
                await c.get_array("aheld", timeout=0.5)
            assert caught.value.job.state == "cancelled"
            assert [j for j in await c.jobs() if not j.finished] == []
            holder.release(att)
            assert np.array_equal(await c.get_array("aheld"), a)
    try:
        error = _bounded(lambda: asyncio.run(main()), 20, lambda: holder.release(att))
        assert error is None, error
    finally:
        holder.close()


def test_a_ring_transfer_notices_a_daemon_that_stops_answering(private_daemon):
    """As any wait for a job: a ping after the client's timeout of silence, and the
    connection closed when that goes unanswered. Before, a transfer through
    the ring waited for the stopped daemon for as long as it was stopped."""
    import signal
    d = private_daemon()
    a = np.random.default_rng(14).random((12 << 20) // 8)
    with d.client(staging_slots=0) as holder, _ring_client(d, timeout=0.5) as c:
        holder.alloc("stop", a.shape, a.dtype, shareable=True)
        holder.put_array("stop", a)
        att = holder.attach("stop")  # the transfer's job stays queued
        call = _Call(lambda: c.get_array("stop"))
        try:
            deadline = time.monotonic() + 20
            while not any(j.op == "get" and j.state == "queued" for j in holder.jobs()):
                assert time.monotonic() < deadline, "the transfer's job never came"
                time.sleep(0.01)
            d.proc.send_signal(signal.SIGSTOP)
            error = call.outcome(20, lambda: (d.proc.send_signal(signal.SIGCONT),
                                              holder.release(att)))
        finally:
            d.proc.send_signal(signal.SIGCONT)
        assert isinstance(error, ConnectionError), error
        assert "did not answer a ping" in str(error)
        assert c.closed
        holder.release(att)
        holder.free("stop")
