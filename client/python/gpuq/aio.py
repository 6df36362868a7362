"""gpuq.AsyncClient: the asyncio client, and the connection under it.

The connection lives on the event loop that first uses it. Its socket is
non-blocking; the loop calls :meth:`AsyncConnection._readable` when bytes
arrive, which routes each frame to its request's future (dispatch.py), so
any number of requests can be in flight on one connection, their replies
matched by id. Deadlines and liveness are checked on the loop when
watch.py's thread says they are due (a loop timer would cost every turn of
the loop); progress events run their request's ``on_event`` on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import time
from asyncio import InvalidStateError
from typing import Any, Deque, Dict, Generator, Optional, Sequence, Union

from . import share, watch
from .aio_methods import AsyncMethods
from .api import Plan, ProgressHandler, _job_call
from .client import DEFAULT_TIMEOUT, ClientBase, _apart, _own_body
from .connection import ConnectionBase, _copy_error
from .dispatch import DROPPED, YIELD, Call
from .forked import AsyncForkedConnection
from .job import Job
from .staging import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS

__all__ = ["AsyncClient", "AsyncConnection", "DEFAULT_POLL_US"]

#: How long a request alone on its connection reads for its reply before it
#: leaves the wait to the loop (AsyncClient's ``poll_us``): as long as gpuqd's
#: own ``--spin``, which covers the requests it answers at once and short jobs.
DEFAULT_POLL_US = 50.0

#: A request answered while it read does not suspend its task, so a task that
#: sends one after another would keep the loop from everything else: such a
#: request lets the loop run once when this long has passed since the last did.
LOOP_TURN_S = 1e-3


#: CPUs this process may run on below which it does not read for replies:
#: gpuqd's main thread and each worker poll for a while too (``--spin``), and
#: on two CPUs a client reading would take one from the job it waits for.
POLL_MIN_CPUS = 4


def default_poll_s() -> float:
    """:data:`DEFAULT_POLL_US` in seconds; 0 on fewer than :data:`POLL_MIN_CPUS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - Linux has it
        cpus = os.cpu_count() or 1
    return DEFAULT_POLL_US * 1e-6 if cpus >= POLL_MIN_CPUS else 0.0


class _EventSlot:
    """The slot of a request with an event handler: its future, which the handler's
    failure fails. A request without one has its future alone as its slot."""

    __slots__ = ("future", "on_event")

    def __init__(self, future: "asyncio.Future[Dict[str, Any]]", on_event: Any) -> None:
        self.future = future
        self.on_event = on_event

    def set_result(self, reply: Dict[str, Any]) -> None:
        self.future.set_result(reply)

    def set_exception(self, error: BaseException) -> None:
        self.future.set_exception(error)

    def event(self, event: Dict[str, Any]) -> None:
        if self.future.done():
            return
        try:
            self.on_event(event)
        except BaseException as exc:  # the caller's handler failed: its call fails
            self.future.set_exception(exc)


class AsyncConnection(ConnectionBase):
    """One connection to gpuqd, used from one event loop."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__(path, timeout)
        self._sock.setblocking(False)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # The send turn: one frame at a time goes out, whole. Held while
        # ``_sending``; waiters queue their futures and are handed it in order
        # (an asyncio.Lock cost a coroutine and a future's check per request).
        self._sending = False
        self._send_queue: Deque["asyncio.Future[None]"] = collections.deque()
        # Requests the daemon answers at once, with their deadlines: now plus the
        # timeout, so in the order sent. watch.py's thread reads the oldest and
        # has the loop expire it when it passes.
        self._due: Dict[int, float] = {}
        self._next_tick = 0.0  # the next liveness check while waits are pending
        self._pinger: Optional["asyncio.Task[None]"] = None  # held: the loop keeps weak ones
        # Seconds a request alone in flight reads for its reply (default_poll_s);
        # whether one was answered so, and when a request lets the loop turn
        # since (LOOP_TURN_S).
        self.poll_s = default_poll_s()
        self._owes_turn = False
        self._turn_due = 0.0

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Binds the connection to ``loop``, the running one, on its first call."""
        if self._loop is None:
            self._loop = loop
            self._d.last_heard = time.monotonic()
            loop.add_reader(self._sock.fileno(), self._readable)
            watch.watch(self)
        elif self._loop is not loop:
            raise RuntimeError("an AsyncClient is bound to the event loop it first ran on")

    async def call(self, call: Call) -> Dict[str, Any]:
        """Sends ``call`` and returns its reply map, whether ``ok`` or not."""
        # Every request of an AsyncClient runs this: what Dispatcher.deadline and
        # _send_at_once would do is written out here, each a call less.
        if self._closed is not None:
            self._check_open()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._start(loop)
        if self._owes_turn and time.monotonic() >= self._turn_due:
            # Before sending, so that a task cancelled here leaves no reply behind.
            self._owes_turn = False
            await asyncio.sleep(0)
        # What loop.create_future() makes on asyncio's own loops, without its call;
        # the future is the request's slot (dispatch.py) unless it takes events.
        future: "asyncio.Future[Dict[str, Any]]" = asyncio.Future(loop=loop)
        d = self._d
        rid, frame = d.add(call, future if call.on_event is None
                           else _EventSlot(future, call.on_event))
        expiry = None
        if not call.waits:
            self._due[rid] = time.monotonic() + d.timeout
        elif call.wait_s is not None:  # a wait's own limit: a timer of its own
            expiry = loop.call_at(loop.time() + call.wait_s + d.timeout, self._expire, rid)
        try:
            try:
                if self._sending or call.fds:
                    await self._send(frame, call.fds)
                else:  # the common case: sent from here, without a coroutine
                    try:
                        sent = self._sock.send(frame)
                    except (BlockingIOError, InterruptedError):
                        sent = 0
                    except OSError as exc:
                        raise self._send_failed(exc, 0) from exc
                    if sent != len(frame):  # the socket's buffer was full
                        self._sending = True
                        await self._send_held(memoryview(frame)[sent:], ())
                    elif self.poll_s and len(d.pending) == 1:
                        self._poll(future)
            except ConnectionError:
                why = future.exception() if future.done() else None
                if why is not None:
                    raise why from None  # the daemon said why it closed
                raise
            if future.done() and not self._owes_turn:  # answered while it read
                self._owes_turn = True
                self._turn_due = time.monotonic() + LOOP_TURN_S
            return await future
        finally:
            if rid in d.pending:  # a reply routed took it off the books already
                d.forget(rid)
            if expiry is not None:
                expiry.cancel()
            elif rid in self._due:  # not when its deadline passed (_expire_due)
                del self._due[rid]

    async def post(self, call: Call) -> None:
        """Sends ``call`` without waiting for its reply (``Call.await_reply`` False):
        the reader lets the reply go."""
        if self._closed is not None:
            self._check_open()
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._start(loop)
        _, frame = self._d.add(call, DROPPED)
        if self._sending or call.fds:
            await self._send(frame, call.fds)
        else:
            rest = self._send_at_once(frame)
            if rest is not None:
                await self._send_held(rest, ())

    def watch_due(self, now: float) -> Optional[float]:
        """Run by watch.py's thread, not the loop: hands the loop the checks due at
        ``now`` (an overdue request, a liveness check while a wait is pending);
        when the next one is due. Reads ``_due`` and ``waits`` only."""
        loop = self._loop
        if loop is None or self._closed is not None:
            return None
        try:
            oldest = next(iter(self._due.values()), None)
        except RuntimeError:  # the loop changed _due meanwhile: let it look
            oldest = now
        checks = []
        if oldest is not None and oldest <= now:
            checks.append(self._expire_due)
            oldest = None
        tick = None
        if self._d.waits:
            if now >= self._next_tick:
                checks.append(self._tick)
                self._next_tick = now + self.timeout / 4
            tick = self._next_tick
        try:
            for check in checks:
                loop.call_soon_threadsafe(check)
        except RuntimeError:  # the loop is closed: nothing of this connection runs
            watch.unwatch(self)
            return None
        return min((t for t in (oldest, tick) if t is not None), default=None)

    def _expire_due(self) -> None:
        """Expires the requests answered-at-once that are overdue, oldest first."""
        now = time.monotonic()
        while self._due:
            rid, deadline = next(iter(self._due.items()))
            if deadline > now:
                return
            del self._due[rid]
            self._expire(rid)

    def _expire(self, rid: int) -> None:
        error = self._d.late_error(rid)
        slot = self._d.forget(rid)
        if slot is not None:
            try:
                slot.set_exception(error)
            except InvalidStateError:
                pass  # cancelled meanwhile

    def _send_at_once(self, data: bytes) -> Optional[memoryview]:
        """Sends a frame with one send while the send turn is free (the caller
        checked). None when it all went; else the turn is taken and what is
        left returned, for :meth:`_send_held` (the socket's buffer was full)."""
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            raise self._send_failed(exc, 0) from exc
        if sent == len(data):
            return None
        self._sending = True
        return memoryview(data)[sent:]

    async def _send(self, data: bytes, fds: Sequence[int]) -> None:
        """Sends one whole frame, the descriptors with its first byte, when the send
        turn comes."""
        if self._sending:
            assert self._loop is not None
            turn: "asyncio.Future[None]" = self._loop.create_future()
            self._send_queue.append(turn)
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():
                    self._hand_over()  # handed the turn, then cancelled: pass it on
                raise
        self._sending = True
        await self._send_held(data, fds)

    async def _send_held(self, data: Union[bytes, memoryview], fds: Sequence[int]) -> None:
        """Sends ``data`` holding the send turn, then hands the turn on; a failure
        part way leaves the stream out of step and closes the connection."""
        try:
            try:
                sent = 0
                while sent < len(data):
                    try:
                        if sent == 0 and fds:
                            sent = socket.send_fds(self._sock, [data], list(fds))
                        else:
                            sent += self._sock.send(memoryview(data)[sent:] if sent else data)
                    except (BlockingIOError, InterruptedError):
                        await self._writable()
            except OSError as exc:
                raise self._send_failed(exc, sent) from exc
        finally:
            self._hand_over()

    def _send_failed(self, exc: OSError, sent: int) -> ConnectionError:
        """Closes the connection after a send failed (with the daemon's last words
        when they are already here); the error to raise."""
        why = self._cannot_send(exc, sent)
        self._break((self._d.salvage(self._sock) if self._closed is None else None) or why)
        return why

    def _hand_over(self) -> None:
        """Gives the send turn to the first waiter still waiting, or frees it."""
        while self._send_queue:
            turn = self._send_queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._sending = False

    async def _writable(self) -> None:
        assert self._loop is not None
        ready = self._loop.create_future()
        fd = self._sock.fileno()
        self._loop.add_writer(fd, lambda: None if ready.done() else ready.set_result(None))
        try:
            await asyncio.wait_for(ready, self.timeout)
        except asyncio.TimeoutError:
            raise OSError(f"the daemon took nothing for {self.timeout:g} s") from None
        finally:
            self._loop.remove_writer(fd)

    def _poll(self, future: "asyncio.Future[Dict[str, Any]]") -> None:
        """Reads and routes what comes for up to ``poll_s``, until ``future`` (the one
        request in flight) is answered; the reader callback takes over after."""
        d, sock = self._d, self._sock
        deadline = time.perf_counter() + self.poll_s
        while True:
            more, fatal = d.receive(sock)
            if fatal is not None:
                self._break(fatal)
                return
            if future.done() or self._closed is not None:
                return
            if not more:
                if time.perf_counter() >= deadline:
                    return
                os.sched_yield()  # a CPU shared with gpuqd's thread goes to it

    def _readable(self) -> None:
        """The loop's reader callback: reads what is there and routes it."""
        more, fatal = self._d.receive(self._sock)
        while more and fatal is None and self._closed is None:
            more, fatal = self._d.receive(self._sock)
        if fatal is not None:
            self._break(fatal)

    def _tick(self) -> None:
        """A liveness check, every quarter timeout while waits for jobs are pending."""
        if not self._d.waits or self._closed is not None:
            return
        verdict = self._d.liveness(time.monotonic())
        if verdict == "dead":
            self._break(self._d.silent_error())
            return
        if verdict == "ping" and self._loop is not None:
            frame = self._d.ping_frame(time.monotonic())
            self._pinger = self._loop.create_task(self._ping(frame))

    async def _ping(self, frame: bytes) -> None:
        try:
            await self._send(frame, ())
        except ConnectionError:
            pass  # _send closed the connection; the waiters learn why

    def _break(self, error: BaseException) -> None:
        if self._closed is not None:
            return
        self._closed = f"closed: {error}"
        self._d.fail_all(lambda: _copy_error(error))
        self._detach()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
        watch.unwatch(self)

    def close(self, why: str = "closed by the client") -> None:
        if self._closed is None:
            self._closed = why
            self._d.fail_all(lambda: ConnectionError(
                f"the connection to gpuqd at {self.path} was {why}"))
            self._detach()
        self._sock.close()


class _Done:
    """An awaitable already done, of None (what AsyncClient.close returns)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator function: awaited, it ends at once

    def __repr__(self) -> str:
        return "<closed>"


_DONE = _Done()


class AsyncClient(AsyncMethods, ClientBase):  # type: ignore[misc]
    """The asyncio twin of :class:`gpuq.Client`: the same methods, as coroutine
    functions (``async def``, aio_methods.py) returning what the sync client's return.

    Many requests may be in flight on one connection (start them as tasks,
    or ``asyncio.gather`` them); replies are matched by id. The connection
    is made by the constructor (an unreachable daemon raises
    :class:`ConnectionError` there) and is bound to the event loop that
    first uses it. Jobs it returns have awaitable ``wait``, ``refresh`` and
    ``cancel``; progress handlers run on the loop. :meth:`set_reconnect` rides
    through a gpuqd restarted on the same socket, as Client's does::

        async with gpuq.AsyncClient() as client:
            jobs = await asyncio.gather(*(client.noop(detach=True) for _ in range(8)))
            await asyncio.gather(*(job.wait() for job in jobs))
    """

    _connection_class = AsyncConnection
    _forked_connection_class = AsyncForkedConnection

    # The reconnect under way, which every request that lost the connection
    # awaits: one new connection for all of them (set_reconnect).
    _reconnecting: Optional["asyncio.Task[bool]"] = None

    def __init__(self, socket: Optional[str] = None, *,
                 timeout: float = DEFAULT_TIMEOUT, staging_slots: int = DEFAULT_SLOTS,
                 staging_slot_bytes: int = DEFAULT_SLOT_BYTES,
                 copy_threads: Optional[int] = None, poll_us: Optional[float] = None) -> None:
        """``poll_us``: how long a request alone on the connection reads for its
        reply itself before it leaves the wait to the loop (default
        :data:`DEFAULT_POLL_US`; 0, never, on fewer than 4 CPUs).
        Other tasks wait meanwhile, as for any code that does not await; a
        task whose requests are all answered so still lets the loop run
        every millisecond. The other arguments are :class:`gpuq.Client`'s."""
        self._poll_s = default_poll_s() if poll_us is None else max(0.0, poll_us) * 1e-6
        super().__init__(socket, timeout=timeout, staging_slots=staging_slots,
                         staging_slot_bytes=staging_slot_bytes, copy_threads=copy_threads)

    def _connect(self, timeout: float) -> Any:
        conn = super()._connect(timeout)
        conn.poll_s = self._poll_s
        return conn

    def _forked(self) -> None:
        super()._forked()
        self._reconnecting = None  # a task of the parent's event loop

    async def _call(self, call: Call) -> Dict[str, Any]:
        """One request on the connection, reconnecting as :meth:`set_reconnect` says.

        The one-request methods (aio_methods.py) do the same themselves, a
        coroutine less per request: ``conn.call``, then :meth:`_recall` when
        it raised ConnectionError.
        """
        conn = self._conn
        try:
            return await conn.call(call)
        except ConnectionError as exc:
            return await self._recall(conn, call, exc)

    async def _recall(self, conn: AsyncConnection, call: Call,
                      lost: ConnectionError) -> Dict[str, Any]:
        """After ``call`` on ``conn`` raised ``lost``: ``call``'s reply on a new
        connection when ``conn`` was lost, a reconnect is set and ``call`` is
        safe to send again; otherwise ``lost``, or why it was not sent again,
        raised."""
        if not self._lost(conn, lost):
            raise lost
        if self._conn is conn:
            if self._reconnecting is None:
                self._reconnecting = asyncio.ensure_future(self._reconnect())
            # Shielded: a caller cancelled does not stop the others' reconnect.
            if not await asyncio.shield(self._reconnecting):
                raise lost
        self._check_resend(call, lost)
        return await self._conn.call(call)

    async def _reconnect(self) -> bool:
        """Whether a new connection to the same socket was made within reconnect_s."""
        try:
            for pause in self._reconnect_pauses():
                conn = self._try_connect()
                if conn is not None:
                    try:
                        ping = await conn.call(Call("ping"))
                    except (ConnectionError, TimeoutError) as exc:
                        self._unanswered(conn, exc)
                    else:
                        self._adopt(conn, ping)
                        return True
                await asyncio.sleep(pause)
            return False
        finally:
            self._reconnecting = None

    def _let_go(self, held: Union["share.Attachment", "share.Region"]) -> None:
        """What a plain ``with`` on this client's attachment or region does before
        its TypeError (share.py): it cannot await, so it unmaps here and ends
        the lease, or frees the region, without waiting, on a connection and a
        thread of their own as an abandoned attach's lease is given back
        (client._apart: a release or region_free takes its holder's uid, not
        its connection), so that the mistake leaks nothing."""
        if isinstance(held, share.Attachment):
            if not held.ptr:
                return  # released already
            self._held.pop(held.lease, None)
            held.unmap("released when a plain `with` on it was refused (an AsyncClient's "
                       "attachment takes `async with`)")
            call = Call("release", {"lease": held.lease})
        else:
            held.unmap()
            call = Call("region_free", {"name": held.name})
        _apart(self.socket, self.timeout, call)

    def close(self) -> "_Done":  # type: ignore[override]
        """Closes the connection at once, as :meth:`gpuq.Client.close` does, and
        returns an awaitable already done: ``await client.close()`` reads as
        every other call of the async client does, while ``client.close()``
        not awaited (sync code, a finalizer) closes all the same. (A coroutine
        function would close nothing until awaited.) :meth:`aclose` is the
        same, as a coroutine function."""
        super().close()
        return _DONE

    async def aclose(self) -> None:
        """Closes the connection (:meth:`close`)."""
        self.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    # One request, one reply, without a plan's generator (as Client's). The methods
    # whose body is only such a call send it themselves (aio_methods.py); these
    # serve Api's methods called any other way (run, Api.ping(client)).

    async def _request_kw(self, op: str, **fields: Any) -> Any:
        reply = await self._call(Call(op, fields))
        if not reply.get("ok"):
            raise self._refusal(reply)
        return _own_body(reply)

    async def _job_kw(self, op: str, *,
                      priority: Optional[str] = None, detach: bool = False,
                      timeout: Optional[float] = None,
                      on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Any:
        reply = await self._call(_job_call(op, fields, (), priority, detach, timeout,
                                           on_progress))
        if not reply.get("ok"):
            raise self._refusal(reply)
        return Job(self, reply["job"])

    async def _drive(self, plan: Plan) -> Any:
        """Runs a plan, awaiting each of its requests in turn."""
        try:
            call = next(plan)
            while True:
                if call is YIELD:
                    try:
                        await asyncio.sleep(0)
                    except BaseException as exc:  # cancelled: the plan cleans up
                        call = plan.throw(exc)
                    else:
                        call = plan.send(None)
                    continue
                if not call.await_reply:
                    try:
                        await self._conn.post(call)
                    except BaseException as exc:
                        call = plan.throw(exc)
                    else:
                        call = plan.send(None)
                    continue
                try:
                    reply = await self._call(call)
                except BaseException as exc:
                    call = plan.throw(exc)
                else:
                    call = self._advance(plan, reply)
        except StopIteration as stop:
            return stop.value
        finally:
            plan.close()
