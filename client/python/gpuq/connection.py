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

Ctrl-C: Python raises KeyboardInterrupt in the main thread, which may be the
reader, between two bytecodes: as a function is entered, after any call
returns (its result then lost), at a loop's jump back; never inside C code
nor between statements that call nothing (CPython 3.10 and later). So:
the lock is a plain lock taken only by ``with`` (threading.Condition's
methods are Python code that an interrupt splits, leaving the lock held or
released twice); a thread sleeps on a lock of its own, woken by
:meth:`Connection._wake_all`; what a read brought is kept across an
interrupt (Dispatcher.read and take), so that the next reader resumes the
frame; a thread left by an exception gives the reader's turn to a waiting
one, and its request's reply goes to its ``on_abandoned``
(:meth:`Connection._leave`); and a send records what went, so that an
interrupted frame is finished before the exception goes on.
"""

from __future__ import annotations

import _thread
import array
import socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set

from .dispatch import DROPPED, FDS_SPACE, Call, Dispatcher
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
    asyncio future's methods, as dispatch.py's slots are). The reply is left
    on the Call too (``Call.reply``), for Client._drive to give it to the
    call's ``on_abandoned`` if an interrupt keeps it from its caller.
    ``done``: the reply was taken and the reader's turn given back, so the
    call has nothing left to square as it returns.

    Made by ``_Slot()`` and its ``call`` set, no ``__init__``: the class's
    attributes are a new slot's (one Python call fewer per round trip);
    ``events`` is a list of the slot's own from its first event on (the
    class's empty one is never added to)."""

    call: Call
    reply: Optional[Dict[str, Any]] = None
    events: List[Dict[str, Any]] = []
    error: Optional[BaseException] = None
    done = False

    def set_result(self, reply: Dict[str, Any]) -> None:
        """Handing the same reply again (an interrupted reader's) changes nothing."""
        self.reply = reply
        self.call.reply = reply

    def event(self, event: Dict[str, Any]) -> None:
        if self.events:
            self.events.append(event)
        else:  # the class's list, or an empty one _next_step left
            self.events = [event]

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
    """One connection to gpuq; :meth:`call` may be used from many threads at once.

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
        # Taken only by ``with`` on the lock itself (the module's doc says why).
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._reader = 0  # the thread whose turn it is to read (its ident), 0: nobody's
        # The locks that threads waiting for a reply or the reader's turn sleep on.
        self._sleepers: Set[Any] = set()

    def call(self, call: Call) -> Dict[str, Any]:
        """Sends ``call`` and returns its reply map, whether ``ok`` or not."""
        slot = _Slot()
        slot.call = call
        d = self._d
        me = threading.get_ident()
        rid = 0
        try:
            with self._lock:
                if self._closed is not None:
                    self._check_open()
                rid = d.last_id = d.last_id + 1  # Dispatcher.new_id, inline
                _, frame = d.add(call, slot, rid)  # before the frame goes out: the reply may come at once
                if not self._reader:  # alone on the connection (the common case): it reads at once
                    self._reader = me
            try:
                self._send(frame, call.fds)
            except ConnectionError:
                if slot.error is not None:  # the daemon said why it closed
                    raise slot.error from None
                raise
            deadline = (time.monotonic() + d.timeout if not call.waits
                        else d.deadline(call, time.monotonic()))
            # Alone on the connection (the common case): _await's first step, taken
            # here, one Python frame fewer per round trip; the same state changes,
            # and an interrupt anywhere in it leaves the same to _leave.
            if self._reader == me and self._closed is None:
                self._read_once(deadline, slot)
                if slot.done:
                    return slot.reply  # type: ignore[return-value]
            return self._await(rid, slot, deadline, me)
        finally:
            if not slot.done:
                self._leave(rid, slot, me)

    def post(self, call: Call) -> None:
        """Sends ``call`` without waiting for its reply (``Call.await_reply`` False):
        whichever thread reads next lets the reply go."""
        with self._lock:
            if self._closed is not None:
                self._check_open()
            _, frame = self._d.add(call, DROPPED)
        self._send(frame, call.fds)

    def _leave(self, rid: int, slot: _Slot, me: int) -> None:
        """What a call left by an exception (Ctrl-C, its deadline, the connection's
        end) leaves behind: the reader's turn, handed on to a waiting thread,
        and its request, whose reply is let go or goes to ``on_abandoned``."""
        with self._lock:
            if self._reader == me:
                self._give_turn()
            if rid and slot.reply is None:
                self._d.forget(rid)

    def _give_turn(self) -> None:
        """Called under the lock by the thread that reads: one that waits takes it."""
        self._reader = 0
        if self._sleepers:
            self._wake_all()

    def _wake_all(self) -> None:
        """Called under the lock. Each sleeper's lock is in one set at a time and
        released once; a sleeper an interrupt keeps from waking wakes at the
        end of its slice."""
        sleepers, self._sleepers = self._sleepers, set()
        for waiter in sleepers:
            waiter.release()

    def close(self, why: str = "closed by the client") -> None:
        with self._lock:
            if self._closed is None:
                self._closed = why
                self._d.fail_all(lambda: ConnectionError(
                    f"the connection to gpuqd at {self.path} was {why}"))
                self._wake_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _send(self, data: bytes, fds: Sequence[int]) -> None:
        """Sends one whole frame, the descriptors on its first byte.

        A frame cut short leaves the stream out of step, so any failure
        closes the connection, with the daemon's reason when it gave one;
        an interrupt (Ctrl-C) in the middle of a frame lets it finish first.
        What each send took is kept in a list as the send returns (see
        Dispatcher.read): an interrupt as it returns loses no count.
        """
        with self._send_lock:
            sent: List[int] = []
            try:
                if fds:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent.extend(map(self._sock.sendmsg, ([data],), (rights,)))
                else:
                    sent.extend(map(self._sock.send, (data,)))
                if sent[0] < len(data):  # the socket took part of it (rare)
                    self._send_rest(data, sent)
            except OSError as exc:
                why = self._cannot_send(exc, sum(sent))
                self._break(self._salvage() or why)
                raise why from exc
            except BaseException:
                if 0 < sum(sent) < len(data):
                    self._finish_frame(data, sent)
                raise

    def _send_rest(self, data: bytes, sent: List[int]) -> None:
        view = memoryview(data)
        while sum(sent) < len(data):
            sent.extend(map(self._sock.send, (view[sum(sent):],)))

    def _finish_frame(self, data: bytes, sent: List[int]) -> None:
        """After an interrupt in the middle of a frame: the rest of it, or the end."""
        try:
            self._send_rest(data, sent)
        except BaseException as exc:
            self._break(ConnectionError(
                f"a request to gpuqd at {self.path} was cut short as it was sent "
                f"({type(exc).__name__}); the connection is closed"))

    def _salvage(self) -> Optional[BaseException]:
        with self._lock:
            if (self._reader and self._reader != threading.get_ident()) or \
                    self._closed is not None:
                return None  # the reader will see what the daemon sent
            return self._d.salvage(self._sock)

    def _await(self, rid: int, slot: _Slot, deadline: Optional[float],
               me: int) -> Dict[str, Any]:
        """The reply to request ``rid``, read by this thread while it is its turn,
        else by another; ``slot``'s events are handed to its ``on_event`` here."""
        on_event = slot.call.on_event
        while True:
            if self._reader == me and slot.reply is None and not slot.events and \
                    slot.error is None and self._closed is None and \
                    (deadline is None or time.monotonic() < deadline):
                self._read_once(deadline, slot)
                if slot.done:
                    return slot.reply  # type: ignore[return-value]
                continue
            events = self._next_step(rid, slot, deadline, me)
            if events is None:
                continue  # this thread's turn to read
            if not events:
                return slot.reply  # type: ignore[return-value]
            for event in events:
                if on_event is not None:
                    on_event(event)

    def _next_step(self, rid: int, slot: _Slot, deadline: Optional[float],
                   me: int) -> Optional[List[Dict[str, Any]]]:
        """Waits until ``slot`` has events (returned), its reply (``[]``, the request
        done with), or it is this thread's turn to read (None). A thread
        that stops reading gives the turn back, so that another takes it."""
        waiter = None
        while True:
            with self._lock:
                if waiter is not None:
                    self._sleepers.discard(waiter)
                if slot.events or slot.reply is not None or slot.error is not None:
                    if self._reader == me:
                        self._give_turn()
                    if slot.events:
                        events, slot.events = slot.events, []
                        return events
                    if slot.error is not None:
                        raise slot.error
                    slot.done = True
                    return []
                self._check_open()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._d.late_error(rid)
                if not self._reader:
                    self._reader = me
                if self._reader == me:
                    return None
                waiter = _thread.allocate_lock()
                waiter.acquire()
                self._sleepers.add(waiter)
            waiter.acquire(True, self._slice(deadline, now))

    def _slice(self, deadline: Optional[float], now: float) -> float:
        step = self.timeout / 4
        return step if deadline is None else max(0.0, min(step, deadline - now))

    def _read_once(self, deadline: Optional[float], slot: _Slot) -> None:
        """Reads what arrives within one slice and routes it (the reader only).

        The read blocks outside the lock (other threads send meanwhile) for
        at most the slice, the socket's SO_RCVTIMEO, which is set again only
        when the slice changes (near a deadline). When what was read is the
        reading thread's own reply (``slot``'s) and no event came before it,
        the reader's turn is given back at once, under the lock the reply
        was routed under, and ``slot.done`` set (one lock, not two).
        """
        left = None if deadline is None else deadline - time.monotonic()
        limit = (self._quarter if left is None or left > self._quarter + 0.001
                 else max(0.001, round(left, 3)))
        if limit != self._rcvtimeo:
            _set_timeo(self._sock, socket.SO_RCVTIMEO, limit)
            self._rcvtimeo = limit
        # One read into the inbox, unless it still holds one that take() has not
        # taken (an interrupted reader's). The read is made inside list.extend,
        # so that its result is kept even when a KeyboardInterrupt comes as it
        # returns: Python raises one only between bytecodes, and a call made
        # from C code (map's) returns into C code; the bytes it read are in the
        # read buffer, and the inbox says how many. (Written out here rather
        # than a Dispatcher method: every round trip passes through it.)
        d = self._d
        fatal: Optional[BaseException] = None
        if not d.inbox:
            try:
                d.inbox.extend(map(self._sock.recvmsg_into, (d.into,), (FDS_SPACE,),
                                   (socket.MSG_CMSG_CLOEXEC,)))
            except (BlockingIOError, InterruptedError, socket.timeout):
                self._check_liveness()  # nothing came in time
                return
            except OSError as exc:
                fatal = d.read_error(exc)
        if fatal is None:
            with self._lock:
                fatal = d.take()
                if slot.reply is not None and not slot.events and slot.error is None:
                    self._reader = 0
                    slot.done = True
                if self._sleepers:
                    self._wake_all()
        if fatal is not None:
            self._break(fatal)

    def _check_liveness(self) -> None:
        with self._lock:
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
        with self._lock:
            if self._closed is not None:
                return
            self._closed = f"closed: {error}"
            self._d.fail_all(lambda: _copy_error(error))
            self._wake_all()
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
