"""Memory shared with gpuqd without copies: host regions and attached buffers.

A :class:`Region` is host memory this process and gpuqd both map, pinned
once by gpuqd: ``put``/``get`` with ``region="NAME[START:STOP]"`` move
bytes between it and a buffer by DMA alone (no staging copy), while this process reads and
writes it as a numpy array (:meth:`Region.array`).

An :class:`Attachment` is a shareable buffer (``alloc(..., shareable=True)``)
mapped into this process: on a GPU, into its own CUDA context through the
driver (``libcuda.so.1`` with ctypes; CuPy and PyTorch take it through
``__cuda_array_interface__``: ``cupy.asarray(att)``, ``torch.as_tensor(att,
device="cuda")``); on the host backend, as a numpy array over the memfd the
buffer lives in. It holds a lease: gpuqd's jobs on the buffer wait until
:meth:`Attachment.release` (read leases let jobs that only read go on).

Both are context managers: ``with client.attach("kv") as a:`` releases the
attachment at the block's end, ``with client.region_create(...) as r:``
frees the region. On an AsyncClient, whose release cannot happen in a sync
``__exit__``, it is ``async with client.attach("kv") as a:``: the async
client's ``attach`` and ``region_create`` return a :class:`Scoped`, which is
awaited for the object or taken by ``async with`` as it is.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from typing import Any, Coroutine, Dict, Generator, NoReturn, Optional, Tuple, TypeVar

__all__ = ["Region", "Attachment", "Scoped", "DTYPES"]

#: The protocol's dtypes as numpy type strings (``bytes`` is u8).
DTYPES = {"bytes": "|u1", "u8": "|u1", "i32": "<i4", "i64": "<i8", "f16": "<f2",
          "bf16": "<u2", "f32": "<f4", "f64": "<f8"}


def _refuse_sync_with(held: Any, what: str, name: str, undo: str) -> None:
    """A plain ``with`` on an AsyncClient's attachment or region: its ``__exit__``
    could not await the release or region_free, so the block would leak the lease
    or the region (and leave a coroutine never awaited). Refused in ``__enter__``
    with TypeError, after the client gives back what it was given (it cannot
    await here either: AsyncClient._let_go)."""
    from .aio import AsyncClient  # here: aio imports this module
    if isinstance(held._client, AsyncClient):
        held._client._let_go(held)
        raise TypeError(f"an AsyncClient's {what} takes `async with`, not `with` (the "
                        f"{undo} at the block's end must be awaited): `async with "
                        f"client.{name}(...) as x:`; this one's {undo} is sent now")


_T = TypeVar("_T")


class Scoped(Coroutine[Any, Any, _T]):
    """What AsyncClient's ``attach`` and ``region_create`` return: a coroutine (for
    ``await``, ``asyncio.create_task``, ``gather``) of the
    :class:`Attachment` or :class:`Region`, which ``async with`` takes as it is,
    releasing the attachment or freeing the region at the block's end::

        async with client.attach("kv") as a:
            ...
        a = await client.attach("kv")      # and later: await client.release(a)

    A plain ``with`` is a TypeError saying so, raised before anything is sent.
    """

    def __init__(self, coro: Coroutine[Any, Any, _T], what: str) -> None:
        self._coro = coro
        self._what = what
        self._value: Any = None

    def __repr__(self) -> str:
        return f"<gpuq.share.Scoped {self._what}>"

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the old signature

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, _T]:
        return self._coro.__await__()

    async def __aenter__(self) -> _T:
        value = await self._coro
        self._value = value
        entered: Any = value
        await entered.__aenter__()  # an Attachment's or a Region's: itself
        return value

    async def __aexit__(self, *exc: Any) -> None:
        await self._value.__aexit__(*exc)

    def __enter__(self) -> NoReturn:
        self._coro.close()  # never sent: nothing to give back
        raise TypeError(f"AsyncClient.{self._what}() takes `async with`, not `with` "
                        f"(what the block's end does must be awaited): `async with "
                        f"client.{self._what}(...) as x:`, or `x = await "
                        f"client.{self._what}(...)`; nothing was sent")

    def __exit__(self, *exc: Any) -> None:  # pragma: no cover - __enter__ raised
        pass


class Region:
    """A host region mapped here: ``name``, ``bytes``, ``view`` (a writable memoryview)."""

    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name = name
        self.bytes = size
        self._fd = fd
        # Populated at once: gpuqd pinned these pages already, and a client
        # that faults them in one by one pays that on its first copies.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._map: Optional[mmap.mmap] = mmap.mmap(fd, size, flags,
                                                   mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self._map)
        # Set by the client that made it (region_create), which frees it in
        # gpuqd when a ``with`` block ends; None for region_open's mappings.
        self._client: Any = None

    def __repr__(self) -> str:
        state = "mapped" if self._map is not None else "unmapped"
        return f"<gpuq.Region {self.name!r} {self.bytes} bytes {state}>"

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"a gpuq Region is a mapping of this process and cannot be pickled "
                        f"or copied: send its name ('{self.name}') and region_open it in "
                        "the other process")

    def __enter__(self) -> "Region":
        _refuse_sync_with(self, "region", "region_create", "region_free")
        return self

    def __exit__(self, *exc: Any) -> None:
        """Unmaps it here and, for a region this client made, frees it in gpuqd
        (after the jobs that use it). Not for an AsyncClient's: use ``async with``
        (``with`` raises TypeError, having freed it)."""
        try:
            self.unmap()
            if self._client is not None:
                self._client.region_free(self.name)
        except Exception:
            raise  # gpuqd answered, or is gone with what it pinned
        except BaseException:  # Ctrl-C: the free may not have gone out
            if self._client is not None:
                self._client._region_free_apart(self.name)
            raise

    async def __aenter__(self) -> "Region":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            self.unmap()
            if self._client is not None:
                await self._client.region_free(self.name)
        except Exception:
            raise
        except BaseException:  # cancelled: the free may not have gone out
            if self._client is not None:
                self._client._region_free_apart(self.name)
            raise

    def array(self, dtype: Any = "u1", count: Optional[int] = None, offset: int = 0) -> Any:
        """A numpy array over the region's bytes from ``offset`` (no copy)."""
        import numpy as np
        if self._map is None:
            raise ValueError(f"region '{self.name}' is unmapped here")
        return np.frombuffer(self._map, dtype=dtype, count=-1 if count is None else count,
                             offset=offset)

    def unmap(self) -> None:
        """Drops this process's mapping (the region stays gpuqd's until region_free).

        Arrays made with :meth:`array` keep the mapping alive until they go.
        """
        if self._map is None:
            return
        self.view.release()
        _close_map(self._map)
        self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def ref(self, offset: int = 0, length: Optional[int] = None) -> str:
        """``NAME[START:STOP]`` for put/get's ``region``: ``length`` bytes from
        ``offset`` (to the end when None), written as a Python slice."""
        return f"{self.name}[{offset}:{'' if length is None else offset + length}]"


def _close_map(m: Optional[mmap.mmap]) -> None:
    """Closes a mapping now, or, while arrays over it live, leaves it to go with them."""
    try:
        if m is not None:
            m.close()
    except BufferError:
        pass


class _Driver:
    """The CUDA driver API through ctypes, loaded at the first CUDA attach."""

    _lib: Optional[ctypes.CDLL] = None

    @classmethod
    def lib(cls) -> ctypes.CDLL:
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            cls._check(lib, lib.cuInit(0), "cuInit")
            cls._lib = lib
        return cls._lib

    @staticmethod
    def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            lib.cuGetErrorName(rc, ctypes.byref(name))
            raise OSError(f"attach: {what} failed: {(name.value or b'?').decode()}")

    @classmethod
    def call(cls, what: str, *args: Any) -> None:
        lib = cls.lib()
        cls._check(lib, getattr(lib, what)(*args), what)


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _cuda_import(fd: int, uuid: str, size: int, writable: bool) -> Tuple[int, int, int, int]:
    """Imports and maps the handle on the GPU named ``uuid``: (pointer, mapped size, handle, ordinal)."""
    drv = _Driver
    count = ctypes.c_int()
    drv.call("cuDeviceGetCount", ctypes.byref(count))
    ordinal, dev = -1, ctypes.c_int()
    for i in range(count.value):
        raw = (ctypes.c_ubyte * 16)()
        drv.call("cuDeviceGet", ctypes.byref(dev), i)
        drv.call("cuDeviceGetUuid", raw, dev)
        if _uuid_text(bytes(raw)) == uuid:
            ordinal = i
            break
    if ordinal < 0:
        raise OSError(f"attach: gpuqd's device {uuid} is not among this process's GPUs")
    ctx = ctypes.c_void_p()
    drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    drv.call("cuCtxPushCurrent_v2", ctx)
    try:
        prop = _Prop(type=1, requestedHandleTypes=1, loc_type=1, loc_id=ordinal)
        gran = ctypes.c_size_t()
        drv.call("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), 0)
        mapped = (size + gran.value - 1) // gran.value * gran.value
        handle, va = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        drv.call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), 1)
        drv.call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(mapped),
                 ctypes.c_size_t(gran.value), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))
        drv.call("cuMemMap", va, ctypes.c_size_t(mapped), ctypes.c_size_t(0), handle,
                 ctypes.c_ulonglong(0))
        access = _Access(loc_type=1, loc_id=ordinal, flags=3 if writable else 1)
        drv.call("cuMemSetAccess", va, ctypes.c_size_t(mapped), ctypes.byref(access),
                 ctypes.c_size_t(1))
    finally:
        drv.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))
    return va.value, mapped, handle.value, ordinal


class Attachment:
    """A shareable buffer mapped here, with its lease: ``ptr``, ``bytes``, ``dtype``, ``count``.

    On a GPU ``ptr`` is a device pointer in this process's CUDA context
    (``device`` its CUDA ordinal here) and ``__cuda_array_interface__``
    describes it; on the host backend :meth:`array` is a numpy array over it.
    Release it (:meth:`gpuq.Client.release`) once this process's work on it
    is complete.
    """

    def __init__(self, result: Dict[str, Any], fd: int) -> None:
        start = time.monotonic()
        self.lease = int(result["lease"])
        self.buffer = result["buffer"]
        self.bytes = int(result["bytes"])
        self.count = int(result["count"])
        self.dtype = result["dtype"]
        self.writable = result["mode"] == "read-write"
        self.host = result["handle"] == "memfd"
        self._map: Optional[mmap.mmap] = None
        self._handle = 0
        if self.host:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0)
            self._map = mmap.mmap(fd, self.bytes, mmap.MAP_SHARED, prot)
            self.ptr = self._address()
            self.device = -1
            self.mapped = self.bytes
        else:
            self.ptr, self.mapped, self._handle, self.device = _cuda_import(
                fd, result["uuid"], self.bytes, self.writable)
        self.import_s = time.monotonic() - start
        # Set by the client that attached it: the attach job's record, and
        # the client whose release a ``with`` block calls.
        self.record: Dict[str, Any] = {}
        self._client: Any = None
        # What a client that keeps this mapping across leases compares with the
        # next attach's reply (device_arrays.py: buffer, device, generation, bytes).
        self._key: Any = None
        # Torch tensors over the mapping, made at its first copies (device_arrays.py).
        self._torch_views: Dict[Any, Any] = {}
        # Once unmapped: what ended it, for the error of every later use.
        self._gone = ""

    def __repr__(self) -> str:
        where = "host" if self.host else f"cuda:{self.device}"
        state = "released" if not self.ptr else self.mode
        return (f"<gpuq.Attachment {self.buffer} {self.dtype} x {self.count} on {where}, "
                f"lease {self.lease} {state}>")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"a gpuq Attachment is a mapping and a lease of this process and "
                        f"cannot be pickled or copied: send the buffer's name "
                        f"('{self.buffer}') and attach it in the other process")

    @property
    def mode(self) -> str:
        return "read-write" if self.writable else "read"

    def __enter__(self) -> "Attachment":
        self._live()
        _refuse_sync_with(self, "attachment", "attach", "release")
        return self

    def __exit__(self, *exc: Any) -> None:
        """Waits for this process's work on the device (:meth:`synchronize`), then
        releases it (unmaps here, ends the lease). Not for an AsyncClient's: use
        ``async with`` (``with`` raises TypeError, having released it)."""
        if not self.ptr:
            return
        try:
            self.synchronize()
            if self._client is not None:
                self._client.release(self)
            else:
                self.unmap()
        except Exception:
            raise  # the device failed (the work may still use the buffer), or gpuqd refused
        except BaseException:
            self._release_interrupted()
            raise

    def _release_interrupted(self) -> None:
        """After Ctrl-C in ``__exit__`` before the release took the attachment in hand
        (it is still among the client's): waits for the device again (the Ctrl-C
        may have come before that wait), then unmaps it and ends its lease on a
        connection of its own, so that no lease is left held by nobody."""
        client = self._client
        if client is None or client._held.get(self.lease) is not self:
            return  # the release under way sees to it (Api._release_plan)
        try:
            self.synchronize()
        except Exception:
            return  # the device failed: the lease stays, as after any such error
        del client._held[self.lease]
        self.unmap()
        client._release_apart(self.lease)

    async def __aenter__(self) -> "Attachment":
        self._live()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.ptr:
            self.synchronize()
        if self.ptr and self._client is not None:
            await self._client.release(self)
        elif self.ptr:
            self.unmap()

    def synchronize(self) -> None:
        """Waits until every stream of this process on the buffer's GPU is done
        (``cuCtxSynchronize`` on its primary context, which torch and CuPy use):
        gpuqd cannot see into this process's streams, so a lease must not end
        while a kernel still writes the buffer. Nothing on the host backend."""
        self._live()
        if self.host:
            return
        drv = _Driver
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        drv.call("cuDeviceGet", ctypes.byref(dev), self.device)
        drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        drv.call("cuCtxPushCurrent_v2", ctx)
        try:
            drv.call("cuCtxSynchronize")
        finally:
            drv.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))
            drv.call("cuDevicePrimaryCtxRelease_v2", dev)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """DLPack's device: (kDLCPU, 0) on the host backend, (kDLCUDA, ordinal) on a GPU."""
        self._live()
        return (1, 0) if self.host else (2, self.device)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """A DLPack capsule over the buffer's memory, no copy:
        ``torch.from_dlpack(att)``, ``cupy.from_dlpack(att)``, ``np.from_dlpack(att)``.

        On the host backend it is numpy's; on a GPU it is made by CuPy or
        torch, whichever is installed (from ``__cuda_array_interface__``),
        since the capsule must come from a library that owns a CUDA stream
        model. The memory is valid until :meth:`release`.
        """
        self._live()
        if self.host:
            return self.array().__dlpack__(stream=stream)
        try:
            import cupy
            return cupy.asarray(self).__dlpack__(stream=stream)
        except ImportError:
            pass
        try:
            import torch
            tensor = torch.as_tensor(self, device=f"cuda:{self.device}")
            return tensor.__dlpack__(stream) if stream is not None else tensor.__dlpack__()
        except ImportError:
            raise TypeError("__dlpack__ of a GPU attachment needs CuPy or torch; without "
                            "them use __cuda_array_interface__ or ptr") from None

    def _address(self) -> int:
        """The host mapping's address (a read-only mmap exports no writable buffer to ctypes)."""
        import numpy as np
        assert self._map is not None  # called while mapping, in __init__
        return int(np.frombuffer(self._map, dtype="u1", count=1).ctypes.data)

    def array(self) -> Any:
        """The host backend's stand-in: a numpy array over the buffer (no copy)."""
        import numpy as np
        self._live()
        if self._map is None:
            raise TypeError("a GPU attachment is device memory: use __cuda_array_interface__ "
                            "(cupy.asarray, torch.as_tensor) or ptr")
        arr = np.frombuffer(self._map, dtype=DTYPES[self.dtype], count=self.count)
        return arr

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if self.host:
            raise AttributeError("the host backend's attachment is host memory (array())")
        self._live()
        return {"shape": (self.count,), "typestr": DTYPES[self.dtype],
                "data": (self.ptr, not self.writable), "version": 3}

    def _live(self) -> None:
        """Refuses any use of the memory once it is unmapped here, saying what did it
        (ValueError, as Python's own closed files and mmaps refuse)."""
        if not self.ptr:
            raise ValueError(f"the attachment of '{self.buffer}' (lease {self.lease}) was "
                             f"{self._gone or 'unmapped here'}: its memory is no longer "
                             "mapped in this process; attach the buffer again to use it")

    def unmap(self, why: str = "") -> None:
        """Drops this process's mapping (release does it first); the lease stays
        until released. ``why``: what ended it, for the errors of later uses."""
        if self.ptr and not self._gone:
            self._gone = why or ("unmapped here by unmap() (its lease stays until "
                                 "client.release(lease))")
        self._torch_views = {}
        if self._map is not None:
            _close_map(self._map)
            self._map = None
        elif self._handle:
            drv = _Driver
            drv.call("cuMemUnmap", ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.mapped))
            drv.call("cuMemAddressFree", ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.mapped))
            drv.call("cuMemRelease", ctypes.c_ulonglong(self._handle))
            self._handle = 0
        self.ptr = 0
