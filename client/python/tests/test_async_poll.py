"""The AsyncClient's request that reads its own reply for a while (aio.py,
``poll_us``): answered so, it returns without a turn of the loop; the loop
still runs every LOOP_TURN_S; requests in flight together, replies with
descriptors or errors, and a connection that ends while a request reads all
behave as through the loop's reader.

``poll_us`` is set here whatever the machine (the default polls only on 4
CPUs or more): long enough (a second) that gpuqd's answer to a ping always
comes within it, so that the order of events is the same on a loaded
machine. Loop turns are counted, never timed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import gpuq
from gpuq import aio

POLL_US = 1e6


class _Turns:
    """A task that counts the loop's turns until stopped."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = False
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while not self._stop:
            await asyncio.sleep(0)
            self.count += 1

    async def stop(self) -> None:
        self._stop = True
        await self._task


async def _turns_from_here(c):
    """A turn counter started once ``c``'s connection is bound to the loop (a first
    ping), and its count then."""
    await c.ping()
    turns = _Turns()
    await asyncio.sleep(0)  # the counter runs once
    return turns, turns.count


def test_the_default_polls_on_four_cpus_or_more(monkeypatch):
    monkeypatch.setattr(aio.os, "sched_getaffinity", lambda pid: set(range(4)))
    assert aio.default_poll_s() == aio.DEFAULT_POLL_US * 1e-6
    monkeypatch.setattr(aio.os, "sched_getaffinity", lambda pid: {0, 1})
    assert aio.default_poll_s() == 0.0


@pytest.mark.parametrize("poll_us,turn_s,turns_least,turns_most", [
    (POLL_US, 3600.0, 0, 0),  # answered while they read: no turn of the loop
    (POLL_US, 0.0, 49, None),  # the loop's turn: before each but the first
    (0, 3600.0, 50, None),  # not polling: each waits on the loop
], ids=["polled", "polled-turning", "not-polled"])
def test_turns_of_the_loop_for_50_pings(daemon, monkeypatch, poll_us, turn_s, turns_least,
                                        turns_most):
    monkeypatch.setattr(aio, "LOOP_TURN_S", turn_s)

    async def main():
        async with gpuq.AsyncClient(daemon.socket, poll_us=poll_us) as c:
            assert c._conn.poll_s == poll_us * 1e-6
            turns, before = await _turns_from_here(c)
            for _ in range(50):
                assert (await c.ping())["version"] == 1
            turned = turns.count - before
            await turns.stop()
        assert turned >= turns_least and (turns_most is None or turned <= turns_most)
    asyncio.run(main())


def test_a_job_and_a_refusal_are_read_while_polling_too(daemon, monkeypatch):
    monkeypatch.setattr(aio, "LOOP_TURN_S", 3600.0)

    async def main():
        async with gpuq.AsyncClient(daemon.socket, poll_us=POLL_US) as c:
            turns, before = await _turns_from_here(c)
            assert (await c.noop()).state == "done"  # waited for
            with pytest.raises(gpuq.NotFound):
                await c.free("no-such-buffer")
            assert turns.count == before
            await turns.stop()
    asyncio.run(main())


def test_a_request_beside_another_in_flight_leaves_its_reply_to_the_loop(stalled,
                                                                        monkeypatch):
    s = stalled()
    polled = []
    real = aio.AsyncConnection._poll

    def counting(self, future):
        polled.append(len(self._d.pending))
        real(self, future)
    monkeypatch.setattr(aio.AsyncConnection, "_poll", counting)

    async def main():
        async with gpuq.AsyncClient(s.daemon.socket, poll_us=2e5) as c:
            waiting = asyncio.ensure_future(c.wait(s.job.id, timeout=30))
            await asyncio.sleep(0.3)  # its poll ran out: the loop waits for it now
            assert polled == [1]
            pings = await asyncio.gather(*(c.ping() for _ in range(8)))
            assert [p["version"] for p in pings] == [1] * 8
            assert polled == [1]  # none polled: the wait was in flight
            s.end()
            assert (await waiting).state == "done"
    asyncio.run(main())


def test_a_reply_with_a_descriptor_is_read_while_polling(daemon, name):
    async def main():
        async with gpuq.AsyncClient(daemon.socket, poll_us=POLL_US) as c:
            await c.alloc(name, count=16, dtype="f32", shareable=True)
            try:
                async with c.attach(f"{name}@0", mode="read") as att:
                    assert att.bytes == 64 and att.lease
            finally:
                await c.free(name)
    asyncio.run(main())


def test_a_connection_that_ends_while_a_request_reads_fails_it(fake):
    def closes(f, conn):
        f.read_request(conn)
        conn.close()

    async def main():
        async with gpuq.AsyncClient(fake(closes).socket, timeout=5, poll_us=POLL_US) as c:
            with pytest.raises(ConnectionError):
                await c.ping()
            assert c.closed
    asyncio.run(main())


def test_progress_events_and_the_reply_come_while_a_wait_reads(stalled):
    """A wait for a job that takes a while, answered within its (long) poll: the
    job's progress events reach the handler from the poll, then the reply."""
    s = stalled()

    def feed():  # progress comes once the job has run a second
        for _ in range(6):
            s.feed(b"z" * 100)
            time.sleep(0.25)
        s.end()

    async def main():
        async with gpuq.AsyncClient(s.daemon.socket, timeout=30, poll_us=10e6) as c:
            events = []
            feeder = threading.Thread(target=feed)
            feeder.start()
            try:
                done = await c.wait(s.job.id, timeout=30, on_progress=events.append)
            finally:
                feeder.join()
            assert done.state == "done" and done.result["bytes"] == 600
            assert events and all(e["job"] == s.job.id for e in events)
    asyncio.run(main())
