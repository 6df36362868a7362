"""Many requests in flight on one connection: threads, and asyncio tasks."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import gpuq


def test_threads_share_one_client(client, name):
    errors, results = [], {}

    def work(t):
        try:
            buf = f"{name}{t}"
            a = np.full(1000 + t, t, dtype=np.int32)
            for i in range(15):
                client.put_array(buf, a + i)
                assert client.get_array(buf).tolist() == (a + i).tolist()
                assert client.noop().state == "done"
                assert client.ping()["version"] == 1
            results[t] = client.checksum(buf).result["checksum"]
            client.free(buf)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 8 and len(set(results.values())) == 8


def test_a_wait_in_one_thread_does_not_hold_up_another(stalled):
    s = stalled()
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(s.job.wait(timeout=30)))
    waiter.start()
    others = [s.client.ping, s.client.buffers]  # answered by the daemon's main thread
    if len(s.client.devices()) > 1:
        others.append(lambda: s.client.noop(device=1, timeout=5))  # a job on another device
    for _ in range(20):  # the waiter's pending wait does not delay these replies
        for other in others:
            other()
    s.end()
    waiter.join(30)
    assert waited and waited[0].state == "done"


def test_asyncio_tasks_on_one_connection(daemon, name):
    async def main():
        async with gpuq.AsyncClient(daemon.socket) as c:
            jobs = await asyncio.gather(*(c.noop(detach=True) for _ in range(100)))
            assert len({j.id for j in jobs}) == 100
            done = await asyncio.gather(*(j.wait(timeout=30) for j in jobs))
            assert all(j.state == "done" for j in done)

            async def one(t):
                buf = f"{name}{t}"
                a = np.arange(t * 100, t * 100 + 77, dtype=np.int64)
                await c.put_array(buf, a)
                back = await c.get_array(buf)
                sums = await c.checksum(buf)
                await c.free(buf)
                return t, back.tolist() == a.tolist(), sums.result["checksum"]
            out = await asyncio.gather(*(one(t) for t in range(20)))
            assert all(ok for _, ok, _ in out) and len({s for _, _, s in out}) == 20
            assert (await c.ping())["version"] == 1
            assert isinstance(await c.devices(), list)
    asyncio.run(main())


def test_asyncio_job_methods_and_errors(daemon, name):
    async def main():
        c = gpuq.AsyncClient(daemon.socket)
        try:
            with pytest.raises(gpuq.NotFound):
                await c.free(name)
            job = await c.alloc(name, nbytes=64, detach=True)
            await job.wait(timeout=10)
            assert (await job.refresh()).state == "done"
            assert await job.cancel() is False
            assert (await c.status(job.id)).state == "done"
            assert job.id in [j.id for j in await c.jobs()]
            assert (await c.wait(job)).state == "done"
            await c.free(name)
            assert "gpuq_jobs_total" in await c.metrics()
        finally:
            await c.aclose()
        assert c.closed
        with pytest.raises(ConnectionError, match="closed"):
            await c.ping()
    asyncio.run(main())


def test_asyncio_one_request_methods_answer_as_the_sync_ones(daemon, client, name):
    """The methods that send one request on the connection themselves (ping, noop,
    checksum, lease_break...: aio_methods.py) return and raise what Client's do."""
    async def main():
        async with gpuq.AsyncClient(daemon.socket) as c:
            reply = await c.ping()
            assert set(reply) == set(client.ping()) and "id" not in reply
            job = await c.noop()
            assert isinstance(job, gpuq.Job) and job.state == "done" and job.op == "noop"
            queued = await c.noop(detach=True, priority="low")
            assert (await queued.wait(timeout=30)).state == "done"
            assert isinstance(await c.regions(), dict)
            for call in (lambda m: m.checksum(name), lambda m: m.lease_break(987654321),
                         lambda m: m.noop(device=999)):
                with pytest.raises(gpuq.NotFound) as sync_error:
                    call(client)
                with pytest.raises(gpuq.NotFound) as async_error:
                    await call(c)
                assert str(async_error.value) == str(sync_error.value)
            with pytest.raises(ValueError, match="detach=True"):
                await c.noop(detach=True, timeout=1)
            with pytest.raises(TypeError):
                await c.noop(op="ping")  # as the sync method: a field cannot be named op
            with pytest.raises(TypeError):
                client.noop(op="ping")
    asyncio.run(main())


def test_asyncio_a_reply_for_a_request_cancelled_as_it_came_is_let_go(daemon):
    """The reader routes a reply to its future, which a cancel may have ended
    just before (in the same turn of the loop, before the task's own turn to
    take the request off the books): the reply is let go, nothing raised."""
    async def main():
        loop = asyncio.get_running_loop()
        raised = []
        loop.set_exception_handler(lambda _, context: raised.append(context))
        async with gpuq.AsyncClient(daemon.socket) as c:
            await c.ping()
            task = asyncio.ensure_future(c.ping())
            await asyncio.sleep(0)  # sent; the task awaits its reply
            time.sleep(0.3)  # which is here by now, not read yet
            loop.call_soon(task.cancel)  # runs in the turn that reads it, before
            await asyncio.sleep(0)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert c._conn._d.pending == {}
            assert (await c.ping())["version"] == 1
        assert raised == []
    asyncio.run(main())


def test_asyncio_progress_and_a_wait_that_runs_out(stalled):
    s = stalled()
    job = s.job

    async def main():
        async with gpuq.AsyncClient(s.daemon.socket) as c:
            events = []
            waiting = asyncio.ensure_future(c.wait(job.id, timeout=30,
                                                   on_progress=events.append))
            with pytest.raises(gpuq.Timeout) as info:
                await c.wait(job.id, timeout=0.2)
            assert info.value.job.state == "running"
            for _ in range(5):
                s.feed(b"z" * 100)
                await asyncio.sleep(0.3)
            s.end()
            done = await waiting
            assert done.state == "done" and done.result["bytes"] == 500
            assert events and all(e["job"] == job.id for e in events)
    asyncio.run(main())


def test_asyncio_a_progress_handler_that_raises_fails_its_wait(stalled):
    s = stalled()

    class Enough(Exception):
        pass

    def handler(event):
        seen.append(event)
        raise Enough(event["bytes"])

    seen = []

    async def main():
        async with gpuq.AsyncClient(s.daemon.socket) as c:
            waiting = asyncio.ensure_future(c.wait(s.job.id, timeout=30, on_progress=handler))
            for _ in range(10):
                s.feed(b"z" * 100)
                await asyncio.sleep(0.3)
                if waiting.done():
                    break
            with pytest.raises(Enough):
                await waiting
            assert len(seen) == 1  # the events after it are let go
            assert c._conn._d.pending == {}
            s.end()
            assert (await c.wait(s.job.id, timeout=30)).state == "done"
    asyncio.run(main())


def test_asyncio_frames_the_socket_cuts_short_go_whole_and_in_turn(fake):
    # Frames larger than the socket's buffer, sent by tasks at once beside small
    # ones while the daemon reads nothing yet: each frame goes out whole before
    # another starts (one cut short holds the send turn), so every request
    # arrives intact and each task gets its own reply.
    big = 6
    pads = [chr(ord("a") + i) * (700 << 10) for i in range(big)]

    def handler(f, conn):
        time.sleep(0.3)  # the client's socket buffer fills meanwhile
        for _ in range(big + 4):
            req = f.read_request(conn)
            pad = req.get("pad", "")
            f.reply(conn, req, first=pad[:1], length=len(pad), whole=pad == pad[:1] * len(pad))
        time.sleep(1)
    srv = fake(handler)

    async def main():
        async with gpuq.AsyncClient(srv.socket, timeout=10) as c:
            calls = [c.request("ping", pad=p) for p in pads] + [c.ping() for _ in range(4)]
            return await asyncio.gather(*calls)
    out = asyncio.run(main())
    for pad, reply in zip(pads, out):
        assert (reply["first"], reply["length"], reply["whole"]) == (pad[0], len(pad), True)
    assert all(reply["length"] == 0 for reply in out[big:])
    assert len(srv.requests) == big + 4
