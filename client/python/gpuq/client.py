"""gpuq.Client: the blocking client."""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Iterator, Optional

from .api import Api, Plan, ProgressHandler, _job_call
from .device_arrays import drop_mappings
from .connection import Connection, ConnectionBase, NotSent
from .dispatch import YIELD, Call, close_fds
from .errors import ProtocolError
from .forked import ForkedConnection, on_fork
from .job import Job
from .staging import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS, Staging
from .wire import default_socket

__all__ = ["Client", "ClientBase", "DEFAULT_TIMEOUT"]

#: Seconds the daemon has to answer anything (see ``Client``'s ``timeout``).
DEFAULT_TIMEOUT = 30.0

#: Requests that read and change nothing: sent again on a new connection when
#: the old one ended with them in flight (as libgpuq's gpuq_set_reconnect does).
#: A job never is: it may have run in the gpuqd that went away.
RETRY_SAFE = frozenset({"ping", "devices", "buffers", "jobs", "status", "wait", "stats",
                        "quota", "metrics", "regions", "leases"})
#: Of those, the ones that name a job by its id: sent again only to a gpuqd that
#: took the old one over, since one started afresh numbers its jobs from 1 again.
NAMES_A_JOB = frozenset({"status", "wait"})


def _own_body(reply: Dict[str, Any]) -> Dict[str, Any]:
    """api._body's map, made by taking the envelope out of ``reply`` itself: the
    reply a call returns is a map nothing else holds, so it need not be copied."""
    reply.pop("id", None)
    reply.pop("ok", None)
    return reply


class ClientBase(Api):
    """What both clients hold: the socket path and a connection to it."""

    _connection_class: Any = Connection
    _forked_connection_class: Any = ForkedConnection

    def __init__(self, socket: Optional[str] = None, *,
                 timeout: float = DEFAULT_TIMEOUT, staging_slots: int = DEFAULT_SLOTS,
                 staging_slot_bytes: int = DEFAULT_SLOT_BYTES,
                 copy_threads: Optional[int] = None) -> None:
        super().__init__(Staging(staging_slots, staging_slot_bytes, copy_threads))
        self.socket = socket or default_socket()
        self._conn = self._connect(timeout)
        self._reconnect_lock = threading.Lock()
        on_fork(self._forked)

    def _lease_abandoned(self, reply: Dict[str, Any]) -> None:
        """An attach's ``on_abandoned`` (dispatch.Call): gpuqd granted a lease to a
        caller who had stopped waiting (Ctrl-C, a cancelled task, the deadline).
        Nobody here holds it, and the buffer's jobs would wait for it as long as
        this connection lives, so it is released at once, on a connection and
        a thread of its own: this runs on whichever thread reads, which must
        not block, and a release takes the holder's uid, not its connection."""
        close_fds(reply)
        result = (reply.get("job") or {}).get("result") or {}
        if reply.get("ok") and result.get("lease") is not None:
            self._release_apart(int(result["lease"]))

    def _release_apart(self, lease: int) -> None:
        """Ends ``lease`` on a connection and a thread of their own, from a handler
        that must not block, or a release broken off (Api._release_plan)."""
        _apart(self.socket, self.timeout, Call("release", {"lease": lease}))

    def _region_free_apart(self, name: str) -> None:
        """Frees region ``name`` on a connection and a thread of their own: a
        ``with`` block's free broken off (Ctrl-C, a cancelled task) before it
        surely went out would leave the region pinned in gpuqd, past this
        process's end. One that did go out makes this one a refusal."""
        _apart(self.socket, self.timeout, Call("region_free", {"name": name}))

    def _region_abandoned(self, reply: Dict[str, Any]) -> None:
        """The ring's region_create's ``on_abandoned``: a region pinned after its
        caller stopped waiting would stay pinned, unused, as long as the
        connection lives (the next transfer makes another ring); it is freed
        the same way."""
        result = (reply.get("job") or {}).get("result") or {}
        if reply.get("ok") and result.get("name"):
            _apart(self.socket, self.timeout, Call("region_free", {"name": result["name"]}))

    def _forked(self) -> None:
        """In a child forked from the process that made this client (forked.py):
        leaves the parent its connection, ring, leases and mappings, closing
        this process's copy of the socket (not shutting it down: that would end
        the parent's connection too, and the daemon must see the parent's own
        close), and connects anew at the next request."""
        old = self._conn
        self._conn = self._forked_connection_class(self.socket, old.timeout,
                                                   self._connect_in_child)
        if isinstance(old, ConnectionBase):
            old.abandon()
        s = self._staging
        self._staging = Staging(s.slots, s.slot_bytes, s.threads, s.group, s.use_rings)
        self._held, self._mappings, self._stale_mappings = {}, {}, []
        self._kept = self._kept.in_child()
        self._reconnect_lock = threading.Lock()

    def _connect(self, timeout: float) -> Any:
        """A new connection to the socket, its events for no request routed to
        :meth:`_notice`; ConnectionError while nothing listens there."""
        conn = self._connection_class(self.socket, timeout)
        conn._d.on_notice = self._notice
        return conn

    def _connect_in_child(self) -> Any:
        """The connection of a forked child's client, made at its first request."""
        self._conn = self._connect(self._conn.timeout)
        return self._conn

    #: Seconds to try connecting again after the connection is lost (0: never);
    #: see :meth:`set_reconnect`.
    reconnect_s: float = 0.0
    #: New connections made after losing one.
    reconnects: int = 0
    #: Whether the gpuqd of the latest reconnect took the old one's state over
    #: (its ping counts ``recoveries``), so that job ids name the same jobs.
    _took_over: bool = False

    def set_reconnect(self, window_s: float) -> None:
        """Reconnects when the connection ends (gpuqd restarted, or crashed and came
        back under systemd), trying for up to ``window_s`` seconds, and sends again
        a request that reads and changes nothing (``RETRY_SAFE``: ping, status,
        buffers, wait...; status and wait only to a gpuqd that took the old
        one over, as job ids start from 1 again in one started afresh). Any
        other request in flight raises ConnectionError
        saying it was not sent again, as a job may have run; the client is
        connected again for the next call. A request that finds the
        connection gone as it is sent (idle through a restart) reached no
        gpuqd, and goes on the new connection, whatever it is. Requests in flight together (from
        threads, or tasks of an AsyncClient) share one new connection, and each
        safe one is sent again once. What belonged to the old connection (the
        staging ring's regions, ephemeral buffers, leases) is not carried over:
        the ring is made again when next needed. Off (0) by default."""
        self.reconnect_s = max(0.0, float(window_s))

    def _lost(self, conn: Any, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a request on ``conn``, is the end of a connection
        to reconnect after: a window is set, and ``conn`` closed without the daemon
        sending anything malformed (a ProtocolError is no restart)."""
        return self.reconnect_s > 0 and not isinstance(exc, ProtocolError) and conn.closed

    def _reconnect_pauses(self) -> Iterator[float]:
        """The pauses between tries to connect again, until reconnect_s has passed."""
        deadline = time.monotonic() + self.reconnect_s
        pause = 0.01
        while time.monotonic() < deadline:
            yield pause
            pause = min(pause * 2, 0.2)

    def _try_connect(self) -> Any:
        """A new connection to the socket, or None while nothing listens there."""
        try:
            return self._connect(self._conn.timeout)
        except ConnectionError:
            return None

    @staticmethod
    def _unanswered(conn: Any, error: BaseException) -> None:
        """A new connection whose first ping failed: a gpuqd that died as it was
        made (its listening socket queues connections until the process is
        gone), or that does not answer yet. Closed; the caller tries again."""
        conn.close(f"not answered ({error})")

    def _adopt(self, conn: Any, ping: Dict[str, Any]) -> None:
        """Serves on ``conn``, whose gpuqd answered ``ping``, from now on, leaving
        behind what went with the old one."""
        self._took_over = bool(ping.get("recoveries"))
        self._staging.close()  # its regions went with the old connection
        # Its leases too: released by no one (the new gpuqd's ids are not theirs).
        drop_mappings(self, None, unmap=False, release=False)
        self._kept.refused = ""
        # The old one is not closed here: a thread may still be leaving its read,
        # and its descriptor's number must not be reused under it (it goes with
        # the object).
        self._conn = conn
        self.reconnects += 1

    def _check_resend(self, call: Call, lost: BaseException) -> None:
        """Raises, for a request in flight when the connection was lost, unless it
        is safe to send again: it never went out (the connection was found gone
        as it was sent), or it reads and changes nothing and moves no descriptor."""
        if isinstance(lost, NotSent):
            return
        if call.op in RETRY_SAFE and not call.fds:
            if call.op not in NAMES_A_JOB or self._took_over:
                return
            raise ConnectionError(
                f"gpuqd at {self.socket} went away with a {call.op} request in flight, "
                f"and the gpuqd that answers there now was started afresh (it took "
                f"nothing over): the job went with the old one, and the {call.op} is not "
                f"asked again, as the new gpuqd numbers its jobs from 1 and may have one "
                f"of that id") from lost
        raise ConnectionError(
            f"gpuqd at {self.socket} went away with a {call.op} request in flight and "
            f"answers there again; it is not sent again, as it may have run "
            f"(client.jobs() shows what did)") from lost

    def _notice(self, frame: Dict[str, Any]) -> None:
        """An event for no request: a broken lease makes a kept mapping of its buffer
        stale (unmapped at close: a copy of another thread may still use it),
        and the kept leases of that name go with it (the broken one is ended;
        others, on other GPUs, are released apart: this thread must not block)."""
        if frame.get("event") == "lease_broken":
            if frame.get("lease") is not None:
                self._kept.drop_lease(int(frame["lease"]))
            for lease in drop_mappings(self, str(frame.get("buffer") or ""), unmap=False):
                self._release_apart(lease)

    @property
    def staging(self) -> Staging:
        """The pinned ring large ordinary arrays travel through (made on first use;
        ``unavailable`` says why there is none, ``retry_at`` when a transfer
        tries to make it again)."""
        return self._staging

    @property
    def timeout(self) -> float:
        """Seconds the daemon has to answer (see the class's documentation)."""
        return self._conn.timeout

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by :meth:`close`, or because it broke)."""
        return self._conn.closed

    def close(self) -> None:
        """Closes the connection; requests in flight fail with ConnectionError.
        Jobs already submitted run on in the daemon; gpuqd frees the staging
        ring's regions with the connection."""
        self._staging.close()
        self._conn.close()
        drop_mappings(self, None, unmap=True, release=False)  # ended with the connection

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<gpuq.{type(self).__name__} {self.socket} {state}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refused, for pickle and copy alike: a client is this process's connection."""
        raise TypeError(f"a gpuq.{type(self).__name__} is this process's connection to gpuqd "
                        "and cannot be pickled or copied: make a gpuq.Client() in the other "
                        "process (a forked child may use this one), and send it buffer "
                        "names and job ids")

    def _advance(self, plan: Plan, reply: Dict[str, Any]) -> Call:
        """Hands a reply to a plan (raised into it when not ``ok``); its next request."""
        if not reply.get("ok"):
            return plan.throw(self._refusal(reply))
        return plan.send(reply)


def _give_up(call: Call) -> None:
    """Hands the reply of ``call``, if it came and its plan did not claim what it
    grants, to the call's ``on_abandoned``."""
    if call.on_abandoned is not None and call.reply is not None and not call.claimed:
        call.claimed = True
        call.on_abandoned(call.reply)


def _apart(socket: str, timeout: float, call: Call) -> None:
    """Sends ``call`` on a connection and a thread of their own, for a handler that
    runs on whichever thread reads and must not block (see _lease_abandoned)."""
    threading.Thread(target=_send_apart, name="gpuq-apart", daemon=True,
                     args=(socket, timeout, call)).start()


def _send_apart(socket: str, timeout: float, call: Call) -> None:
    try:
        conn = Connection(socket, timeout)
    except ConnectionError:
        return  # gpuqd is gone, and with it what the connection held
    try:
        conn.call(call)
    except (ConnectionError, TimeoutError):
        pass  # what the first connection holds ends when it closes
    finally:
        conn.close()


class Client(ClientBase):
    """A connection to gpuqd, with one method per request of the protocol.

    ``socket``: the daemon's socket path; by default ``$GPUQ_SOCKET``, else
    the one the ``gpuq`` CLI would use (:func:`gpuq.default_socket`).
    ``timeout``: seconds the daemon has to answer a request that it answers
    at once, and the silence after which a long wait for a job checks with a
    ``ping`` that the daemon is still there (a wait for a job itself is
    bounded only by its own ``timeout``). An unreachable daemon raises
    :class:`ConnectionError` naming the socket.

    ``staging_slots`` x ``staging_slot_bytes``: the pinned ring that large
    ordinary arrays travel through (gpuq/staging.py; made at the first such
    transfer, ``staging_slots=0`` for none); ``copy_threads`` fill it.

    One client may be used from several threads at once: their requests
    share the connection and each thread gets its own replies. Use it as a
    context manager, or call :meth:`close`::

        with gpuq.Client() as client:
            client.alloc("w", count=1024, dtype="f32")
            client.fill("w", "random", seed=1)
            print(client.checksum("w").result["checksum"])
    """

    def _call(self, call: Call) -> Dict[str, Any]:
        """One request on the connection, reconnecting as :meth:`set_reconnect` says."""
        conn = self._conn
        try:
            return conn.call(call)
        except ConnectionError as exc:
            if not self._lost(conn, exc):
                raise
            with self._reconnect_lock:  # threads that lost it together make one anew
                if self._conn is conn:
                    self._reconnect(exc)
            self._check_resend(call, exc)
            return self._conn.call(call)

    def _reconnect(self, lost: BaseException) -> None:
        """A new connection to the same socket within reconnect_s, or ``lost`` raised."""
        for pause in self._reconnect_pauses():
            conn = self._try_connect()
            if conn is not None:
                try:
                    ping = conn.call(Call("ping"))
                except (ConnectionError, TimeoutError) as exc:
                    self._unanswered(conn, exc)
                else:
                    self._adopt(conn, ping)
                    return
            time.sleep(pause)
        raise lost

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # One request, one reply: what ping, noop and the other simple methods send,
    # without a plan's generator (the same requests and errors as Api's).

    def _request_kw(self, op: str, **fields: Any) -> Any:
        reply = self._call(Call(op, fields))
        if not reply.get("ok"):
            raise self._refusal(reply)
        return _own_body(reply)

    def _job_kw(self, op: str, *, priority: Optional[str] = None, detach: bool = False,
                timeout: Optional[float] = None,
                on_progress: Optional[ProgressHandler] = None, **fields: Any) -> Any:
        reply = self._call(_job_call(op, fields, (), priority, detach, timeout,
                                     on_progress))
        if not reply.get("ok"):
            raise self._refusal(reply)
        return Job(self, reply["job"])

    def _drive(self, plan: Plan) -> Any:
        """Runs a plan, blocking on each of its requests in turn.

        A plan left by an exception (Ctrl-C above all, which may come at any
        point: as the reply is read, handed up, or taken in by the plan) may
        leave a reply that grants something in no one's hands: its call's
        ``on_abandoned`` then gets it (the reply not yet come gets it as it
        comes: Connection._leave)."""
        call = YIELD
        try:
            call = next(plan)
            while True:
                if call is YIELD:
                    call = plan.send(None)
                    continue
                if not call.await_reply:
                    try:
                        self._conn.post(call)
                    except BaseException as exc:
                        call = plan.throw(exc)
                    else:
                        call = plan.send(None)
                    continue
                try:
                    reply = self._call(call)
                except BaseException as exc:
                    call = plan.throw(exc)
                else:
                    call = self._advance(plan, reply)
        except StopIteration as stop:
            return stop.value  # the plan is over: nothing is called after it returned
        except BaseException:
            _give_up(call)
            plan.close()
            raise
