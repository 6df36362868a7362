"""numpy round trips: bit-exact for every dtype at odd sizes, shapes, refusals, memfds."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

import gpuq
from gpuq import memfd

SIZES = [1, 3, 4097, 100003]


def random_bits(dtype, n, seed):
    """n elements of every bit pattern, NaNs, infinities and -0.0 included."""
    dt = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt)


def bits(a):
    return a.view(np.dtype(f"u{a.dtype.itemsize}") if a.dtype.itemsize > 1 else np.uint8)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64", "float16", "float32", "float64"])
def test_round_trip_is_bit_exact(client, name, dtype, size):
    a = random_bits(dtype, size, seed=size)
    job = client.put_array(name, a)
    try:
        assert job.result["bytes"] == a.nbytes
        [buf] = [b for b in client.buffers() if b["name"] == name]
        assert buf["dtype"] == gpuq.arrays.gpuq_dtype(a.dtype) and buf["count"] == size
        back = client.get_array(name)
        assert back.dtype == a.dtype and back.shape == a.shape
        assert np.array_equal(bits(back), bits(a))
    finally:
        client.free(name)


@pytest.mark.parametrize("size", [1, 4097])
def test_bf16_as_uint16_bits(client, name, size):
    a = random_bits("uint16", size, seed=7)
    client.put_array(name, a, dtype="bf16")
    try:
        assert [b["dtype"] for b in client.buffers() if b["name"] == name] == ["bf16"]
        back = client.get_array(name)
        assert back.dtype.itemsize == 2 and back.shape == (size,)
        assert np.array_equal(back.view(np.uint16), a)
        try:
            import ml_dtypes
            assert back.dtype == np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            assert back.dtype == np.uint16
    finally:
        client.free(name)


@pytest.mark.parametrize("dtype", ["int8", "uint32", "complex64", "bool"])
def test_other_numpy_dtypes_go_as_bytes(client, name, dtype):
    a = random_bits("uint8", 999 * np.dtype(dtype).itemsize, seed=3).view(dtype)
    if dtype == "bool":
        a = a.view(np.uint8) & 1
        a = a.astype(bool)
    with pytest.raises(gpuq.BadRequest, match="dtype='bytes'"):
        client.put_array(name, a)
    assert name not in {b["name"] for b in client.buffers()}  # nothing allocated
    client.put_array(name, a, dtype="bytes")
    try:
        back = client.get_array(name, dtype=a.dtype)
        assert back.dtype == a.dtype and np.array_equal(bits(back), bits(a))
        raw = client.get_array(name)
        assert raw.dtype == np.uint8 and raw.nbytes == a.nbytes
    finally:
        client.free(name)


@pytest.mark.parametrize("dtype", [object, [("n", "i4"), ("o", object)]])
def test_arrays_of_python_objects_are_refused_as_bytes(client, name, dtype):
    """Their bytes are pointers into this process: refused before anything is sent."""
    a = np.array([(1, "a"), (2, "b")], dtype=dtype)
    sent = _count_ops(client, "buffers") + _count_ops(client, "alloc")
    for kw in ({"dtype": "bytes"}, {}):
        with pytest.raises(gpuq.BadRequest, match="Python objects"):
            client.put_array(name, a, **kw)
    assert sent == []


@pytest.mark.parametrize("shape", [(2, 3), (4,), (1, 2, 1, 2, 1, 2, 1, 2),
                                   (1, 2, 1, 2, 1, 2, 1, 2, 1)])
def test_the_shape_of_raw_bytes_is_kept_by_the_daemon(client, name, daemon, shape):
    """A complex64 array stored as bytes comes back with its shape in any process:
    gpuqd keeps its bytes' shape, as numpy's view(np.uint8) has it (it kept
    none, and only the client that put it knew the shape)."""
    a = (np.arange(int(np.prod(shape))) * (1 + 2j)).astype(np.complex64).reshape(shape)
    raw = a.view(np.uint8).shape  # (2, 24)
    client.put_array(name, a, dtype="bytes")
    try:
        if len(shape) > 8:  # more dimensions than gpuqd keeps: 1-D, for every process
            assert client.get_array(name, dtype=np.complex64).shape == (a.size,)
            return
        with daemon.client() as other:
            for c in (client, other):
                back = c.get_array(name, dtype=np.complex64)
                assert back.shape == a.shape and np.array_equal(back, a)
                assert c.get_array(name).shape == raw  # bytes, as uint8
                assert c.get_array(name, dtype=np.float32).shape == a.view(np.float32).shape
            assert other.buffer(name).shape == raw
    finally:
        client.free(name)


def test_raw_bytes_go_into_a_buffer_of_another_dtype(client, name, daemon):
    """Into a buffer of f32: the shape gpuqd keeps is in f32 elements (a uint8
    array's was sent in bytes, and refused as the wrong count)."""
    client.alloc(name, (3, 4), np.float32)
    try:
        raw = np.arange(48, dtype=np.uint8)
        client.put_array(name, raw, dtype="bytes")
        assert np.array_equal(client.get_array(name, dtype=np.uint8), raw)
        c = (np.arange(6) * 1j).astype(np.complex64).reshape(2, 3)
        client.put_array(name, c, dtype="bytes")
        with daemon.client() as other:
            assert other.buffer(name).shape == (2, 6)
            back = other.get_array(name, dtype=np.complex64)
            assert back.shape == (2, 3) and np.array_equal(back, c)
    finally:
        client.free(name)

def test_shape_is_kept_by_the_daemon(client, name, daemon):
    a = random_bits("float32", 2 * 3 * 5, seed=1).reshape(2, 3, 5)
    client.put_array(f"{name}@0", a)
    try:
        assert client.get_array(name).shape == (2, 3, 5)
        assert client.get_array(name, shape=(6, 5)).shape == (6, 5)
        with daemon.client() as other:  # another process gets the array it was given
            assert other.get_array(name).shape == (2, 3, 5)
            assert other.buffer(name).shape == (2, 3, 5)
        with pytest.raises(gpuq.BadRequest, match="shape"):
            client.get_array(name, shape=(7, 5))
    finally:
        client.free(name)
    assert f"{name}@0" not in client._shapes


def test_a_shape_may_leave_one_dimension_to_infer(client, name):
    """-1 as numpy's reshape takes it (it was refused: "shape (2, -1) holds -2 elements")."""
    client.put_array(name, np.arange(12, dtype=np.float32))
    try:
        assert client.get_array(name, shape=(2, -1)).shape == (2, 6)
        assert client.get_array(name, shape=(-1, 3, 2)).shape == (2, 3, 2)
        assert client.get_array(name, shape=-1).shape == (12,)
        for bad, why in (((5, -1), "its 12 elements are not a multiple of 5"),
                         ((0, -1), "its 12 elements are not a multiple of 0"),
                         ((-1, -1), "one may be -1"), ((2, -6), "one may be -1"),
                         ((5, 2), "holds 10 elements")):
            with pytest.raises(gpuq.BadRequest, match=re.escape(why)):
                client.get_array(name, shape=bad)
    finally:
        client.free(name)


def test_non_contiguous_and_big_endian_arrays(client, name):
    a = random_bits("float64", 64 * 3, seed=2).reshape(64, 3)
    col = a[::2, 1]
    client.put_array(name, col)
    assert np.array_equal(bits(client.get_array(name)), bits(np.ascontiguousarray(col)))
    client.free(name)
    be = np.arange(100, dtype=">i4")
    client.put_array(name, be)
    try:
        back = client.get_array(name)
        assert back.dtype == np.int32 and back.tolist() == list(range(100))
    finally:
        client.free(name)


@pytest.mark.parametrize("kind,as_bytes", [
    ("<i4", False), (">i4", False), ("<f8", False), (">f8", False),
    ("<i4", True), (">i4", True), (">f8", True), ("<u4", True), (">u4", True),
    (">c8", True)])
def test_byte_orders_round_trip(client, name, kind, as_bytes):
    """Every array is stored in the machine's byte order, raw bytes too, and read
    back in the order asked for: get_array(dtype=a.dtype) gives a's values in
    a's dtype, as a new array or into out= (a big-endian dtype read the stored
    bytes unswapped: [0 16777216 ...] for arange)."""
    a = np.arange(-3, 6).astype(kind)
    native = a.dtype.newbyteorder("=")
    client.put_array(name, a, dtype="bytes" if as_bytes else None)
    try:
        back = client.get_array(name, dtype=a.dtype)
        assert back.dtype == a.dtype and back.tolist() == a.tolist()
        assert client.get_array(name, dtype=native).tolist() == a.tolist()
        stored = client.get_array(name)
        assert stored.tobytes() == a.astype(native).tobytes()  # the machine's order
        out = np.zeros(a.shape, a.dtype)
        assert client.get_array(name, out=out, dtype=a.dtype) is out
        assert out.tolist() == a.tolist()
        if not as_bytes:  # out= of the buffer's dtype in either order
            out = np.zeros(a.shape, a.dtype)
            assert client.get_array(name, out=out) is out and out.tolist() == a.tolist()
    finally:
        client.free(name)


def test_an_existing_buffer_must_match(client, name):
    client.alloc(name, count=10, dtype="f32")
    try:
        client.fill(name, "value", value=3)
        with pytest.raises(gpuq.BadRequest, match=r"holds 10 f32 .*the array is 10 f64"):
            client.put_array(name, np.zeros(10))
        with pytest.raises(gpuq.BadRequest, match="holds 10 f32 .*the array is 11 f32"):
            client.put_array(name, np.zeros(11, np.float32))
        assert client.get_array(name).tolist() == [3.0] * 10  # untouched
        client.put_array(name, np.ones(10, np.float32))  # a match goes in
        assert client.get_array(name).tolist() == [1.0] * 10
    finally:
        client.free(name)


def test_out_arrays(client, name):
    a = random_bits("int64", 1001, seed=4)
    client.put_array(name, a)
    try:
        plain = np.empty(1001, np.int64)
        assert client.get_array(name, out=plain) is plain
        assert np.array_equal(plain, a)
        shared = gpuq.memfd_array((7, 143), np.int64)
        assert client.get_array(name, out=shared) is shared
        assert np.array_equal(shared.ravel(), a)
        for bad in (np.empty(1000, np.int64), np.empty(1001, np.int32),
                    np.empty((1001, 2), np.int64)[:, 0]):
            with pytest.raises(gpuq.BadRequest, match="out="):
                client.get_array(name, out=bad)
        # Each refusal says which rule the array broke.
        read_only = np.empty(1001, np.int64)
        read_only.flags.writeable = False
        for bad, why in ((read_only, "out= is read-only"),
                         (np.empty((1001, 2), np.int64)[:, 0], "out= is not C-contiguous"),
                         (np.empty((7, 143), np.int64, order="F"), "out= is not C-contiguous"),
                         (np.empty(1001, np.int32), "array of 1001 int64 elements for buffer "
                                                    f"'{name}@0', not 1001 int32 elements"),
                         ([0] * 1001, "not a list")):
            with pytest.raises(gpuq.BadRequest, match=re.escape(why)):
                client.get_array(name, out=bad)
    finally:
        client.free(name)


def test_memfd_arrays_travel_without_a_client_side_copy(client, name, monkeypatch):
    def no_copy(*a, **kw):
        raise AssertionError("copied into a fresh memfd")
    shared = gpuq.memfd_array(5000, np.float32)
    shared[:] = np.arange(5000, dtype=np.float32)
    assert memfd.find(shared) is not None and memfd.find(np.zeros(3)) is None
    monkeypatch.setattr(memfd, "from_bytes", no_copy)
    client.put_array(name, shared[1000:2000])  # a view at an offset into the memfd
    try:
        back = gpuq.memfd_array(1000, np.float32)
        assert client.get_array(name, out=back) is back
        assert memfd.find(back) is not None
        assert back.tolist() == list(range(1000, 2000))
        back *= 2
        client.put_array(name, back)
        assert client.get_array(name)[:3].tolist() == [2000.0, 2002.0, 2004.0]
        client.put(shared[:1000], name)  # put takes memfd arrays as bytes, too
        assert client.get_array(name)[-1] == 999.0
    finally:
        client.free(name)
    with pytest.raises(AssertionError, match="copied"):
        client.put_array(name, np.zeros(4, np.float32))  # a plain array is copied


def test_names_for_arrays(client, name):
    with pytest.raises(gpuq.BadRequest, match="range"):
        client.put_array(f"{name}[0:8]", np.zeros(4))
    with pytest.raises(gpuq.BadRequest, match="GPU"):
        client.get_array(f"{name}@x")
    with pytest.raises(gpuq.NotFound, match=name):
        client.get_array(name)
    n = len(client.devices())
    if n > 1:
        client.put_array(f"{name}@0", np.zeros(4))
        client.put_array(f"{name}@1", np.ones(4))
        try:
            with pytest.raises(gpuq.BadRequest, match="several devices"):
                client.get_array(name)
            assert client.get_array(f"{name}@1").tolist() == [1.0] * 4
        finally:
            client.free(f"{name}@0")
            client.free(f"{name}@1")


def test_an_empty_array_is_refused(client, name):
    """Before anything is sent, saying why (gpuqd said "field 'count': 0 is out of range")."""
    sent = _count_ops(client, "buffers") + _count_ops(client, "alloc")
    for empty in (np.zeros(0, np.float32), np.zeros((3, 0)), np.zeros((2, 0), np.complex64)):
        with pytest.raises(gpuq.BadRequest, match=r"is empty \(shape .*cannot be empty"):
            client.put_array(name, empty, dtype="bytes" if empty.dtype.kind == "c" else None)
    for shape, kw in (((0,), {}), ((4, 0), {}), (None, {"count": 0}), (None, {"bytes": 0})):
        with pytest.raises(gpuq.BadRequest, match="cannot be empty"):
            client.alloc(name, shape, "f4" if shape or "count" in kw else None, **kw)
    assert sent == []
    assert gpuq.memfd_array(0).shape == (0,)


def test_transfers_with_part_of_a_memfd_array_stay_inside_it(client, name):
    whole = gpuq.memfd_array(3000, np.uint8)
    whole[:] = 7
    data = np.random.default_rng(5).integers(0, 256, 1000, dtype=np.uint8)
    client.put_array(name, data, dtype="bytes")
    try:
        client.get(name, whole[1000:2000])  # bounded by the view, not the memfd
        assert np.array_equal(whole[1000:2000], data)
        assert set(whole[:1000].tolist()) == {7} == set(whole[2000:].tolist())
        whole[1000:2000] = 9
        client.get(f"{name}[0:500]", whole[1000:2000])  # a range: copied back, 500 bytes
        assert np.array_equal(whole[1000:1500], data[:500])
        assert set(whole[1500:2000].tolist()) == {9}
        client.put(whole[2000:2500], f"{name}[500:]")  # a range: its own exact memfd
        client.put(whole[:500], name, length=500)
        assert client.get_array(name).tolist() == [7] * 1000
        with pytest.raises(ValueError, match="more than"):
            client.put(whole[:10], name, length=11)
    finally:
        client.free(name)


def _count_ops(client, op):
    """Counts the requests ``op`` the client sends from now on (a list, one per call)."""
    seen = []
    call = client._conn.call

    def counting(c):
        if c.op == op:
            seen.append(c.fields)
        return call(c)
    client._conn.call = counting
    return seen


def test_put_and_get_array_look_a_buffer_up_once(daemon, name):
    with daemon.client() as c:
        a = np.arange(1000, dtype=np.float32)
        c.put_array(name, a)
        looked = _count_ops(c, "buffers")
        for _ in range(3):
            c.put_array(name, a)
            assert np.array_equal(c.get_array(name), a)
        assert looked == []
        c.free(name)


def test_a_buffer_made_anew_elsewhere_is_looked_up_again(daemon, name):
    """Freed and made again with another size and dtype by another client: this
    client's remembered row is stale, and put_array/get_array find the new one."""
    with daemon.client() as c, daemon.client() as other:
        c.put_array(name, np.arange(1000, dtype=np.float32))
        assert c.get_array(name).dtype == np.float32
        other.free(name)
        other.put_array(name, np.arange(10, dtype=np.int64))
        back = c.get_array(name)
        assert back.dtype == np.int64 and np.array_equal(back, np.arange(10))
        other.free(name)
        other.put_array(name, np.arange(300, dtype=np.float32))
        # The row this client keeps says i64 x 10: refused by it, then looked up
        # afresh, the refusal names what the buffer holds now.
        with pytest.raises(gpuq.BadRequest, match="holds 300 f32"):
            c.put_array(name, np.arange(5, dtype=np.int32))
        c.put_array(name, np.ones(300, dtype=np.float32))
        assert np.array_equal(other.get_array(name), np.ones(300, dtype=np.float32))
        c.free(name)


def test_free_through_this_client_forgets_the_buffer(daemon, name):
    with daemon.client() as c:
        c.put_array(name, np.arange(8, dtype=np.float64))
        c.free(name)
        c.put_array(name, np.arange(4, dtype=np.int32))
        back = c.get_array(name)
        assert back.dtype == np.int32 and np.array_equal(back, np.arange(4))
        c.free(name)


def test_a_transfer_that_fails_after_a_remembered_row_is_not_sent_again(daemon, name):
    """The retry after a remembered row is for a stale row (a buffer freed or made
    anew elsewhere), refused before any job: a put_array or get_array whose job
    timed out raises that job's Timeout, at its own timeout, and sends nothing
    more (it sent the job again, which ran later too, and waited twice)."""
    with daemon.client() as c:
        c.alloc(name, (4,), np.float32, shareable=True)
        c.put_array(name, np.ones(4, np.float32))  # the row is remembered
        puts, gets = _count_ops(c, "put"), _count_ops(c, "get")
        with c.attach(name):  # a lease: jobs on the buffer queue behind it
            start = time.monotonic()
            with pytest.raises(gpuq.Timeout) as put:
                c.put_array(name, np.full(4, 2, np.float32), timeout=0.5)
            with pytest.raises(gpuq.Timeout) as get:
                c.get_array(name, timeout=0.5)
            took = time.monotonic() - start
        assert len(puts) == 1 and len(gets) == 1, (puts, gets)
        assert took < 1.8, took  # each waited once
        assert put.value.job.wait(timeout=10).state == "done"
        assert get.value.job.wait(timeout=10).state == "done"
        assert c.get_array(name).tolist() == [2.0] * 4
        c.free(name)


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_arrays_get_array_returns_hold_no_descriptor(daemon, name):
    """A kept result of get_array is an ordinary array or a bare mapping: ~500 kept
    small results used to hold two descriptors each (a memfd mapping), enough to
    reach RLIMIT_NOFILE's usual 1024. Every path: small, the staging ring, a large
    get without the ring (a mapping of the memfd gpuqd wrote, its descriptor
    closed: no copy here), Buffer.get, a dtype of the other byte order."""
    small = np.arange(100, dtype=np.float32)
    large = np.arange(5 << 18, dtype=np.float32)  # 5 MiB: the ring's size
    mid = np.arange(1 << 18, dtype=np.int64)  # 2 MiB: a mapping, under the ring's size
    with daemon.client() as c, daemon.client(staging_slots=0) as plain:
        c.put_array(name, small)
        c.put_array(name + "L", large)
        c.put_array(name + "M", mid)
        try:
            for cl in (c, plain):  # warm: the ring, the lookups
                cl.get_array(name), cl.get_array(name + "L")
            before = _open_fds()
            kept = [c.get_array(name) for _ in range(20)]
            kept += [c.get_array(name, dtype=">f4") for _ in range(5)]
            kept += [c.buffer(name).get() for _ in range(5)]
            kept += [c.get_array(name + "L"), plain.get_array(name + "L")]
            kept += [c.get_array(name + "M") for _ in range(3)]
            assert _open_fds() == before
            for arr in kept[:30]:
                assert np.array_equal(arr, small) and memfd.find(arr) is None
            for arr in kept[30:]:
                assert np.array_equal(arr, large if arr.dtype == np.float32 else mid) and memfd.find(arr) is None
                assert arr.flags.writeable and arr.flags.c_contiguous

            def copied(*a, **kw):
                raise AssertionError("a large get copied its bytes once more")
            real = memfd.read_into
            memfd.read_into = copied
            try:
                again = plain.get_array(name + "L")
            finally:
                memfd.read_into = real
            again[:2] = -1  # a private array: the next get does not see it
            assert plain.get_array(name + "L")[0] == 0.0
            del kept, again
        finally:
            c.free(name)
            c.free(name + "L")
            c.free(name + "M")


def test_async_get_array_results_hold_no_descriptor(daemon, name):
    import asyncio

    async def main():
        async with gpuq.AsyncClient(daemon.socket) as ac:
            await ac.put_array(name, np.arange(10, dtype=np.int64))
            await ac.get_array(name)
            before = _open_fds()
            kept = await asyncio.gather(*(ac.get_array(name) for _ in range(20)))
            assert _open_fds() == before
            assert all(a.tolist() == list(range(10)) for a in kept)
            await ac.free(name)
    asyncio.run(main())
