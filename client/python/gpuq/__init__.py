"""gpuq: the Python client of gpuqd, the GPU job daemon.

``gpuq.Client`` (blocking, thread-safe) and ``gpuq.AsyncClient`` (asyncio)
have the same methods: one per request of docs/protocol.md. Job requests
return a :class:`Job`; refusals and failures raise a :class:`GpuqError`
subclass named after the protocol's error code; numpy arrays and torch
tensors go in and out with ``put_array`` and ``get_array``, at close to
pinned speed; ``client.buffer(name)`` is a :class:`Buffer` with numpy's
attributes. See docs/python.md for a tour.
"""

from .aio import AsyncClient
from .api import parse_ops
from .buffer import Buffer
from .client import DEFAULT_TIMEOUT, Client
from .errors import (ERRORS, BadFrame, BadRequest, Busy, Cancelled, DeviceError, Exists,
                     GpuqError, Internal, IoError, NoDevice, NotFound, OutOfMemory,
                     PermissionDenied, ProtocolError, ReplyTimeout, Restarted, ShuttingDown, Timeout,
                     UnknownOp, UnsupportedVersion, error_class)
from .job import Job
from .dtypes import gpuq_dtype
from .memfd import memfd_array
from .share import Attachment, Region
from .staging import Staging
from .wire import PROTOCOL_VERSION, default_socket

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "Job", "Buffer", "Attachment", "Region", "Staging",
    "gpuq_dtype", "DEFAULT_TIMEOUT", "PROTOCOL_VERSION",
    "default_socket", "memfd_array", "parse_ops", "ERRORS", "error_class",
    "GpuqError", "BadRequest", "BadFrame", "UnsupportedVersion", "UnknownOp", "NotFound",
    "Exists", "NoDevice", "OutOfMemory", "Busy", "PermissionDenied", "Cancelled",
    "Timeout", "IoError", "DeviceError", "ShuttingDown", "Internal", "Restarted", "ProtocolError",
    "ReplyTimeout", "__version__",
]
