"""Ctrl-C (KeyboardInterrupt) in the thread that reads a sync Client's socket.

Python raises KeyboardInterrupt in the main thread between two bytecodes:
on entry to a function, after any call returns (its result then lost), and
on a loop's jump back. These tests raise it deterministically at each of
those points in turn, through a profile hook (``sys.setprofile``: ``call``,
``return`` and ``c_return`` events in gpuq's own code), and check that the
client is still whole afterwards: every other thread gets its replies, the
next call reads the next frame from its start, and a lease granted to an
interrupted attach is given back.
"""

from __future__ import annotations

import dis
import os
import sys
import threading
import time
from typing import Any, Callable, List

import gpuq
from conftest import host_only

PACKAGE = os.path.dirname(gpuq.__file__) + os.sep
ROUNDS_MAX = 5000  # far more points than a call passes through
# What a frame ends with when it returns a value. (A generator's yield is not
# one: the caller's send or next returns the value, its own c_return.)
_RETURNS = {dis.opmap[op] for op in ("RETURN_VALUE", "RETURN_CONST") if op in dis.opmap}


class Interrupt:
    """Raises KeyboardInterrupt at the ``at``-th profile event of gpuq's code in
    this thread (``fired`` says whether the call got that far)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0
        self.fired = False
        self.where = ("", "")  # the event and function it fired in

    def __enter__(self) -> "Interrupt":
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(None)

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return", "c_return"):
            return
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return
        if event == "return" and frame.f_code.co_code[frame.f_lasti] not in _RETURNS:
            return  # an exception passing through: Python checks for signals after calls that return
        self.seen += 1
        if self.seen == self.at:
            self.fired = True
            self.where = (event, frame.f_code.co_name)
            raise KeyboardInterrupt(f"injected at {event} in {frame.f_code.co_name}")


def each_point(call: Callable[[], Any], after: Callable[[Interrupt], None]) -> int:
    """Runs ``call`` interrupted at its 1st, 2nd, ... point until it runs through;
    ``after(interrupt)`` checks the client after each interrupted run. Returns
    how many points there were."""
    for at in range(1, ROUNDS_MAX):
        interrupt = Interrupt(at)
        try:
            with interrupt:
                call()
        except KeyboardInterrupt:
            assert interrupt.fired
        if not interrupt.fired:
            return at - 1
        after(interrupt)
    raise AssertionError("the call never ran through")


class ShortReads:
    """The client's socket, handing out at most ``most`` bytes per read, so that
    every frame is read in pieces and an interrupt can land mid-frame. With
    ``gate``, a read in the main thread first waits (briefly) until another
    thread's request is in flight too, so that the main thread reads replies
    that are not its own."""

    def __init__(self, client: gpuq.Client, most: int, gate: bool = False) -> None:
        self._sock = client._conn._sock
        self._pending = client._conn._d.pending
        self._most = most
        self._gate = gate

    def recvmsg_into(self, buffers: List[Any], *args: Any) -> Any:
        if self._gate and threading.current_thread() is threading.main_thread():
            deadline = time.monotonic() + 0.05
            while len(self._pending) < 2 and time.monotonic() < deadline:
                time.sleep(0.0002)
        return self._sock.recvmsg_into([memoryview(buffers[0])[:self._most]], *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_ctrl_c_anywhere_in_a_call_leaves_the_client_whole(daemon):
    with daemon.client(timeout=5) as c:
        def after(interrupt: Interrupt) -> None:
            at = interrupt.at
            assert c.ping()["version"] == 1, f"broken by an interrupt at point {at}"
        points = each_point(lambda: c.ping(), after)
        assert points > 20
        assert not c.closed


def test_ctrl_c_in_the_middle_of_a_frame_resumes_it(private_daemon, name):
    """A reply read in 3-byte pieces: an interrupt between two of them leaves the
    rest to the next read, which goes on with the same frame (the connection is
    not closed as if gpuqd had sent garbage). A daemon of its own: the reply
    lists only these buffers."""
    with private_daemon().client(timeout=5) as c:
        for i in range(3):
            c.alloc(f"{name}{i}", count=16, dtype="f32")
        c._conn._sock = ShortReads(c, 3)
        expected = sorted(b["name"] for b in c.buffers())

        def after(interrupt: Interrupt) -> None:
            at = interrupt.at
            got = sorted(b["name"] for b in c.buffers())
            assert got == expected, f"after an interrupt at point {at}"
        each_point(lambda: c.buffers(), after)
        assert not c.closed
        for i in range(3):
            c.free(f"{name}{i}")


def test_ctrl_c_in_one_thread_leaves_the_others_served(daemon, name):
    """Another thread's replies may be what the main thread was reading when
    interrupted: they reach it all the same, and no lock is left held."""
    with daemon.client(timeout=5) as c:
        c._conn._sock = ShortReads(c, 5, gate=True)
        done, errors, stop = [0], [], threading.Event()

        def work() -> None:
            try:
                while not stop.is_set():
                    assert c.ping()["version"] == 1
                    done[0] += 1
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
        worker = threading.Thread(target=work)
        worker.start()
        try:
            def after(interrupt: Interrupt) -> None:
                at = interrupt.at
                seen = done[0]
                deadline = time.monotonic() + 4
                while done[0] < seen + 2 and time.monotonic() < deadline and not errors:
                    c.noop()
                assert not errors, f"after an interrupt at point {at}: {errors[0]!r}"
                assert done[0] >= seen + 2, f"the worker is stuck after point {at}"
            # The worker's pings are answered at once, the main thread's job when it
            # has run: what the main thread reads is mostly the worker's replies.
            each_point(lambda: c.noop(), after)
        finally:
            stop.set()
            worker.join(20)
        assert not worker.is_alive()
        assert not errors, errors
        assert not c.closed


def _held_leases(c: gpuq.Client, buf: str) -> List[Any]:
    return [lease for lease in c.leases() if lease.get("buffer", "").startswith(buf)]


def _no_lease_left(c: gpuq.Client, buf: str, at: Any) -> None:
    """Waits (bounded) for every lease on ``buf`` to end, then runs a job on it."""
    deadline = time.monotonic() + 5
    while _held_leases(c, buf) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not _held_leases(c, buf), f"a lease was left held by an interrupt at point {at}"
    assert c.fill(buf, "zero", timeout=5).state == "done"


def test_ctrl_c_in_attach_leaves_no_lease_held(daemon, name):
    """Interrupted anywhere in attach (and in the release after), no lease is left
    held that the client does not hold: one granted to an attach given up is
    released, and one in hand is in ``c._held`` (what ``release(id)`` finds)."""
    host_only()
    with daemon.client(timeout=5) as c:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        c._conn._sock = ShortReads(c, 64)
        got: List[Any] = []

        def attach() -> None:
            got[:] = []
            got.append(c.attach(name))
            c.release(got[0])

        def after(interrupt: Interrupt) -> None:
            if c._held and not got:
                # Only as attach hands back the attachment, in hand, can the caller
                # not get it: no code of the client's runs there to see it.
                assert interrupt.where in (("return", "_attach_plan"), ("return", "_drive"),
                                           ("return", "attach")), \
                    f"an attachment in hand was lost at {interrupt.where}"
            for lease in list(c._held):  # as a user would, from leases()
                c.release(lease)
            _no_lease_left(c, name, f"{interrupt.at} {interrupt.where}")
        each_point(attach, after)
        c.free(name)


def test_ctrl_c_as_an_attachment_is_released_leaves_no_lease_held(daemon, name):
    host_only()
    with daemon.client(timeout=5) as c:
        c.alloc(name, count=16, dtype="f32", shareable=True)
        holder: List[Any] = []

        def leave() -> None:
            holder[0].__exit__(None, None, None)

        for at in range(1, ROUNDS_MAX):
            holder[:] = [c.attach(name)]
            interrupt = Interrupt(at)
            try:
                with interrupt:
                    leave()
            except KeyboardInterrupt:
                pass
            if not interrupt.fired:
                break
            for lease in list(c._held):
                # Only as the with block's exit begins, before its first line: no
                # code of the client's runs (python.md: release(id) ends it).
                assert interrupt.where == ("call", "__exit__"), interrupt.where
                c.release(lease)
            _no_lease_left(c, name, f"{at} {interrupt.where}")
        c.free(name)


def _region_left(c: gpuq.Client, name: str) -> bool:
    """Whether gpuqd still lists region ``name``, after the frees sent apart
    (their own connections and threads) have had their time."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(r["name"] == name for r in c.regions()["regions"]):
            return False
        time.sleep(0.01)
    return True


def test_ctrl_c_as_a_region_is_freed_leaves_it_not_pinned(daemon, name):
    """A region outlives its process: a ``with`` block's free broken off before
    it surely went out is sent apart, so that gpuqd does not keep its pages
    pinned for nobody. Only the exit's very start runs no code of the
    client's; region_free(name) ends it then."""
    host_only()
    with daemon.client(timeout=5) as c:
        for at in range(1, ROUNDS_MAX):
            region = c.region_create(name, 1 << 16)
            interrupt = Interrupt(at)
            try:
                with interrupt:
                    region.__exit__(None, None, None)
            except KeyboardInterrupt:
                pass
            if not interrupt.fired:
                assert not _region_left(c, name)
                break
            if _region_left(c, name):
                assert interrupt.where == ("call", "__exit__"), (at, interrupt.where)
                c.region_free(name)
