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
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Tuple

from . import device_arrays, memfd
from .buffer_rows import bytes_shape, cached_lookup_plan, check_fit, find_or_alloc_plan, \
    not_found_plan, product, refuse_empty, remember, retrying, split_name
from .device_arrays import array_module, is_device_array
from .dispatch import Call
from .dtypes import SIZES, gpuq_dtype, numpy_dtype
from .errors import BadRequest
from .host_arrays import empty_aligned
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


# Host arrays (numpy, torch CPU tensors) ------------------------------------------


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
    if array_module(arr) == "torch":
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


# put_array ------------------------------------------------------------------------


def put_array_plan(api: "Api", spec: str, arr: Any, dtype: Any,
                   job: Dict[str, Any], create: bool = True) -> Plan:
    """Finds or allocates the buffer (``create``; else NotFound when there is none),
    checks that the array fits it, and puts it."""
    cut = device_arrays.shortcut(api, (spec, True), arr) if dtype is None else None
    if cut is not None:
        return (yield from device_arrays.shortcut_plan(api, cut, arr, True))
    name, device = split_name(spec)
    return (yield from retrying(api, name, lambda used: _put_array_plan(
        api, spec, name, device, arr, dtype, job, used, create)))


def _put_array_plan(api: "Api", spec: str, name: str, device: Optional[int], arr: Any,
                    dtype: Any, job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    if is_device_array(arr):
        done = yield from device_arrays.put_plan(api, spec, name, device, arr, dtype, job, used,
                                           create)
        if done is not None:
            return done
        arr = device_arrays.to_host(arr)
    arr, gd = _prepare(arr, dtype)
    refuse_empty(arr.shape)
    shape = ([int(n) for n in arr.shape] if gd != "bytes"
             else bytes_shape(arr.shape, arr.itemsize, SIZES["bytes"]))
    size: Dict[str, Any] = ({"bytes": arr.nbytes} if gd == "bytes"
                            else {"count": arr.size, "dtype": gd})
    buf = yield from find_or_alloc_plan(api, spec, name, device, size, shape, False, job,
                                         used, create)
    check_fit(buf, arr.nbytes, arr.size, gd)
    if gd == "bytes":  # in the elements of the buffer they go into
        shape = bytes_shape(arr.shape, arr.itemsize, SIZES.get(str(buf.get("dtype")), 1))
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
        cut = device_arrays.shortcut(api, (spec, False), out)
        if cut is not None:
            return (yield from device_arrays.shortcut_plan(api, cut, out, False))
    name, device = split_name(spec)
    return (yield from retrying(api, name, lambda used: _get_array_plan(
        api, spec, name, device, out, dtype, shape, job, used)))


def _get_array_plan(api: "Api", spec: str, name: str, device: Optional[int], out: Any,
                    dtype: Any, shape: Any, job: Dict[str, Any], used: List[bool]) -> Plan:
    _np()  # its ImportError says how to install it
    buf, cached = yield from cached_lookup_plan(api, name, device)
    used.append(cached)
    if buf is None:
        raise (yield from not_found_plan(api, spec))
    label = f"{name}@{buf['device']}"
    nbytes = int(buf["bytes"])
    if out is not None and is_device_array(out):
        done = yield from device_arrays.get_plan(api, spec, (name, device), label, buf, out,
                                                 job)
        if done is None:  # not shareable: through the host
            host = yield from get_array_plan(api, label, None, None, None, job)
            device_arrays.host_into_device(host, out)
            return out
        return done
    dt = numpy_dtype(buf["dtype"]) if dtype is None else _read_as(dtype)
    if nbytes % dt.itemsize:
        raise BadRequest(f"buffer '{label}' holds {nbytes} bytes, not a whole number of "
                         f"{dt.name} ({dt.itemsize} bytes each)")
    count = nbytes // dt.itemsize
    if out is not None:
        given = out
        view = _check_out(_torch_to_numpy(out)[0] if array_module(out) == "torch" else out,
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
            known = product([n for n in shape_t if n != -1])
            if not known or count % known:
                raise BadRequest(f"shape {shape_t} does not fit buffer '{label}': its {count} "
                                 f"elements are not a multiple of {known}")
            shape_t = tuple(count // known if n == -1 else n for n in shape_t)
        if product(shape_t) != count:
            raise BadRequest(f"shape {shape_t} holds {product(shape_t)} elements; buffer "
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
    whole = product(kept)
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
