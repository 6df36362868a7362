"""Client.set_reconnect and AsyncClient.set_reconnect: a gpuqd killed and started
again on the same socket, as systemd restarts a crashed one. Reads go again; a
job in flight does not, and says so; without it a lost connection stays an
error. A re-exec in place keeps the connection: nothing to reconnect."""

import asyncio
import signal
import subprocess
import threading
import time

import pytest

import gpuq
from conftest import BACKEND, GPUQD, Daemon


def crash_and_restart(d: Daemon) -> None:
    """SIGKILL (no goodbye, the socket file left behind), then a new gpuqd there."""
    d.proc.kill()
    d.proc.wait()
    argv = [str(GPUQD), "--backend", BACKEND, "--socket", d.socket, "--log-level", "warn"]
    with open(d.log, "a") as log:
        d.proc = subprocess.Popen(argv, stdout=log, stderr=log)
    d._wait_ready()


def test_off_by_default_a_lost_connection_stays_an_error(private_daemon):
    d = private_daemon()
    with d.client() as c:
        c.ping()
        crash_and_restart(d)
        with pytest.raises(ConnectionError):
            c.ping()
        assert c.reconnects == 0


def test_reads_go_again_on_a_new_connection(private_daemon):
    d = private_daemon()
    with d.client() as c:
        c.set_reconnect(20)
        c.ping()
        crash_and_restart(d)
        c.ping()  # sent again on a new connection, answered by the new daemon
        assert c.reconnects == 1
        c.alloc("after", bytes=4096)  # the new daemon serves the client as before
        assert c.buffer("after").nbytes == 4096
        assert c.reconnects == 1


def test_a_job_sent_after_an_idle_restart_goes_on_the_new_connection(private_daemon):
    """The client sat idle while gpuqd restarted: its next request finds the old
    connection gone as it sends (nothing of it left), so it never reached any
    gpuqd and goes on the new connection, a job as much as a read."""
    d = private_daemon()
    with d.client() as c:
        c.set_reconnect(20)
        c.ping()
        crash_and_restart(d)
        assert c.noop().state == "done"
        assert c.reconnects == 1
        assert [j.op for j in c.jobs()] == ["noop"]  # sent once, to the new gpuqd


def test_a_job_in_flight_is_not_sent_again(stalled):
    s = stalled()
    c = s.daemon.client()
    c.set_reconnect(20)
    failure = []

    def fill() -> None:
        try:
            c.fill("w", "zero")  # queued behind the stalled put
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            failure.append(exc)

    t = threading.Thread(target=fill)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            not any(j.op == "fill" and j.state == "queued" for j in s.client.jobs()):
        time.sleep(0.01)
    crash_and_restart(s.daemon)  # the put still stalled, the fill still queued
    t.join(30)
    assert failure and isinstance(failure[0], ConnectionError), failure
    assert "not sent again" in str(failure[0]) and "fill" in str(failure[0])
    assert c.reconnects == 1
    c.ping()  # connected again for the next call
    c.close()


def test_threads_that_lose_the_connection_together_share_one_new_one(stalled):
    s = stalled()
    c = s.daemon.client()
    c.set_reconnect(20)
    got: list = []

    def wait() -> None:
        try:
            got.append(c.wait(s.job.job))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    # Most likely the waits are in gpuqd by now; one that is not finds the
    # connection broken as it sends, and goes to the new gpuqd (NotFound).
    time.sleep(0.2)
    crash_and_restart(s.daemon)
    for t in threads:
        t.join(30)
    # The new gpuqd started afresh (it numbers its jobs from 1 again): a wait in
    # flight is not asked of it, since the id may name one of its own jobs.
    afresh = [r for r in got if isinstance(r, ConnectionError) and "started afresh" in str(r)]
    assert len(got) == 3 and afresh, got
    assert all(r in afresh or isinstance(r, gpuq.NotFound) for r in got), got
    assert c.reconnects == 1
    c.close()


def test_a_ring_transfer_cut_by_a_restart_says_the_connection_was_lost(private_daemon):
    """A transfer through the staging ring waits on gpuqd with ``wait`` requests
    when its job stands still (here queued behind a lease). One lost with the
    connection goes again to the new gpuqd, which never had the job: that
    answer would be another job's, or not_found; the transfer says what
    happened instead, and the next one makes a ring on the new connection."""
    np = pytest.importorskip("numpy")
    d = private_daemon()
    a = np.arange((12 << 20) // 4, dtype=np.float32)
    holder = d.client(staging_slots=0)
    holder.alloc("cut", a.shape, a.dtype, shareable=True)
    holder.attach("cut")  # the transfer's job stays queued
    c = d.client(staging_slots=5, staging_slot_bytes=1 << 20, copy_threads=2)
    c.set_reconnect(20)
    got: list = []

    def get() -> None:
        try:
            got.append(c.get_array("cut"))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got.append(exc)

    t = threading.Thread(target=get, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            not any(j.op == "get" and j.state == "queued" for j in holder.jobs()):
        time.sleep(0.01)
    time.sleep(0.2)  # past the ring's first polls: it waits on gpuqd
    crash_and_restart(d)
    t.join(30)
    assert got and isinstance(got[0], ConnectionError), got
    # the wait is not asked of the new gpuqd (started afresh), or its answer is
    # not taken: either way the transfer says the connection went
    assert "staging ring" in str(got[0]) or "not asked again" in str(got[0]), got
    assert c.reconnects == 1
    assert c.put_array("again", a).result["path"] == "ring"
    assert np.array_equal(c.get_array("again"), a)
    c.close()
    holder.close()


def test_a_ring_that_could_not_be_made_is_tried_again_on_the_new_connection(private_daemon,
                                                                          monkeypatch):
    """Before, the client stayed on the plain path after the restart, though the new
    gpuqd had room; a ring refused is tried again at the next transfer on a new
    connection, without waiting for its retry to be due (an hour here)."""
    np = pytest.importorskip("numpy")
    import warnings
    import gpuq.staging
    monkeypatch.setattr(gpuq.staging, "_RETRY_S", 3600.0, raising=False)
    d = private_daemon()
    c = d.client()
    c.set_reconnect(20)
    info = c.regions()
    if info.get("memlock_limit") is None:
        pytest.skip("gpuqd's RLIMIT_MEMLOCK is unlimited here: nothing to exhaust")
    room = info["memlock_limit"] - int(info.get("pinned_bytes") or 0)
    c.region_create("hog", (room - (512 << 10)) // 4096 * 4096)  # goes with this gpuqd
    a = np.arange((5 << 20) // 4, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert c.put_array("before", a).result["path"] != "ring"
    assert c.staging.unavailable is not None
    crash_and_restart(d)
    c.ping()
    assert c.reconnects == 1
    assert c.put_array("after", a).result["path"] == "ring"
    assert c.staging.unavailable is None
    c.close()


# AsyncClient.set_reconnect: the same promise, for requests in flight together.

async def _until_queued(s, op: str) -> None:
    """Lets the loop send until a job ``op`` is queued behind the stalled put."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            not any(j.op == op and j.state == "queued" for j in s.client.jobs()):
        await asyncio.sleep(0.01)


def test_async_off_by_default_a_lost_connection_stays_an_error(private_daemon):
    d = private_daemon()

    async def main() -> None:
        async with gpuq.AsyncClient(d.socket) as c:
            await c.ping()
            crash_and_restart(d)
            with pytest.raises(ConnectionError):
                await c.ping()
            assert c.reconnects == 0

    asyncio.run(main())


def test_async_reads_go_again_on_a_new_connection(private_daemon):
    """ping and noop send their request on the connection themselves
    (aio_methods.py), not through AsyncClient._call: lost with it, they reconnect
    as it does; pings that find it lost together share one new connection."""
    d = private_daemon()

    async def main() -> None:
        async with gpuq.AsyncClient(d.socket) as c:
            c.set_reconnect(20)
            before = (await c.ping())["pid"]
            crash_and_restart(d)
            got = await asyncio.gather(*(c.ping() for _ in range(3)))
            assert [g["pid"] for g in got] == [d.proc.pid] * 3 and before != d.proc.pid
            assert c.reconnects == 1
            assert (await c.noop()).state == "done"  # served as before on it
            crash_and_restart(d)
            # idle through the restart: the noop never reached the old gpuqd, so it goes
            assert (await c.noop()).state == "done"
            assert c.reconnects == 2
            assert (await c.ping())["pid"] == d.proc.pid
            assert [j.op for j in await c.jobs()] == ["noop"]

    asyncio.run(main())


def test_async_requests_in_flight_share_one_new_connection(stalled):
    s = stalled()
    job = s.job.job

    async def main() -> None:
        c = gpuq.AsyncClient(s.daemon.socket)
        c.set_reconnect(20)
        # Three waits (reads of one gpuqd's job) and a fill queued behind the stalled put (a job), all
        # sent on the one connection before gpuqd goes away.
        waits = [asyncio.ensure_future(c.wait(job)) for _ in range(3)]
        fill = asyncio.ensure_future(c.fill("w", "zero"))
        await _until_queued(s, "fill")
        crash_and_restart(s.daemon)
        got = await asyncio.gather(*waits, fill, return_exceptions=True)
        # The new gpuqd started afresh: a wait in flight is not asked of it, as its
        # own job ids start from 1 again (the job may be one of its own).
        for result in got[:3]:
            assert isinstance(result, ConnectionError), got
            assert "started afresh" in str(result) and "wait" in str(result)
        assert isinstance(got[3], ConnectionError), got
        assert "not sent again" in str(got[3]) and "fill" in str(got[3])
        assert c.reconnects == 1  # one new connection for all four
        await c.alloc("after", bytes=4096)  # served as before on it
        assert (await c.buffer("after")).nbytes == 4096
        assert c.reconnects == 1
        c.close()

    asyncio.run(main())


def test_async_a_reexec_keeps_the_connection(stalled):
    """A re-exec in place (SIGUSR2) hands the connection over: no reconnect; the
    wait for the cut-short job says it was restarted, the fill queued behind it
    is replayed by the new image (its reply comes on the same connection), and
    the client serves on."""
    s = stalled("--restart-drain", "100")
    job = s.job.job

    async def main() -> None:
        async with gpuq.AsyncClient(s.daemon.socket) as c:
            c.set_reconnect(20)
            before = (await c.ping()).get("restarts", 0)
            wait = asyncio.ensure_future(c.wait(job))
            fill = asyncio.ensure_future(c.fill("w", "zero"))
            await _until_queued(s, "fill")
            s.daemon.proc.send_signal(signal.SIGUSR2)
            got = await asyncio.gather(wait, fill, return_exceptions=True)
            assert isinstance(got[0], gpuq.Restarted), got
            assert not isinstance(got[1], BaseException), got
            assert (await c.ping())["restarts"] == before + 1
            assert c.reconnects == 0
            assert (await c.buffer("w")).nbytes == 1 << 16  # kept through the re-exec

    asyncio.run(main())


def test_a_ring_get_whose_job_ended_before_a_reexec_succeeds(private_daemon, monkeypatch):
    """A ring transfer whose job ended as gpuqd re-executed itself (SIGUSR2) asks
    the new image, which keeps the connection and the ring but no job record,
    for that job: not_found. The ring's status counter says it succeeded, so
    the transfer does, with the buffer's bytes, and sends nothing again (it took
    the not_found for a stale ring and sent the get again, and a get_array under
    load could fail with it)."""
    np = pytest.importorskip("numpy")
    from gpuq import staging
    d = private_daemon()
    a = np.arange((12 << 20) // 4, dtype=np.float32)
    c = d.client(staging_slots=5, staging_slot_bytes=1 << 20, copy_threads=2)
    c.put_array("ring", a)
    before = c.ping().get("restarts", 0)
    original = staging.Staging._await_plan

    def reexec_first(self, done):
        monkeypatch.setattr(staging.Staging, "_await_plan", original)  # once
        watcher = d.client(staging_slots=0)
        while watcher.status(done.id).state != "done":  # the job ends in the old image
            time.sleep(0.005)
        d.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 20
        while watcher.ping().get("restarts", 0) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.close()
        return (yield from original(self, done))

    monkeypatch.setattr(staging.Staging, "_await_plan", reexec_first)
    got = c.get_array("ring")
    assert c.ping()["restarts"] == before + 1 and c.reconnects == 0
    assert np.array_equal(got, a)
    gets = [j for j in c.jobs() if j.op == "get"]  # this image's: none was sent again
    assert gets == [], [(j.id, j.state) for j in gets]
    c.close()
