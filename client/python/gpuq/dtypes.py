"""Element types in numpy's vocabulary: what users write, as gpuq's names.

gpuq has eight dtypes (``bytes u8 i32 i64 f16 bf16 f32 f64``). Users of
numpy and torch write them as ``np.float32``, ``"float32"``, ``"f4"``,
``np.dtype("<f4")`` or ``torch.float32``; every one of those is accepted
wherever the client takes a dtype, and turned into gpuq's name here, so
that the daemon (which knows only its own names) never sees another. numpy
is not needed for gpuq's own names and numpy's plain names.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from .errors import BadRequest

__all__ = ["GPUQ_DTYPES", "SIZES", "gpuq_dtype", "numpy_dtype", "itemsize"]

#: gpuq's dtypes, as the protocol names them.
GPUQ_DTYPES: Tuple[str, ...] = ("bytes", "u8", "i32", "i64", "f16", "bf16", "f32", "f64")
#: Bytes per element.
SIZES: Dict[str, int] = {"bytes": 1, "u8": 1, "i32": 4, "i64": 8, "f16": 2, "bf16": 2,
                         "f32": 4, "f64": 8}
#: numpy's (and torch's) names -> gpuq's.
_NAMES: Dict[str, str] = {
    "uint8": "u8", "int32": "i32", "int64": "i64", "float16": "f16", "half": "f16",
    "bfloat16": "bf16", "float32": "f32", "float": "f32", "float64": "f64",
    "double": "f64", "u1": "u8", "i4": "i32", "i8": "i64", "f2": "f16", "f4": "f32",
    "f8": "f64", "<u1": "u8", "|u1": "u8", "<i4": "i32", "<i8": "i64", "<f2": "f16",
    "<f4": "f32", "<f8": "f64", "=f4": "f32", "=f8": "f64", "B": "u8",
}
#: gpuq -> numpy dtype name (bf16: ml_dtypes' bfloat16 when installed, else its bits).
_NUMPY: Dict[str, str] = {"bytes": "uint8", "u8": "uint8", "i32": "int32", "i64": "int64",
                          "f16": "float16", "bf16": "bfloat16", "f32": "float32",
                          "f64": "float64"}


def _choices() -> str:
    return ("numpy's (np.float32, 'float32', 'f4'), torch's (torch.float32) or gpuq's "
            f"({' '.join(GPUQ_DTYPES)}); numpy types gpuq lacks (float128, complex, "
            "int16, ...) need astype() or dtype='bytes'")


def gpuq_dtype(dtype: Any) -> str:
    """gpuq's name for ``dtype``, however it is written; BadRequest naming the choices.

    Accepts gpuq's names, numpy names and type codes (``"float32"``,
    ``"f4"``), numpy types and dtypes (``np.float32``), torch dtypes
    (``torch.bfloat16``), ml_dtypes' ``bfloat16``.
    """
    if isinstance(dtype, str):
        if dtype in SIZES:
            return dtype
        if dtype in _NAMES:
            return _NAMES[dtype]
    else:
        try:
            return _KNOWN[dtype]
        except (KeyError, TypeError):  # not seen yet, or not hashable
            pass
        name = _gpuq_dtype_of_object(dtype)
        if len(_KNOWN) >= _KNOWN_MOST:  # a caller making new dtype objects without end
            _KNOWN.clear()
        try:
            _KNOWN[dtype] = name
        except TypeError:
            pass
        return name
    return _gpuq_dtype_of_object(dtype)


#: dtype objects already named (numpy dtypes and types, torch dtypes): naming a
#: numpy dtype afresh took about 4 us on the development machine, a few times
#: per put_array or get_array (CuPy arrays' dtypes are numpy's).
_KNOWN: Dict[Any, str] = {}
_KNOWN_MOST = 64


def _gpuq_dtype_of_object(dtype: Any) -> str:
    """gpuq_dtype for what is not one of the plain names."""
    if not isinstance(dtype, str):
        text = str(dtype)
        if text.startswith("torch."):  # torch.float32 -> float32, without importing torch
            name = text[len("torch."):]
            if name in _NAMES:
                return _NAMES[name]
            raise BadRequest(f"torch dtype {text} has no gpuq dtype: {_choices()}")
    try:
        import numpy as np
        name = np.dtype(dtype).name
    except (ImportError, TypeError, ValueError):
        raise BadRequest(f"{dtype!r} is not a dtype gpuq knows: {_choices()}") from None
    if name in _NAMES and np.dtype(dtype).isnative:
        return _NAMES[name]
    raise BadRequest(f"numpy dtype {np.dtype(dtype).str} has no gpuq dtype: {_choices()}")


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (any spelling :func:`gpuq_dtype` takes)."""
    return SIZES[gpuq_dtype(dtype)]


def numpy_dtype(dtype: str) -> Any:
    """The numpy dtype that holds a gpuq dtype's elements (bf16: see ``_NUMPY``)."""
    import numpy as np
    if dtype == "bf16":
        try:
            import ml_dtypes
            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype(np.uint16)
    if dtype not in _NUMPY:
        raise BadRequest(f"gpuq dtype {dtype!r} is unknown to this client "
                         f"(it knows {', '.join(GPUQ_DTYPES)}); pass dtype= to read it as one")
    return np.dtype(_NUMPY[dtype])
