"""A daemon that goes away, stops answering, or sends what it should not:
the client always returns, with an error that says what happened."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import msgpack
import pytest

import gpuq
from gpuq.wire import encode_frame



def test_unreachable_daemon_names_the_socket(tmp_path):
    path = str(tmp_path / "nobody.sock")
    with pytest.raises(ConnectionError, match=f"{path}.*is gpuqd running"):
        gpuq.Client(path)
    with pytest.raises(ConnectionError, match=path):
        gpuq.AsyncClient(path)
    long = "/tmp/" + "x" * 200
    with pytest.raises(ConnectionError, match="cannot connect"):
        gpuq.Client(long)


def test_default_socket_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUQ_SOCKET", "/some/where.sock")
    assert gpuq.default_socket() == "/some/where.sock"
    monkeypatch.delenv("GPUQ_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    if os.geteuid() == 0:
        assert gpuq.default_socket() == "/run/gpuq/gpuqd.sock"
    else:
        own = str(tmp_path / "gpuq.sock")
        assert gpuq.default_socket() in (own, "/run/gpuq/gpuqd.sock")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert gpuq.default_socket() == "/run/gpuq/gpuqd.sock"


def test_daemon_killed_during_a_wait(stalled):
    s = stalled()
    threading.Timer(0.3, s.daemon.proc.kill).start()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"{s.daemon.socket}.*closed the connection"):
        s.job.wait()  # no time limit: only the daemon's going can end it
    assert time.monotonic() - t0 < 10
    assert s.client.closed
    with pytest.raises(ConnectionError, match="make a new client"):
        s.client.ping()


def test_daemon_killed_with_requests_from_several_threads(stalled):
    s = stalled()
    errors = []

    def waiter():
        try:
            s.client.wait(s.job, timeout=60)
        except BaseException as exc:
            errors.append(exc)
    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    s.daemon.proc.kill()
    for t in threads:
        t.join(20)
    assert len(errors) == 4 and all(isinstance(e, ConnectionError) for e in errors)


def test_stopped_daemon_times_out_and_liveness_closes_a_long_wait(stalled):
    s = stalled(timeout=0.5)
    s.daemon.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(gpuq.ReplyTimeout, match="did not answer"):
            s.client.ping()  # answered at once by a live daemon
        assert 0.4 < time.monotonic() - t0 < 5
        assert not s.client.closed  # a reply timeout keeps the connection
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="did not answer a ping"):
            s.job.wait()  # no limit of its own: the ping finds the daemon silent
        assert time.monotonic() - t0 < 5 and s.client.closed
    finally:
        s.daemon.proc.send_signal(signal.SIGCONT)


def test_a_long_wait_survives_while_pings_are_answered(stalled):
    s = stalled(timeout=0.3)
    threading.Timer(1.5, s.end).start()
    assert s.job.wait().state == "done"  # 5 liveness periods, each answered


def test_asyncio_daemon_killed_and_stopped(stalled):
    s = stalled()
    proc = s.daemon.proc

    async def main():
        c = gpuq.AsyncClient(s.daemon.socket, timeout=0.5)
        proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(gpuq.ReplyTimeout):
                await c.ping()
            with pytest.raises(ConnectionError, match="did not answer a ping"):
                await c.wait(s.job.id)
        finally:
            proc.send_signal(signal.SIGCONT)
        c2 = gpuq.AsyncClient(s.daemon.socket)
        waiting = asyncio.ensure_future(c2.wait(s.job.id))
        await asyncio.sleep(0.2)
        proc.kill()
        with pytest.raises(ConnectionError, match="closed the connection"):
            await asyncio.wait_for(waiting, 10)
    asyncio.run(main())


# A fake daemon, for what gpuqd never sends ----------------------------------

def answer_ping_then(after):
    def handler(f, conn):
        req = f.read_request(conn)
        f.reply(conn, req, version=1)
        after(f, conn)
    return handler


#: Frames no client can read, and what the error it raises says.
UNREADABLE_FRAMES = [
    (b"\x00\x00\x00\x03\xc1\xc1\xc1", "not msgpack"),
    (b"\x00\x00\x00\x01\x05", "not a map"),
    (b"\xff\xff\xff\xff", "above the"),
]


def answers_ping_then_sends(fake, junk):
    """A fake daemon that answers a ping, then sends ``junk`` for the next request."""
    def after(f, conn):
        f.read_request(conn)
        conn.sendall(junk)
        time.sleep(1)
    return fake(answer_ping_then(after))


@pytest.mark.parametrize("junk,match", UNREADABLE_FRAMES)
def test_unreadable_frames_close_the_connection(fake, junk, match):
    srv = answers_ping_then_sends(fake, junk)
    c = gpuq.Client(srv.socket, timeout=5)
    assert c.ping()["version"] == 1
    with pytest.raises(gpuq.ProtocolError, match=match):
        c.ping()
    assert c.closed


@pytest.mark.parametrize("junk,match", UNREADABLE_FRAMES)
def test_unreadable_frames_close_the_asyncio_connection(fake, junk, match):
    srv = answers_ping_then_sends(fake, junk)

    async def main():
        async with gpuq.AsyncClient(srv.socket, timeout=5) as c:
            assert (await c.ping())["version"] == 1
            with pytest.raises(gpuq.ProtocolError, match=match):
                await c.ping()
            assert c.closed
    asyncio.run(main())


def test_frames_read_into_the_buffer_decode_as_fed():
    # Connections hand what each read brought to FrameReader.feed_from, in their
    # one read buffer; whatever the reads' sizes, the maps are feed's.
    from gpuq.wire import FrameReader
    frames = [encode_frame({"id": i, "ok": True, "pad": "x" * (i * 37)}) for i in range(12)]
    stream = b"".join(frames)
    expect = FrameReader().feed(stream)
    assert len(expect) == 12
    buf = bytearray(len(stream))
    view = memoryview(buf)
    for cut in (1, 3, 4, 5, 41, len(frames[0]), len(frames[0]) + 2, len(stream)):
        reader, got = FrameReader(), []
        for at in range(0, len(stream), cut):
            piece = stream[at:at + cut]
            buf[:len(piece)] = piece
            got += reader.feed_from(buf, view, len(piece))
        assert got == expect, cut
    for junk, match in ((b"\x00\x00\x00\x03\xc1\xc1\xc1", "not msgpack"),
                        (b"\x00\x00\x00\x01\x05", "not a map"),
                        (b"\x00\x00\x00\x02\x80\x05", "not msgpack"),  # a map, then more
                        (b"\xff\xff\xff\xff", "above the")):
        buf[:len(junk)] = junk
        with pytest.raises(gpuq.ProtocolError, match=match):
            FrameReader().feed_from(buf, view, len(junk))
        with pytest.raises(gpuq.ProtocolError, match=match):
            FrameReader().feed(junk)


def test_odd_but_readable_frames(fake):
    def handler(f, conn):
        req = f.read_request(conn)
        conn.sendall(encode_frame({"event": "progress", "id": 999, "bytes": 1}))  # nobody's
        conn.sendall(encode_frame({"id": 12345, "ok": True}))  # no such request
        bad_utf8 = msgpack.packb({"id": req["id"], "ok": False,
                                  "error": {"code": "io_error", "message": "x"}})
        bad_utf8 = bad_utf8.replace(b"\xa1x", b"\xa2\xff\xfe")
        conn.sendall(len(bad_utf8).to_bytes(4, "big") + bad_utf8)
        req = f.read_request(conn)
        conn.sendall(encode_frame({"id": req["id"], "ok": False}))  # no error map
        req = f.read_request(conn)
        conn.sendall(encode_frame({"id": 0, "ok": False,
                                   "error": {"code": "bad_frame", "message": "too big"}}))
        time.sleep(1)
    srv = fake(handler)
    c = gpuq.Client(srv.socket, timeout=5)
    with pytest.raises(gpuq.IoError) as info:
        c.ping()
    assert "\ufffd" in str(info.value)  # replaced, not a crash
    with pytest.raises(gpuq.GpuqError, match="without an error map"):
        c.ping()
    with pytest.raises(gpuq.BadFrame, match="too big"):
        c.ping()
    assert c.closed


def test_no_reply_is_a_reply_timeout_and_the_connection_lives(fake):
    def handler(f, conn):
        f.read_request(conn)  # never answered
        req = f.read_request(conn)
        f.reply(conn, req, version=1)
        time.sleep(1)
    srv = fake(handler)
    c = gpuq.Client(srv.socket, timeout=0.3)
    with pytest.raises(gpuq.ReplyTimeout):
        c.ping()
    assert c.ping()["version"] == 1


def test_what_is_sent(fake, tmp_path):
    def handler(f, conn):
        for _ in range(6):
            req = f.read_request(conn)
            f.reply(conn, req, job={"job": req["id"], "op": req["op"], "state": "queued"})
        time.sleep(1)
    srv = fake(handler)
    c = gpuq.Client(srv.socket, timeout=5)
    c.noop(detach=True)
    c.noop(priority="high", timeout=2.5, on_progress=print)
    c.alloc("w", nbytes=10, wait_memory_ms=250, priority="low")
    c.put(b"abc", "w", detach=True)
    c.run("w", "sin | add 2", ephemeral=True)
    c.job("all_gather", buffer="w", devices=[0, 1])
    sent = srv.requests
    assert all(r["v"] == 1 and isinstance(r["id"], int) for r in sent)
    assert len({r["id"] for r in sent}) == 6
    assert "priority" not in sent[0] and "wait" not in sent[0] and "device" not in sent[0]
    assert sent[1]["priority"] == "high" and sent[1]["wait"] is True
    assert sent[1]["timeout_ms"] == 2500 and sent[1]["progress"] is True
    assert sent[2]["priority"] == "low" and sent[2]["wait_memory_ms"] == 250
    assert sent[2]["bytes"] == 10 and "count" not in sent[2]
    assert sent[3]["fds"] == 1 and len(srv.fds) == 1
    assert os.pread(srv.fds[0], 10, 0) == b"abc"
    assert sent[4]["ops"] == [["sin"], ["add", 2]] and sent[4]["ephemeral"] is True
    assert sent[5]["op"] == "all_gather" and sent[5]["devices"] == [0, 1]


def test_numpy_scalars_and_paths_encode():
    import numpy as np
    from pathlib import Path
    frame = encode_frame({"a": np.int64(3), "b": np.float32(0.5), "c": Path("/x"),
                          "d": (1, 2), "e": np.bool_(True)})
    assert msgpack.unpackb(frame[4:]) == {"a": 3, "b": 0.5, "c": "/x", "d": [1, 2],
                                          "e": True}
    with pytest.raises(TypeError, match="cannot carry"):
        encode_frame({"x": object()})


def test_requests_without_fields_are_packed_as_any_other():
    # ping and the listings reuse pre-packed parts around their id: the bytes
    # must be those of the whole map packed at once, whatever the id's width.
    from gpuq.wire import encode_request, new_packer
    packer = new_packer()
    for op in ("ping", "jobs", "x" * 40):
        for rid in (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32, 2**63):
            whole = encode_frame({"v": 1, "id": rid, "op": op})
            assert encode_request(op, rid, {}, 0, packer) == whole
            assert encode_request(op, rid, {"device": None}, 0, packer) == whole
    for n in range(100):  # more ops than are kept pre-packed
        for _ in range(2):
            op = f"op{n}"
            assert encode_request(op, n, {}, 0, packer) == encode_frame(
                {"v": 1, "id": n, "op": op})
    assert msgpack.unpackb(encode_request("ping", 5, {}, 1, packer)[4:])["fds"] == 1


def test_too_many_descriptors_are_refused_before_sending(client):
    with pytest.raises(ValueError, match="at most 4"):
        client.request("noop", fds=[0, 0, 0, 0, 0])
    assert client.ping()["version"] == 1
