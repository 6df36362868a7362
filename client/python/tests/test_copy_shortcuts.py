"""The shortcut of a repeated device copy (device_arrays.py, "Repeated device copies
through a kept lease"): put_array/get_array of a device array like the last
one, with the same name, go straight to the copy through the kept lease, and
take the whole plan again whenever anything the shortcut relies on changed
(the buffer's row, the lease, the array's type, dtype or shape, a held
attachment).

No device arrays here: a stand-in with a CUDA array interface over numpy
memory, and the copy (device_arrays._device_copy) replaced by one through the host
backend's attachment. Counts and order are checked, never times."""

from __future__ import annotations

import numpy as np
import pytest

import gpuq
from gpuq import arrays, buffer_rows, device_arrays, kept_leases
from test_kept_leases import _Copies, _leases, _sent


class _DeviceArray:
    """numpy memory that put_array/get_array take for a device array."""

    def __init__(self, a):
        self.a = a
        self.dtype = a.dtype
        self.shape = a.shape
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str,
                                         "data": (a.ctypes.data, False), "version": 3}

    def reshape(self, *shape):
        return self.a.reshape(*shape)


@pytest.fixture
def copies(monkeypatch):
    c = _Copies()
    monkeypatch.setattr(device_arrays, "_device_copy", c)
    return c


@pytest.fixture
def plans(monkeypatch):
    """Counts the calls that took the whole plan (a cached or fresh lookup)."""
    seen = []
    real = buffer_rows.cached_lookup_plan

    def counting(api, name, device):
        seen.append(name)
        return (yield from real(api, name, device))
    monkeypatch.setattr(arrays, "cached_lookup_plan", counting)  # get_array's
    monkeypatch.setattr(buffer_rows, "cached_lookup_plan", counting)  # put_array's
    return seen


@pytest.fixture
def c(daemon, name):
    """A client and its shareable buffer ``name``, 64 f32 on GPU 0 (freed after)."""
    with daemon.client() as client:
        client.alloc(name, count=64, dtype="f32", shareable=True)
        try:
            yield client
        finally:
            client.free(name)


def _dev(values, dtype=np.float32):
    return _DeviceArray(np.asarray(values, dtype=dtype))


def _moves_bytes(c, name) -> bool:
    """Whether the stand-in copy moves bytes: the host backend's attachments are
    host memory (on a GPU it only counts)."""
    return bool(c._kept.get(f"{name}@0").att.host)


def test_a_repeated_put_and_get_take_the_shortcut(c, name, copies, plans):
    first = c.put_array(name, _dev(np.arange(64)))
    assert plans == [name] and first.result["path"] == "device"
    lease = first.result["lease"]
    before = _sent(c)
    again = c.put_array(name, _dev(np.arange(64) * 2))
    assert plans == [name]  # no lookup: the shortcut
    assert _sent(c) == before
    assert again.result["lease"] == lease and again.result["path"] == "device"
    assert again.result["bytes"] == 256 and again.state == first.state
    out = _dev(np.zeros(64))
    assert c.get_array(name, out=out) is out
    assert plans == [name, name]  # the get's own first time
    assert c.get_array(name, out=out) is out and plans == [name, name]
    assert _sent(c) == before
    assert [call for call in copies.calls] == \
        [(lease, True), (lease, True), (lease, False), (lease, False)]
    if _moves_bytes(c, name):
        assert np.array_equal(out.a, np.arange(64) * 2)


def test_another_clients_job_ends_the_lease_and_the_shortcut(c, daemon, name, copies,
                                                             plans):
    with daemon.client() as other:
        lease = c.put_array(name, _dev(np.ones(64))).result["lease"]
        assert other.fill(name, "value", value=3.0, timeout=30).state == "done"
        before = _sent(c)
        out = _dev(np.zeros(64))
        c.get_array(name, out=out)
        assert _sent(c) == before + 1  # attached again: the whole plan
        again = c.put_array(name, _dev(np.full(64, 5.0)))
        assert again.result["lease"] != lease
        if _moves_bytes(c, name):
            assert np.all(out.a == 3.0)
            assert np.all(other.get_array(name) == 5.0)


def test_a_buffer_made_anew_is_looked_up_again(daemon, name, copies, plans):
    """Freed and made again with another size by another client of the same user:
    the put finds the new buffer, never the old mapping."""
    with daemon.client() as c, daemon.client() as other:
        c.alloc(name, count=64, dtype="f32", shareable=True)
        c.put_array(name, _dev(np.ones(64)))
        other.free(name)  # revokes the kept lease
        other.alloc(name, count=128, dtype="f32", shareable=True)
        try:
            with pytest.raises(gpuq.BadRequest, match="holds 128"):
                c.put_array(name, _dev(np.ones(64)))
            c.put_array(name, _dev(np.full(128, 7.0)))
            if _moves_bytes(c, name):
                assert np.all(other.get_array(name) == 7.0)
            c.put_array(name, _dev(np.full(128, 8.0)))
            looked = len(plans)
            c.put_array(name, _dev(np.full(128, 9.0)))
            assert len(plans) == looked  # the shortcut of the new buffer
        finally:
            c.free(name)


def test_another_dtype_shape_or_kind_takes_the_whole_plan(c, name, copies, plans):
    c.put_array(name, _dev(np.ones(64)))
    with pytest.raises(gpuq.BadRequest, match="holds 64 f32"):
        c.put_array(name, _dev(np.ones(64), np.int32))
    looked = len(plans)
    assert looked > 1  # not the shortcut of the f32 array
    c.put_array(name, _DeviceArray(np.ones((8, 8), np.float32)))
    assert len(plans) == looked + 1  # another shape: looked up, then its own
    c.put_array(name, _DeviceArray(np.ones((8, 8), np.float32)))
    assert len(plans) == looked + 1
    c.put_array(name, np.ones(64, np.float32))  # a host array: never a shortcut
    assert len(plans) == looked + 2
    assert c.buffer(name).shape == (64,)
    c.put_array(name, _DeviceArray(np.ones((8, 8), np.float32)))
    assert len(plans) == looked + 3  # the numpy put gave the buffer another row


def test_a_held_attachment_takes_the_copies(c, name, copies, plans):
    c.put_array(name, _dev(np.ones(64)))
    c.put_array(name, _dev(np.ones(64)))
    assert len(plans) == 1
    with c.buffer(name).attach() as att:
        done = c.put_array(name, _dev(np.full(64, 2.0)))
        assert done.result["path"] == "held" and len(plans) == 2
        assert copies.calls[-1] == (att.lease, True)
    done = c.put_array(name, _dev(np.full(64, 3.0)))
    assert done.result["path"] == "device"
    assert [r["state"] for r in _leases(c, name)] == ["held"]


def test_a_held_read_attachment_takes_the_gets(c, name, copies, plans):
    """A read lease the caller holds sits beside a kept read lease (neither
    conflicts): gets go through the held one, as the plan has it."""
    out = _dev(np.zeros(64))
    c.get_array(name, out=out)
    c.get_array(name, out=out)
    kept = c._kept.get(f"{name}@0")
    assert len(plans) == 1 and not kept.writable
    with c.attach(f"{name}@0", mode="read") as att:  # no lookup
        c.get_array(name, out=out)
        assert copies.calls[-1] == (att.lease, False)
    c.get_array(name, out=out)
    assert copies.calls[-1] == (kept.lease, False)


def test_a_forgotten_row_takes_the_whole_plan(c, name, copies, plans):
    """The shortcut follows the client's view of the buffer: once it forgets the
    row (a failure, a free, a new lookup), the next copy looks again."""
    c.put_array(name, _dev(np.ones(64)))
    buffer_rows.forget(c, name)
    c.put_array(name, _dev(np.ones(64)))
    assert len(plans) == 2
    c.put_array(name, _dev(np.ones(64)))
    assert len(plans) == 2


def test_a_failed_copy_ends_its_use(c, name, copies, plans, monkeypatch):
    c.put_array(name, _dev(np.ones(64)))
    kept = c._kept.get(f"{name}@0")

    def failing(att, arr, into_attachment):
        raise RuntimeError("the device said no")
    monkeypatch.setattr(device_arrays, "_device_copy", failing)
    with pytest.raises(RuntimeError, match="said no"):
        c.put_array(name, _dev(np.ones(64)))
    assert len(plans) == 1 and kept.uses == 0  # the shortcut's use ended
    assert kept_leases._held_by_gpuqd(kept.fd)


def test_an_async_client_takes_the_shortcut(daemon, name, copies, plans):
    import asyncio

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            await c.alloc(name, count=16, dtype="f32", shareable=True)
            try:
                await c.put_array(name, _dev(np.ones(16)))
                before = _sent(c)
                done = await c.put_array(name, _dev(np.ones(16)))
                out = _dev(np.zeros(16))
                assert await c.get_array(name, out=out) is out
                await c.get_array(name, out=out)
                assert _sent(c) == before and done.result["path"] == "device"
                assert plans == [name, name]
            finally:
                await c.free(name)
    asyncio.run(main())
