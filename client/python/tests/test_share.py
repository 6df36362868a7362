"""Regions and attached buffers from Python: a region's bytes round trip through
a buffer with one DMA each way; an attached buffer holds gpuqd's jobs on it
until released. The CUDA tier attaches through the driver and checks with
CuPy when it is installed (skipped otherwise, saying so)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gpuq
from conftest import BACKEND


def _require_memlock(client, nbytes):
    limit = client.regions().get("memlock_limit")
    if limit is not None and limit < nbytes:
        pytest.skip(f"gpuqd's RLIMIT_MEMLOCK here is {limit} bytes, less than this test pins")


def test_region_round_trip_is_bit_exact(client, name):
    _require_memlock(client, 2 << 20)
    region = client.region_create(name, 1 << 20)
    try:
        data = region.array("u1")
        data[:] = np.random.default_rng(3).integers(0, 256, data.size, dtype=np.uint8)
        client.alloc(name, nbytes=1 << 20)
        # ref() writes a Python slice: bytes 4097 up to 104100.
        assert region.ref(4097, 100003) == f"{name}[4097:104100]"
        job = client.put(None, name, region=region.ref(4097), length=100003)
        assert job.result["path"] == "region" and job.result["bytes"] == 100003
        back = client.get_array(name, dtype="u1")
        assert np.array_equal(back[:100003], data[4097:4097 + 100003])
        data[:] = 0
        client.get(f"{name}[0:4096]", None, region=region.ref(1))
        assert np.array_equal(data[1:4097], back[:4096]) and data[0] == 0
        assert any(r["name"] == name for r in client.regions()["regions"])
        again = client.region_open(name)
        assert bytes(again.view[1:4097]) == bytes(back[:4096])
        again.unmap()
        client.free(name)
    finally:
        region.unmap()
        client.region_free(name)


def test_region_refusals_raise_their_codes(client, name):
    with pytest.raises(gpuq.BadRequest, match="multiple of the page size"):
        client.region_create(name, 1000)
    with pytest.raises(gpuq.NotFound):
        client.put(None, "nothing", region="no-such-region")


def _require_cupy():
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # no cupy, or no usable GPU for it
        pytest.skip(f"the CUDA attach check uses CuPy: {exc}")
    return cupy


def _waits_behind_lease(client, job) -> bool:
    for _ in range(200):
        if client.status(job).record.get("waiting_reason") == "lease":
            return True
        time.sleep(0.01)
    return False


def test_attach_holds_jobs_until_released(client, daemon, name):
    count = (1 << 20) // 4
    client.alloc(name, count=count, dtype="f32", shareable=True)
    client.fill(name, "value", value=1.5)
    other = daemon.client()
    att = client.attach(name)
    try:
        assert att.lease > 0 and att.count == count and att.dtype == "f32"
        waiting = other.checksum(name, detach=True)
        if att.host:
            view = att.array()
            assert view[0] == 1.5
            view[:] = 2.5
        else:
            cupy = _require_cupy()
            arr = cupy.asarray(att)
            assert float(arr[0]) == 1.5
            arr += 1.0
            cupy.cuda.Device().synchronize()
        assert _waits_behind_lease(other, waiting)
    finally:
        client.release(att)
    expected = np.full(count, 2.5, dtype=np.float32)
    client.put_array(name + "x", expected)
    assert other.wait(waiting).result["checksum"] == client.checksum(name + "x").result["checksum"]
    assert np.array_equal(client.get_array(name), expected)
    other.close()
    client.free(name)
    client.free(name + "x")


def test_attach_refuses_a_pool_buffer(client, name):
    client.alloc(name, nbytes=4096)
    try:
        with pytest.raises(gpuq.BadRequest, match="not shareable"):
            client.attach(name)
    finally:
        client.free(name)


def _lease(client, label, mode="read-write"):
    """What put_array and get_array of a device array take: a lease and a kept mapping."""
    from gpuq import device_arrays
    lease, _, att = client._drive(device_arrays._lease_plan(client, label, mode, None))
    return lease, att


def test_a_kept_mapping_is_reused_only_for_the_same_buffer(daemon, name):
    """put_array/get_array of device arrays keep a buffer's mapping across leases;
    a buffer freed and made anew under the same name and size (another
    generation) is mapped afresh, never through the old mapping."""
    with daemon.client() as c, daemon.client() as other:
        c.alloc(name, count=1024, dtype="f32", shareable=True)
        rows = {b["name"]: b for b in c.buffers()}
        assert isinstance(rows[name]["generation"], int)
        lease, first = _lease(c, f"{name}@0")
        c.request("release", lease=lease)
        lease, again = _lease(c, f"{name}@0", "read")
        c.request("release", lease=lease)
        assert again is first and first.ptr
        # Freed and made again by another client: same name, size and device.
        other.free(name)
        other.alloc(name, count=1024, dtype="f32", shareable=True)
        assert {b["name"]: b for b in other.buffers()}[name]["generation"] != \
            rows[name]["generation"]
        other.fill(name, "value", value=7.0)
        lease, fresh = _lease(c, f"{name}@0", "read")
        try:
            assert fresh is not first and first.ptr == 0  # the old one is unmapped
            if fresh.host:
                assert fresh.array()[0] == 7.0
        finally:
            c.request("release", lease=lease)
        # free through this client forgets it; close unmaps what is left.
        c.free(name)
        assert c._mappings == {} and fresh.ptr == 0
        c.alloc(name, count=16, dtype="f32", shareable=True)
        lease, last = _lease(c, f"{name}@0")
        c.request("release", lease=lease)
        other.free(name)  # by another client: this one keeps its mapping till close
        c.close()
        assert last.ptr == 0


def _release_unawaited(lease, replies):
    """A plan that sends a release without waiting for it, as a copy's own lease
    ends; ``replies`` gets what the plan was handed back (nothing)."""
    from gpuq.dispatch import Call
    replies.append((yield Call("release", {"lease": lease}, await_reply=False)))
    return lease


def test_a_release_not_waited_for_ends_the_lease_before_the_next_request(daemon, name):
    """A device copy's release goes out without waiting for its reply: the plan
    goes on at once, the next request on the connection (sync or asyncio)
    already finds the lease gone, and the reply dropped on the way (even a
    refusal: the lease was not held any more) leaves nothing pending."""
    import asyncio
    import os

    from gpuq.dispatch import Call
    with daemon.client() as c:
        c.alloc(name, count=1024, dtype="f32", shareable=True)
        try:
            lease, _ = _lease(c, f"{name}@0")
            replies = []
            assert c._drive(_release_unawaited(lease, replies)) == lease
            assert replies == [None]
            assert [row["lease"] for row in c.leases()] == []  # read after the release
            c._drive(_release_unawaited(lease, replies))  # not held: not_found, dropped
            assert c.ping()["pid"] and c._conn._d.pending == {}

            async def asynchronously():
                async with gpuq.AsyncClient(daemon.socket) as a:
                    reply = await a._call(Call("attach", {"buffer": f"{name}@0", "wait": True},
                                               waits=True))
                    for fd in reply.get("_fds") or []:
                        os.close(fd)
                    held = reply["job"]["result"]["lease"]
                    assert [row["lease"] for row in await a.leases()] == [held]
                    await a._drive(_release_unawaited(held, replies))
                    assert [row["lease"] for row in await a.leases()] == []
                    await a.ping()
                    return a._conn._d.pending
            assert asyncio.run(asynchronously()) == {}
            assert replies == [None, None, None]
        finally:
            c.free(name)


def test_a_broken_lease_makes_the_kept_mapping_stale(daemon, name):
    import os
    if os.geteuid() != 0:
        pytest.skip("lease_break needs root or the admin group")
    with daemon.client() as c, daemon.client() as admin:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        lease, att = _lease(c, f"{name}@0")
        admin.lease_break(lease)
        c.ping()  # the event is read with the next reply
        assert f"{name}@0" not in c._mappings and att in c._stale_mappings
        lease, fresh = _lease(c, f"{name}@0")
        c.request("release", lease=lease)
        assert fresh is not att
        c.free(name)


def test_an_attachment_the_client_holds_serves_its_device_copies_until_released(client,
                                                                                name):
    from gpuq.device_arrays import held_attachment
    client.alloc(name, count=1024, dtype="f32", shareable=True)
    label = f"{name}@{client.buffer(name).device}"
    try:
        assert held_attachment(client, label, write=False) is None
        with client.attach(name, mode="read") as r:
            # A read lease serves gets only; another buffer's never.
            assert held_attachment(client, label, write=False) is r
            assert held_attachment(client, label, write=True) is None
            assert held_attachment(client, f"{name}x@0", write=False) is None
        assert held_attachment(client, label, write=False) is None  # released
        with client.attach(name) as w:
            assert held_attachment(client, label, write=True) is w
            # A broken lease (the event gpuqd sends its holder) ends that at once.
            client._notice({"event": "lease_broken", "lease": w.lease, "buffer": name})
            assert held_attachment(client, label, write=True) is None
        with client.attach(name) as w:
            assert held_attachment(client, label, write=True) is w
            freed = client.free(name, detach=True)  # waits for the lease; forgotten now
            assert held_attachment(client, label, write=True) is None
        assert freed.wait().state == "done"
    finally:
        if any(b["name"] == name for b in client.buffers()):
            client.free(name)


def _behind_a_stalled_put(c, name):
    """A shareable buffer ``name`` with a put from a pipe nobody feeds yet on it:
    an attach waits behind it. Returns the put's job and the pipe's write end."""
    import os
    c.alloc(name, bytes=1 << 16, shareable=True)
    r, w = os.pipe()
    try:
        return c.put(r, name, detach=True), w
    finally:
        os.close(r)  # the daemon has its own


def _attach_waiting(client) -> bool:
    return any(j.op == "attach" and not j.finished for j in client.jobs())


def _until_no_lease(leases, deadline_s=30.0):
    deadline = time.monotonic() + deadline_s
    while leases():
        assert time.monotonic() < deadline, "the lease granted after the caller gave up stayed"
        time.sleep(0.02)


def test_an_attach_given_up_gives_back_the_lease_granted_later(daemon, name):
    """Ctrl-C while an attach waits: gpuqd grants its lease when the jobs before it
    end, and before this nobody knew it was held, so the buffer's jobs waited
    for it as long as the connection lived. Its descriptor is closed too."""
    import os
    import signal
    import threading
    with daemon.client(timeout=10) as c:
        stall, w = _behind_a_stalled_put(c, name)
        fds = len(os.listdir("/proc/self/fd"))
        main = threading.get_ident()

        def interrupt():  # once the attach is queued, the main thread waits for it
            with daemon.client() as other:
                while not _attach_waiting(other):
                    time.sleep(0.01)
            signal.pthread_kill(main, signal.SIGINT)
        threading.Thread(target=interrupt).start()
        with pytest.raises(KeyboardInterrupt):
            c.attach(name)
        os.write(w, bytes(1 << 16))
        os.close(w)
        stall.wait()  # its reads bring the attach's late reply: the lease goes back
        _until_no_lease(c.leases)
        for t in threading.enumerate():
            if t.name == "gpuq-apart":
                t.join(10)
        assert c.checksum(name, timeout=10).state == "done"
        assert len(os.listdir("/proc/self/fd")) <= fds
        c.free(name)


def test_an_async_attach_cancelled_gives_back_the_lease_granted_later(daemon, name):
    import asyncio
    import os

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            with daemon.client() as sync:
                stall, w = _behind_a_stalled_put(sync, name)
                task = asyncio.ensure_future(c.attach(name))
                while not _attach_waiting(sync):
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                os.write(w, bytes(1 << 16))
                os.close(w)
                stall.wait()
                deadline = time.monotonic() + 30
                while await c.leases():  # the loop reads the late reply meanwhile
                    assert time.monotonic() < deadline, "the lease stayed"
                    await asyncio.sleep(0.02)
                assert (await c.checksum(name, timeout=10)).state == "done"
                await c.free(name)
    asyncio.run(main())


def test_an_attach_whose_timeout_runs_out_is_given_up(daemon, name):
    """attach(timeout=) behind a put that stalls: Timeout, and no lease is left,
    neither waiting nor granted once the put ends."""
    import os
    with daemon.client(timeout=10) as c:
        stall, w = _behind_a_stalled_put(c, name)
        with pytest.raises(gpuq.Timeout, match="given up"):
            c.attach(name, timeout=0.3)
        assert c.leases() == []
        os.write(w, bytes(1 << 16))
        os.close(w)
        stall.wait()
        assert c.leases() == []
        assert c.checksum(name, timeout=10).state == "done"
        c.free(name)


def test_an_async_clients_attachment_goes_in_async_with(daemon, name):
    """On an AsyncClient, attach (and Buffer.attach) returns what ``async with``
    takes as it is and what ``await`` takes, and a task too; the block's end
    releases the lease, so a free after it does not wait."""
    import asyncio

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            k = await c.alloc(name, (4,), np.float32, shareable=True)
            on_host = BACKEND == "host"  # a GPU attachment is device memory: no .array()
            async with c.attach(name) as a:
                assert isinstance(a, gpuq.Attachment) and a.lease > 0
                if on_host:
                    a.array()[:] = 1.5
                assert [row["lease"] for row in await c.leases()] == [a.lease]
            assert a.ptr == 0 and await c.leases() == []
            async with k.attach(mode="read") as a:
                assert a.mode == "read"
                if on_host:
                    assert a.array().tolist() == [1.5] * 4
            async with await c.attach(name) as a:  # the older spelling
                assert a.lease > 0
            a = await asyncio.create_task(c.attach(name))
            await c.release(a)
            assert await c.leases() == []
            await asyncio.wait_for(k.free(), 10)
    asyncio.run(main())


def test_a_plain_with_on_an_async_clients_attachment_is_refused(daemon, name):
    """A sync ``with`` cannot await the release: it raises TypeError saying to use
    ``async with``, and leaks no lease (the buffer's free does not wait for ever)
    and no coroutine never awaited."""
    import asyncio
    import gc
    import warnings

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            k = await c.alloc(name, (4,), np.float32, shareable=True)
            gc.collect()  # earlier tests' garbage warns of itself here otherwise
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                with pytest.raises(TypeError, match="async with"):
                    with c.attach(name):  # not sent at all
                        pass
                assert await c.leases() == []
                with pytest.raises(TypeError, match="async with"):
                    with k.attach():
                        pass
                with pytest.raises(TypeError, match="async with"):
                    with await c.attach(name):  # granted: given back
                        pass
                gc.collect()
            assert [str(w.message) for w in seen] == []
            deadline = time.monotonic() + 10
            while await c.leases():
                assert time.monotonic() < deadline, "the lease stayed"
                await asyncio.sleep(0.02)
            assert c._held == {}
            await asyncio.wait_for(k.free(), 10)
    asyncio.run(main())


def test_an_async_clients_region_goes_in_async_with(daemon, name):
    """region_create is scoped as attach is: ``async with`` frees the region at the
    block's end; a plain ``with`` is refused and frees what it was given."""
    import asyncio

    with daemon.client() as sync:
        _require_memlock(sync, 1 << 16)

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            async with c.region_create(name, 4096) as r:
                assert isinstance(r, gpuq.share.Region) and r.array("u1").size == 4096
                assert [x["name"] for x in (await c.regions())["regions"]] == [name]
            assert r.view is not None and (await c.regions())["regions"] == []
            with pytest.raises(TypeError, match="async with"):
                with await c.region_create(name, 4096):
                    pass
            deadline = time.monotonic() + 10
            while (await c.regions())["regions"]:
                assert time.monotonic() < deadline, "the region stayed"
                await asyncio.sleep(0.02)
    asyncio.run(main())


def test_release_takes_a_lease_id(daemon, name):
    """release(N) with a lease id from leases(): an attachment this client holds is
    unmapped and released; a lease of yours whose attachment is another
    client's (or was dropped) just ends. Anything else is a TypeError."""
    try:
        with daemon.client() as c, daemon.client() as other:
            c.alloc(name, count=4, dtype="f32", shareable=True)
            att = c.attach(name)
            assert [row["lease"] for row in c.leases()] == [att.lease]
            c.release(c.leases()[0]["lease"])
            assert c.leases() == [] and att.ptr == 0 and c._held == {}
            theirs = other.attach(name, mode="read")
            c.release(np.int64(theirs.lease))
            assert c.leases() == []
            for wrong in ("1", 1.0, True, None):
                with pytest.raises(TypeError, match="Attachment or a lease id"):
                    c.release(wrong)
    finally:  # the leases went with the connections
        with daemon.client() as c:
            c.free(name, timeout=10)


def _uses_of_an_attachment(att):
    """Every use of an attachment's memory, by name (each should refuse once it is gone)."""
    uses = {"array": att.array if att.host else None,
            "__dlpack__": att.__dlpack__, "__dlpack_device__": att.__dlpack_device__,
            "synchronize": att.synchronize, "with": lambda: att.__enter__()}
    if not att.host:
        uses["__cuda_array_interface__"] = lambda: att.__cuda_array_interface__
    return {k: v for k, v in uses.items() if v is not None}


def test_a_released_attachment_says_it_was_released_and_by_what(client, name):
    """Not "a GPU attachment is device memory" (the host backend's array() after
    release said so): every use says the attachment is gone, and what ended it."""
    client.alloc(name, (8,), np.float32, shareable=True)
    try:
        with client.attach(name) as att:
            if att.host:
                att.array()[:] = 1
        for use, call in _uses_of_an_attachment(att).items():
            with pytest.raises(ValueError, match=r"released by client\.release\(\)") as e:
                call()
            assert f"'{name}@0'" in str(e.value) and f"lease {att.lease}" in str(e.value), use
        att = client.attach(name)
        client.release(att.lease)  # by its lease id
        with pytest.raises(ValueError, match=r"released by client\.release\(\)"):
            att.__dlpack_device__()
        att = client.attach(name)
        att.unmap()  # the lease goes on
        with pytest.raises(ValueError, match=r"unmapped here by unmap\(\).*lease"):
            att.__dlpack__()
        client.release(att)
    finally:
        client.free(name)


def test_an_attachment_given_back_by_a_plain_with_says_so(daemon, name):
    import asyncio

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            await c.alloc(name, (4,), np.float32, shareable=True)
            att = await c.attach(name)
            with pytest.raises(TypeError, match="async with"):
                with att:
                    pass
            with pytest.raises(ValueError, match="released .*plain `with`"):
                att.__dlpack_device__()
            await c.free(name)
    asyncio.run(main())
