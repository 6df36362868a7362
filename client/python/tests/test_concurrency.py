"""Many requests in flight on one connection: threads, and asyncio tasks."""

from __future__ import annotations

import asyncio
import os
import signal
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


def test_an_async_clients_close_is_done_at_once_and_may_be_awaited(daemon):
    """close() closes at once, as Client's does, so a caller that does not await it
    (sync code, a finalizer) still closes; ``await client.close()`` works too, as
    every other method of the async client is awaited, and so does aclose()."""
    async def main():
        c = gpuq.AsyncClient(daemon.socket)
        await c.ping()
        done = c.close()
        assert c.closed
        assert await done is None
        assert await c.close() is None  # twice is fine
        c = gpuq.AsyncClient(daemon.socket)
        await c.aclose()
        assert c.closed
    asyncio.run(main())
    c = gpuq.AsyncClient(daemon.socket)
    c.close()  # outside any event loop: nothing to await, nothing left pending
    assert c.closed


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
        # Not reading for the reply after the send (poll_us=0): the loop's reader
        # is the one that routes it, as this test needs.
        async with gpuq.AsyncClient(daemon.socket, poll_us=0) as c:
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


def _in_child(work) -> int:
    """Runs ``work()`` in a forked child; its pid. The child's exit code says whether
    it passed; what it raised comes back through :func:`_reap`."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            work()
            code = 0
        except BaseException as exc:
            os.write(w, repr(exc).encode()[:4000])
        finally:
            os._exit(code)
    os.close(w)
    _children[pid] = r
    return pid


_children: dict = {}


def _reap(pid: int) -> None:
    r = _children.pop(pid)
    _, status = os.waitpid(pid, 0)
    why = os.read(r, 4096).decode()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0, why


def test_a_forked_child_connects_anew_beside_its_parent(daemon, name):
    """The child's requests never share the parent's connection (both talk at once
    here, each getting its own replies), and it makes a staging ring of its own."""
    with gpuq.Client(daemon.socket, timeout=10, staging_slots=2, staging_slot_bytes=1 << 20,
                     copy_threads=2) as c:
        a = np.arange((5 << 20) // 4, dtype=np.int32)  # staged: 4 MiB or more
        c.put_array(f"{name}p", a)
        ring = c.staging.region.name if c.staging.region is not None else None

        def child():
            for _ in range(200):
                job = c.noop()
                assert c.status(job.id).id == job.id
            assert np.array_equal(c.get_array(f"{name}p"), a)
            c.put_array(f"{name}c", a + 1)
            assert ring is None or c.staging.region.name != ring
        pid = _in_child(child)
        for _ in range(200):
            job = c.noop()
            assert c.status(job.id).id == job.id
        assert np.array_equal(c.get_array(f"{name}p"), a)
        _reap(pid)
        assert np.array_equal(c.get_array(f"{name}c"), a + 1)
        assert c.reconnects == 0
        c.free(f"{name}p")
        c.free(f"{name}c")


def test_a_forked_child_closing_its_client_leaves_the_parent_connected(daemon):
    """A shutdown() of the socket they share would end the parent's connection too."""
    with gpuq.Client(daemon.socket, timeout=10) as c:
        c.ping()

        def child():
            c.ping()
            c.close()
        _reap(_in_child(child))
        assert c.ping()["version"] == 1 and not c.closed


_PARENT = """
import os, sys
sys.path.insert(0, sys.argv[2])
import gpuq
c = gpuq.Client(sys.argv[1], timeout=10)
c.alloc(sys.argv[3], bytes=4096, ephemeral=True)
if os.fork() == 0:  # the child outlives its parent, holding nothing of its connection
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the test reads the parent's output to its end
    os.dup2(null, 2)
    os.read(0, 1)
    os._exit(0)
print("made", flush=True)
os._exit(0)  # no close(): the connection ends with the process's descriptor
"""


def test_the_parents_connection_ends_with_the_parent_not_its_child(daemon, name):
    """A child holding a copy of the parent's socket would keep the parent's
    connection open after the parent is gone: its ephemeral buffer would stay."""
    import subprocess
    import sys
    package = os.path.dirname(os.path.dirname(gpuq.__file__))
    r, w = os.pipe()
    run = subprocess.run([sys.executable, "-c", _PARENT, daemon.socket, package, f"{name}e"],
                         stdin=r, capture_output=True, text=True, timeout=60)
    os.close(r)
    try:
        assert run.stdout.strip() == "made", run.stderr
        with daemon.client() as other:
            deadline = time.monotonic() + 30
            while any(b["name"] == f"{name}e" for b in other.buffers()):
                assert time.monotonic() < deadline, "the parent's connection outlived it"
                time.sleep(0.02)
    finally:
        os.close(w)  # the child reads end of file and exits


def test_an_async_client_forked_connects_anew_in_the_childs_loop(daemon):
    c = gpuq.AsyncClient(daemon.socket, timeout=10)
    pid_here = asyncio.run(c.ping())["pid"]

    def child():
        async def main():
            assert (await c.ping())["pid"] == pid_here
            assert (await c.noop()).state == "done"
            await c.aclose()
        asyncio.run(main())
    _reap(_in_child(child))
    c.close()


def test_asyncio_requests_in_flight_arm_no_loop_timer(daemon):
    """Deadlines and liveness are kept by the client's clock thread (gpuq/watch.py):
    a timer armed on the loop would cost every turn of it, so every request."""
    async def main():
        loop = asyncio.get_running_loop()
        async with gpuq.AsyncClient(daemon.socket) as c:
            for _ in range(3):
                await c.ping()
                await c.noop()  # a wait for a job: liveness applies
            ping, noop = asyncio.ensure_future(c.ping()), asyncio.ensure_future(c.noop())
            await asyncio.sleep(0)  # both sent, their replies not yet read
            armed = [h for h in loop._scheduled if not h.cancelled()]  # CPython's heap
            await ping
            await noop
        return armed
    assert asyncio.run(main()) == []


def test_an_async_client_forked_still_times_out_in_the_child(stalled):
    """The clock thread does not come along into a forked child: the child's
    connection starts one of its own, and its requests still time out."""
    s = stalled(timeout=0.5)
    c = gpuq.AsyncClient(s.daemon.socket, timeout=0.5)
    asyncio.run(c.ping())  # the parent's clock runs
    s.daemon.proc.send_signal(signal.SIGSTOP)
    try:
        def child():
            async def main():
                t0 = time.monotonic()
                with pytest.raises(gpuq.ReplyTimeout):
                    await c.ping()
                assert 0.4 < time.monotonic() - t0 < 5
            asyncio.run(main())
        _reap(_in_child(child))
    finally:
        s.daemon.proc.send_signal(signal.SIGCONT)
    c.close()
