"""Arrays in and out of buffers: ``put_array`` and ``get_array``.

What goes in: a numpy array (any, C-contiguous or not), a torch CPU tensor
(through numpy, without a copy), and on a GPU machine a torch CUDA tensor
or a CuPy array (a device-to-device copy through an attachment). What
comes out: a numpy array of the buffer's dtype and shape, or the array
given as ``out=`` filled in place (numpy, torch CPU or CUDA, CuPy).

The shape of the array a buffer was given is stored by gpuqd (``shape`` on
alloc and put, docs/protocol.md), so any process reads back the array it
was given; the client also remembers it per ``NAME@GPU`` for daemons that
do not keep one.

How bytes travel, fastest first: an array that lives in a memfd
(:func:`gpuq.memfd_array`) is passed as it is; a large ordinary array goes
through the client's pinned staging ring, copied chunk by chunk by several
threads while the daemon moves the previous chunk (staging.py); anything
else is copied into a fresh memfd. New arrays that ``get_array`` returns
hold no descriptor: a small one is an ordinary array, copied out of a
memfd closed at once; a large one not carried by the ring is a mapping of
the memfd gpuqd wrote, whose descriptor is closed (memfd.map_array).
numpy, torch and CuPy are imported only when an array of theirs is met.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Sequence, Tuple

from . import kept_leases, memfd, share
from .dispatch import Call
from .dtypes import SIZES, gpuq_dtype, numpy_dtype
from .errors import BadRequest, Busy, Exists, GpuqError, NotFound, Restarted
from .host_arrays import empty_aligned
from .job import Job, timeout_ms
from .staging import MIN_STAGED_BYTES

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api

__all__ = ["DTYPES", "gpuq_dtype", "numpy_dtype", "split_name", "put_array_plan",
           "get_array_plan", "name_first"]

Plan = Generator[Call, Any, Any]

#: gpuq dtype -> numpy dtype name (kept for callers of the older module).
DTYPES: Dict[str, str] = {"bytes": "uint8", "u8": "uint8", "i32": "int32", "i64": "int64",
                          "f16": "float16", "bf16": "bfloat16", "f32": "float32",
                          "f64": "float64"}


def _np() -> Any:
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy is there in every test
        raise ImportError("put_array and get_array need numpy (apt install python3-numpy "
                          "or pip install numpy)") from exc
    return numpy


def name_first(name: Any, array: Any, method: str) -> Tuple[Any, Any]:
    """``(name, array)`` from a call written either way round.

    The name comes first, as in redis-py's ``set(name, value)`` and the CLI;
    the older order (array first) still works, with a DeprecationWarning.
    """
    if not isinstance(name, str) and isinstance(array, str):
        warnings.warn(f"{method}(array, name) is deprecated: write {method}(name, array)",
                      DeprecationWarning, stacklevel=4)
        return array, name
    return name, array


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
    fresh one (see :func:`_retrying`)."""
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


def _retrying(api: "Api", name: str, make: Any) -> Plan:
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


def _not_found(api: "Api", spec: str) -> Plan:
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


# Kinds of arrays ------------------------------------------------------------------

def _module(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def is_device_array(obj: Any) -> bool:
    """A torch CUDA tensor or a CuPy array (device memory this process holds)."""
    mod = _module(obj)
    if mod == "torch":
        return bool(getattr(obj, "is_cuda", False))
    if mod == "cupy":
        return True
    return hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__")


def _torch_to_numpy(t: Any) -> Tuple[Any, Optional[str]]:
    """A CPU tensor's numpy view (no copy where it can be had) and its gpuq dtype
    when numpy has no type for it (bfloat16)."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(_np().uint16), "bf16"
    return t.numpy(), None


def _prepare(arr: Any, dtype: Any) -> Tuple[Any, str]:
    """The array as native-order numpy elements, and the gpuq dtype it goes to."""
    np = _np()
    forced: Optional[str] = None
    if _module(arr) == "torch":
        arr, forced = _torch_to_numpy(arr)
    arr = np.asarray(arr)
    if arr.dtype.hasobject:
        raise BadRequest(f"the array holds Python objects (dtype {arr.dtype}), whose bytes "
                         "are pointers into this process: store numbers (convert it with "
                         "astype())")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if dtype is None:
        if forced:
            return arr, forced
        try:
            return arr, gpuq_dtype(arr.dtype)
        except BadRequest:
            raise BadRequest(f"numpy dtype {arr.dtype.name} has no gpuq dtype (gpuq has "
                             "u8 i32 i64 f16 bf16 f32 f64); convert it with astype(), or "
                             "pass dtype='bytes' to store its raw bytes") from None
    gd = gpuq_dtype(dtype)
    if gd != "bytes" and arr.dtype.itemsize != SIZES[gd]:
        raise BadRequest(f"a {arr.dtype.name} array cannot be stored as {gd}: its "
                         f"elements are {arr.dtype.itemsize} bytes, {gd}'s {SIZES[gd]}")
    return arr, gd


def _check_fit(buf: Dict[str, Any], nbytes: int, size: int, dtype: str) -> None:
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


def _product(shape: Sequence[int]) -> int:
    total = 1
    for n in shape:
        total *= int(n)
    return total


def _refuse_empty(shape: Sequence[int]) -> None:
    """BadRequest, before anything is sent, for an array with no elements."""
    if _product(shape) == 0:
        raise BadRequest(f"the array is empty (shape {tuple(int(n) for n in shape)}), and "
                         "gpuq buffers cannot be empty: they hold at least one element")


#: The most dimensions gpuqd keeps of a buffer's shape (docs/protocol.md, alloc).
MAX_DIMS = 8


def _bytes_shape(shape: Sequence[int], itemsize: int, elem: int) -> List[int]:
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
        return [_product(dims) * itemsize // elem]
    if itemsize == elem:
        return dims
    return dims[:-1] + [last // elem]


# put_array ------------------------------------------------------------------------

def _find_or_alloc_plan(api: "Api", spec: str, name: str, device: Optional[int],
                        size: Dict[str, Any], shape: Optional[List[int]], shareable: bool,
                        job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    buf, cached = yield from cached_lookup_plan(api, name, device)
    used.append(cached)
    if buf is not None:
        return buf
    if not create:
        raise (yield from _not_found(api, spec))
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


def put_array_plan(api: "Api", spec: str, arr: Any, dtype: Any,
                   job: Dict[str, Any], create: bool = True) -> Plan:
    """Finds or allocates the buffer (``create``; else NotFound when there is none),
    checks that the array fits it, and puts it."""
    cut = _shortcut(api, (spec, True), arr) if dtype is None else None
    if cut is not None:
        return (yield from _shortcut_plan(api, cut, arr, True))
    name, device = split_name(spec)
    return (yield from _retrying(api, name, lambda used: _put_array_plan(
        api, spec, name, device, arr, dtype, job, used, create)))


def _put_array_plan(api: "Api", spec: str, name: str, device: Optional[int], arr: Any,
                    dtype: Any, job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    if is_device_array(arr):
        done = yield from _device_put_plan(api, spec, name, device, arr, dtype, job, used,
                                           create)
        if done is not None:
            return done
        arr = _device_to_host(arr)
    arr, gd = _prepare(arr, dtype)
    _refuse_empty(arr.shape)
    shape = ([int(n) for n in arr.shape] if gd != "bytes"
             else _bytes_shape(arr.shape, arr.itemsize, SIZES["bytes"]))
    size: Dict[str, Any] = ({"bytes": arr.nbytes} if gd == "bytes"
                            else {"count": arr.size, "dtype": gd})
    buf = yield from _find_or_alloc_plan(api, spec, name, device, size, shape, False, job,
                                         used, create)
    _check_fit(buf, arr.nbytes, arr.size, gd)
    if gd == "bytes":  # in the elements of the buffer they go into
        shape = _bytes_shape(arr.shape, arr.itemsize, SIZES.get(str(buf.get("dtype")), 1))
    label = f"{name}@{buf['device']}"
    extra = {"shape": shape} if buf.get("shape") != shape else {}
    result = yield from _put_bytes_plan(api, label, arr, int(buf["device"]), extra, job)
    api._shapes[label] = tuple(shape)
    if extra:  # gpuqd keeps the shape now
        remember(api, name, device, dict(buf, shape=shape))
    return result


def _put_bytes_plan(api: "Api", label: str, arr: Any, device: int, extra: Dict[str, Any],
                    job: Dict[str, Any]) -> Plan:
    """Moves an array's bytes into a whole buffer by the fastest way open to it."""
    np = _np()
    found = memfd.find(arr)
    staging = api._staging
    if found is None and arr.nbytes >= MIN_STAGED_BYTES and staging.try_acquire():
        try:
            ready = yield from staging._ready_plan(api, device)
            if ready:
                flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
                start = time.monotonic()
                done = yield from staging.put_plan(api, label, flat, extra, job)
                return _summary(done, arr.nbytes, time.monotonic() - start, staging)
        finally:
            staging.release()
    fd = (memfd.open_range(found[0], found[1], writable=False) if found
          else memfd.from_bytes(arr if arr.flags.c_contiguous else arr.copy()))
    try:
        done = yield from api._job_plan("put", dict(extra, buffer=label, length=arr.nbytes),
                                        fds=(fd,), **job)
    finally:
        os.close(fd)
    return done


def _summary(last: Any, nbytes: int, seconds: float, staging: Any) -> Any:
    """The last chunk's Job, its result saying what the whole transfer did: ``bytes``,
    ``seconds`` and ``gbps`` over every chunk as the client timed them, ``path``
    ``ring``, how many ``chunks`` of ``slot_bytes``, and ``timing``, where the
    calling thread's time went (:attr:`gpuq.Staging.timing`)."""
    last.record = dict(last.record, result=dict(
        last.result or {}, bytes=nbytes, seconds=seconds,
        gbps=nbytes / seconds / 1e9 if seconds > 0 else 0.0, path="ring",
        chunks=-(-nbytes // staging.slot_bytes), slot_bytes=staging.slot_bytes,
        timing=dict(staging.timing)))
    return last


# get_array ------------------------------------------------------------------------

#: New arrays of this many bytes or more that the staging ring does not carry
#: are a mapping of the memfd gpuqd wrote (no copy here; one mapping each, of
#: the 65530 Linux allows a process by default); smaller ones are copied out
#: of it into an ordinary array, which costs under 0.1 ms.
MAP_FROM_BYTES = 1 << 20

def get_array_plan(api: "Api", spec: str, out: Any, dtype: Any, shape: Any,
                   job: Dict[str, Any]) -> Plan:
    """Reads a whole buffer into a new array, or into ``out``."""
    if out is not None and dtype is None and shape is None:
        cut = _shortcut(api, (spec, False), out)
        if cut is not None:
            return (yield from _shortcut_plan(api, cut, out, False))
    name, device = split_name(spec)
    return (yield from _retrying(api, name, lambda used: _get_array_plan(
        api, spec, name, device, out, dtype, shape, job, used)))


def _get_array_plan(api: "Api", spec: str, name: str, device: Optional[int], out: Any,
                    dtype: Any, shape: Any, job: Dict[str, Any], used: List[bool]) -> Plan:
    _np()  # its ImportError says how to install it
    buf, cached = yield from cached_lookup_plan(api, name, device)
    used.append(cached)
    if buf is None:
        raise (yield from _not_found(api, spec))
    label = f"{name}@{buf['device']}"
    nbytes = int(buf["bytes"])
    if out is not None and is_device_array(out):
        return (yield from _device_get_plan(api, spec, (name, device), label, buf, out, job))
    dt = numpy_dtype(buf["dtype"]) if dtype is None else _read_as(dtype)
    if nbytes % dt.itemsize:
        raise BadRequest(f"buffer '{label}' holds {nbytes} bytes, not a whole number of "
                         f"{dt.name} ({dt.itemsize} bytes each)")
    count = nbytes // dt.itemsize
    if out is not None:
        given = out
        view = _check_out(_torch_to_numpy(out)[0] if _module(out) == "torch" else out,
                          dt, count, label)
        if view.dtype.isnative:
            yield from _get_bytes_plan(api, label, view, int(buf["device"]), job)
        else:  # the bytes are stored in the machine's order: swapped into out's
            native = view.view(_native(view.dtype))
            yield from _get_bytes_plan(api, label, native, int(buf["device"]), job)
            view[...] = native.copy()
        return given
    want = _shape(api, label, buf, count, shape)
    if not dt.isnative:  # read in the machine's order, as stored, then converted
        target = yield from _get_new_plan(api, label, buf, want, _native(dt), job)
        return target.astype(dt)
    return (yield from _get_new_plan(api, label, buf, want, dt, job))


def _get_new_plan(api: "Api", label: str, buf: Dict[str, Any], want: Tuple[int, ...],
                  dt: Any, job: Dict[str, Any]) -> Plan:
    """A whole buffer's bytes as a new array of shape ``want`` and dtype ``dt``."""
    np = _np()
    nbytes = int(buf["bytes"])
    if nbytes >= MIN_STAGED_BYTES and api._staging.try_acquire():
        try:
            ready = yield from api._staging._ready_plan(api, int(buf["device"]))
            if ready:
                target = empty_aligned(want, dt)
                flat = target.reshape(-1).view(np.uint8)
                yield from api._staging.get_plan(api, label, flat, job)
                return target
        finally:
            api._staging.release()
    if nbytes < MAP_FROM_BYTES:
        # An ordinary array, filled from a memfd that is closed at once: a kept
        # result holds no descriptor, for one copy of under 1 MiB.
        target = np.empty(want, dt)
        yield from _get_bytes_plan(api, label, target, int(buf["device"]), job)
        return target
    # Larger, without the ring (busy with another thread's transfer, off, or
    # under its 4 MiB): the memfd gpuqd writes, mapped once it has, its
    # descriptor closed, so the array holds none and its bytes are not copied
    # again here.
    fd = memfd.create(nbytes, "gpuq-array")
    try:
        yield from api._job_plan("get", {"buffer": label, "length": nbytes}, fds=(fd,), **job)
        return memfd.map_array(fd, want, dt)
    finally:
        os.close(fd)


def _native(dt: Any) -> Any:
    """``dt`` in the machine's byte order (every field of a structured one)."""
    return dt if dt.isnative else dt.newbyteorder("=")


def _read_as(dtype: Any) -> Any:
    """The numpy dtype to read a buffer's bytes as: any spelling of gpuq's, or any
    numpy dtype gpuq has no name for (``np.int8``)."""
    try:
        return numpy_dtype(gpuq_dtype(dtype))
    except BadRequest:
        return _np().dtype(dtype)


def _get_bytes_plan(api: "Api", label: str, target: Any, device: int,
                    job: Dict[str, Any]) -> Plan:
    """Fills a C-contiguous numpy array with a whole buffer's bytes, fastest way first."""
    np = _np()
    nbytes = target.nbytes
    found = memfd.find(target)
    if found is None and nbytes >= MIN_STAGED_BYTES and api._staging.try_acquire():
        try:
            ready = yield from api._staging._ready_plan(api, device)
            if ready:
                flat = target.reshape(-1).view(np.uint8)
                start = time.monotonic()
                done = yield from api._staging.get_plan(api, label, flat, job)
                return _summary(done, nbytes, time.monotonic() - start, api._staging)
        finally:
            api._staging.release()
    fd = memfd.open_range(found[0], found[1], writable=True) if found else memfd.create(nbytes)
    try:
        done = yield from api._job_plan("get", {"buffer": label, "length": nbytes},
                                        fds=(fd,), **job)
        if not found:
            # As bytes through numpy: a buffer protocol export of a dtype that
            # numpy's own exports do not spell (ml_dtypes' bfloat16) is refused.
            memfd.read_into(fd, memoryview(target.reshape(-1).view(np.uint8)))
    finally:
        os.close(fd)
    return done


def _shape(api: "Api", label: str, buf: Dict[str, Any], count: int,
           shape: Any) -> Tuple[int, ...]:
    """The shape of a new array of ``count`` elements: asked for, else the one gpuqd
    keeps (:func:`_read_shape`), else (a daemon that keeps none) the one this
    client put, else 1-D."""
    if shape is not None:
        shape_t = (shape,) if isinstance(shape, int) else tuple(int(n) for n in shape)
        if shape_t.count(-1) > 1 or any(n < -1 for n in shape_t):
            raise BadRequest(f"shape {shape_t}: its dimensions are 0 or more, and one may be "
                             "-1, inferred from the buffer's size (as numpy's reshape)")
        if -1 in shape_t:
            known = _product([n for n in shape_t if n != -1])
            if not known or count % known:
                raise BadRequest(f"shape {shape_t} does not fit buffer '{label}': its {count} "
                                 f"elements are not a multiple of {known}")
            shape_t = tuple(count // known if n == -1 else n for n in shape_t)
        if _product(shape_t) != count:
            raise BadRequest(f"shape {shape_t} holds {_product(shape_t)} elements; buffer "
                             f"'{label}' holds {count}")
        return shape_t
    kept = buf.get("shape")
    if kept is None:
        kept = api._shapes.get(label)
    if kept is None:
        return (count,)
    return _read_shape(tuple(int(n) for n in kept), int(buf["bytes"]), count)


def _read_shape(kept: Tuple[int, ...], nbytes: int, count: int) -> Tuple[int, ...]:
    """A buffer of ``nbytes`` whose shape is ``kept`` (in its own elements) read as
    ``count`` elements: that shape when they are its own, else with its last
    axis's bytes in the new elements, as numpy's ``view`` ((2, 24) bytes as
    complex64: (2, 3)), else 1-D."""
    whole = _product(kept)
    if whole == count:
        return kept
    if kept and whole:
        last = kept[-1] * (nbytes // whole)  # bytes
        if last % (nbytes // count) == 0:
            return kept[:-1] + (last // (nbytes // count),)
    return (count,)


def _check_out(out: Any, dt: Any, count: int, label: str) -> Any:
    """``out`` when it fits: ``count`` elements of ``dt``, in either byte order, in
    writable C-ordered memory; else BadRequest saying which of those it is not."""
    if (not hasattr(out, "dtype") or _native(out.dtype) != _native(dt)
            or out.size != count):
        got = (f"{out.size} {out.dtype} elements" if hasattr(out, "dtype")
               else f"a {type(out).__name__}")
        raise BadRequest(f"out= must be an array of {count} {dt.name} elements for buffer "
                         f"'{label}', not {got}")
    if not out.flags.writeable:
        raise BadRequest("out= is read-only: get_array writes into it; pass a writable "
                         "array")
    if not out.flags.c_contiguous:
        raise BadRequest("out= is not C-contiguous (a Fortran-ordered array, or a view that "
                         "steps over elements): get_array fills one block of memory; pass "
                         "a C-contiguous array, or copy the one get_array returns into it")
    return out


# Device arrays (torch CUDA tensors, CuPy): device-to-device through an attachment ----

def _device_to_host(arr: Any) -> Any:
    """A device array's copy in host memory (for buffers that cannot be attached)."""
    if _module(arr) == "torch":
        return arr.detach().cpu()
    import cupy
    return cupy.asnumpy(arr)


def _device_dtype(arr: Any) -> str:
    return gpuq_dtype(arr.dtype)


def _device_put_plan(api: "Api", spec: str, name: str, device: Optional[int], arr: Any,
                     dtype: Any, job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    """A device array into a shareable buffer with one device-to-device copy; None
    when the buffer exists and is not shareable (the caller goes through the host)."""
    gd = gpuq_dtype(dtype) if dtype is not None else _device_dtype(arr)
    shape = [int(n) for n in arr.shape]
    _refuse_empty(shape)
    count = _product(shape)
    nbytes = count * SIZES[_device_dtype(arr)]
    size: Dict[str, Any] = {"bytes": nbytes} if gd == "bytes" else {"count": count, "dtype": gd}
    buf = yield from _find_or_alloc_plan(
        api, spec, name, device, size,
        shape if gd != "bytes" else _bytes_shape(shape, SIZES[_device_dtype(arr)], 1),
        True, job, used, create)
    _check_fit(buf, nbytes, count, gd)
    if not buf.get("shareable"):
        return None
    label = f"{name}@{buf['device']}"
    start = time.monotonic()
    held = held_attachment(api, label, write=True)
    if held is not None:  # the caller's own lease: no attach, no release
        _device_copy(held, arr, into_attachment=True)
        record, path = held.record, "held"
    else:
        record = yield from _leased_copy_plan(api, label, "read-write", arr, nbytes,
                                              job.get("timeout"))
        path = "device"
        if dtype is None:
            _remember_shortcut(api, (spec, True), label, (name, device), buf, arr)
    api._shapes[label] = tuple(shape)  # gpuqd keeps the shape given at alloc
    return _copied(api, record, nbytes, start, path)


def _copied(api: "Api", record: Dict[str, Any], nbytes: int, start: float,
            path: str) -> Job:
    """A device put's Job: the attach job's ``record``, its result with the copy's
    ``bytes``, ``seconds`` (since ``start``), ``path`` and ``gbps``."""
    seconds = time.monotonic() - start
    return Job(api, dict(record, result=dict(
        record.get("result") or {}, bytes=nbytes, seconds=seconds, path=path,
        gbps=nbytes / seconds / 1e9 if seconds > 0 else 0.0)))


def _device_get_plan(api: "Api", spec: str, key: Tuple[str, Optional[int]], label: str,
                     buf: Dict[str, Any], out: Any, job: Dict[str, Any]) -> Plan:
    """A shareable buffer into a device array with one copy; through the host otherwise."""
    nbytes = _product(out.shape) * SIZES[_device_dtype(out)]
    if nbytes != int(buf["bytes"]):
        raise BadRequest(f"out= holds {nbytes} bytes; buffer '{label}' holds {buf['bytes']}")
    if not buf.get("shareable"):
        host = yield from get_array_plan(api, label, None, None, None, job)
        _host_into_device(host, out)
        return out
    held = held_attachment(api, label, write=False)
    if held is not None:  # the caller's own lease: no attach, no release
        _device_copy(held, out, into_attachment=False)
        return out
    yield from _leased_copy_plan(api, label, "read", out, nbytes, job.get("timeout"))
    _remember_shortcut(api, (spec, False), label, key, buf, out)
    return out


# Repeated device copies through a kept lease ----------------------------------------
#
# A copy that a kept lease served is remembered: the buffer the name found
# (the looked-up row itself), the array's type, dtype and shape. The same
# call again goes straight to the copy while nothing it checked has changed:
# the row is still the one looked up (a free, a failure or a new lookup
# replaces it), the lease is still kept and lives, and the caller holds no
# attachment (a copy goes through that instead). On the H200 a 256 MiB copy
# takes 0.13 ms, so each microsecond of Python costs most of a percent.

class _Shortcut:
    __slots__ = ("kept", "label", "row_key", "row", "kind", "dtype", "shape", "nbytes")

    def __init__(self, kept: kept_leases.KeptLease, label: str,
                 row_key: Tuple[str, Optional[int]], row: Dict[str, Any], arr: Any) -> None:
        self.kept, self.label, self.row_key, self.row = kept, label, row_key, row
        self.kind, self.dtype, self.shape = type(arr), arr.dtype, tuple(arr.shape)
        self.nbytes = int(row["bytes"])


def _remember_shortcut(api: "Api", key: Tuple[str, bool], label: str,
                       row_key: Tuple[str, Optional[int]], row: Dict[str, Any],
                       arr: Any) -> None:
    """After a copy of ``arr`` with buffer ``label`` (``key``: what the caller named,
    and whether the copy wrote), while the lease that served it is kept."""
    kept = api._kept.get(label)
    if kept is not None and (kept.writable or not key[1]):
        api._kept.remember(key, _Shortcut(kept, label, row_key, row, arr))


def _shortcut(api: "Api", key: Tuple[str, bool], arr: Any) -> Optional[_Shortcut]:
    """The shortcut of a copy like ``arr``'s (see above), its lease's use begun; or
    None: the call takes the whole plan."""
    cut = api._kept.shortcuts.get(key)
    if (cut is None or api._held or type(arr) is not cut.kind or arr.dtype != cut.dtype
            or tuple(arr.shape) != cut.shape or api._rows.get(cut.row_key) is not cut.row
            or not is_device_array(arr) or not api._kept.resume(cut.kept)):
        return None
    return cut


def _shortcut_plan(api: "Api", cut: _Shortcut, arr: Any, write: bool) -> Plan:
    """The copy of a shortcut whose use has begun: a put's Job, or ``arr`` (a get's)."""
    kept = cut.kept
    start = time.monotonic()
    try:
        _device_copy(kept.att, arr, into_attachment=write)
    finally:
        if kept.end_use():  # dropped meanwhile by another thread: released now
            yield Call("release", {"lease": kept.lease}, await_reply=False)
    if not write:
        return arr
    api._shapes[cut.label] = cut.shape
    return _copied(api, kept.record, cut.nbytes, start, "device")


def _leased_copy_plan(api: "Api", label: str, mode: str, arr: Any, nbytes: int,
                      timeout: Optional[float]) -> Plan:
    """A copy between device array ``arr`` (``nbytes``) and buffer ``label`` under a
    lease (``mode`` ``read-write``: into the buffer; ``read``: out of it),
    waited for on the device; the attach job's record.

    The lease is a revocable one the client keeps (kept_leases.py): while it
    lives, a copy sends nothing. Else the copy attaches, asking for one, and
    keeps it; from a gpuqd that grants none (older, or one that refused it),
    the lease is released after the copy, without waiting for the answer:
    gpuqd carries out a connection's requests in the order sent, so whatever
    this client asks next finds the lease gone. Either saves a round trip
    per copy, 25-45 µs on the H200, where 256 MiB take 0.13 ms to copy."""
    write = mode == "read-write"
    kept, ended = api._kept.use(label, write)
    for old in ended:  # a read lease, before a write's attach: gpuqd need not revoke it
        yield Call("release", {"lease": old}, await_reply=False)
    ended = []
    if kept is None:
        lock = -1 if api._kept.refused else kept_leases.new_lock()
        try:
            lease, record, att = yield from _lease_plan(api, label, mode, timeout, lock,
                                                        nbytes)
            if lock >= 0 and (record.get("result") or {}).get("revocable") is True:
                kept = kept_leases.KeptLease(lease, label, write, att, record, lock)
                lock = -1  # the kept lease's now
                ended = api._kept.keep(kept)
        finally:
            kept_leases.close_lock(lock)
    else:
        lease, record, att = kept.lease, kept.record, kept.att
    try:
        if att.bytes != nbytes:  # a kept lease's buffer is the one the lease holds
            raise BadRequest(f"buffer '{label}' holds {att.bytes} bytes, the array "
                             f"{nbytes}; look it up again")
        _device_copy(att, arr, into_attachment=write)
    finally:
        if kept is None:
            yield Call("release", {"lease": lease}, await_reply=False)
        elif kept.end_use():  # dropped meanwhile by another thread: released now
            yield Call("release", {"lease": lease}, await_reply=False)
        for old in ended:  # the least recently used past the kept leases' limit
            yield Call("release", {"lease": old}, await_reply=False)
    return record


def held_attachment(api: "Api", label: str, write: bool) -> Any:
    """An attachment of buffer ``label`` (NAME@GPU) that this client holds, with the
    access a copy needs (``write``: a read-write lease), or None. While the
    caller holds a lease, gpuqd's jobs that conflict with it wait, so a copy
    through it needs no lease of its own: that saves the attach, the import
    check and the release, three round trips (about 1 ms at 256 MiB on the
    H200, where the copy itself takes 0.13 ms)."""
    for att in api._held.values():
        if att.buffer == label and att.ptr and (att.writable or not write):
            return att
    return None


def _lease_plan(api: "Api", label: str, mode: str, timeout: Optional[float],
                lock: int = -1, nbytes: Optional[int] = None) -> Plan:
    """A lease on shareable buffer ``label`` and a mapping of it: ``(lease, the attach
    job's record, Attachment)``. The mapping is kept across calls (importing one
    costs about as much as a 256 MiB copy on the H200) and reused while gpuqd's
    reply names the same buffer (its ``generation``), size and device, with the
    access ``mode`` needs; the descriptor that came is then closed unused.

    ``lock``: a lease lock (kept_leases.new_lock), sent to ask for a revocable
    lease (the record's result says ``revocable`` when granted); refused, a
    plain attach follows, and this connection asks for none again (``busy``:
    it holds as many as gpuqd allows; it asks again next time).
    ``nbytes``: the bytes the caller's copy needs; a buffer of another size is
    a BadRequest (it was freed and made anew since the caller looked it up),
    its lease released."""
    fields = {"buffer": label, "mode": mode, "wait": True, "timeout_ms": timeout_ms(timeout)}
    call = Call("attach", dict(fields, revocable=True) if lock >= 0 else fields,
                (lock,) if lock >= 0 else (), waits=True, wait_s=timeout,
                on_abandoned=api._lease_abandoned)
    try:
        reply = yield call
    except (BadRequest, Busy, Restarted) as exc:
        # Refused before any job: the revocable part, or the buffer itself (which
        # the plain attach then says again). Busy: this connection holds as many
        # revocable leases as gpuqd allows, for now. Restarted while queued: a
        # request that carried a descriptor is not replayed, a plain attach is.
        if lock < 0 or (exc.job is not None and not isinstance(exc, Restarted)):
            raise
        call = Call("attach", fields, (), waits=True, wait_s=timeout,
                    on_abandoned=api._lease_abandoned)
        reply = yield call
        if isinstance(exc, BadRequest):
            api._kept.refused = exc.message
    fds = reply.get("_fds") or []
    result = reply["job"]["result"]
    try:
        if nbytes is not None and result.get("bytes") != nbytes:
            raise BadRequest(f"buffer '{label}' changed since this client looked it up: it "
                             f"holds {result.get('bytes')} bytes now, the copy {nbytes}")
        key = (result.get("buffer"), result.get("device"), result.get("generation"),
               result.get("bytes"))
        att = api._mappings.get(label)
        if att is not None and (att._key != key or (mode == "read-write" and not att.writable)):
            # No lease holds the old one; kept leases of the name go with it.
            for old in drop_mappings(api, base_name(label), unmap=True):
                yield Call("release", {"lease": old}, await_reply=False)
            att = None
        if att is None:
            att = share.Attachment(result, fds[0])
            att._key = key
            if result.get("generation") is not None:  # else gpuqd cannot say when it is stale
                api._mappings[label] = att
            else:
                api._stale_mappings.append(att)
        leased = int(result["lease"]), dict(reply["job"]), att
        call.claimed = True  # the caller's try takes it with no call in between
        return leased
    except BaseException:
        call.claimed = True  # released here
        yield Call("release", {"lease": result["lease"]})
        raise
    finally:
        for fd in fds:
            os.close(fd)


def drop_mappings(api: "Api", name: Optional[str], unmap: bool,
                  release: bool = True) -> List[int]:
    """Forgets the kept mappings of buffers called ``name`` (None: all), and unmaps
    them now (``unmap``: no lease of this client's uses them; one a copy
    still uses is left to close) or at close; and the kept leases of those
    buffers. Returns the leases the caller is to release (not waited for;
    none without ``release``: after the connection ended or a fork)."""
    name = None if name is None else base_name(name)
    ended, busy = api._kept.drop(name, release)
    for lease in [k for k, att in api._held.items()
                  if name is None or base_name(att.buffer) == name]:
        del api._held[lease]  # copies take a lease of their own again
    gone = [k for k in api._mappings if name is None or base_name(k) == name]
    stale = [api._mappings.pop(k) for k in gone]
    if name is None:
        stale += api._stale_mappings
        api._stale_mappings = []
    if not unmap:
        api._stale_mappings.extend(stale)
        return ended
    for att in stale:
        if id(att) in busy and name is not None:
            api._stale_mappings.append(att)
        else:
            att.unmap()
    return ended


def _host_into_device(host: Any, out: Any) -> None:
    if _module(out) == "torch":
        import torch
        out.copy_(torch.from_numpy(host.reshape(-1).view("u1")).view(out.dtype)
                  .reshape(out.shape))
    else:
        import cupy
        out.view(cupy.uint8).reshape(-1).set(host.reshape(-1).view("u1"))


class _ByteView:
    """An attachment's memory as a flat array of bytes (``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, nbytes: int, readonly: bool) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, readonly), "version": 3}


#: Typed views kept per mapping (_device_copy): a few shapes, not every one ever copied.
_TORCH_VIEWS_KEPT = 16


def _device_copy(att: Any, arr: Any, into_attachment: bool) -> None:
    """Copies between a device array and an attachment, on the GPU, and waits for it."""
    if att.host:  # the host backend: the attachment is host memory
        host = att.array().view("u1")
        src = _device_to_host(arr)
        if into_attachment:
            host[:] = _np().asarray(src).reshape(-1).view("u1")
        else:
            _host_into_device(host, arr)
        return
    # The mapping's bytes, never marked read-only: torch refuses such an interface
    # outright, and a read lease's memory is only read below (the copy's source).
    if _module(arr) == "torch":
        import torch
        # Tensors over a kept mapping are kept with it: its bytes (made once per
        # mapping) and a view of them per dtype and shape copied, so that a call
        # is one copy_ and one synchronize (each torch call costs microseconds,
        # and 256 MiB take 0.13 ms to copy on the H200).
        views = att._torch_views
        key = (arr.dtype, arr.shape)
        mem = views.get(key)
        if mem is None:
            raw = views.get(None)
            if raw is None:
                raw = views[None] = torch.as_tensor(_ByteView(att.ptr, att.bytes, False),
                                                    device=f"cuda:{att.device}")
            if len(views) > _TORCH_VIEWS_KEPT:  # a caller cycling through shapes
                views.clear()
                views[None] = raw
            mem = views[key] = raw.view(arr.dtype).view(arr.shape)
        if into_attachment:
            mem.copy_(arr.detach() if arr.requires_grad else arr)
        else:
            if not arr.is_contiguous():
                raise BadRequest("out= must be a contiguous tensor")
            arr.copy_(mem)
        torch.cuda.synchronize(att.device)
        if arr.get_device() != att.device:
            torch.cuda.synchronize(arr.get_device())
    else:
        import cupy
        with cupy.cuda.Device(att.device):
            mem = cupy.asarray(_ByteView(att.ptr, att.bytes, False))
            if into_attachment:
                cupy.copyto(mem, cupy.ascontiguousarray(arr).reshape(-1).view(cupy.uint8))
            else:
                cupy.copyto(arr.reshape(-1).view(cupy.uint8), mem)
            cupy.cuda.runtime.deviceSynchronize()
