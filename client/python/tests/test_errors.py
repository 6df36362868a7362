"""Every error code of the protocol raises its own class, reached for real."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import gpuq
from gpuq.errors import error_from_map

from conftest import REPO, host_only


def protocol_codes():
    header = (REPO / "protocol" / "protocol.h").read_text()
    return [c for c in re.findall(r'X\(GPUQ_E_\w+, "(\w+)"\)', header)]


def test_every_code_of_protocol_h_has_a_class():
    codes = protocol_codes()
    assert len(codes) >= 16
    assert sorted(codes) == sorted(gpuq.ERRORS)
    for code, cls in gpuq.ERRORS.items():
        assert cls.code == code and issubclass(cls, gpuq.GpuqError)
        assert getattr(gpuq, cls.__name__) is cls
        err = error_from_map({"code": code, "message": "m"})
        assert type(err) is cls and err.code == code and str(err) == "m"


def test_unknown_codes_and_odd_error_maps_still_raise_gpuq_error():
    err = error_from_map({"code": "new_in_v2", "message": "later"})
    assert type(err) is gpuq.GpuqError and err.code == "new_in_v2"
    assert "without a message" in str(error_from_map({"code": "busy"}))
    assert isinstance(error_from_map("junk"), gpuq.GpuqError)


def test_builtin_bases_for_except_clauses():
    assert issubclass(gpuq.Timeout, TimeoutError)
    assert issubclass(gpuq.ReplyTimeout, TimeoutError)
    assert issubclass(gpuq.NotFound, LookupError)
    assert issubclass(gpuq.PermissionDenied, PermissionError)
    assert issubclass(gpuq.OutOfMemory, MemoryError)
    assert issubclass(gpuq.ProtocolError, ConnectionError)


def test_bad_request_names_the_field(client, name):
    with pytest.raises(gpuq.BadRequest, match="bytes") as info:
        client.alloc(name)  # neither bytes nor count
    assert info.value.job is None and info.value.reply["ok"] is False
    client.alloc(name, nbytes=64)
    try:
        with pytest.raises(gpuq.BadRequest, match="sparkle"):
            client.fill(name, "sparkle")
        with pytest.raises(gpuq.BadRequest, match="bytes"):
            client.alloc(name + "n", nbytes=-1)
    finally:
        client.free(name)


def test_unknown_op(client):
    with pytest.raises(gpuq.UnknownOp, match="frobnicate"):
        client.request("frobnicate")


def test_not_found_buffer_job_and_device(client):
    with pytest.raises(gpuq.NotFound, match="nothere"):
        client.free("nothere")
    with pytest.raises(gpuq.NotFound):
        client.status(1 << 60)
    with pytest.raises(gpuq.NotFound):
        client.noop(device=999)


def test_exists(client, name):
    client.alloc(name, nbytes=64)
    try:
        with pytest.raises(gpuq.Exists, match=name):
            client.alloc(name, nbytes=64)
    finally:
        client.free(name)


def test_out_of_memory(client, name):
    twice = 2 * client.devices()[0]["mem_total"]
    with pytest.raises(gpuq.OutOfMemory):
        client.alloc(name, nbytes=twice)
    assert name not in {b["name"] for b in client.buffers()}


def test_io_error_when_the_source_ends_early(client, name):
    client.alloc(name, nbytes=4096)
    r, w = os.pipe()
    try:
        os.write(w, b"y" * 10)
        os.close(w)
        with pytest.raises(gpuq.IoError, match="10") as info:
            client.put(r, name, length=100)
        assert info.value.job is not None and info.value.job.state == "failed"
    finally:
        os.close(r)
        client.free(name)


def test_busy_while_a_buffer_is_being_freed(stalled):
    s = stalled()
    freeing = s.client.free("w", detach=True)  # queued behind the put that holds w
    with pytest.raises(gpuq.Busy, match="being freed"):
        s.client.checksum("w")
    s.end()
    s.job.wait(timeout=10)
    assert freeing.wait(timeout=10).state == "done"


def test_device_error_then_no_device(private_daemon):
    host_only()
    d = private_daemon("--reset-limit", "0", env={"GPUQ_HOST_FAULT_DEVICE": "1"})
    with d.client() as c:
        c.alloc("w", nbytes=64, device=1)
        with pytest.raises(gpuq.DeviceError, match="simulated sticky fault"):
            c.checksum("w@1")
        with pytest.raises(gpuq.NoDevice):
            c.noop(device=1)
        assert c.noop(device=0).state == "done"  # the other device carries on


def test_shutting_down_refuses_new_jobs(stalled):
    s = stalled("--shutdown-timeout", "20000")
    s.daemon.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    with pytest.raises(gpuq.ShuttingDown):
        while time.monotonic() < deadline:  # until the daemon has seen the signal
            s.client.noop(detach=True)  # queued behind the stalled put, until then
            time.sleep(0.01)
    waited = []
    waiter = threading.Thread(target=lambda: waited.append(s.job.wait(timeout=10)))
    waiter.start()
    time.sleep(0.1)
    s.end()  # the running put ends, and the daemon with it
    waiter.join(20)
    assert waited and waited[0].state == "done"
    assert s.daemon.proc.wait(20) == 0


CHILD = """
import sys, gpuq
c = gpuq.Client(sys.argv[1])
try:
    c.shutdown()
except gpuq.PermissionDenied as e:
    print("refused:", e.code, e)
    sys.exit(0)
sys.exit(1)
"""


def test_permission_denied_for_shutdown_by_a_plain_user(private_daemon):
    if os.geteuid() != 0:
        with private_daemon().client() as c:
            with pytest.raises(gpuq.PermissionDenied):
                c.shutdown()
        return
    d = private_daemon("--socket-group", "nogroup")
    os.chmod(d.dir, 0o755)
    pkg = os.path.dirname(os.path.dirname(gpuq.__file__))
    run = subprocess.run([sys.executable, "-c", CHILD, d.socket], user=65534, group=65534,
                         env=dict(os.environ, PYTHONPATH=pkg), capture_output=True,
                         text=True, timeout=60)
    if "Permission denied" in run.stderr and "python" in run.stderr.lower():
        pytest.skip(f"uid 65534 cannot run this interpreter: {run.stderr[-200:]}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "refused: permission_denied" in run.stdout
    assert d.client().ping()["pid"] == d.proc.pid  # still serving


def test_bad_frame_from_the_client_closes_only_that_connection(daemon, client, name):
    client.alloc(name, nbytes=64)
    client.fill(name, "random", seed=1)
    before = client.checksum(name).result["checksum"]
    with daemon.client() as other:
        with pytest.raises(gpuq.BadFrame):
            other.request("ping", pad="x" * (2 << 20))  # above --max-frame
        assert other.closed
        with pytest.raises(ConnectionError, match="closed"):
            other.ping()
    assert client.checksum(name).result["checksum"] == before
    client.free(name)
