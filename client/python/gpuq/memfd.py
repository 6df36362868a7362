"""Memory that a client and gpuqd share through a memfd (Linux ``memfd_create``).

``put`` and ``get`` move bytes through a descriptor the client passes. For
data already in this process (bytes, numpy arrays) that descriptor is a
memfd: anonymous memory with a file descriptor. This module makes them,
writes data into them, maps them as numpy arrays, and finds the memfd under
an array that was made here, so that such arrays travel without any copy on
the client side.

Every memfd made here is sealed against shrinking (``F_SEAL_SHRINK``): a
mapping of it can never fault past a truncated end, and gpuqd may register
it with the device (the ``registered`` path).

Arrays of :func:`memfd_array` keep their memfd open (two descriptors: the
memfd and the mmap object's copy of it), so that they travel as they are.
Arrays ``get_array`` returns hold none (:func:`map_array`): a process may
keep any number of them.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import weakref
from typing import Any, Optional, Sequence, Tuple, Union

__all__ = ["MemfdMap", "create", "from_bytes", "read_into", "memfd_array", "map_array", "find",
           "open_range"]

Shape = Union[int, Sequence[int]]


def create(size: int, name: str = "gpuq") -> int:
    """A new memfd of ``size`` bytes (zeros), sealed against shrinking; the caller closes it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def from_bytes(data: Any, name: str = "gpuq") -> int:
    """A new sealed memfd holding a copy of ``data`` (any contiguous buffer), offset 0.

    ``write`` is used rather than a mapping: the kernel fills the memfd's
    pages without a page fault per page, which is several times faster.
    """
    view = memoryview(data).cast("B")
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_into(fd: int, view: memoryview) -> None:
    """Fills ``view`` (bytes) from the file ``fd``, from its offset 0."""
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], done)
        if n <= 0:
            raise OSError(f"the memfd ended after {done} of {len(view)} bytes")
        done += n


class MemfdMap(mmap.mmap):
    """A shared mapping of a whole memfd that keeps the descriptor open while it lives.

    ``fd`` is the memfd, ``address`` where the mapping starts in this process.
    """

    fd: int
    address: int


def map_memfd(fd: int, size: int) -> MemfdMap:
    """Maps the memfd ``fd`` (which the map then owns and closes) read-write."""
    mm = MemfdMap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    mm.fd = fd
    weakref.finalize(mm, os.close, fd)
    import numpy as np  # numpy is optional; only arrays need it
    probe = np.frombuffer(mm, np.uint8, count=1)
    mm.address = probe.ctypes.data
    del probe
    return mm


def memfd_array(shape: Shape, dtype: Any = "float32") -> Any:
    """A numpy array of zeros in a memfd: ``put_array`` and ``get_array(out=)`` move it
    without copying it on the client side.

    Views of such an array (slices, reshapes) keep the benefit as long as
    they are C-contiguous. Each holds two descriptors while it lives (its
    memfd, and the mmap object's copy); arrays that ``get_array`` returns
    hold none, and travel as ordinary arrays do. An empty shape gives an
    ordinary empty array.
    """
    import numpy as np
    dt = np.dtype(dtype)
    shape_t: Tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for n in shape_t:
        count *= n
    if count == 0:
        return np.empty(shape_t, dt)
    mm = map_memfd(create(count * dt.itemsize, "gpuq-array"), count * dt.itemsize)
    return np.frombuffer(mm, dt, count=count).reshape(shape_t)


_libc: Optional[ctypes.CDLL] = None


def _mmap_calls() -> ctypes.CDLL:
    """libc's ``mmap`` and ``munmap`` (Python's mmap objects keep a descriptor)."""
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int, ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = lib
    return _libc


class _Mapping:
    """A shared read-write mapping of a memfd that holds no descriptor: the memory
    (and the memfd's pages) stay until this object goes, which numpy arrays over
    it (``__array_interface__``) keep alive as their base."""

    def __init__(self, fd: int, size: int) -> None:
        lib = _mmap_calls()
        addr = lib.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(err, f"mapping a memfd of {size} bytes: {os.strerror(err)}")
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1",
                                    "data": (addr, False), "version": 3}
        # Not at exit: an array over it may still be read then (the process's
        # end unmaps it anyway).
        weakref.finalize(self, lib.munmap, addr, size).atexit = False


def map_array(fd: int, shape: Shape, dtype: Any) -> Any:
    """A numpy array over the whole memfd ``fd`` (of exactly its bytes), mapped
    shared, that holds no descriptor: the caller closes ``fd`` when it likes.

    What ``get_array`` returns for a large buffer the staging ring does not
    carry: gpuqd wrote the memfd, so the array is those pages, with no copy
    here; the memory goes when the array (and every view of it) does.
    """
    import numpy as np
    dt = np.dtype(dtype)
    shape_t: Tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
    count = 1
    for n in shape_t:
        count *= n
    flat = np.asarray(_Mapping(fd, count * dt.itemsize))
    return flat.view(dt).reshape(shape_t)


def find(array: Any) -> Optional[Tuple[MemfdMap, int]]:
    """The memfd mapping under ``array`` and the array's byte offset in it, or None.

    Only C-contiguous arrays qualify: their bytes are one range of the memfd.
    """
    if not getattr(array, "flags", None) or not array.flags.c_contiguous:
        return None
    base = array
    while base is not None:
        if isinstance(base, MemfdMap):
            offset = array.ctypes.data - base.address
            if 0 <= offset and offset + array.nbytes <= len(base):
                return base, offset
            return None
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return None


def open_range(mm: MemfdMap, offset: int, writable: bool) -> int:
    """A fresh descriptor of ``mm``'s memfd whose file offset is ``offset``.

    gpuqd reads and writes a descriptor from its current offset and moves
    it, and a passed descriptor shares its offset with the one it came
    from; opening the memfd anew (through /proc/self/fd) gives each transfer
    an offset of its own, so transfers of several arrays in one memfd can
    run at once. The caller closes it.
    """
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
    fd = os.open(f"/proc/self/fd/{mm.fd}", flags)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
