"""The whole protocol as methods, in numpy's vocabulary: every op of
docs/protocol.md has one, expressions and reductions return what a Python
user expects, dtypes take every spelling, buffers are objects."""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings

import numpy as np
import pytest

import gpuq
from gpuq.ops import OP_METHODS
from conftest import REPO

#: Headings of docs/protocol.md that name things that are not ops.
NOT_OPS = {"peer_path", "permission_denied"}


def protocol_ops():
    """Every op docs/protocol.md documents: the backticked names of its headings."""
    ops = set()
    for line in (REPO / "docs" / "protocol.md").read_text().splitlines():
        if line.startswith("### "):
            ops.update(re.findall(r"`([a-z_0-9]+)`", line))
    return sorted(ops - NOT_OPS)


def test_every_op_of_the_protocol_has_a_method():
    ops = protocol_ops()
    assert len(ops) >= 40 and "reduce_expr" in ops and "group" in ops
    missing = [op for op in ops
               if not callable(getattr(gpuq.Client, OP_METHODS.get(op, op), None))]
    assert missing == [], f"ops without a method: {missing}"
    for op in ops:  # the async client's are coroutine functions of the same signature
        method = OP_METHODS.get(op, op)
        sync, coro = getattr(gpuq.Client, method), getattr(gpuq.AsyncClient, method)
        sig = inspect.signature(coro)
        if method in ("attach", "region_create"):  # share.Scoped: async with takes it too
            assert sig.return_annotation == \
                f"'share.Scoped[{inspect.signature(sync).return_annotation[1:-1]}]'"
            sig = sig.replace(return_annotation=inspect.signature(sync).return_annotation)
        else:
            assert inspect.iscoroutinefunction(coro), method
        assert inspect.signature(sync) == sig, method
        assert coro.__doc__ == sync.__doc__, method


def test_expressions_and_reductions(client, name):
    x = np.arange(1000, dtype=np.float32)
    client.put_array(f"{name}x", x)
    client.put_array(f"{name}y", np.ones(1000, np.float32))
    try:
        job = client.expr(f"{name}y = 2 * {name}x + {name}y")
        assert job.state == "done"
        assert np.array_equal(client.get_array(f"{name}y"), 2 * x + 1)
        total = client.reduce(f"sum({name}x)")
        assert isinstance(total, float) and total == float(x.sum())
        assert client.reduce(f"sum(abs({name}x - {name}y))") == float(np.abs(x - (2 * x + 1)).sum())
        at = client.reduce(f"argmax({name}x)")
        assert isinstance(at, int) and at == 999
        assert client.reduce(f"count_nonzero({name}x)", count=10) == 9
        client.run(f"{name}y = {name}x + 1")  # run takes an expression too
        assert client.reduce(f"max({name}y)") == 1000.0
        with pytest.raises(ValueError, match="expression"):
            client.run(f"{name}y")
    finally:
        client.free(f"{name}x")
        client.free(f"{name}y")


def test_collectives_as_methods(client, name):
    n = len(client.devices())
    if n < 2:
        pytest.skip("needs two devices")
    for dev in (0, 1):
        client.put_array(f"{name}@{dev}", np.full(8, dev + 1, np.float32))
    try:
        assert client.allreduce(name, devices=[0, 1]).result["collective"] == "allreduce"
        assert client.get_array(f"{name}@1").tolist() == [3.0] * 8
        client.broadcast(name, root=1, devices=[0, 1])
        client.reduce_collective(name, root=0, devices=[0, 1], reduce="max")
        job = client.group([{"op": "allreduce", "buffer": name}], devices=[0, 1])
        assert job.result["collective"] == "group"
    finally:
        for dev in (0, 1):
            client.free(f"{name}@{dev}")


def test_benchmarks_return_their_tables(client):
    table = client.bench_copy(sizes=[1 << 20], repeats=1)
    assert isinstance(table, dict) and table["rows"]
    assert {"group", "bytes", "method", "gbps"} <= set(table["rows"][0])


def test_my_quota(client):
    mine = client.my_quota()
    assert "limits" in mine and "used" in mine


@pytest.mark.parametrize("dtype", [np.float32, "float32", "f4", np.dtype("<f4"), "f32"])
def test_dtypes_in_every_spelling(client, name, dtype):
    buf = client.alloc(name, (2, 5), dtype)
    try:
        assert isinstance(buf, gpuq.Buffer)
        assert buf.dtype == np.float32 and buf.shape == (2, 5) and buf.nbytes == 40
        assert buf.gpuq_dtype == "f32" and buf.ref == f"{name}@0"
        assert repr(buf) == f"<gpuq.Buffer {name}@0 float32 shape=(2, 5) 40 B>"
        assert client.buffer(name).shape == (2, 5)  # gpuqd keeps the shape
    finally:
        client.free(name)


def test_dtype_names():
    assert [gpuq.gpuq_dtype(d) for d in (np.uint8, "int32", "i8", "half", np.float64,
                                         "bf16", "bytes")] == \
        ["u8", "i32", "i64", "f16", "f64", "bf16", "bytes"]

    class FakeTorchDtype:  # torch's dtypes print as torch.NAME
        def __str__(self) -> str:
            return "torch.bfloat16"
    assert gpuq.gpuq_dtype(FakeTorchDtype()) == "bf16"
    with pytest.raises(gpuq.BadRequest, match="int16"):
        gpuq.gpuq_dtype(np.int16)
    with pytest.raises(ValueError):  # BadRequest is a ValueError too
        gpuq.gpuq_dtype("float128")


def test_dtype_objects_named_again_come_from_the_kept_names():
    from gpuq import dtypes
    dtypes._KNOWN.clear()  # whatever earlier tests named
    for _ in range(2):  # the second time from _KNOWN
        assert [gpuq.gpuq_dtype(d) for d in (np.dtype("<f4"), np.float32, np.dtype("int64"))] \
            == ["f32", "f32", "i64"]
    assert np.dtype("<f4") in dtypes._KNOWN
    for _ in range(2):  # refusals are not kept: each says why again
        with pytest.raises(gpuq.BadRequest, match=">f4"):
            gpuq.gpuq_dtype(np.dtype(">f4"))
    assert np.dtype(">f4") not in dtypes._KNOWN

    class Fresh:  # a caller making new dtype objects without end
        def __str__(self) -> str:
            return "torch.float16"
    for _ in range(3 * dtypes._KNOWN_MOST):
        assert gpuq.gpuq_dtype(Fresh()) == "f16"
    assert len(dtypes._KNOWN) <= dtypes._KNOWN_MOST


def test_alloc_takes_the_protocols_words(client, name):
    assert client.alloc(name, bytes=1024).nbytes == 1024
    client.free(name)
    assert client.alloc(name, count=10, dtype=np.float32).shape == (10,)
    client.free(name)
    job = client.alloc(name, bytes=64, detach=True)
    assert isinstance(job, gpuq.Job)
    job.wait()
    client.free(name)
    with pytest.raises(ValueError, match="shape"):
        client.alloc(name, (2, 2), count=5, dtype="f32")


def test_buffer_objects(client, name):
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    client.put_array(name, a)
    buf = client.buffer(name)
    assert (buf.name, buf.device, buf.dtype, buf.shape, buf.size) == \
        (name, 0, np.dtype(np.int64), (3, 4), 12)
    assert np.array_equal(buf.get(), a)
    buf.put(a * 2)
    assert np.array_equal(buf.get(), a * 2) and len(buf) == 3
    buf.free()
    with pytest.raises(gpuq.NotFound, match="your buffers"):
        client.buffer(name)
    with pytest.raises(gpuq.NotFound, match="your buffers"):
        client.get_array(name)


def test_a_freed_buffer_object_refuses_further_use(client, name):
    """Freed through it, a Buffer refuses every use, saying so, and its repr says
    freed (its put allocated the buffer again, and its get was NotFound)."""
    buf = client.alloc(name, (3, 4), np.float32, shareable=True)
    buf.free()
    assert buf.freed and repr(buf).endswith(" freed>")
    for use in (lambda: buf.put(np.ones((3, 4), np.float32)), buf.get, buf.attach,
                buf.free):
        with pytest.raises(gpuq.NotFound, match="was freed through this Buffer"):
            use()
    assert name not in {b["name"] for b in client.buffers()}


def test_a_buffer_object_does_not_allocate_its_buffer_again(client, daemon, name):
    """Freed another way (another Buffer, the client, another process), its put is
    NotFound as its get is: it allocated the buffer again."""
    buf = client.alloc(name, (3, 4), np.float32)
    with daemon.client() as other:
        other.free(name)
    with pytest.raises(gpuq.NotFound, match=name):
        buf.put(np.ones((3, 4), np.float32))
    assert name not in {b["name"] for b in client.buffers()}


def test_a_buffer_object_follows_its_own_puts(client, daemon, name):
    buf = client.alloc(name, (3, 4), np.float32)
    try:
        buf.put(np.ones(12, np.float32))
        assert buf.shape == (12,) == client.buffer(name).shape and len(buf) == 12
        buf.put(np.ones((2, 6), np.float32))
        assert buf.shape == (2, 6) and buf.row["shape"] == [2, 6]
    finally:
        buf.free()

    async def main():
        async with gpuq.AsyncClient(daemon.socket) as ac:
            abuf = await ac.alloc(name, (3, 4), np.float32)
            await abuf.put(np.ones(12, np.float32))
            assert abuf.shape == (12,)
            await abuf.free()
            assert abuf.freed
            with pytest.raises(gpuq.NotFound, match="freed"):
                await abuf.get()
    asyncio.run(main())

def test_the_older_argument_order_still_works(client, name):
    with pytest.warns(DeprecationWarning, match=r"put_array\(name, array\)"):
        client.put_array(np.ones(3, np.float32), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.get_array(name).tolist() == [1.0] * 3
    client.free(name)


def test_attachments_and_regions_are_context_managers(client, name):
    buf = client.alloc(name, (4, 4), np.float32, shareable=True)
    with buf.attach() as att:
        assert name in repr(att) and "lease" in repr(att)
        if att.host:
            att.array()[:] = 7
            assert np.from_dlpack(att).sum() == 112  # zero copy: the buffer's own bytes
            assert att.__dlpack_device__() == (1, 0)
    assert "released" in repr(att)
    assert np.array_equal(buf.get().reshape(-1), np.full(16, 7, np.float32)) or not att.host
    buf.free()
    limit = client.regions().get("memlock_limit")
    if limit is not None and limit < 8192:
        pytest.skip("gpuqd may not pin a page here")
    with client.region_create(name, 4096) as region:
        assert repr(region) == f"<gpuq.Region '{name}' 4096 bytes mapped>"
    assert all(r["name"] != name for r in client.regions()["regions"])


def test_torch_tensors(client, name):
    torch = pytest.importorskip("torch", reason="torch is not installed here (the GPU "
                                "machine's tests run it)")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    client.put_array(name, t)
    back = client.get_array(name)
    assert back.shape == (3, 4) and np.array_equal(back, t.numpy())
    out = torch.empty(3, 4)
    assert client.get_array(name, out=out) is out and torch.equal(out, t)
    client.free(name)
    b = torch.ones(5, dtype=torch.bfloat16)
    client.put_array(name, b)
    assert client.buffer(name).gpuq_dtype == "bf16"
    client.free(name)


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="torch is not installed here (the GPU "
                                "machine's tests run it)")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device here")
    return torch


def test_cuda_tensors_go_device_to_device(client, name):
    torch = _torch_cuda()
    t = torch.arange(1 << 16, dtype=torch.float32, device="cuda").reshape(256, 256)
    job = client.put_array(name, t)
    try:
        assert job.result["path"] == "device" and job.result["bytes"] == t.numel() * 4
        buf = client.buffer(name)
        assert buf.shareable and buf.shape == (256, 256) and buf.gpuq_dtype == "f32"
        out = torch.empty_like(t)
        assert client.get_array(name, out=out) is out and torch.equal(out, t)
        assert np.array_equal(client.get_array(name), t.cpu().numpy())
        with buf.attach() as a:
            seen = torch.from_dlpack(a)  # the buffer's own memory, no copy
            assert torch.equal(seen.reshape(256, 256).cpu(), t.cpu())
            # While the client holds the lease, its copies go through it.
            job = client.put_array(name, t * 2)
            assert job.result["path"] == "held"
            torch.cuda.synchronize()
            assert torch.equal(seen.reshape(256, 256), t * 2)
            assert client.get_array(name, out=out) is out and torch.equal(out, t * 2)
            # A view that steps over elements goes as its values, in C order, and
            # a tensor that requires grad as its data (the mapping's typed views).
            across = (t * 3).T
            assert client.put_array(name, across).result["path"] == "held"
            torch.cuda.synchronize()
            assert torch.equal(seen.reshape(256, 256), across.contiguous())
            assert client.put_array(name, (t * 5).requires_grad_()).result["path"] == "held"
            assert client.get_array(name, out=out) is out and torch.equal(out, t * 5)
            assert not out.requires_grad
        assert client.put_array(name, t).result["path"] == "device"
        with pytest.raises(gpuq.BadRequest):
            client.put_array(name, t[:10])  # the wrong size is refused, nothing sent
    finally:
        client.free(name)
    plain = f"{name}p"
    client.alloc(plain, (256, 256), torch.float32)  # not shareable: through the host
    try:
        client.put_array(plain, t)
        out = torch.zeros_like(t)
        client.get_array(plain, out=out)
        assert torch.equal(out, t)
    finally:
        client.free(plain)


def test_cupy_arrays_go_device_to_device(client, name):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed here (the GPU "
                               "machine's tests run it)")
    a = cupy.arange(4096, dtype=cupy.float64).reshape(64, 64)
    client.put_array(name, a)
    try:
        out = cupy.empty_like(a)
        client.get_array(name, out=out)
        assert bool((out == a).all())
        with client.buffer(name).attach(mode="read") as att:
            assert float(cupy.asarray(att).sum()) == float(a.sum())
    finally:
        client.free(name)
