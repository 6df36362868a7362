"""What the sync and asyncio connections share: ids, deadlines, routing, liveness.

A connection sends a request and parks a *slot* under its id; every frame
read is routed here to the slot it belongs to: a reply (matched by ``id``)
or a progress event (a frame with ``event``, carrying the waiting request's
id). A slot has an asyncio future's ``set_result`` (the reply) and
``set_exception`` (the connection's end, a deadline passed), so that an
asyncio future is one as it is, and ``event`` when it takes progress events.
Both may raise InvalidStateError, as a future's do once it is done (its
request given up as the reply came): what came is then let go. This module
never blocks and does no I/O.

Every read has a time limit. A request that the daemon answers at once
(everything but a wait for a job) must be answered within the client's
``timeout``. A wait for a job may take as long as the job; while one is
pending and nothing has arrived for ``timeout`` seconds, the connection asks
:meth:`Dispatcher.liveness` and sends a ``ping`` (answered by the daemon's
main thread whatever its workers do): no frame at all within another
``timeout`` means the daemon is stuck or gone, and the connection is closed.
"""

from __future__ import annotations

import array
import os
import select
import socket
import time
from asyncio import InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .errors import BadFrame, GpuqError, ReplyTimeout, error_from_map
from .wire import MAX_FDS, MAX_REPLY_FRAME, FrameReader, encode_request, new_packer

__all__ = ["Call", "DROPPED", "Dispatcher", "FDS_SPACE", "READ_CHUNK", "YIELD", "close_all"]

READ_CHUNK = 1 << 18
# Room for the most descriptors a reply brings (SCM_RIGHTS), as socket.recv_fds asks.
FDS_SPACE = socket.CMSG_SPACE(MAX_FDS * 4)

EventHandler = Callable[[Dict[str, Any]], None]


@dataclass
class Call:
    """One request to send: its op and fields, descriptors, and how long it may take.

    ``waits``: the daemon answers when a job ends (a job request with
    ``wait``, or the ``wait`` op), so the reply may take as long as the job.
    ``wait_s``: the request's own limit on that wait (its ``timeout_ms``),
    ``None`` for none. ``on_event``: called with each progress event.
    ``await_reply``: False to send it and go on, its reply dropped whenever a
    later read brings it (:data:`DROPPED`). gpuqd reads one connection's
    frames in order, so the requests sent after it are carried out after it;
    what it answers is never known, so only a request whose refusal changes
    nothing for the caller may be sent so (the release of a lease that a
    copy of the client's own held: a lease not held any more is what it asks).
    ``on_abandoned``: called with the reply when it comes after the caller
    stopped waiting for it (Ctrl-C, a cancelled task, the client's deadline),
    for a reply that grants something (an ``attach``'s lease) that must then
    be given back; without it such a reply is let go. A plan that yields
    such a call sets its ``claimed`` once what the reply grants is its own
    (Client._drive gives an unclaimed reply to ``on_abandoned``).
    """

    op: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    fds: Sequence[int] = ()
    waits: bool = False
    wait_s: Optional[float] = None
    on_event: Optional[EventHandler] = None
    await_reply: bool = True
    on_abandoned: Optional[EventHandler] = None
    # Set as the reply comes, on the sync client: a reply an interrupt kept from
    # its caller goes to ``on_abandoned`` unless the caller ``claimed`` it
    # (took what it grants in hand); see Client._drive.
    reply: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False,
                                            compare=False)
    claimed: bool = field(default=False, init=False, repr=False, compare=False)


#: What a plan yields, instead of a request, to let other work on its thread
#: run: nothing for Client (its plan blocks its own thread anyway); one turn of
#: the event loop for AsyncClient. Its reply is None.
YIELD = Call("")


def close_fds(frame: Dict[str, Any]) -> None:
    """Closes the descriptors a reply brought (``_fds``), for a reply let go."""
    close_all(frame.pop("_fds", None) or [])


def close_all(fds: List[int]) -> None:
    """Closes the descriptors in ``fds``, taking each off the list first: called
    again after an interrupt, it closes none twice."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


class _Dropped:
    """The slot of every request sent with ``await_reply`` False: what comes for it
    (its reply, or the connection's end) is let go."""

    __slots__ = ()

    def set_result(self, reply: Dict[str, Any]) -> None:
        close_fds(reply)

    def event(self, event: Dict[str, Any]) -> None:
        pass

    def set_exception(self, error: BaseException) -> None:
        pass


DROPPED = _Dropped()


class _Abandoned(_Dropped):
    """The slot of a request with ``on_abandoned`` once its caller stopped waiting:
    its reply goes to that handler, on whichever thread reads (it must not block)."""

    __slots__ = ("handler",)

    def __init__(self, handler: EventHandler) -> None:
        self.handler = handler

    def set_result(self, reply: Dict[str, Any]) -> None:
        self.handler(reply)


def _rights(anc: List[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors in recvmsg's ancillary data (as socket.recv_fds reads them)."""
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    return list(fds)


class Dispatcher:
    """The bookkeeping of one connection to gpuqd at ``path`` (see the module doc)."""

    def __init__(self, path: str, timeout: float, max_frame: int = MAX_REPLY_FRAME) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        self.path = path
        self.timeout = float(timeout)
        self.reader = FrameReader(max_frame)
        # Used under the connection's lock (sync) or on its loop (asyncio) only.
        self._packer = new_packer()
        self.pending: Dict[int, Any] = {}
        # Pending ids whose call has an ``on_abandoned`` handler: forget() then
        # leaves an _Abandoned slot in their place.
        self._abandon: Dict[int, EventHandler] = {}
        self.waits: Set[int] = set()  # pending ids that wait for a job
        self.ops: Dict[int, str] = {}  # pending ids' ops, for messages
        self.last_id = 0  # ids are taken under the connection's lock or on its loop
        self.last_heard = 0.0
        self.ping_id: Optional[int] = None
        self.ping_sent = 0.0
        # Descriptors received (SCM_RIGHTS) and not yet claimed by the reply they came with.
        self.fds: List[int] = []
        # What the reads brought and take() has not routed yet, kept across a
        # KeyboardInterrupt in the reader: the inbox, the read whose bytes are
        # still in the read buffer (recvmsg's result, at most one; the sync
        # connection reads into it itself), and the frames decoded.
        self.inbox: List[Tuple[Any, ...]] = []
        self.frames: List[Dict[str, Any]] = []
        # Every read lands here: recvmsg into a new bytes object of READ_CHUNK would
        # cost an mmap, an mremap and an munmap per reply (it is above malloc's
        # mmap threshold), more than the round trip's own two syscalls.
        self._chunk = bytearray(READ_CHUNK)
        self._chunk_view = memoryview(self._chunk)
        self.into = [self._chunk]
        # Called with each event frame no pending request waits for (``lease_broken``),
        # on whichever thread reads: it must not block.
        self.on_notice: Optional[EventHandler] = None

    def new_id(self) -> int:
        """A fresh request id (taken under the connection's lock or on its loop)."""
        self.last_id += 1
        return self.last_id

    def add(self, call: Call, slot: Any, rid: int = 0) -> Tuple[int, bytes]:
        """Parks ``slot`` under id ``rid`` (a fresh one when 0); returns the id and the
        frame of ``call``.

        Raises ValueError for too many descriptors, TypeError for a field
        msgpack cannot carry; nothing is parked then.
        """
        fds = len(call.fds) if call.fds else 0
        if fds > MAX_FDS:
            raise ValueError(f"a request carries at most {MAX_FDS} descriptors, "
                             f"not {fds}")
        rid = rid or self.new_id()
        frame = encode_request(call.op, rid, call.fields, fds, self._packer)
        self.pending[rid] = slot
        self.ops[rid] = call.op
        if call.waits:
            self.waits.add(rid)
        if call.on_abandoned is not None:
            self._abandon[rid] = call.on_abandoned
        return rid, frame

    def forget(self, rid: int) -> Any:
        """Takes request ``rid`` off the books (answered, failed or given up); its slot.
        One given up before its reply came whose call has ``on_abandoned`` stays
        on the books, its reply bound for that handler."""
        self.waits.discard(rid)
        slot = self.pending.pop(rid, None)
        handler = self._abandon.pop(rid, None) if self._abandon else None
        if handler is not None and slot is not None:
            self.pending[rid] = _Abandoned(handler)
            return slot
        self.ops.pop(rid, None)
        return slot

    def deadline(self, call: Call, now: float) -> Optional[float]:
        """When to give up on the reply to ``call`` (``None``: only liveness applies)."""
        if not call.waits:
            return now + self.timeout
        if call.wait_s is None:
            return None
        return now + call.wait_s + self.timeout

    def take(self) -> Optional[BaseException]:
        """Routes what the reads brought: the read the :attr:`inbox` holds (the sync
        connection's read, Connection._read_once), then
        each frame complete, in order. Returns the error that ends the connection,
        if one came: the daemon closed it, or sent what cannot be read.

        Called by one thread at a time (the connection's reader, under its lock),
        and safe against a KeyboardInterrupt anywhere in it: each step is done
        first and recorded after, by statements that call nothing (between
        those Python never raises it), so an interrupted step is taken again,
        whole, by the next call; a frame is never lost nor read from its middle.

        Every reply goes through here, so the steps are written out in one
        frame rather than a function each (a round trip is a few dozen Python
        calls; each one more costs about 1% of it).
        """
        try:
            if self.inbox:
                # The read the inbox holds, out of the read buffer: its descriptors
                # to fds, its bytes to frames (one whole frame, decoded in place,
                # the common case) or to the frame reader's buf.
                size, anc = self.inbox[0][0], self.inbox[0][1]
                fds = _rights(anc) if anc else []
                whole = self.reader.whole_frame(self._chunk, self._chunk_view,
                                                size) if size else None
                # Recorded without a call in between: all of it, or none.
                self.fds += fds
                if whole is not None:
                    self.frames += [whole]
                else:
                    self.reader.buf += self._chunk_view[:size]
                del self.inbox[:]
                if not size:
                    return self.eof_error()
            if self.reader.buf:  # what a whole frame read leaves it: nothing
                self._split()
        except ConnectionError as exc:  # ProtocolError
            return exc
        self.last_heard = time.monotonic()
        frames = self.frames
        while frames:
            # The first frame goes to its slot, then off the list (an interrupt in
            # between hands it again: handing a reply to its slot twice changes
            # nothing).
            frame = frames[0]
            rid = frame.get("id")
            if "event" in frame:
                slot = self.pending.get(rid) if rid is not None else None
                if slot is not None:
                    handler = getattr(slot, "event", None)  # a future has none
                    if handler is not None:
                        handler(frame)
                elif self.on_notice is not None:
                    self.on_notice(frame)
                del frames[0]
                continue
            if "fds" in frame and isinstance(frame["fds"], int) and "_fds" not in frame:
                # A reply with descriptors (attach, region_open) claims them in
                # arrival order: they came with its frame's first byte.
                count = frame["fds"]
                frame["_fds"], self.fds = self.fds[:count], self.fds[count:]
            if rid is not None and rid == self.ping_id:
                self.ping_id = None
            elif rid == 0 or rid is None:
                # It answers a frame the daemon could not read; this client only
                # sends well-formed frames, so it is a ``bad_frame`` (or worse)
                # and the daemon is about to close the connection.
                err = frame.get("error")
                return error_from_map(err, reply=frame) if err is not None else BadFrame(
                    f"gpuqd sent a reply without an id: {frame!r}", reply=frame)
            elif rid in self.pending:
                # Handed to its slot, then request rid taken off the books.
                try:
                    self.pending[rid].set_result(frame)
                except InvalidStateError:  # given up as it came (the module's doc)
                    handler = self._abandon.get(rid)
                    if handler is not None:
                        handler(frame)
                    else:
                        close_fds(frame)
                # Recorded without a call in between (what forget() does, inline).
                if rid in self._abandon:
                    del self._abandon[rid]
                if rid in self.waits:
                    self.waits -= {rid}
                del self.ops[rid]  # ops and pending hold the same ids
                del self.pending[rid]
            else:
                close_fds(frame)  # a reply no one waits for any more
            del frames[0]
        return None

    def _split(self) -> None:
        """Moves each frame the frame reader holds whole to :attr:`frames`."""
        while True:
            first = self.reader.first_frame()
            if first is None:
                return
            self.frames += [first[0]]  # recorded without a call in between
            del self.reader.buf[:first[1]]

    def receive(self, sock: socket.socket) -> Tuple[bool, Optional[BaseException]]:
        """Reads once from ``sock`` (readable, or non-blocking) and routes what came.

        Returns whether there may be more to read at once (the read filled
        its chunk), and the error that ends the connection if one came: the
        daemon closed it or sent what cannot be read. (The asyncio
        connection's reader runs this once per reply.)
        """
        try:
            size, anc, _, _ = sock.recvmsg_into(self.into, FDS_SPACE,
                                                socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return False, None
        except OSError as exc:
            return False, self.read_error(exc)
        if (not anc and size < READ_CHUNK and size and not self.inbox and not self.frames
                and not self.reader.buf):
            # Most reads are one whole reply: it is decoded in place and routed here.
            try:
                reply = self.reader.whole_frame(self._chunk, self._chunk_view, size)
            except ConnectionError as exc:  # ProtocolError
                return False, exc
            if reply is not None:
                return False, self._route_reply(reply)
        self.inbox += [(size, anc)]
        return size == READ_CHUNK, self.take()

    def _route_reply(self, reply: Dict[str, Any]) -> Optional[BaseException]:
        """Hands ``reply``, a whole frame just read with nothing before it, to the
        request it answers when that is a plain one (no events, descriptors,
        liveness ping or handler for a reply given up): the common case of
        :meth:`take`, in fewer steps (every AsyncClient request comes here).
        Any other frame goes through :meth:`take`."""
        rid = reply.get("id", 0)  # 0 answers a frame gpuqd could not read: take() says so
        slot = self.pending.get(rid)
        if (slot is None or "event" in reply or "fds" in reply or rid in self._abandon
                or rid == self.ping_id):
            self.frames += [reply]
            return self.take()
        self.last_heard = time.monotonic()
        try:
            slot.set_result(reply)
        except InvalidStateError:
            pass  # given up as it came (the module's doc): nothing to give back
        self.waits.discard(rid)
        del self.ops[rid]  # ops and pending hold the same ids
        del self.pending[rid]
        return None

    def read_error(self, exc: OSError) -> ConnectionError:
        """The error that ends the connection after a read failed with ``exc``."""
        if isinstance(exc, ConnectionResetError):
            return self.eof_error(" (reset)")
        return ConnectionError(f"reading from gpuqd at {self.path} failed: "
                               f"{exc.strerror or exc}")

    def salvage(self, sock: socket.socket) -> Optional[BaseException]:
        """After a send failed: the daemon's last words, if they are already here.

        gpuqd refuses an oversized frame as soon as it reads its length, and
        closes the connection while the client may still be sending: the
        ``bad_frame`` reply saying why is waiting to be read. Reads only what
        has arrived (never blocks) and routes it; returns the error that
        ended the connection, if one came. Call it as the only reader.
        """
        ready = select.poll()
        ready.register(sock.fileno(), select.POLLIN)
        while ready.poll(0):
            _, fatal = self.receive(sock)
            if fatal is not None:
                return fatal if isinstance(fatal, GpuqError) else None
        return None

    def liveness(self, now: float) -> Optional[str]:
        """``"ping"`` when a ping should be sent now, ``"dead"`` when one went unanswered.

        Only waits for jobs need it: every other request has its deadline.
        """
        if not self.waits:
            return None
        if self.ping_id is not None:
            return "dead" if now - self.ping_sent >= self.timeout else None
        if now - self.last_heard >= self.timeout:
            return "ping"
        return None

    def ping_frame(self, now: float) -> bytes:
        """The frame of a liveness ping; its reply is consumed by :meth:`route`."""
        self.ping_id = self.last_id = self.last_id + 1
        self.ping_sent = now
        return encode_request("ping", self.ping_id, {}, 0, self._packer)

    def late_error(self, rid: int) -> ReplyTimeout:
        """The reply to request ``rid`` did not come by its deadline."""
        op = self.ops.get(rid, "request")
        return ReplyTimeout(
            f"gpuqd at {self.path} did not answer {op} (request {rid}) in time: the client "
            f"allows {self.timeout:g} s (its timeout) beyond any wait the request asked "
            "for; it may still be carried out")

    def silent_error(self) -> ConnectionError:
        return ConnectionError(
            f"gpuqd at {self.path} sent nothing for {self.timeout:g} s and did not answer "
            f"a ping within {self.timeout:g} s more; the connection is closed (is the "
            "daemon stopped or overloaded? raise the client's timeout if it is only slow)")

    def eof_error(self, how: str = "") -> ConnectionError:
        return ConnectionError(f"gpuqd at {self.path} closed the connection{how}")

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fails every pending slot, each with its own exception object."""
        slots = list(self.pending.values())
        self.pending.clear()
        self.waits.clear()
        self.ops.clear()
        self._abandon.clear()
        for frame in self.frames:  # read, never routed, and never will be
            close_fds(frame)
        del self.frames[:]
        close_fds({"_fds": self.fds})
        self.fds = []
        for slot in slots:
            try:
                slot.set_exception(make_error())
            except InvalidStateError:
                pass  # see the module's doc
