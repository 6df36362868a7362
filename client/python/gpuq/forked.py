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
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:  # pragma: no cover
    from .client import ClientBase
    from .dispatch import Call

__all__ = ["ForkedConnection", "AsyncForkedConnection", "track"]


class ForkedConnection:
    """What a client forked from another process holds until its first request,
    which makes the client's own connection (as its constructor would) and
    goes on it."""

    def __init__(self, client: "ClientBase", timeout: float) -> None:
        self._client = client
        self._timeout = timeout
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
            client = self._client
            if self._closed:
                raise ConnectionError(f"the connection to gpuqd at {client.socket} is closed "
                                      "(closed by the client); make a new client")
            if client._conn is self:
                conn = client._connection_class(client.socket, self._timeout)
                conn._d.on_notice = client._notice
                client._conn = conn
            return client._conn

    def call(self, call: "Call") -> Dict[str, Any]:
        return self._connected().call(call)

    def post(self, call: "Call") -> None:
        self._connected().post(call)

    def close(self, why: str = "closed by the client") -> None:
        self._closed = True


class AsyncForkedConnection(ForkedConnection):
    """The same for an AsyncClient: it connects in its first request's event loop."""

    async def call(self, call: "Call") -> Dict[str, Any]:  # type: ignore[override]
        return await self._connected().call(call)

    async def post(self, call: "Call") -> None:  # type: ignore[override]
        await self._connected().post(call)


_clients: "weakref.WeakSet[ClientBase]" = weakref.WeakSet()


def track(client: "ClientBase") -> None:
    """Lets ``client`` go of its parent's connection in a forked child (module doc)."""
    _clients.add(client)


def _after_fork_in_child() -> None:
    for client in list(_clients):
        client._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
