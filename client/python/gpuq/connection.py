"""The blocking connection under :class:`gpuq.Client`: safe to share between threads.

Threads that call at the same time each send their request (one frame at a
time, under the send lock) and park a slot for its reply. No background
thread reads: one of the waiting threads at a time is the *reader*; it reads
what has arrived, routes each frame to its slot (dispatch.py) and wakes the
others, which look at their slots and one of which becomes the next reader
when needed. A thread's progress events are queued on its slot and its
``on_event`` callback runs in that thread, between reads.

Every wait is bounded: the reader polls in slices of at most a quarter of
the client's timeout, so deadlines and the liveness ping (dispatch.py) are
looked at even when nothing arrives.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .dispatch import DROPPED, Call, Dispatcher
from .errors import GpuqError

__all__ = ["Connection", "ConnectionBase", "connect_socket"]


def connect_socket(path: str, timeout: float) -> socket.socket:
    """A connected UNIX stream socket, or ConnectionError naming ``path`` and a fix."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except (OSError, ValueError) as exc:
        sock.close()
        raise ConnectionError(f"cannot connect to gpuqd at {path}: {_reason(exc)}") from exc
    return sock


def _reason(exc: BaseException) -> str:
    """Why a connect failed, and what the user can do about it (as the CLI says)."""
    if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
        return f"{exc.strerror} (is gpuqd running? set GPUQ_SOCKET or name the socket)"
    if isinstance(exc, PermissionError):
        return f"{exc.strerror} (the socket's permissions do not let this user in)"
    if isinstance(exc, socket.timeout):
        return "the daemon did not accept the connection in time (is it overloaded?)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


class _Slot:
    """Where the reader leaves one request's reply, events or failure (named as an
    asyncio future's methods, as dispatch.py's slots are)."""

    __slots__ = ("reply", "events", "error")

    def __init__(self) -> None:
        self.reply: Optional[Dict[str, Any]] = None
        self.events: List[Dict[str, Any]] = []
        self.error: Optional[BaseException] = None

    def set_result(self, reply: Dict[str, Any]) -> None:
        self.reply = reply

    def event(self, event: Dict[str, Any]) -> None:
        self.events.append(event)

    def set_exception(self, error: BaseException) -> None:
        self.error = error


class NotSent(ConnectionError):
    """The connection was found gone before any byte of a request went out: no
    gpuqd saw the request, so it may go on a new connection, a job too."""


class ConnectionBase:
    """What both connections hold: the socket, its dispatcher, and whether it is closed."""

    def __init__(self, path: str, timeout: float) -> None:
        self._d = Dispatcher(path, timeout)
        self.path = path
        # A UNIX socket connects at once; doing it here makes an unreachable
        # daemon an error of the client's constructor.
        self._sock = connect_socket(path, timeout)
        self._closed: Optional[str] = None  # why, once closed
        self._d.last_heard = time.monotonic()

    @property
    def timeout(self) -> float:
        return self._d.timeout

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def abandon(self) -> None:
        """In a child forked from the process that made it: closes this process's
        copy of the socket, and nothing else (forked.py). A shutdown() would
        end the connection for the parent too."""
        self._closed = "left to the process this one was forked from"
        self._sock.close()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise NotSent(f"the connection to gpuqd at {self.path} is closed "
                          f"({self._closed}); make a new client")

    def _cannot_send(self, exc: OSError, sent: int) -> ConnectionError:
        """The error of a send that failed, NotSent when no byte of the frame went."""
        kind = NotSent if sent == 0 else ConnectionError
        return kind(f"cannot send to gpuqd at {self.path}: {exc.strerror or exc}")


class Connection(ConnectionBase):
    """One connection to gpuqd; :meth:`call` may be used from many threads at once.

    The socket is a blocking one whose limits are the kernel's own
    (``SO_SNDTIMEO``, ``SO_RCVTIMEO``) rather than Python's, which would
    poll before every send and every read: a round trip is then one
    ``sendmsg`` and one ``recvmsg``.
    """

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__(path, timeout)
        self._sock.settimeout(None)
        _set_timeo(self._sock, socket.SO_SNDTIMEO, timeout)
        self._rcvtimeo = -1.0  # the SO_RCVTIMEO set now (-1: not yet)
        self._quarter = max(0.001, round(timeout / 4, 3))  # the slice without a deadline
        self._cond = threading.Condition(threading.Lock())
        self._send_lock = threading.Lock()
        self._reading = False
        # The slot of the call that took the reader's turn as it sent (_lead).
        self._leader: Optional[_Slot] = None
        self._leader_thread = 0
        # Threads in the condition's wait (under the lock): none, no notify needed.
        self._sleepers = 0

    def call(self, call: Call) -> Dict[str, Any]:
        """Sends ``call`` and returns its reply map, whether ``ok`` or not."""
        slot = _Slot()
        d = self._d
        with self._cond:
            if self._closed is not None:
                self._check_open()
            rid, frame = d.add(call, slot)
            # Alone on the connection (the common case), this thread reads at once,
            # without handing the reader's turn round through _next_step.
            lead = not self._reading
            if lead:
                self._reading = True
                self._leader = slot
                self._leader_thread = threading.get_ident()
        settled = False  # the reply is here and the books are square (_lead)
        try:  # the slot goes in before the frame goes out: the reply may come at once
            try:
                self._send(frame, call.fds)
            except ConnectionError:
                if slot.error is not None:  # the daemon said why it closed
                    raise slot.error from None
                raise
            deadline = d.deadline(call, time.monotonic())
            if lead:
                reply = self._lead(slot, deadline)
                if reply is not None:
                    settled = True
                    return reply
            return self._await(rid, slot, deadline, call.on_event)
        finally:
            if not settled:
                with self._cond:
                    if self._leader is slot:  # the send failed before _lead ran
                        self._release_reader()
                    d.forget(rid)

    def post(self, call: Call) -> None:
        """Sends ``call`` without waiting for its reply (``Call.await_reply`` False):
        whichever thread reads next lets the reply go."""
        with self._cond:
            if self._closed is not None:
                self._check_open()
            _, frame = self._d.add(call, DROPPED)
        self._send(frame, call.fds)

    def _lead(self, slot: _Slot, deadline: Optional[float]) -> Optional[Dict[str, Any]]:
        """Reads as the reader until ``slot`` has its reply, an event or an error,
        then gives the reader's turn back (waking the others).

        Returns the reply when it came and no event before it: the reader's
        turn was given back under the same lock as the reply was routed, and
        routing it took the request off the books, so nothing is left to do.
        Otherwise None, and _await carries on.
        """
        try:
            while slot.reply is None and not slot.events and slot.error is None:
                if self._closed is not None or (deadline is not None and
                                                time.monotonic() >= deadline):
                    break  # _await raises what applies
                if self._read_once(deadline, slot):
                    return slot.reply
        except BaseException:
            with self._cond:
                if self._leader is slot:  # not given back already by _read_once
                    self._release_reader()
            raise
        with self._cond:
            self._release_reader()
        return None

    def _release_reader(self) -> None:
        """Called under the lock by the thread that reads."""
        self._leader = None
        self._reading = False
        if self._sleepers:
            self._cond.notify_all()

    def close(self, why: str = "closed by the client") -> None:
        with self._cond:
            if self._closed is None:
                self._closed = why
                self._d.fail_all(lambda: ConnectionError(
                    f"the connection to gpuqd at {self.path} was {why}"))
                self._cond.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _send(self, data: bytes, fds: Sequence[int]) -> None:
        """Sends one whole frame, the descriptors on its first byte.

        A frame cut short leaves the stream out of step, so any failure
        closes the connection, with the daemon's reason when it gave one.
        """
        with self._send_lock:
            sent = 0
            try:
                if fds:
                    sent = socket.send_fds(self._sock, [data], list(fds))
                else:
                    sent = self._sock.send(data)
                if sent < len(data):
                    self._sock.sendall(memoryview(data)[sent:])
            except OSError as exc:
                why = self._cannot_send(exc, sent)
                self._break(self._salvage() or why)
                raise why from exc

    def _salvage(self) -> Optional[BaseException]:
        with self._cond:
            mine = self._leader is not None and self._leader_thread == threading.get_ident()
            if (self._reading and not mine) or self._closed is not None:
                return None  # the reader will see what the daemon sent
            return self._d.salvage(self._sock)

    def _await(self, rid: int, slot: _Slot, deadline: Optional[float],
               on_event: Optional[Callable[[Dict[str, Any]], None]]) -> Dict[str, Any]:
        while True:
            events, lead = self._next_step(rid, slot, deadline)
            if slot.reply is not None and not events:
                return slot.reply
            for event in events:
                if on_event is not None:
                    on_event(event)
            if lead:
                try:
                    self._read_once(deadline)
                finally:
                    with self._cond:
                        self._reading = False
                        self._cond.notify_all()

    def _next_step(self, rid: int, slot: _Slot,
                   deadline: Optional[float]) -> Tuple[List[Dict[str, Any]], bool]:
        """Waits until this thread has events to handle, its reply, or the reader's turn."""
        with self._cond:
            while True:
                if slot.events:
                    events, slot.events = slot.events, []
                    return events, False
                if slot.reply is not None:
                    return [], False
                if slot.error is not None:
                    raise slot.error
                self._check_open()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._d.late_error(rid)
                if not self._reading:
                    self._reading = True
                    return [], True
                self._sleepers += 1
                try:
                    self._cond.wait(self._slice(deadline, now))
                finally:
                    self._sleepers -= 1

    def _slice(self, deadline: Optional[float], now: float) -> float:
        step = self.timeout / 4
        return step if deadline is None else max(0.0, min(step, deadline - now))

    def _read_once(self, deadline: Optional[float], lead: Optional[_Slot] = None) -> bool:
        """Reads what arrives within one slice and routes it (the reader only).

        The read blocks outside the lock (other threads send meanwhile) for
        at most the slice, the socket's SO_RCVTIMEO, which is set again only
        when the slice changes (near a deadline). ``lead``: the reading
        thread's own slot; when what was read is its reply and no event came
        before it, the reader's turn is given back at once, under the lock
        the reply was routed under, and True returned (one lock, not two).
        """
        left = None if deadline is None else deadline - time.monotonic()
        limit = (self._quarter if left is None or left > self._quarter + 0.001
                 else max(0.001, round(left, 3)))
        if limit != self._rcvtimeo:
            _set_timeo(self._sock, socket.SO_RCVTIMEO, limit)
            self._rcvtimeo = limit
        size, fds, fatal = self._d.read(self._sock)
        if size is None and fatal is None:
            self._check_liveness()
            return False
        answered = False
        if size is not None:
            with self._cond:
                _, fatal = self._d.take(size, fds)
                if self._sleepers:
                    self._cond.notify_all()
                if lead is not None and lead.reply is not None and not lead.events:
                    self._release_reader()
                    answered = True
        if fatal is not None:
            self._break(fatal)
        return answered

    def _check_liveness(self) -> None:
        with self._cond:
            verdict = self._d.liveness(time.monotonic())
            frame = self._d.ping_frame(time.monotonic()) if verdict == "ping" else None
        if verdict == "dead":
            self._break(self._d.silent_error())
        elif frame is not None:
            try:
                self._send(frame, ())
            except ConnectionError:
                pass  # _send closed the connection; the waiters learn why

    def _break(self, error: BaseException) -> None:
        """Closes the connection, failing every pending request with ``error``."""
        with self._cond:
            if self._closed is not None:
                return
            self._closed = f"closed: {error}"
            self._d.fail_all(lambda: _copy_error(error))
            self._cond.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _set_timeo(sock: socket.socket, option: int, seconds: float) -> None:
    """Sets SO_SNDTIMEO or SO_RCVTIMEO (a struct timeval) to ``seconds``."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, option,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def _copy_error(error: BaseException) -> BaseException:
    """A fresh exception like ``error``, so that threads do not share one object."""
    if isinstance(error, GpuqError):
        return type(error)(error.message, code=error.code, reply=error.reply)
    return type(error)(*error.args)
