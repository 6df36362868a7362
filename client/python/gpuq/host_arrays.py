"""New host arrays that the staging ring's copy threads fill fastest.

``get_array()`` into a new array spends most of its time on fresh pages:
each first write faults one in and the kernel zeroes it. With transparent
huge pages (in ``madvise`` mode, as on the H200 host, numpy advises them
for large arrays) a fault brings in a whole 2 MiB page. But numpy's memory
starts wherever ``malloc``'s mapping put it (a few KiB short of a 2 MiB
boundary there), so every slot-sized chunk the copy threads write
straddles two huge pages, which neighbouring threads fault at once. An
array whose data starts on a 2 MiB boundary gives each 2 MiB chunk one
huge page of its own: 12 threads wrote a new 256 MiB array at 35 GB/s so,
against 21 GB/s into ``np.empty``'s (docs/PERFORMANCE.md).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

__all__ = ["HUGE_PAGE", "empty_aligned"]

#: The huge page size of x86-64 and of arm64 with 4 KiB pages.
HUGE_PAGE = 2 << 20


def empty_aligned(shape: Union[int, Sequence[int]], dtype: Any) -> Any:
    """``np.empty(shape, dtype)`` whose data starts on a :data:`HUGE_PAGE` boundary.

    The array is a view of an allocation one huge page larger; the pages
    before the boundary are never written, so they are never faulted in.
    Small arrays (under a huge page) are plain ``np.empty``.
    """
    import numpy as np
    dt = np.dtype(dtype)
    shape_t = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
    count = 1
    for n in shape_t:
        count *= n
    nbytes = count * dt.itemsize
    if nbytes < HUGE_PAGE:
        return np.empty(shape_t, dt)
    raw = np.empty(nbytes + HUGE_PAGE, np.uint8)
    skip = -raw.ctypes.data % HUGE_PAGE
    return raw[skip:skip + nbytes].view(dt).reshape(shape_t)
