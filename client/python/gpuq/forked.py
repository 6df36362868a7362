"""Clients in a process forked from the one that made them.

After ``fork()`` the child holds copies of the parent's descriptors and
memory: its client's socket is the parent's connection, and the client's
staging ring is the parent's region. Sharing either would mix two
processes' traffic: replies go to whichever process reads first, request
ids are issued twice, and both write the ring's slots. So in the child
every client lets go of both at once (an ``os.register_at_fork`` hook: no
request, no lock of the parent's taken) and connects anew at its first
request. A forked worker (multiprocessing's ``fork`` start method, a
DataLoader worker) can thus use the client it inherited. What belonged to
the parent's connection stays the parent's: its leases, its ephemeral
buffers and regions, its ring, and mappings of device memory (CUDA does
not carry over a fork).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Callable, Dict, List

__all__ = ["ForkedConnection", "AsyncForkedConnection", "on_fork"]


class ForkedConnection:
    """What a client holds in a forked child until its first request: that request
    makes the client's own connection (``connect()``, which also hands it to
    the client) and goes on it."""

    def __init__(self, path: str, timeout: float, connect: Callable[[], Any]) -> None:
        self.path = path
        self._timeout = timeout
        self._connect = connect
        self._conn: Any = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def timeout(self) -> float:
        return self._timeout

    @property
    def closed(self) -> bool:
        return self._closed

    def _connected(self) -> Any:
        with self._lock:
            if self._closed:
                raise ConnectionError(f"the connection to gpuqd at {self.path} is closed "
                                      "(closed by the client); make a new client")
            if self._conn is None:
                self._conn = self._connect()
            return self._conn

    def call(self, call: Any) -> Dict[str, Any]:
        return self._connected().call(call)

    def post(self, call: Any) -> None:
        self._connected().post(call)

    def close(self, why: str = "closed by the client") -> None:
        self._closed = True


class AsyncForkedConnection(ForkedConnection):
    """The same for an AsyncClient: it connects in its first request's event loop."""

    async def call(self, call: Any) -> Dict[str, Any]:  # type: ignore[override]
        return await self._connected().call(call)

    async def post(self, call: Any) -> None:  # type: ignore[override]
        await self._connected().post(call)


_hooks: List["weakref.WeakMethod[Callable[[], None]]"] = []
_hooks_lock = threading.Lock()


def on_fork(hook: Callable[[], None]) -> None:
    """Calls the bound method ``hook`` in every child forked after this, for as long
    as its object lives (held weakly)."""
    with _hooks_lock:
        _hooks[:] = [h for h in _hooks if h() is not None]
        _hooks.append(weakref.WeakMethod(hook))


def _after_fork_in_child() -> None:
    for ref in list(_hooks):
        hook = ref()
        if hook is not None:
            hook()


os.register_at_fork(after_in_child=_after_fork_in_child)
