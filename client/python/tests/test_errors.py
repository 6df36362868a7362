"""Every error code of the protocol raises its own class, reached for real."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
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


def test_errors_pickle_with_their_job_as_data(client):
    """A worker's error reaches a ProcessPoolExecutor's parent by pickle: its class,
    code, message, reply and job (id and record) arrive; the job is bound to no
    client there (the parent's client.wait(job) takes it)."""
    import pickle
    job = client.noop()
    classes = list(gpuq.ERRORS.values()) + [gpuq.GpuqError]
    for cls in classes:
        code = cls.code or "new_in_v2"
        err = cls("the message", code=code, job=job, reply={"ok": False, "job": job.record})
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and back.code == code and str(back) == "the message"
        assert back.message == "the message" and back.reply == err.reply
        assert back.job.id == job.id and back.job.record == job.record
        assert back.job.state == "done" and back.job._client is None
    plain = pickle.loads(pickle.dumps(gpuq.NotFound("no job here")))
    assert plain.job is None and plain.code == "not_found"


def test_a_timeout_crosses_to_another_process_and_its_job_is_waited_for_there(daemon, name):
    import pickle
    with daemon.client() as c, daemon.client() as parent:
        c.alloc(name, (4,), "f32", shareable=True)
        try:
            att = c.attach(name)
            with pytest.raises(gpuq.Timeout) as caught:
                c.fill(name, "zero", timeout=0.1)
            back = pickle.loads(pickle.dumps(caught.value))
            assert isinstance(back, gpuq.Timeout) and back.job.id == caught.value.job.id
            with pytest.raises(RuntimeError, match=r"client\.wait\(job\)"):
                back.job.wait()
            c.release(att)
            assert parent.wait(back.job, timeout=10).state == "done"
            assert parent.status(back.job).state == "done"
        finally:
            c.free(name)


def test_jobs_and_buffers_pickle_as_data_and_the_rest_refuses_clearly(client, name):
    import copy
    import pickle
    buf = client.alloc(name, (2, 3), "f32")
    try:
        job = client.noop()
        for kept in (copy.copy(job), copy.deepcopy(job)):  # in process: still bound
            assert kept.refresh().state == "done"
        back = pickle.loads(pickle.dumps(job))
        assert back.id == job.id and back.record == job.record and back.state == "done"
        for use in (back.wait, back.refresh, back.cancel):
            with pytest.raises(RuntimeError, match=r"no client.*client\.wait\(job\)"):
                use()
        assert client.wait(back).state == "done"
        assert copy.deepcopy(buf).get().shape == (2, 3)
        b = pickle.loads(pickle.dumps(buf))
        assert (b.ref, b.shape, b.dtype, b.nbytes, b.job.id) == \
            (buf.ref, buf.shape, buf.dtype, buf.nbytes, buf.job.id)
        assert repr(b) == repr(buf)
        for use in (b.get, lambda: b.put(np.zeros((2, 3), np.float32)), b.free, b.attach):
            with pytest.raises(RuntimeError, match=re.escape(f"client.buffer('{buf.ref}')")):
                use()
        assert client.buffer(b.ref).get().shape == (2, 3)
        for thing, says in ((client, r"gpuq\.Client\(\) in the other process"),):
            for how in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=says):
                    how(thing)
    finally:
        client.free(name)


def test_attachments_and_regions_refuse_pickle_and_copy_saying_what_to_send(client, name):
    import copy
    import pickle
    client.alloc(name, (4,), "f32", shareable=True)
    try:
        with client.attach(name) as att:
            for how in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=f"send the buffer's name .'{name}@0'"):
                    how(att)
        region = client.region_create(name + "r", 4096, ephemeral=True)
        try:
            for how in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=f"send its name .'{name}r'"):
                    how(region)
        finally:
            client.region_free(region.name)
            region.unmap()
    finally:
        client.free(name)
