"""Buffer: a named buffer of gpuqd as an object, with numpy's attributes.

``client.buffer("x")`` and ``client.alloc(...)`` return one. It is a
snapshot of the buffer's row in ``buffers`` (name, device, dtype, shape,
size) plus methods that call the client for it: ``get``, ``put``,
``free``, ``attach``. The shape is the one gpuqd keeps for the buffer
(``shape`` on alloc and put), so a buffer made by another process reads
back as the array it was given; its own ``put`` updates it. ``put`` never
allocates: a buffer that is gone is :class:`~gpuq.NotFound`, and once
freed through ``free`` the object refuses every use.

Zero-copy access goes through an attachment (a lease: gpuqd's jobs on the
buffer wait while it is held), so it is scoped::

    with buf.attach() as t:
        x = torch.from_dlpack(t)       # on a GPU: the buffer's own memory

On the async client ``get``, ``put``, ``free`` and ``attach`` return
awaitables, as the client's methods do.

Pickled (to another process), a Buffer is its row and attributes, bound
to no client: its methods then raise RuntimeError saying to take
``client.buffer(buf.ref)`` of a client there. ``copy.copy`` and
``copy.deepcopy`` keep the client.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from . import arrays
from .dtypes import SIZES, numpy_dtype
from .errors import NotFound, Timeout

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api, ProgressHandler
    from .job import Job

__all__ = ["Buffer", "human_bytes"]


def human_bytes(n: int) -> str:
    """``1.5 GiB``, ``4 KiB``, ``100 B``: sizes as people read them."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if size == int(size) else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


class Buffer:
    """One of your buffers: ``name``, ``device``, ``dtype`` (numpy), ``gpuq_dtype``,
    ``shape``, ``size`` (elements), ``nbytes``, ``shareable``, ``ref``
    (``NAME@GPU``, what requests name it by), and ``freed`` (freed through
    this object, which then refuses further use)."""

    def __init__(self, client: "Api", row: Mapping[str, Any],
                 job: Optional["Job"] = None) -> None:
        # None once unpickled (_unpickled), which _live refuses.
        self._client: "Api" = client
        self.row: Dict[str, Any] = dict(row)
        self.job = job
        self.name: str = str(row["name"])
        self.device: int = int(row["device"])
        self.gpuq_dtype: str = str(row.get("dtype") or "bytes")
        count = row.get("count")
        nbytes = row.get("bytes")
        self.nbytes: int = int(nbytes if nbytes is not None
                               else int(count or 0) * SIZES.get(self.gpuq_dtype, 1))
        self.size: int = int(count if count is not None
                             else self.nbytes // SIZES.get(self.gpuq_dtype, 1))
        shape = row.get("shape")
        self.shape: Tuple[int, ...] = (tuple(int(n) for n in shape) if shape is not None
                                       else (self.size,))
        self.shareable: bool = bool(row.get("shareable", False))
        self.freed: bool = False

    def __reduce__(self) -> Any:
        return (_unpickled, (dict(self.__dict__, _client=None),))

    def __copy__(self) -> "Buffer":
        return _unpickled(dict(self.__dict__))

    def __deepcopy__(self, memo: Dict[int, Any]) -> "Buffer":
        return _unpickled({k: v if k == "_client" else copy.deepcopy(v, memo)
                           for k, v in self.__dict__.items()})

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.device}"

    @property
    def dtype(self) -> Any:
        """The numpy dtype of its elements (``bytes`` reads as uint8)."""
        return numpy_dtype(self.gpuq_dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def result(self) -> Optional[Dict[str, Any]]:
        """The alloc's result, when this buffer came from :meth:`gpuq.Client.alloc`."""
        return self.job.result if self.job is not None else None

    def __repr__(self) -> str:
        try:
            dtype = self.dtype.name
        except ImportError:  # pragma: no cover - without numpy
            dtype = self.gpuq_dtype
        return (f"<gpuq.Buffer {self.ref} {dtype} shape={self.shape} "
                f"{human_bytes(self.nbytes)}{' freed' if self.freed else ''}>")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    def _live(self) -> None:
        """Refuses the use of a buffer freed through this object (raised at the call,
        on the async client too, before anything is sent)."""
        if self.freed:
            raise NotFound(f"buffer '{self.ref}' was freed through this Buffer object; "
                           "alloc or put_array makes a new one")
        if self._client is None:
            raise RuntimeError(f"this Buffer of '{self.ref}' came through pickle and belongs "
                               f"to no client: use client.buffer('{self.ref}') of a client "
                               "of this process")

    def get(self, out: Any = None, **kwargs: Any) -> Any:
        """The buffer as an array (:meth:`gpuq.Client.get_array`)."""
        self._live()
        return self._client.get_array(self.ref, out, **kwargs)

    def put(self, array: Any, *, dtype: Any = None, priority: Optional[str] = None,
            timeout: Optional[float] = None,
            on_progress: Optional["ProgressHandler"] = None) -> "Job":
        """Stores an array of its dtype and size (:meth:`gpuq.Client.put_array`), and
        takes the array's shape as its own. The buffer must exist: one that is
        gone is :class:`~gpuq.NotFound`, not allocated again."""
        self._live()
        return self._client._drive(self._put_plan(array, dtype, dict(
            priority=priority, timeout=timeout, on_progress=on_progress)))

    def _put_plan(self, array: Any, dtype: Any, job: Dict[str, Any]) -> "arrays.Plan":
        client = self._client
        done = yield from arrays.put_array_plan(client, self.ref, array, dtype, job,
                                                create=False)
        row = client._rows.get((self.name, self.device))
        if row is not None and row.get("shape") is not None:  # the shape gpuqd keeps now
            self.row["shape"] = list(row["shape"])
            self.shape = tuple(int(n) for n in row["shape"])
        return done

    def free(self, **kwargs: Any) -> "Job":
        """Frees it (:meth:`gpuq.Client.free`); the object then refuses further use."""
        self._live()
        return self._client._drive(self._free_plan(kwargs))

    def _free_plan(self, kwargs: Dict[str, Any]) -> "arrays.Plan":
        job = {key: kwargs.pop(key) for key in ("priority", "detach", "timeout", "on_progress")
               if key in kwargs}
        try:
            done = yield from self._client._free_plan(self.ref, kwargs, job)
        except Timeout:  # accepted: the free goes on
            self.freed = True
            raise
        self.freed = True
        return done

    def attach(self, mode: str = "read-write", **kwargs: Any) -> Any:
        """Maps it here under a lease (:meth:`gpuq.Client.attach`); use ``with``
        (``async with`` for a Buffer of an AsyncClient). The
        :class:`~gpuq.share.Attachment` has ``__dlpack__`` and
        ``__cuda_array_interface__`` on a GPU, ``array()`` on the host backend."""
        self._live()
        return self._client.attach(self.ref, mode=mode, **kwargs)


def _unpickled(state: Dict[str, Any]) -> Buffer:
    """A Buffer with these attributes (``_client`` among them), made without a lookup."""
    buf = Buffer.__new__(Buffer)
    buf.__dict__.update(state)
    return buf
