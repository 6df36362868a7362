"""The buffers ``put_array`` and ``get_array`` name (arrays.py, device_arrays.py):
what ``buffers`` said of each, kept per client, found or made, and whether
an array fits one.

A client looks a buffer up once, not once per call: the row ``buffers``
gave is kept by (NAME, GPU or None) with the shape gpuqd keeps, and
forgotten on ``free`` and ``alloc`` through the client and on any failure
of a call that used it. A call refused as a stale row would be (the buffer
was freed and made anew, by this process or another) looks afresh and
runs once more (:func:`retrying`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Sequence, Tuple

from .dispatch import Call
from .errors import BadRequest, Exists, GpuqError, NotFound

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api

__all__ = ["split_name", "base_name", "lookup_plan", "cached_lookup_plan", "remember",
           "forget", "retrying", "not_found_plan", "find_or_alloc_plan", "check_fit",
           "product", "refuse_empty", "bytes_shape", "MAX_DIMS"]

Plan = Generator[Call, Any, Any]


def split_name(spec: str) -> Tuple[str, Optional[int]]:
    """``"w@1"`` -> ("w", 1); ``"w"`` -> ("w", None). Ranges are refused here."""
    if not isinstance(spec, str) or not spec:
        raise BadRequest(f"a buffer is named by a string NAME or NAME@GPU, not {spec!r}")
    if "[" in spec:
        raise BadRequest(f"'{spec}': put_array and get_array take a whole buffer (NAME or "
                         "NAME@GPU), not a range; use put and get for ranges")
    name, at, gpu = spec.partition("@")
    if not at:
        return name, None
    if not gpu.isdigit():
        raise BadRequest(f"'{spec}': the GPU after '@' must be a number")
    return name, int(gpu)


def base_name(spec: Any) -> str:
    """A buffer's name without ``@GPU`` or a range (``"w@1[0:8]"`` -> ``"w"``)."""
    return str(spec).split("[", 1)[0].partition("@")[0]


def lookup_plan(api: "Api", name: str, device: Optional[int]) -> Plan:
    """The caller's buffer called ``name`` (on ``device`` if given), or None."""
    row = yield from _lookup_fresh_plan(api, name, device)
    if row is not None:
        remember(api, name, device, row)
    return row


def cached_lookup_plan(api: "Api", name: str, device: Optional[int]) -> Plan:
    """As :func:`lookup_plan`, but what ``buffers`` said last time when this client
    has asked already: ``(row, cached)``. A transfer with a cached row that is
    refused as a stale row would be forgets it and tries once more with a
    fresh one (see :func:`retrying`)."""
    row = api._rows.get((name, device))
    if row is not None:
        return row, True
    return (yield from lookup_plan(api, name, device)), False


def remember(api: "Api", name: str, device: Optional[int], row: Dict[str, Any]) -> None:
    """Keeps ``row`` for later transfers of buffer ``name``, found as given and as NAME@GPU."""
    api._rows[(name, device)] = row
    if row.get("device") is not None:
        api._rows[(name, int(row["device"]))] = row


def forget(api: "Api", name: str) -> None:
    """Drops what this client keeps of every buffer called ``name``: freed, made anew,
    or a transfer with it failed."""
    for key in [k for k in api._rows if k[0] == name]:
        del api._rows[key]


def retrying(api: "Api", name: str, make: Any) -> Plan:
    """Runs the plan ``make(used)`` gives, ``used`` a list its lookups append whether
    they answered from the cache to; when it fails after a cached answer, forgets
    the buffer, and when the failure may be the cached row's, runs it once more,
    looking afresh (the buffer may have been freed and made anew, by this process
    or another, since it was cached)."""
    used: List[bool] = []
    try:
        return (yield from make(used))
    except GpuqError as exc:
        forget(api, name)
        if not any(used) or not _stale_row_refusal(exc):
            raise
    return (yield from make([]))


def _stale_row_refusal(exc: GpuqError) -> bool:
    """Whether ``exc`` is what a stale row gives, so that trying again is safe: a
    request refused before any job existed (no ``job``), as a buffer that is gone
    (``not_found``) or holds another dtype or size (``bad_request``, this
    client's or gpuqd's) is refused. A job that was accepted is never sent
    again: one that failed, was cancelled or is still running when its wait
    ran out (:class:`Timeout`) stays the call's answer."""
    return exc.job is None and isinstance(exc, (NotFound, BadRequest))


def _lookup_fresh_plan(api: "Api", name: str, device: Optional[int]) -> Plan:
    reply = yield Call("buffers", {"device": device})
    uid = api._uid()
    mine: List[Dict[str, Any]] = [b for b in reply.get("buffers", [])
                                  if b.get("name") == name and b.get("owner", uid) == uid]
    if len(mine) > 1:
        where = ", ".join(f"{name}@{b.get('device')}" for b in mine)
        raise BadRequest(f"buffer '{name}' exists on several devices ({where}); name one "
                         "as NAME@GPU")
    return mine[0] if mine else None


def not_found_plan(api: "Api", spec: str) -> Plan:
    """NotFound for ``spec``, listing the caller's buffers as the CLI does."""
    reply = yield Call("buffers", {})
    uid = api._uid()
    names = sorted(f"{b.get('name')}@{b.get('device')}" for b in reply.get("buffers", [])
                   if b.get("owner", uid) == uid)
    # The daemon keeps it for a GPU it does not serve (docs/protocol.md, ``devices``).
    kept = [b for b in reply.get("absent", [])
            if b.get("owner", uid) == uid and b.get("name") == split_name(spec)[0]]
    where = (f"; '{kept[0]['name']}' is kept for GPU {kept[0].get('uuid')}, which the daemon "
             "does not serve now: it comes back with its bytes when one serves that GPU"
             if kept else "")
    return NotFound(f"buffer '{spec}' not found; your buffers: "
                    f"{', '.join(names) if names else '(none)'}{where}")


# Buffers that arrays go into ----------------------------------------------------

def find_or_alloc_plan(api: "Api", spec: str, name: str, device: Optional[int],
                        size: Dict[str, Any], shape: Optional[List[int]], shareable: bool,
                        job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    buf, cached = yield from cached_lookup_plan(api, name, device)
    used.append(cached)
    if buf is not None:
        return buf
    if not create:
        raise (yield from not_found_plan(api, spec))
    forget(api, name)
    try:
        done = yield from api._job_plan("alloc", dict(name=name, device=device, shape=shape,
                                                      shareable=shareable or None, **size),
                                        priority=job.get("priority"))
        made = dict(done.result or {}, shape=shape)
        remember(api, name, device, made)
        return made
    except Exists:  # made meanwhile by another thread or process: look again
        buf = yield from lookup_plan(api, name, device)
        if buf is None:
            raise
        return buf


def check_fit(buf: Dict[str, Any], nbytes: int, size: int, dtype: str) -> None:
    if dtype == "bytes":
        ok = buf.get("bytes") == nbytes
    else:
        ok = buf.get("dtype") == dtype and buf.get("count") == size
    if ok:
        return
    have = (f"buffer '{buf.get('name')}@{buf.get('device')}' holds {buf.get('count')} "
            f"{buf.get('dtype')} ({buf.get('bytes')} bytes)")
    want = f"the array is {size} {dtype} ({nbytes} bytes)"
    raise BadRequest(f"{have} but {want}; free it, put into another name, or convert "
                     f"the array (arr.astype(...)) to match")


def product(shape: Sequence[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def refuse_empty(shape: Sequence[int]) -> None:
    """BadRequest, before anything is sent, for an array with no elements."""
    if product(shape) == 0:
        raise BadRequest(f"the array is empty (shape {tuple(int(n) for n in shape)}), and "
                         "gpuq buffers cannot be empty: they hold at least one element")


#: The most dimensions gpuqd keeps of a buffer's shape (docs/protocol.md, alloc).
MAX_DIMS = 8


def bytes_shape(shape: Sequence[int], itemsize: int, elem: int) -> List[int]:
    """The shape gpuqd keeps for an array of ``shape`` with ``itemsize``-byte elements
    stored as raw bytes in a buffer of ``elem``-byte elements: its shape in the
    buffer's elements, as numpy's ``view`` gives it (a (2, 3) complex64 array
    in a buffer of bytes: (2, 24)), so that ``get_array(dtype=np.complex64)``
    in any process reads (2, 3) from it (:func:`_read_shape`); 1-D where its
    last axis is not a whole number of the buffer's elements, or where it has
    more dimensions than gpuqd keeps."""
    dims = [int(n) for n in shape]
    last = (dims[-1] if dims else 1) * itemsize
    if len(dims) > MAX_DIMS or last % elem:
        return [product(dims) * itemsize // elem]
    if itemsize == elem:
        return dims
    return dims[:-1] + [last // elem]
