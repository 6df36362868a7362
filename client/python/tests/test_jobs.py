"""Jobs: detach and wait, time limits, cancel, progress events, records as attributes."""

from __future__ import annotations

import os
import threading
import time

import pytest

import gpuq


def test_detached_job_waits_later(stalled):
    s = stalled()
    job = s.job
    assert not job.finished and job.result is None and job.error is None
    s.feed(b"x" * 100)
    s.end()
    assert job.wait(timeout=10) is job
    assert job.state == "done" and job.result["bytes"] == 100 and job.finished


def test_wait_that_runs_out_raises_timeout_and_the_job_goes_on(stalled):
    s = stalled()
    with pytest.raises(gpuq.Timeout) as info:
        s.job.wait(timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert info.value.job is s.job and s.job.state == "running"
    with pytest.raises(gpuq.Timeout) as info:  # a job request that waits, too
        s.client.noop(timeout=0.1)  # queued behind the stalled put
    queued = info.value.job
    assert queued is not None and queued.op == "noop" and not queued.finished
    s.end()
    assert s.job.wait(timeout=10).state == "done"
    assert queued.wait(timeout=10).state == "done"


def test_cancel_stops_a_running_job_and_wait_raises_cancelled(stalled):
    job = stalled().job
    assert job.cancel() is True
    with pytest.raises(gpuq.Cancelled) as info:
        job.wait(timeout=10)
    assert info.value.job is job and job.state == "cancelled"
    assert isinstance(job.error, gpuq.Cancelled)
    with pytest.raises(gpuq.Cancelled):  # a finished job's wait answers at once
        job.wait()
    assert job.cancel() is False


def test_progress_events_reach_the_callback_in_the_waiting_thread(private_daemon):
    d = private_daemon()
    with d.client() as c:
        total = 1 << 20
        c.alloc("w", nbytes=total)
        r, w = os.pipe()
        events, threads = [], set()

        def on_progress(event):
            events.append(event)
            threads.add(threading.get_ident())

        def feed():  # a slow source: progress comes once a job has run a second
            for _ in range(16):
                os.write(w, b"\0" * (total // 16))
                time.sleep(0.1)
            os.close(w)
        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            job = c.put(r, "w", length=total, on_progress=on_progress, timeout=30)
        finally:
            os.close(r)
            feeder.join()
        assert job.result["bytes"] == total
        assert events, "no progress event in a 1.6 s put"
        assert all(e["event"] == "progress" and e["job"] == job.id for e in events)
        assert events[-1]["total"] == total and 0 < events[-1]["bytes"] <= total
        assert threads == {threading.get_ident()}


def test_detach_refuses_wait_options(client):
    with pytest.raises(ValueError):
        client.noop(detach=True, timeout=1)


def test_records_are_attributes_and_new_keys_show_up(client):
    job = client.noop()
    assert job.owner == job.record["owner"] and job.queued_s >= 0 and job.device == 0
    assert "noop" in repr(job)
    with pytest.raises(AttributeError, match="has no 'nothing'"):
        job.nothing
    future = gpuq.Job(client, dict(job.record, priority="high", waiting="behind job 3"))
    assert future.priority == "high" and future.waiting == "behind job 3"


def test_failed_job_raises_with_its_record(client, name):
    client.alloc(name, nbytes=64)
    try:
        with pytest.raises(gpuq.BadRequest) as info:
            client.put(b"x" * 65, name)  # longer than the room: refused before any byte
        assert "65" in str(info.value) or "room" in str(info.value)
    finally:
        client.free(name)


def test_timeouts_are_seconds_and_become_the_protocols_milliseconds(client):
    from gpuq.job import timeout_ms
    assert timeout_ms(None) is None
    assert timeout_ms(1.5) == 1500 and timeout_ms(0.0001) == 1
    assert timeout_ms(0) == 1  # the protocol's 0 would mean no limit at all
    with pytest.raises(ValueError):
        client.noop(timeout=-1)
    with pytest.raises(ValueError):
        client.noop(timeout=float("nan"))
