"""Revocable leases that put_array/get_array of device arrays keep between copies
(gpuq/kept_leases.py, docs/protocol.md "Revocable leases"): a repeated copy
sends no request while nobody else wants the buffer, a job that wants it
ends the lease (at once when no copy is under way, after the copy otherwise),
and the next copy attaches again.

No device arrays here: the copy (device_arrays._device_copy) is replaced by one of
numpy arrays through the host backend's attachment (on a GPU backend it
only counts), so the lease logic around it runs as put_array's does.
Counts and order are checked, never times."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import gpuq
from gpuq import device_arrays, kept_leases
from gpuq.wire import encode_frame


class _Copies:
    """Stands in for device_arrays._device_copy: records each copy, and moves the bytes
    where the attachment is host memory."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, att, arr, into_attachment):
        self.calls.append((att.lease, into_attachment))
        if not att.host:
            return
        view = att.array().view("u1")
        flat = arr.reshape(-1).view("u1")
        if into_attachment:
            view[:] = flat
        else:
            flat[:] = view


@pytest.fixture
def copies(monkeypatch):
    c = _Copies()
    monkeypatch.setattr(device_arrays, "_device_copy", c)
    return c


def _copy(client, label, mode, arr):
    """What put_array (``read-write``) or get_array (``read``) of a device array
    runs once it has found the buffer: the attach job's record."""
    return client._drive(device_arrays._leased_copy_plan(client, label, mode, arr, arr.nbytes, None))


def _sent(client) -> int:
    """Requests this client has sent so far (awaited or not)."""
    return client._conn._d.last_id


def _leases(client, name):
    """The leases on this test's buffers (names starting with ``name``)."""
    return [r for r in client.leases() if r["buffer"].startswith(name)]


def _lease_of(record) -> int:
    return int(record["result"]["lease"])


def _kept_after_a_put(c, name):
    """A shareable buffer ``name`` on GPU 0 and a put into it: its label, the kept
    lease's id and the kept lease (the caller frees the buffer)."""
    c.alloc(name, count=1024, dtype="f32", shareable=True)
    label = f"{name}@0"
    lease = _lease_of(_copy(c, label, "read-write", np.ones(1024, np.float32)))
    return label, lease, c._kept.get(label)


def _waits_behind_lease(client, job, tries=300) -> bool:
    for _ in range(tries):
        record = client.status(job).record
        if record.get("waiting_reason") == "lease":
            return True
        if record.get("state") in ("done", "failed", "cancelled"):
            return False
        time.sleep(0.01)
    return False


def _host(att) -> bool:
    return bool(att.host)


# Against gpuqd --------------------------------------------------------------------

def test_a_kept_lease_serves_repeated_copies_without_a_request(daemon, name, copies):
    with daemon.client() as c:
        c.alloc(name, count=1024, dtype="f32", shareable=True)
        label = f"{name}@0"
        try:
            src = np.arange(1024, dtype=np.float32)
            before = _sent(c)
            first = _copy(c, label, "read-write", src)
            assert _sent(c) == before + 1  # the attach alone: nothing released
            assert first["result"]["revocable"] is True
            lease = _lease_of(first)
            rows = _leases(c, name)
            assert [(r["lease"], r["state"], r["mode"], r.get("revocable")) for r in rows] == \
                [(lease, "held", "read-write", True)]
            kept = c._kept.get(label)
            assert kept is not None and kept.lease == lease and kept.uses == 0
            # Held by gpuqd (byte 0), not in use here (byte 1 free) between copies.
            assert kept_leases._held_by_gpuqd(kept.fd)
            before = _sent(c)
            again = _copy(c, label, "read-write", src * 2)
            out = np.zeros(1024, np.float32)
            _copy(c, label, "read", out)  # a read-write lease serves a get too
            assert _sent(c) == before  # no request at all
            assert _lease_of(again) == lease and c._kept.get(label) is kept
            assert copies.calls == [(lease, True), (lease, True), (lease, False)]
            if _host(kept.att):
                assert np.array_equal(out, src * 2)
                assert np.array_equal(c.get_array(name), src * 2)  # a job: revokes it
            # free through the client forgets it (the free revoked it) and its mapping.
            c.free(name)
            assert c._kept.get(label) is None and kept.fd == -1 and c._mappings == {}
            assert _leases(c, name) == []
        finally:
            if any(b["name"] == name for b in c.buffers()):
                c.free(name)


def test_another_clients_write_ends_an_idle_kept_lease(daemon, name, copies):
    with daemon.client() as c, daemon.client() as other:
        try:
            label, lease, kept = _kept_after_a_put(c, name)
            # The fill does not wait for the lease: gpuqd revokes it, unused.
            assert other.fill(name, "value", value=3.0, timeout=30).state == "done"
            assert _leases(c, name) == [] and not kept_leases._held_by_gpuqd(kept.fd)
            before = _sent(c)
            out = np.zeros(1024, np.float32)
            record = _copy(c, label, "read", out)
            assert _sent(c) == before + 1  # found ended: attached again
            assert _lease_of(record) != lease and record["result"]["revocable"] is True
            again = c._kept.get(label)
            assert again is not kept and not again.writable and kept.fd == -1
            assert again.att is kept.att  # the same buffer: its mapping is kept
            if _host(again.att):
                assert np.all(out == 3.0)
            # A put after that read needs read-write: the read lease is released
            # first (not waited for), then a read-write one taken.
            record = _copy(c, label, "read-write", np.full(1024, 5.0, np.float32))
            assert _sent(c) == before + 3
            assert c._kept.get(label).writable and again.fd == -1
            assert [(r["lease"], r["mode"]) for r in _leases(c, name)] == \
                [(_lease_of(record), "read-write")]
            # A job that only reads waits behind a read-write lease too: revoked.
            assert other.checksum(name, timeout=30).state == "done"
            assert _leases(c, name) == []
        finally:
            c.free(name)


def test_a_job_waits_for_a_copy_under_way_then_ends_the_lease(daemon, name, copies):
    with daemon.client() as c, daemon.client() as other:
        try:
            label, lease, kept = _kept_after_a_put(c, name)
            assert kept.begin_use()  # a copy under way
            job = other.fill(name, "value", value=4.0, detach=True)
            try:
                assert _waits_behind_lease(other, job)
                assert other.status(job).record.get("waiting_job") == lease
                assert [r["lease"] for r in _leases(c, name)] == [lease]
            finally:
                assert kept.end_use() is False
            assert other.wait(job, timeout=30).state == "done"
            assert _leases(c, name) == []
            out = np.zeros(1024, np.float32)
            record = _copy(c, label, "read", out)
            assert _lease_of(record) != lease
            if _host(kept.att):
                assert np.all(out == 4.0)
        finally:
            c.free(name)


def test_an_async_client_keeps_leases_too(daemon, name, copies):
    import asyncio

    async def main():
        async with gpuq.AsyncClient(daemon.socket, timeout=10) as c:
            await c.alloc(name, count=16, dtype="f32", shareable=True)
            label = f"{name}@0"
            try:
                plan = device_arrays._leased_copy_plan
                first = await c._drive(plan(c, label, "read-write", np.ones(16, np.float32),
                                            64, None))
                before = _sent(c)
                again = await c._drive(plan(c, label, "read", np.zeros(16, np.float32),
                                            64, None))
                assert _sent(c) == before and _lease_of(again) == _lease_of(first)
                assert [r["revocable"] for r in await c.leases()
                        if r["buffer"].startswith(name)] == [True]
            finally:
                await c.free(name)
            assert len(c._kept) == 0
    asyncio.run(main())


def test_the_least_recently_used_kept_lease_goes_past_eight(daemon, name, copies):
    names = [f"{name}{i}" for i in range(kept_leases.MAX_KEPT + 1)]
    with daemon.client() as c:
        try:
            leases = {}
            for n in names[:-1]:
                c.alloc(n, count=16, dtype="f32", shareable=True)
                leases[n] = _lease_of(_copy(c, f"{n}@0", "read-write",
                                            np.ones(16, np.float32)))
            assert len(c._kept) == kept_leases.MAX_KEPT
            assert sorted(r["lease"] for r in _leases(c, name)) == sorted(leases.values())
            # Used again, the first is the most recent; the second is the least.
            before = _sent(c)
            _copy(c, f"{names[0]}@0", "read", np.zeros(16, np.float32))
            assert _sent(c) == before
            lru = c._kept.get(f"{names[1]}@0")
            c.alloc(names[-1], count=16, dtype="f32", shareable=True)
            leases[names[-1]] = _lease_of(_copy(c, f"{names[-1]}@0", "read-write",
                                                np.ones(16, np.float32)))
            assert len(c._kept) == kept_leases.MAX_KEPT
            assert c._kept.get(f"{names[1]}@0") is None and lru.fd == -1
            assert c._kept.get(f"{names[0]}@0") is not None
            # Its release reached gpuqd before the next request.
            held = sorted(r["lease"] for r in _leases(c, name))
            assert held == sorted(v for k, v in leases.items() if k != names[1])
            # free through the client drops that buffer's alone.
            c.free(names[2])
            assert c._kept.get(f"{names[2]}@0") is None and len(c._kept) == 7
        finally:
            for n in names:
                if any(b["name"] == n for b in c.buffers()):
                    c.free(n, timeout=30)


def test_a_kept_lease_dropped_during_its_copy_is_released_at_the_copys_end(daemon, name,
                                                                          copies,
                                                                          monkeypatch):
    """Another thread forgets the buffer while a copy goes through its kept lease:
    the mapping is not unmapped under the copy, and the copy's end closes the
    lock and releases the lease."""
    with daemon.client() as c:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        try:
            label = f"{name}@0"
            lease = _lease_of(_copy(c, label, "read-write", np.ones(16, np.float32)))
            kept = c._kept.get(label)
            seen = []
            real = copies.__call__

            def dropping(att, arr, into_attachment):
                seen.append(device_arrays.drop_mappings(c, name, unmap=True))
                seen.append((att.ptr != 0, kept.fd >= 0, att in c._stale_mappings))
                real(att, arr, into_attachment)
            monkeypatch.setattr(device_arrays, "_device_copy", dropping)
            before = _sent(c)
            _copy(c, label, "read-write", np.ones(16, np.float32))
            assert seen == [[], (True, True, True)]  # nothing released under the copy
            assert _sent(c) == before + 1 and kept.fd == -1  # its release, at the end
            assert _leases(c, name) == [] and len(c._kept) == 0
            assert copies.calls[-1] == (lease, True)
        finally:
            c.free(name)


def test_close_ends_kept_leases_with_the_connection(daemon, name, copies):
    with daemon.client() as watcher:
        c = daemon.client()
        c.alloc(name, count=16, dtype="f32", shareable=True)
        try:
            _copy(c, f"{name}@0", "read-write", np.ones(16, np.float32))
            kept = c._kept.get(f"{name}@0")
            fd = kept.fd
            c.close()
            assert kept.fd == -1 and len(c._kept) == 0
            with pytest.raises(OSError):
                os.fstat(fd)
            deadline = time.monotonic() + 30
            while _leases(watcher, name):
                assert time.monotonic() < deadline, "the lease outlived its connection"
                time.sleep(0.02)
        finally:
            watcher.free(name, timeout=30)


def test_a_forked_child_leaves_the_parents_kept_lease_alone(daemon, name, copies):
    with daemon.client() as c:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        try:
            label = f"{name}@0"
            lease = _lease_of(_copy(c, label, "read-write", np.ones(16, np.float32)))
            fd = c._kept.get(label).fd
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: none of the parent's kept leases, nor its lock
                code = 1
                try:
                    os.close(r)
                    ok = len(c._kept) == 0
                    try:
                        os.fstat(fd)
                        ok = False
                    except OSError:
                        pass
                    ok = ok and lease in [x["lease"] for x in _leases(c, name)]
                    c.close()  # releases nothing of the parent's
                    code = 0 if ok else 2
                finally:
                    os._exit(code)
            os.close(w)
            _, status = os.waitpid(pid, 0)
            os.close(r)
            assert os.waitstatus_to_exitcode(status) == 0
            before = _sent(c)
            _copy(c, label, "read-write", np.ones(16, np.float32))
            assert _sent(c) == before  # still kept, still held
            assert [x["lease"] for x in _leases(c, name)] == [lease]
        finally:
            c.free(name)


def test_a_broken_kept_lease_is_dropped(daemon, name, copies):
    if os.geteuid() != 0:
        pytest.skip("lease_break needs root or the admin group")
    with daemon.client() as c, daemon.client() as admin:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        try:
            lease = _lease_of(_copy(c, f"{name}@0", "read-write", np.ones(16, np.float32)))
            kept = c._kept.get(f"{name}@0")
            admin.lease_break(lease)
            c.ping()  # the event comes with the next reply
            assert c._kept.get(f"{name}@0") is None and kept.fd == -1
            record = _copy(c, f"{name}@0", "read-write", np.ones(16, np.float32))
            assert _lease_of(record) != lease
        finally:
            c.free(name)


def test_a_reconnect_drops_kept_leases_without_releasing_them(private_daemon, copies):
    from test_reconnect import crash_and_restart
    d = private_daemon()
    with d.client() as c:
        c.set_reconnect(20)
        c.alloc("k", count=16, dtype="f32", shareable=True)
        _copy(c, "k@0", "read-write", np.ones(16, np.float32))
        kept = c._kept.get("k@0")
        crash_and_restart(d)
        assert not kept_leases._held_by_gpuqd(kept.fd)  # gone with gpuqd
        c.ping()
        assert c.reconnects == 1 and len(c._kept) == 0 and kept.fd == -1
        assert c.leases() == []


def test_a_wrong_size_is_refused_and_the_lease_given_back(daemon, name, copies):
    """The buffer was freed and made anew with another size since the caller
    looked it up: BadRequest before any copy, its lease released."""
    with daemon.client() as c:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        try:
            with pytest.raises(gpuq.BadRequest, match="changed"):
                _copy(c, f"{name}@0", "read-write", np.ones(32, np.float32))
            assert copies.calls == [] and _leases(c, name) == [] and len(c._kept) == 0
            _copy(c, f"{name}@0", "read-write", np.ones(16, np.float32))
            with pytest.raises(gpuq.BadRequest, match="holds 64 bytes"):
                _copy(c, f"{name}@0", "read-write", np.ones(8, np.float32))
            assert len(copies.calls) == 1 and c._kept.get(f"{name}@0").uses == 0
        finally:
            c.free(name)


# gpuqd that grants none -------------------------------------------------------------

def _attach_reply(f, conn, req, lease, **extra):
    """An attach's reply with a host handle (a memfd of 4096 bytes)."""
    fd = os.memfd_create("fake-buffer")
    os.ftruncate(fd, 4096)
    result = dict(lease=lease, buffer="x@0", device=0, uuid="GPU-0", dtype="bytes",
                  count=4096, bytes=4096, mode=req.get("mode", "read-write"),
                  handle="memfd", generation=7, **extra)
    frame = encode_frame({"id": req["id"], "ok": True, "fds": 1,
                          "job": {"job": lease, "op": "attach", "state": "done",
                                  "result": result}})
    socket.send_fds(conn, [frame], [fd])
    os.close(fd)


def _serve(script):
    """A fake gpuqd answering each request with the next of ``script``: a lease id
    (an attach's reply), "refuse" (bad_request), "busy", "restarted" or "ok"."""
    def handler(f, conn):
        for step in script:
            req = f.read_request(conn)
            if step in ("refuse", "busy"):
                code = "bad_request" if step == "refuse" else "busy"
                conn.sendall(encode_frame({"id": req["id"], "ok": False, "error": {
                    "code": code, "message": "revocable: not here"}}))
            elif step == "restarted":  # a queued attach with a descriptor, not replayed
                conn.sendall(encode_frame({"id": req["id"], "ok": False, "error": {
                    "code": "restarted", "message": "not replayable"}, "job": {
                    "job": 40, "op": "attach", "state": "failed"}}))
            elif step == "ok":
                f.reply(conn, req)
            else:
                _attach_reply(f, conn, req, step)
        time.sleep(0.5)
    return handler


def _ops(srv):
    return [(r["op"], r.get("revocable"), r.get("fds"), r.get("lease")) for r in srv.requests]


def _wait_requests(srv, n):
    deadline = time.monotonic() + 10
    while len(srv.requests) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_gpuqd_that_ignores_revocable_gets_a_release_per_copy(fake, copies, monkeypatch):
    made, closed = [], []

    def new_lock():
        made.append(real_new())
        return made[-1]

    def close_lock(fd):
        closed.append(fd)
        real_close(fd)
    real_new, real_close = kept_leases.new_lock, kept_leases.close_lock
    monkeypatch.setattr(kept_leases, "new_lock", new_lock)
    monkeypatch.setattr(kept_leases, "close_lock", close_lock)
    srv = fake(_serve([11, "ok", 12, "ok"]))
    with gpuq.Client(srv.socket, timeout=5) as c:
        for _ in range(2):
            _copy(c, "x@0", "read-write", np.ones(1024, np.float32))
            assert closed == made  # each lock closed once its attach said no
        _wait_requests(srv, 4)
        assert _ops(srv) == [("attach", True, 1, None), ("release", None, None, 11),
                             ("attach", True, 1, None), ("release", None, None, 12)]
        assert len(c._kept) == 0 and c._kept.refused == "" and len(made) == 2
        assert len(copies.calls) == 2


def test_a_refused_revocable_attach_falls_back_to_plain_ones(fake, copies):
    srv = fake(_serve(["refuse", 21, "ok", 22, "ok"]))
    with gpuq.Client(srv.socket, timeout=5) as c:
        for _ in range(2):
            _copy(c, "x@0", "read", np.ones(1024, np.float32))
        _wait_requests(srv, 5)
        assert _ops(srv) == [("attach", True, 1, None), ("attach", None, None, None),
                             ("release", None, None, 21), ("attach", None, None, None),
                             ("release", None, None, 22)]
        assert "not here" in c._kept.refused and len(c._kept) == 0


@pytest.mark.parametrize("why", ["busy", "restarted"])
def test_a_busy_or_unreplayed_revocable_attach_falls_back_for_that_copy_alone(fake, copies,
                                                                              why):
    """busy: the connection holds as many revocable leases as gpuqd allows;
    restarted: gpuqd re-executed while the attach was queued, and a request
    that carried a descriptor is not replayed. That copy takes a plain lease;
    the next asks for a revocable one again."""
    srv = fake(_serve([why, 31, "ok", 32]))
    with gpuq.Client(srv.socket, timeout=5) as c:
        _copy(c, "x@0", "read", np.ones(1024, np.float32))
        assert c._kept.refused == "" and len(c._kept) == 0
        _copy(c, "x@0", "read", np.ones(1024, np.float32))
        _wait_requests(srv, 4)
        assert _ops(srv)[:4] == [("attach", True, 1, None), ("attach", None, None, None),
                                 ("release", None, None, 31), ("attach", True, 1, None)]


# The lock protocol, against another process standing in for gpuqd -------------------

_STAND_IN = r"""
import fcntl, sys
fd = int(sys.argv[1])
while True:
    cmd = sys.stdin.readline().split()
    if not cmd:
        break
    try:
        if cmd[0] == "lock":
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, int(cmd[1]))
        elif cmd[0] == "unlock":
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, int(cmd[1]))
        print("ok", flush=True)
    except OSError:
        print("busy", flush=True)
"""


class _StandIn:
    """A process holding the lock's memfd, taking and dropping its byte locks as told."""

    def __init__(self, fd: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _STAND_IN, str(fd)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, pass_fds=(fd,))

    def __call__(self, cmd: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def test_the_lock_protocol_against_another_process():
    fd = kept_leases.new_lock()
    assert fd >= 0
    kept = kept_leases.KeptLease(1, "x@0", True, None, {}, fd)
    other = _StandIn(fd)
    try:
        assert other("lock 0") == "ok"  # the grant
        assert other("lock 1") == "busy"  # in use from before the attach
        assert kept.end_use() is False
        # Two uses at once (threads): one lock, held until the last ends.
        assert kept.begin_use() and kept.begin_use() and kept.uses == 2
        assert kept.end_use() is False and other("lock 1") == "busy"
        assert kept.end_use() is False and kept.uses == 0
        # Revoking: the other process takes byte 1, and no use can start.
        assert other("lock 1") == "ok"
        assert kept.begin_use() is False and kept.uses == 0
        assert other("unlock 1") == "ok"
        assert kept.begin_use() and kept.end_use() is False
        # The lease ended (byte 0 dropped): no use, and byte 1 is left unlocked.
        assert other("unlock 0") == "ok"
        assert kept.begin_use() is False and kept.uses == 0
        assert other("lock 1") == "ok" and other("unlock 1") == "ok"
        # Dropped during a use: the use's end closes the lock and asks for the release.
        assert other("lock 0") == "ok"
        assert kept.begin_use()
        assert kept.retire(True) is False and kept.fd == fd
        assert kept.begin_use() is False  # dropped: no new use
        assert kept.end_use() is True and kept.fd == -1
        with pytest.raises(OSError):
            os.fstat(fd)
    finally:
        other.close()
        kept_leases.close_lock(kept.fd)


def test_kept_leases_are_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(kept_leases, "_held_by_gpuqd", lambda fd: True)
    kept = kept_leases.KeptLeases()
    made = []

    def keep(label, lease, writable=True):
        k = kept_leases.KeptLease(lease, label, writable, None, {}, kept_leases.new_lock())
        made.append(k)
        ended = kept.keep(k)
        assert k.end_use() is False
        return ended

    try:
        for i in range(kept_leases.MAX_KEPT):
            assert keep(f"b{i}@0", 100 + i) == []
        got, ended = kept.use("b0@0", write=True)
        assert got is made[0] and ended == [] and got.end_use() is False
        assert keep("b8@0", 108) == [101]  # b1 was the least recently used
        assert kept.get("b1@0") is None and made[1].fd == -1
        # A read lease does not serve a write: dropped, to be released.
        assert keep("r@1", 200, writable=False) == [102]
        assert kept.use("r@1", write=True) == (None, [200])
        assert kept.get("r@1") is None
        # Dropped by name (any GPU), without release after a connection's end.
        keep("b3@1", 300)
        assert kept.drop("b3", release=False) == ([], set())
        assert kept.get("b3@0") is None and kept.get("b3@1") is None
        assert sorted(kept.drop("b4", release=True)[0]) == [104]
        kept.drop_lease(105)
        assert kept.get("b5@0") is None
        # An ended one (byte 0 free) is dropped at its next use, unreleased.
        monkeypatch.setattr(kept_leases, "_held_by_gpuqd", lambda fd: False)
        assert kept.use("b6@0", write=False) == (None, [])
        assert kept.get("b6@0") is None and made[6].fd == -1
        child = kept.in_child()
        assert len(child) == 0 and all(k.fd == -1 for k in made)
    finally:
        for k in made:
            kept_leases.close_lock(k.fd)
