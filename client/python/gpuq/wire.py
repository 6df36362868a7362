"""The wire format of docs/protocol.md, without any I/O.

A frame is a 4-byte big-endian payload length, then one msgpack map. This
module builds request frames and splits a byte stream into reply maps; the
sync and asyncio connections feed it whatever their sockets read.
"""

from __future__ import annotations

import os
import struct
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import msgpack

from .errors import BadRequest, ProtocolError

__all__ = ["PROTOCOL_VERSION", "MAX_FDS", "MAX_REPLY_FRAME", "default_socket",
           "encode_request", "encode_frame", "FrameReader"]

#: The protocol version this client speaks (every request's ``v``).
PROTOCOL_VERSION = 1
#: Descriptors that may ride on one request (SCM_RIGHTS).
MAX_FDS = 4
#: The largest reply frame accepted, as libgpuq's default: a ``jobs`` reply
#: listing the whole job history fits with room to spare.
MAX_REPLY_FRAME = 64 << 20
HEADER = 4
_LENGTH = struct.Struct(">I")  # a frame's HEADER: its payload's length


def default_socket() -> str:
    """The socket used when none is given, resolved as the ``gpuq`` CLI does.

    ``$GPUQ_SOCKET`` if set; else ``/run/gpuq/gpuqd.sock`` for root or when
    ``$XDG_RUNTIME_DIR`` is unset; else ``$XDG_RUNTIME_DIR/gpuq.sock`` (a
    user's own daemon) unless it does not exist and the system service's does.
    """
    env = os.environ.get("GPUQ_SOCKET")
    if env:
        return env
    system = "/run/gpuq/gpuqd.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if os.geteuid() == 0 or not xdg:
        return system
    own = os.path.join(xdg, "gpuq.sock")
    if os.path.exists(own) or not os.path.exists(system):
        return own
    return system


def _plain(value: Any) -> Any:
    """msgpack's fallback: numpy scalars and paths become what they stand for."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a numpy scalar
        return value.item()
    if hasattr(value, "__index__"):
        return value.__index__()
    if hasattr(value, "__float__") and not isinstance(value, (str, bytes)):
        return float(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"a request cannot carry a {type(value).__name__} ({value!r}); "
                    "use str, int, float, bool, list or dict")


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """One frame holding ``message`` (any map: tests send malformed requests with it)."""
    payload = msgpack.packb(message, use_bin_type=True, default=_plain)
    return len(payload).to_bytes(HEADER, "big") + payload


def new_packer() -> Any:
    """A msgpack packer for :func:`encode_request`: one per connection (a packer is
    not thread-safe), which saves making one per request."""
    return msgpack.Packer(use_bin_type=True, default=_plain)


def encode_request(op: str, request_id: int, fields: Mapping[str, Any],
                   fds: int = 0, packer: Any = None) -> bytes:
    """The frame of a request: ``v``, ``id``, ``op``, then every field not None
    (and ``fds`` when descriptors ride with it). ``packer``: :func:`new_packer`'s,
    used by one thread at a time."""
    if packer is not None and not fds and not fields and type(op) is str:
        parts = _BARE.get(op)
        if parts is None:
            return _bare_request(op, request_id, packer)
        head, tail, size = parts
        packed = packer.pack(request_id)
        return (size + len(packed)).to_bytes(HEADER, "big") + head + packed + tail
    message: Dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": op}
    for key, value in fields.items():
        if value is not None and key not in message:
            message[key] = value
    if fds:
        message["fds"] = fds
    try:
        if packer is None:
            return encode_frame(message)
        payload = packer.pack(message)
    except OverflowError:  # the packer starts afresh: the connection goes on
        raise BadRequest(_beyond_64_bits(message), "bad_request") from None
    return len(payload).to_bytes(HEADER, "big") + payload


_INT_MIN, _INT_END = -(2**63), 2**64


def _beyond_64_bits(message: Mapping[str, Any]) -> str:
    """What msgpack could not carry, worded as gpuqd words a field out of range."""
    def find(value: Any, path: str) -> Optional[Tuple[str, int]]:
        if isinstance(value, int) and not isinstance(value, bool):
            return None if _INT_MIN <= value < _INT_END else (path, value)
        if isinstance(value, Mapping):
            items: Any = ((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
        else:
            return None
        for where, item in items:
            found = find(item, where)
            if found is not None:
                return found
        return None

    for key, value in message.items():
        found = find(value, key)
        if found is not None:
            return (f"field '{found[0]}': {found[1]} is beyond the protocol's integers "
                    "(-2^63 to 2^64-1)")
    return "a field holds an integer beyond the protocol's (-2^63 to 2^64-1)"


# The packed map of a request with only v, id and op (ping, jobs, the listings),
# split around its id, by op, with their length: made once, so that each such
# request packs only its id. The map's keys are in the order encode_request
# packs them. Kept for the first _BARE_OPS ops seen (the protocol has fewer;
# request() takes any).
_BARE: Dict[str, Tuple[bytes, bytes, int]] = {}
_BARE_OPS = 64


def _bare_request(op: str, request_id: int, packer: Any) -> bytes:
    """encode_request's frame for a request without fields whose op _BARE has
    not kept: its parts made (and kept while there is room)."""
    head = (bytes([0x80 | 3]) + packer.pack("v") + packer.pack(PROTOCOL_VERSION)
            + packer.pack("id"))  # 0x8N: a map of N (< 16) pairs
    tail = packer.pack("op") + packer.pack(op)
    if len(_BARE) < _BARE_OPS:
        _BARE[op] = (head, tail, len(head) + len(tail))
    payload = b"".join((head, packer.pack(request_id), tail))
    return len(payload).to_bytes(HEADER, "big") + payload


class FrameReader:
    """Splits the bytes read from the daemon into reply maps.

    ``feed`` returns every map that is complete. Anything that is not a
    frame holding one msgpack map raises :class:`ProtocolError`: the stream
    cannot be trusted after it, so the connection must be closed. Strings
    that are not valid UTF-8 are decoded with replacement characters rather
    than failing the connection.

    A connection does not call ``feed``: it takes the steps one at a time
    (:meth:`whole_frame`, then ``buf``, :meth:`first_frame`), so that a
    KeyboardInterrupt between two of them loses nothing (dispatch.py). The
    methods only look; what a step changes, its caller writes in ``buf``
    itself: the bytes of a frame not yet complete, kept across reads.
    """

    def __init__(self, max_frame: int = MAX_REPLY_FRAME) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()

    def feed(self, data: Union[bytes, memoryview]) -> List[Dict[str, Any]]:
        """The maps completed by ``data``, decoded before this returns (``data`` may
        be a view of a buffer that the next read overwrites)."""
        return self.feed_from(bytearray(data), memoryview(data), len(data))

    def feed_from(self, buf: bytearray, view: memoryview,
                  length: int) -> List[Dict[str, Any]]:
        """What ``feed(view[:length])`` returns, for ``length`` bytes read into
        ``buf`` (``view`` is a memoryview of it)."""
        whole = self.whole_frame(buf, view, length)
        if whole is not None:
            return [whole]
        self.buf += view[:length]
        maps: List[Dict[str, Any]] = []
        while True:
            first = self.first_frame()
            if first is None:
                return maps
            maps.append(first[0])
            del self.buf[:first[1]]

    def whole_frame(self, buf: bytearray, view: memoryview,
                    length: int) -> Optional[Dict[str, Any]]:
        """The map, when the ``length`` bytes read into ``buf`` (``view`` a memoryview
        of it) are one whole frame and nothing is kept from before: the common
        case, decoded from one slice of ``view`` with no copy. Else None: the
        bytes go on ``buf``, and :meth:`first_frame` takes the frames out."""
        if not self.buf and length >= HEADER:
            size = _LENGTH.unpack_from(buf)[0]
            if length == HEADER + size and size <= self.max_frame:
                try:
                    obj = msgpack.unpackb(view[HEADER:length], raw=False,
                                          unicode_errors="replace", strict_map_key=False)
                except Exception as exc:  # msgpack raises several unrelated classes
                    raise _not_msgpack(exc) from exc
                if isinstance(obj, dict):
                    return obj
                raise _not_a_map(obj)
        return None

    def first_frame(self) -> Optional[Tuple[Dict[str, Any], int]]:
        """The map of the first frame ``buf`` holds whole, and how many bytes of ``buf``
        it takes (the caller deletes them), or None while it is incomplete."""
        if len(self.buf) < HEADER:
            return None
        size = _LENGTH.unpack_from(self.buf)[0]
        if size > self.max_frame:
            raise ProtocolError(f"gpuqd sent a frame of {size} bytes, above the "
                                f"{self.max_frame} this client accepts")
        if len(self.buf) < HEADER + size:
            return None
        return self._decode(self.buf[HEADER:HEADER + size]), HEADER + size

    @staticmethod
    def _decode(payload: Union[bytes, bytearray, memoryview]) -> Dict[str, Any]:
        try:
            obj = msgpack.unpackb(payload, raw=False, unicode_errors="replace",
                                  strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated classes
            raise _not_msgpack(exc) from exc
        if not isinstance(obj, dict):
            raise _not_a_map(obj)
        return obj


def _not_msgpack(exc: Exception) -> ProtocolError:
    return ProtocolError(f"gpuqd sent a frame that is not msgpack: {exc}")


def _not_a_map(obj: Any) -> ProtocolError:
    return ProtocolError(f"gpuqd sent a frame holding a {type(obj).__name__}, not a map")
