"""numpy arrays in and out of buffers: ``put_array`` and ``get_array``.

A buffer allocated with ``count`` and ``dtype`` records both in gpuqd; the
shape of the array it came from is kept by the client (per client object,
per ``NAME@GPU``), since the daemon has no notion of one. numpy is imported
only here, so the rest of the client works without it.

The bytes travel through a memfd (memfd.py). An array that already lives in
one (``get_array``'s results, :func:`gpuq.memfd_array`) is passed as it is;
any other array is copied into a fresh memfd first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Tuple

from . import memfd
from .dispatch import Call
from .errors import BadRequest, Exists, NotFound

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api

__all__ = ["DTYPES", "gpuq_dtype", "numpy_dtype", "split_name"]

#: gpuq dtype -> numpy dtype name. ``bf16`` has no numpy type of its own:
#: ml_dtypes' ``bfloat16`` when installed, else its bits as ``uint16``.
DTYPES: Dict[str, str] = {"bytes": "uint8", "u8": "uint8", "i32": "int32", "i64": "int64",
                          "f16": "float16", "bf16": "bfloat16", "f32": "float32",
                          "f64": "float64"}
_SIZES = {"bytes": 1, "u8": 1, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8}
_FROM_NUMPY = {"uint8": "u8", "int32": "i32", "int64": "i64", "float16": "f16",
               "bfloat16": "bf16", "float32": "f32", "float64": "f64"}


def _np() -> Any:
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy is there in every test
        raise ImportError("put_array and get_array need numpy (apt install python3-numpy "
                          "or pip install numpy)") from exc
    return numpy


def gpuq_dtype(dtype: Any) -> str:
    """The gpuq dtype of a numpy dtype, or BadRequest naming the choices."""
    name = _np().dtype(dtype).name
    if name in _FROM_NUMPY:
        return _FROM_NUMPY[name]
    raise BadRequest(f"numpy dtype {name} has no gpuq dtype (gpuq has "
                     f"{', '.join(_FROM_NUMPY)}); convert it with astype(), or pass "
                     "dtype='bytes' to store its raw bytes")


def numpy_dtype(dtype: str) -> Any:
    """The numpy dtype that holds a gpuq dtype's elements (see DTYPES for bf16)."""
    np = _np()
    if dtype == "bf16":
        try:
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    if dtype not in DTYPES:
        raise BadRequest(f"gpuq dtype {dtype!r} is unknown to this client "
                         f"(it knows {', '.join(DTYPES)}); pass dtype= to read it as one")
    return np.dtype(DTYPES[dtype])


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


def lookup_plan(api: "Api", name: str, device: Optional[int]
                ) -> Generator[Call, Any, Optional[Dict[str, Any]]]:
    """The caller's buffer called ``name`` (on ``device`` if given), or None."""
    reply = yield Call("buffers", {"device": device})
    uid = api._uid()
    mine: List[Dict[str, Any]] = [b for b in reply.get("buffers", [])
                                  if b.get("name") == name and b.get("owner", uid) == uid]
    if len(mine) > 1:
        where = ", ".join(f"{name}@{b.get('device')}" for b in mine)
        raise BadRequest(f"buffer '{name}' exists on several devices ({where}); name one "
                         "as NAME@GPU")
    return mine[0] if mine else None


def _prepare(arr: Any, dtype: Optional[str]) -> Tuple[Any, str]:
    """The array as native-order elements, and the gpuq dtype it goes to."""
    np = _np()
    arr = np.asarray(arr)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if dtype is None:
        return arr, gpuq_dtype(arr.dtype)
    if dtype not in _SIZES:
        raise BadRequest(f"dtype {dtype!r} is not a gpuq dtype ({', '.join(_SIZES)})")
    if dtype != "bytes" and arr.dtype.itemsize != _SIZES[dtype]:
        raise BadRequest(f"a {arr.dtype.name} array cannot be stored as {dtype}: its "
                         f"elements are {arr.dtype.itemsize} bytes, {dtype}'s "
                         f"{_SIZES[dtype]}")
    return arr, dtype


def _check_fit(buf: Dict[str, Any], arr: Any, dtype: str) -> None:
    have = (f"buffer '{buf.get('name')}@{buf.get('device')}' holds {buf.get('count')} "
            f"{buf.get('dtype')} ({buf.get('bytes')} bytes)")
    want = f"the array is {arr.size} {dtype} ({arr.nbytes} bytes)"
    if dtype == "bytes":
        ok = buf.get("bytes") == arr.nbytes
    else:
        ok = buf.get("dtype") == dtype and buf.get("count") == arr.size
    if not ok:
        raise BadRequest(f"{have} but {want}; free it, put into another name, or convert "
                         f"the array (arr.astype(...)) to match")


def put_array_plan(api: "Api", arr: Any, spec: str, dtype: Optional[str],
                   job: Dict[str, Any]) -> Generator[Call, Any, Any]:
    """Finds or allocates the buffer, checks that the array fits it, and puts it."""
    arr, gd = _prepare(arr, dtype)
    name, device = split_name(spec)
    buf = yield from lookup_plan(api, name, device)
    if buf is None:
        size = {"bytes": arr.nbytes} if gd == "bytes" else {"count": arr.size, "dtype": gd}
        try:
            done = yield from api._job_plan("alloc", dict(name=name, device=device, **size),
                                            priority=job.get("priority"))
            buf = done.result
        except Exists:  # made meanwhile by another thread or process: look again
            buf = yield from lookup_plan(api, name, device)
            if buf is None:
                raise
    _check_fit(buf, arr, gd)
    label = f"{name}@{buf['device']}"
    found = memfd.find(arr)
    fd = (memfd.open_range(found[0], found[1], writable=False) if found
          else memfd.from_bytes(arr if arr.flags.c_contiguous else arr.copy()))
    try:
        result = yield from api._job_plan("put", {"buffer": label, "length": arr.nbytes},
                                          fds=(fd,), **job)
    finally:
        os.close(fd)
    api._shapes[label] = arr.shape
    return result


def get_array_plan(api: "Api", spec: str, out: Any, dtype: Any, shape: Any,
                   job: Dict[str, Any]) -> Generator[Call, Any, Any]:
    """Reads a whole buffer into a new memfd-backed array, or into ``out``."""
    np = _np()
    name, device = split_name(spec)
    buf = yield from lookup_plan(api, name, device)
    if buf is None:
        raise NotFound(f"buffer '{spec}' not found")
    label = f"{name}@{buf['device']}"
    nbytes = int(buf["bytes"])
    dt = np.dtype(dtype) if dtype is not None else numpy_dtype(buf["dtype"])
    if nbytes % dt.itemsize:
        raise BadRequest(f"buffer '{label}' holds {nbytes} bytes, not a whole number of "
                         f"{dt.name} ({dt.itemsize} bytes each)")
    count = nbytes // dt.itemsize
    if out is not None:
        target = _check_out(out, dt, count, label)
    else:
        target = memfd.memfd_array(_shape(api, label, count, shape), dt)
    found = memfd.find(target)
    fd = memfd.open_range(found[0], found[1], writable=True) if found else memfd.create(nbytes)
    try:
        yield from api._job_plan("get", {"buffer": label, "length": nbytes}, fds=(fd,), **job)
        if not found:
            memfd.read_into(fd, memoryview(target).cast("B"))
    finally:
        os.close(fd)
    return target


def _shape(api: "Api", label: str, count: int, shape: Any) -> Tuple[int, ...]:
    if shape is not None:
        shape_t = (shape,) if isinstance(shape, int) else tuple(shape)
        total = 1
        for n in shape_t:
            total *= n
        if total != count:
            raise BadRequest(f"shape {shape_t} holds {total} elements; buffer '{label}' "
                             f"holds {count}")
        return shape_t
    kept = api._shapes.get(label)
    if kept is not None:
        total = 1
        for n in kept:
            total *= n
        if total == count:
            return tuple(kept)
    return (count,)


def _check_out(out: Any, dt: Any, count: int, label: str) -> Any:
    if not hasattr(out, "dtype") or out.dtype != dt or out.size != count:
        got = (f"a {out.dtype} array of {out.size}" if hasattr(out, "dtype")
               else f"a {type(out).__name__}")
        raise BadRequest(f"out= must be a {dt.name} array of {count} elements for buffer "
                         f"'{label}', not {got}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise BadRequest("out= must be a writable C-contiguous array")
    return out
