"""Client.set_reconnect: a gpuqd killed and started again on the same socket, as
systemd restarts a crashed one. Reads go again; a job in flight does not, and
says so; without it a lost connection stays an error."""

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
