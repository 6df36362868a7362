"""Every request method against a real gpuqd, checked against what it did."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

import pytest

import gpuq


def test_ping_names_the_daemon(client, daemon):
    reply = client.ping()
    assert reply["server"].startswith("gpuqd ")
    assert reply["version"] == gpuq.PROTOCOL_VERSION
    assert reply["pid"] == daemon.proc.pid
    assert reply["devices"] >= 1 and "id" not in reply and "ok" not in reply


def test_devices_and_stats_list_each_device(client):
    devices = client.devices()
    assert [d["index"] for d in devices] == list(range(len(devices)))
    assert all(d["healthy"] and d["mem_total"] > 0 for d in devices)
    stats = client.stats()
    assert [s["index"] for s in stats] == [d["index"] for d in devices]
    assert "chain" in stats[0] and "counters" in stats[0]
    assert [s["index"] for s in client.stats(device=0)] == [0]


def test_alloc_by_bytes_and_by_count(client, name):
    buf = client.alloc(name, nbytes=4096)
    assert isinstance(buf, gpuq.Buffer) and buf.nbytes == 4096 and buf.ref == f"{name}@0"
    job = buf.job
    assert job.state == "done" and job.op == "alloc"
    assert job.result == {"name": name, "device": 0, "dtype": "bytes", "count": 4096,
                          "bytes": 4096, "shareable": False, "ephemeral": False}
    typed = client.alloc(name + "t", count=100, dtype="f64", device=0)
    assert typed.result["bytes"] == 800 and typed.result["dtype"] == "f64"
    listed = {b["name"]: b for b in client.buffers()}
    assert listed[name]["bytes"] == 4096 and listed[name + "t"]["count"] == 100
    assert client.free(name).result["bytes"] == 4096
    assert client.free(name + "t@0").result["bytes"] == 800
    assert name not in {b["name"] for b in client.buffers()}


def test_an_ephemeral_buffer_goes_with_its_connection(daemon, client, name):
    with daemon.client() as other:
        job = other.alloc(name, nbytes=4096, ephemeral=True)
        assert job.result["ephemeral"] is True
        assert {b["name"]: b for b in client.buffers()}[name]["ephemeral"] is True
    deadline = time.monotonic() + 10
    while name in {b["name"] for b in client.buffers()}:
        assert time.monotonic() < deadline, "the ephemeral buffer outlived its connection"
        time.sleep(0.02)


def test_alloc_on_each_device(client, name):
    n = len(client.devices())
    for dev in range(n):
        client.alloc(name, nbytes=64, device=dev)
    assert sorted(b["device"] for b in client.buffers() if b["name"] == name) == list(range(n))
    assert [b["device"] for b in client.buffers(device=n - 1) if b["name"] == name] == [n - 1]
    for dev in range(n):
        client.free(f"{name}@{dev}")


def test_alloc_name_at_device_is_the_device(client, name):
    dev = len(client.devices()) - 1
    assert client.alloc(f"{name}@{dev}", nbytes=64).result["device"] == dev
    assert [b["device"] for b in client.buffers() if b["name"] == name] == [dev]
    with pytest.raises(ValueError, match="says device"):
        client.alloc(f"{name}@{dev}", nbytes=64, device=dev + 1)
    client.free(f"{name}@{dev}")


def test_fill_patterns_and_checksum_agree_with_the_bytes(client, name):
    client.alloc(name, count=1000, dtype="i32")
    try:
        client.fill(name, "iota")
        assert list(client.get_array(name)[:5]) == [0, 1, 2, 3, 4]
        client.fill(name, "value", value=7)
        assert set(client.get_array(name).tolist()) == {7}
        client.fill(name, "zero")
        zero = client.checksum(name).result
        assert zero["bytes"] == 4000
        client.fill(name, "random", seed=5)
        first = client.checksum(name).result["checksum"]
        data = client.get_array(name).tobytes()
        client.fill(name, "random", seed=6)
        assert client.checksum(name).result["checksum"] != first
        client.put(data, name)  # the same bytes give the same checksum
        assert client.checksum(name).result["checksum"] == first != zero["checksum"]
    finally:
        client.free(name)


def test_put_and_get_every_kind_of_endpoint(client, name):
    data = os.urandom(10007)
    client.alloc(name, nbytes=len(data))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            with open(src, "wb") as f:
                f.write(data)
            put = client.put(src, name, verify=True)
            assert put.result["bytes"] == len(data) and put.result["verified"]
            dst = os.path.join(tmp, "dst")
            with open(dst, "wb") as f:
                f.write(b"x" * 50000)  # longer: a path is truncated first
            client.get(name, dst)
            assert open(dst, "rb").read() == data
            with open(src, "rb") as f:  # a file object: its descriptor
                client.put(f, name)
            fd = os.open(dst, os.O_RDWR | os.O_TRUNC)
            try:
                client.get(name, fd)  # a raw descriptor, not closed by the client
                os.fstat(fd)
            finally:
                os.close(fd)
            assert open(dst, "rb").read() == data
        back = bytearray(len(data))
        client.put(memoryview(data[::-1]), name)
        client.get(name, back)
        assert bytes(back) == data[::-1]
    finally:
        client.free(name)


def test_put_and_get_ranges_offsets_and_scratch(client, name):
    client.alloc(name, nbytes=8192)
    try:
        client.fill(name, "zero")
        client.put(b"abcd", f"{name}[100:104]")
        client.put(b"efgh", name, offset=200, length=4)
        back = bytearray(8)
        client.get(name, back, offset=100, length=4)
        assert bytes(back[:4]) == b"abcd"
        client.get(f"{name}[200:204]", back)
        assert bytes(back[:4]) == b"efgh"
        scratch = client.put(None, name, scratch=True, seed=9)
        assert scratch.result["bytes"] == 8192
        client.alloc(name + "r", nbytes=8192)
        client.fill(name + "r", "random", seed=9)  # the scratch stream is fill random's
        assert (client.checksum(name).result["checksum"]
                == client.checksum(name + "r").result["checksum"])
        assert client.get(name, None, scratch=True).result["bytes"] == 8192
        client.free(name + "r")
    finally:
        client.free(name)


def test_put_paths_staged_and_registered(client, name):
    data = os.urandom(1 << 20)
    client.alloc(name, nbytes=len(data))
    try:
        assert client.put(data, name, path="staged").result["path"] == "staged"
        reg = client.put(data, name, path="registered", verify=True)
        assert reg.result["path"] == "registered" and reg.result["verified"]
    finally:
        client.free(name)


def test_copy_within_and_between_devices(client, name):
    data = os.urandom(5000)
    client.put_array(name, bytearray(data), dtype="bytes")
    try:
        client.alloc(name + "b", nbytes=5000)
        ce = client.copy(name, name + "b", verify=True)
        assert ce.result["bytes"] == 5000 and ce.result["verified"]
        sm = client.copy(f"{name}[0:1000]", f"{name}b[4000:]", engine="sm")
        assert sm.result["engine"] == "sm"
        back = bytearray(5000)
        client.get(name + "b", back)
        assert bytes(back) == data[:4000] + data[:1000]
        if len(client.devices()) > 1:
            client.alloc(name + "c", nbytes=5000, device=1)
            peer = client.copy(name, f"{name}c@1", verify=True)
            assert peer.result["verified"] and peer.result["path"]
            client.free(name + "c@1")
        client.free(name + "b")
    finally:
        client.free(name)


def test_run_a_chain_from_a_string_and_from_a_list(client, name):
    import numpy as np
    x = np.linspace(0.5, 2.0, 101, dtype=np.float32)
    client.put_array(name, x)
    try:
        job = client.run(name, "mul 2 | add 1")
        assert job.result["ops"] == 2 and job.result["kernels"] == 1
        np.testing.assert_array_equal(client.get_array(name), x * np.float32(2) + np.float32(1))
        client.alloc(name + "o", count=101, dtype="f32")
        out = client.run(name, ["neg", ["mul", 0.5]], out=name + "o", mode="eager")
        assert out.result["mode"] == "eager" and out.result["out"].startswith(name + "o")
        np.testing.assert_array_equal(client.get_array(name + "o"),
                                      -(x * np.float32(2) + np.float32(1)) * np.float32(0.5))
        client.free(name + "o")
    finally:
        client.free(name)


def test_parse_ops_reads_the_cli_syntax():
    assert gpuq.parse_ops("sin | add 1 | clamp -1 2.5") == [["sin"], ["add", 1],
                                                            ["clamp", -1, 2.5]]
    assert gpuq.parse_ops(["sin", ["add", 1], {"op": "neg"}]) == [["sin"], ["add", 1],
                                                                  {"op": "neg"}]


def test_allreduce_sums_over_the_devices(client, name):
    import numpy as np
    n = len(client.devices())
    if n < 2:
        pytest.skip("needs two devices")
    for dev in range(n):
        client.put_array(f"{name}@{dev}", np.full(33, dev + 1, np.float32))
    try:
        job = client.allreduce(name, devices=list(range(n)), reduce="sum")
        assert job.result["devices"] == list(range(n)) and job.result["count"] == 33
        want = float(sum(range(1, n + 1)))
        for dev in range(n):
            assert set(client.get_array(f"{name}@{dev}").tolist()) == {want}
    finally:
        for dev in range(n):
            client.free(f"{name}@{dev}")


def test_noop_on_a_device_and_as_a_gang(client):
    assert client.noop().result["device"] == 0
    n = len(client.devices())
    gang = client.noop(devices=list(range(n)))
    assert gang.state == "done" and gang.record.get("devices", [0]) == list(range(n))


def test_jobs_status_wait_and_cancel_take_ids_or_jobs(client):
    job = client.noop(detach=True)
    assert job.state in ("queued", "running", "done")
    assert client.wait(job.id).state == "done"
    assert client.status(job).state == "done"
    assert job.id in [j.id for j in client.jobs()]
    assert client.cancel(job.id) is False  # already finished


def test_quota_shows_limits_beside_usage(daemon, client, name):
    client.alloc(name, nbytes=64 << 10, device=0)
    try:
        users = client.quota()
        me = [u for u in users if u["uid"] == os.geteuid()]
        assert len(me) == 1
        assert me[0]["used"]["device_memory"][0] >= 64 << 10
        assert me[0]["used"]["connections"] >= 1
        assert me[0]["limits"]["weight"] == 1
        if os.geteuid() == 0:  # root is never limited: every limit is None
            assert me[0]["limits"]["device_memory"] is None
            assert me[0]["limits"]["connections"] is None
        else:  # the built-in default
            assert me[0]["limits"]["connections"] == 512
        assert [u["uid"] for u in client.quota(uid=os.geteuid())] == [os.geteuid()]

        async def via_async():
            async with gpuq.AsyncClient(daemon.socket) as c:
                return await c.quota(uid=os.geteuid())

        assert asyncio.run(via_async())[0]["uid"] == os.geteuid()
    finally:
        client.free(name)


def test_metrics_is_prometheus_text(client):
    text = client.metrics()
    assert "gpuq_build_info" in text and "gpuq_jobs_total" in text


def test_generic_request_and_job(client):
    assert client.request("ping")["version"] == 1
    job = client.job("noop", device=0)
    assert isinstance(job, gpuq.Job) and job.state == "done"


def test_extra_fields_reach_the_daemon(client, name):
    # owner= is root's way to name whose buffer; anyone else is refused for it,
    # so the field demonstrably arrives.
    client.alloc(name, nbytes=64)
    try:
        if os.geteuid() == 0:
            assert client.checksum(f"{name}@0", owner=0).result["bytes"] == 64
        else:
            with pytest.raises(gpuq.PermissionDenied):
                client.checksum(f"{name}@0", owner=0)
    finally:
        client.free(name)


def test_priority_is_accepted_by_every_job_method(client, name):
    client.alloc(name, nbytes=16, priority="high", wait_memory_ms=10)
    client.fill(name, "zero", priority="low")
    job = client.checksum(name, priority="normal")
    assert job.state == "done" and job.priority == "normal"
    with pytest.raises(gpuq.BadRequest, match="priority"):
        client.checksum(name, priority="urgent")
    client.free(name, priority="high")


def test_reset_device_loses_the_buffers_and_serves_again(private_daemon, name):
    if os.geteuid() != 0:
        pytest.skip("only root and the admin group may reset a device")
    d = private_daemon()
    with d.client() as c:
        c.alloc(name, nbytes=64)
        reply = c.reset_device(0)
        assert reply["reset_requested"] is True
        deadline = time.monotonic() + 20
        while c.devices()[0]["resets"] == reply["resets"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.devices()[0]["healthy"]
        with pytest.raises(gpuq.DeviceError, match="lost"):
            c.checksum(name)
        c.free(name)


def test_restart_keeps_buffers_and_the_connection(private_daemon, name):
    if os.geteuid() != 0:
        pytest.skip("only root and the admin group may restart the daemon")
    d = private_daemon()
    with d.client() as c:
        c.alloc(name, nbytes=1 << 20)
        c.fill(name, "random", seed=3)
        before = c.checksum(name).result["checksum"]
        pid = c.ping()["pid"]
        reply = c.restart()
        assert reply["restarting"] is True and reply["restarts"] == 0
        deadline = time.monotonic() + 20
        while c.ping().get("restarts", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.ping()["restarts"] == 1 and c.ping()["pid"] == pid
        assert c.checksum(name).result["checksum"] == before
        with pytest.raises(gpuq.BadRequest, match="cannot take over"):
            c.restart(binary="/bin/false")
        c.free(name)


def test_absent_names_the_gpus_whose_buffers_are_kept_aside(private_daemon, name):
    """A re-exec whose configuration leaves a GPU out keeps that GPU's buffers
    aside (absent) and puts the others' on the index their GPU has now;
    drop_absent lets the kept ones go."""
    from conftest import BACKEND
    if os.geteuid() != 0:
        pytest.skip("only root and the admin group may restart the daemon")
    if BACKEND != "host":
        pytest.skip("needs two devices to leave one out (host devices stand in)")
    conf = os.path.join(tempfile.mkdtemp(prefix="gpuq-py-conf."), "gpuqd.conf")
    with open(conf, "w") as f:
        f.write("devices = 0,1\n")
    d = private_daemon("--host-devices", "2", "--config", conf)
    with d.client() as c:
        assert c.absent() == []
        c.alloc(f"{name}-aside", nbytes=1 << 20, device=0)
        c.alloc(name, nbytes=4096, device=1)
        c.fill(f"{name}@1", "iota", dtype="u8")
        before = c.checksum(f"{name}@1").result["checksum"]
        with open(conf, "w") as f:
            f.write("devices = 1\n")
        c.restart()
        deadline = time.monotonic() + 20
        while c.ping().get("restarts", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.absent() == [{"uuid": "HOST-0", "buffers": 1, "bytes": 1 << 20}]
        assert c.checksum(f"{name}@0").result["checksum"] == before  # HOST-1, now device 0
        with pytest.raises(gpuq.NotFound, match="is on GPU HOST-0, which this gpuqd does not serve"):
            c.checksum(f"{name}-aside")
        with pytest.raises(gpuq.NotFound, match="-aside' is kept for GPU HOST-0, which the daemon"):
            c.buffer(f"{name}-aside")  # the client's own lookup says so too
        with pytest.raises(gpuq.BadRequest, match="GPU HOST-1 is device 0 of this gpuqd"):
            c.drop_absent("HOST-1")
        assert c.drop_absent("HOST-0") == {"uuid": "HOST-0", "buffers": 1, "bytes": 1 << 20}
        assert c.absent() == []
        with pytest.raises(gpuq.NotFound, match=r"no buffers are kept for GPU HOST-0 \(kept for: none\)"):
            c.drop_absent("HOST-0")
        with pytest.raises(gpuq.NotFound, match="'.*-aside' not found"):
            c.checksum(f"{name}-aside")


def test_shutdown_stops_the_daemon(private_daemon):
    if os.geteuid() != 0:
        pytest.skip("only root and the admin group may stop the daemon "
                    "(test_errors checks the refusal)")
    d = private_daemon()
    with d.client() as c:
        reply = c.shutdown()
        assert reply["stopping"] is True and reply["jobs_active"] == 0
        assert reply["shutdown_timeout_ms"] > 0
    assert d.proc.wait(20) == 0


#: Methods of one request each, and what each needs besides ``**fields``.
ONE_REQUEST_METHODS = {
    "ping": ((), "ping"), "devices": ((), "devices"), "buffers": ((), "buffers"),
    "stats": ((), "stats"), "quota": ((), "quota"), "my_quota": ((), "quota"),
    "metrics": ((), "metrics"), "jobs": ((), "jobs"), "leases": ((), "leases"),
    "regions": ((), "regions"), "lease_break": ((123456,), "lease_break"),
    "shutdown": ((), "shutdown"), "restart": ((), "restart"),
    "reset_device": ((0,), "reset_device"),
}


def test_every_one_request_method_sends_extra_fields(client):
    """docs/python.md: "Every named method also takes **fields, sent as they are"
    (the requests are only looked at here, never sent: shutdown stays unsent)."""
    seen = []

    def looking(c):
        seen.append((c.op, dict(c.fields)))
        raise gpuq.NotFound("not sent (the test looks at the request)")
    call = client._conn.call
    client._conn.call = looking
    try:
        for method, (args, op) in ONE_REQUEST_METHODS.items():
            seen.clear()
            with pytest.raises(gpuq.NotFound, match="not sent"):
                getattr(client, method)(*args, owner=0, newer_field="x")
            assert [(o, f.get("owner"), f.get("newer_field")) for o, f in seen] == \
                [(op, 0, "x")], method
    finally:
        client._conn.call = call


def test_the_async_one_request_methods_send_extra_fields(daemon):
    async def main():
        async with gpuq.AsyncClient(daemon.socket) as ac:
            sent = []
            call = ac._conn.call

            async def looking(c):
                sent.append((c.op, dict(c.fields)))
                return await call(c)
            ac._conn.call = looking
            for method in ("ping", "regions", "leases", "jobs", "metrics", "my_quota"):
                await getattr(ac, method)(newer_field="x")
            return sent
    sent = asyncio.run(main())
    assert [(op, f.get("newer_field")) for op, f in sent] == [
        ("ping", "x"), ("regions", "x"), ("leases", "x"), ("jobs", "x"), ("metrics", "x"),
        ("quota", "x")]
