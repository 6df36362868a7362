"""Large ordinary arrays through the pinned staging ring: bit-exact in chunks, into
new arrays and into ``out=``, falling back to the plain path with a reason."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import gpuq
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


def test_without_room_to_pin_the_plain_path_says_why(private_daemon):
    d = private_daemon()
    with d.client() as c:
        info = c.regions()
        limit = info.get("memlock_limit")
        if limit is None:
            pytest.skip("gpuqd's RLIMIT_MEMLOCK is unlimited here: nothing to exhaust")
        hog = (limit - int(info.get("pinned_bytes") or 0) - (512 << 10)) // 4096 * 4096
        region = c.region_create("hog", hog) if hog > 0 else None
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
