"""The protocol's bad-input cases, sent from the client side: each gets the
documented answer, and nothing else is lost (other clients, their buffers)."""

from __future__ import annotations

import os
import socket

import msgpack
import pytest

import gpuq
from gpuq.errors import error_from_map
from gpuq.wire import FrameReader, encode_frame


def raw_exchange(path: str, data: bytes, fds=()):
    """Sends bytes on a fresh connection; returns the first reply and whether the
    daemon closed the connection after it."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    try:
        if fds:
            socket.send_fds(s, [data[:1]], list(fds))
            s.sendall(data[1:])
        else:
            s.sendall(data)
        reader, got = FrameReader(), []
        while not got:
            chunk = s.recv(65536)
            if not chunk:
                return None, True
            got = reader.feed(chunk)
        s.settimeout(0.3)
        try:
            closed = s.recv(1) == b""
        except socket.timeout:
            closed = False
        return got[0], closed
    finally:
        s.close()


def raw_payload(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


@pytest.fixture
def witness(client, name):
    """A buffer of another client whose bytes must survive every case."""
    client.alloc(name, nbytes=4096)
    client.fill(name, "random", seed=11)
    before = client.checksum(name).result["checksum"]
    yield
    assert client.checksum(name).result["checksum"] == before
    client.free(name)


@pytest.mark.parametrize("data,match", [
    (raw_payload(b"\xc1"), "msgpack"),                      # not msgpack
    (raw_payload(msgpack.packb([1, 2])), "map"),            # not a map
    (b"\x7f\xff\xff\xff", "frame"),                         # above --max-frame
    (raw_payload(msgpack.packb({"v": 1, "id": 3, "op": "ping",
                                "x": [[[[[1]]]]]})), ""),    # nested too deep
    (raw_payload(msgpack.packb({"v": 1, "id": 4, "op": "put", "buffer": "w",
                                "fds": 1})), "descriptors"),  # fds without descriptors
], ids=["not-msgpack", "not-a-map", "oversize", "too-deep", "fds-missing"])
def test_unreadable_frames_get_bad_frame_and_are_closed(daemon, witness, data, match):
    reply, closed = raw_exchange(daemon.socket, data)
    assert reply is not None and reply["ok"] is False
    err = error_from_map(reply["error"])
    assert type(err) is gpuq.BadFrame and match.lower() in str(err).lower()
    assert closed


@pytest.mark.parametrize("request_map,cls,match", [
    ({"v": 2, "id": 7, "op": "ping"}, gpuq.UnsupportedVersion, ""),
    ({"v": 1, "id": 8, "op": "frobnicate"}, gpuq.UnknownOp, "frobnicate"),
    ({"v": 1, "id": 9}, gpuq.BadRequest, "op"),
    ({"v": 1, "id": 10, "op": "alloc", "name": "x"}, gpuq.BadRequest, "bytes"),
    ({"v": 1, "id": 11, "op": "alloc", "name": 5, "bytes": 8}, gpuq.BadRequest, "name"),
    ({"v": 1, "id": 12, "op": "alloc", "name": "x", "bytes": -8}, gpuq.BadRequest, "bytes"),
    ({"v": 1, "id": 13, "op": "alloc", "name": "../x", "bytes": 8}, gpuq.BadRequest, "name"),
    ({"v": 1, "id": 14, "op": "fill", "buffer": "nothere", "pattern": "zero"},
     gpuq.NotFound, "nothere"),
    ({"v": 1, "id": 15, "op": "status", "job": "seven"}, gpuq.BadRequest, "job"),
    ({"v": 1, "id": 16, "op": "noop", "wait": "yes"}, gpuq.BadRequest, "wait"),
], ids=lambda v: str(v["id"]) if isinstance(v, dict) else None)
def test_refused_requests_keep_the_connection(daemon, witness, request_map, cls, match):
    reply, closed = raw_exchange(daemon.socket, encode_frame(request_map))
    assert reply["id"] == request_map["id"] and reply["ok"] is False
    err = error_from_map(reply["error"])
    assert type(err) is cls and match in str(err)
    assert not closed


def test_bad_input_through_the_client(client, name, witness):
    with pytest.raises(gpuq.BadRequest, match="name"):
        client.alloc("bad name!", nbytes=8)
    with pytest.raises(gpuq.BadRequest):
        client.alloc(name + "x", nbytes=8, device=-1)
    with pytest.raises(gpuq.BadRequest):
        client.put(b"abc", f"{name}[1M:1048577]")  # a range outside the buffer
    r, w = os.pipe()
    try:
        with pytest.raises(gpuq.BadRequest):
            client.get(name, r)  # a descriptor open only for reading
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(gpuq.BadRequest):
        client.copy(f"{name}[0:2K]", f"{name}[1K:]")  # overlapping ranges
    with pytest.raises(gpuq.BadRequest, match="op 1"):
        client.run(name, "frob")
    assert client.ping()["version"] == 1  # the same connection goes on


@pytest.mark.parametrize("value", [-(2**63) - 1, 2**64, 2**200])
def test_an_integer_beyond_64_bits_is_a_bad_request_naming_its_field(client, name, witness, value):
    """msgpack cannot carry it: the client says which field, as gpuqd would, and
    the connection (and its packer) go on."""
    with pytest.raises(gpuq.BadRequest, match=f"field 'value': {value} is beyond"):
        client.fill(name, "value", value=value)
    with pytest.raises(gpuq.BadRequest, match=r"field 'ops\[0\]\[1\]'"):
        client.run(name, [["add", value]])
    assert client.ping()["version"] == 1
