"""The descriptors that ``put`` reads from and ``get`` writes to.

gpuqd never opens a path for a client: the client opens it and passes the
descriptor. :func:`source` and :func:`sink` turn what a caller hands over
(a path, a descriptor, a file object, a buffer of bytes) into a descriptor
and remember what must happen afterwards: close what was opened here, copy
back into a buffer that is not itself in a memfd.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from . import memfd

__all__ = ["Endpoint", "source", "sink"]

class Endpoint:
    """A descriptor to pass (``fd``, or None for none), and its clean-up.

    ``limit``: the bytes the descriptor may give or take when they are fewer
    than it holds (an array that is a view into a larger memfd, a buffer to
    copy back into), else None.
    """

    def __init__(self, fd: Optional[int], owned: bool, limit: Optional[int] = None,
                 copy_back: Optional[memoryview] = None) -> None:
        self.fd = fd
        self.owned = owned
        self.limit = limit
        self.copy_back = copy_back

    @property
    def fds(self) -> Tuple[int, ...]:
        return () if self.fd is None else (self.fd,)

    def finish(self, nbytes: int) -> None:
        """After a get that wrote ``nbytes``: copies them into the caller's buffer."""
        if self.copy_back is None or self.fd is None:
            return
        if nbytes > len(self.copy_back):
            raise ValueError(f"the get wrote {nbytes} bytes, more than the "
                             f"{len(self.copy_back)} the destination holds; give a length "
                             "or a smaller range")
        memfd.read_into(self.fd, self.copy_back[:nbytes])

    def close(self) -> None:
        if self.owned and self.fd is not None:
            os.close(self.fd)
            self.fd = None


def source(src: Any, share: bool = True) -> Endpoint:
    """What ``put`` reads: a path, a descriptor (``int``, read from its current
    offset), an object with ``fileno()``, a bytes-like object, or None (no
    descriptor: ``scratch``).

    ``share``: an array in a memfd is passed as a range of that memfd (its
    ``limit`` must then be the put's length); else bytes are copied into a
    memfd of their own, whose end bounds the put.
    """
    return _endpoint(src, False, share)


def sink(dst: Any, share: bool = True) -> Endpoint:
    """What ``get`` writes: a path (created or truncated), a descriptor (written
    from its current offset), an object with ``fileno()``, a writable
    bytes-like object (filled in place), or None (no descriptor: ``scratch``).

    ``share``: an array in a memfd is written in place (the get's length
    must then be its ``limit``, or it would write past it); else a fresh
    memfd is copied back into the object after the get.
    """
    return _endpoint(dst, True, share)


def _endpoint(obj: Any, writing: bool, share: bool) -> Endpoint:
    if obj is None:
        return Endpoint(None, False)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return Endpoint(obj, False)
    if isinstance(obj, (str, os.PathLike)):
        # A destination is opened for reading too: gpuqd maps one it may
        # read, which is faster than parallel writes taking turns on a lock.
        flags = (os.O_RDWR | os.O_CREAT | os.O_TRUNC) if writing else os.O_RDONLY
        return Endpoint(os.open(obj, flags | os.O_CLOEXEC, 0o666), True)
    if hasattr(obj, "fileno"):
        return Endpoint(obj.fileno(), False)
    found = memfd.find(obj) if share else None
    if found is not None:
        return Endpoint(memfd.open_range(found[0], found[1], writable=writing), True,
                        limit=obj.nbytes)  # type: ignore[union-attr]
    try:
        view: Optional[memoryview] = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is not None and not view.c_contiguous:
        if writing:
            raise TypeError("get cannot write into a buffer that is not contiguous")
        view = memoryview(view.tobytes())
    if view is None or (writing and view.readonly):
        what = "a writable bytes-like object" if writing else "a bytes-like object"
        raise TypeError(f"{'get cannot write into' if writing else 'put cannot read from'} "
                        f"a {type(obj).__name__}: pass a path, a descriptor, a file object "
                        f"or {what}")
    view = view.cast("B")
    if not writing:
        return Endpoint(memfd.from_bytes(view), True)
    return Endpoint(memfd.create(len(view)), True, limit=len(view), copy_back=view)
