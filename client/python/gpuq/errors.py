"""Exceptions: one class per error code of the protocol, and the client's own.

Every refusal or failure that the daemon reports raises a subclass of
:class:`GpuqError` named after its ``code`` (``not_found`` raises
:class:`NotFound`, ``out_of_memory`` :class:`OutOfMemory`, ...), carrying
the daemon's message, the code, and the job when there is one. A code this
client does not know yet raises :class:`GpuqError` itself with that code, so
a newer daemon never breaks an older client.

Trouble with the connection is not a refusal and raises Python's own
classes: :class:`ConnectionError` when the daemon cannot be reached or goes
away (the message names the socket), :class:`ProtocolError` (a
``ConnectionError``) when it sends something this client cannot read, and
:class:`ReplyTimeout` (a ``TimeoutError``) when no reply comes in time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .job import Job

__all__ = [
    "GpuqError", "BadRequest", "BadFrame", "UnsupportedVersion", "UnknownOp",
    "NotFound", "Exists", "NoDevice", "OutOfMemory", "Busy", "PermissionDenied",
    "Cancelled", "Timeout", "IoError", "DeviceError", "ShuttingDown", "Internal",
    "ProtocolError", "ReplyTimeout", "ERRORS", "error_class", "error_from_map",
]


class GpuqError(Exception):
    """A request refused, or a job failed, as the daemon reported it.

    Attributes:
        code: the protocol's error code (``"not_found"``, ...).
        message: the daemon's message: it names the thing and the fix.
        job: the :class:`~gpuq.Job` the error belongs to, when the request
            created one (a failed or cancelled job, a wait that timed out);
            ``None`` for a request refused before any job existed.
        reply: the whole reply (or job record) the error came in.
    """

    code: str = ""

    def __init__(self, message: str, code: Optional[str] = None,
                 job: Optional["Job"] = None,
                 reply: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.job = job
        self.reply = dict(reply) if reply is not None else {}

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        job = f", job={self.job.id}" if self.job is not None else ""
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}{job})"


class BadRequest(GpuqError, ValueError):
    """A field is missing, mistyped, out of range or inconsistent (``bad_request``).

    The client raises it too, before sending anything, when ``put_array`` or
    ``get_array`` meet a buffer whose dtype or size does not fit the array.
    """
    code = "bad_request"


class BadFrame(GpuqError):
    """The daemon could not read a frame and closed the connection (``bad_frame``)."""
    code = "bad_frame"


class UnsupportedVersion(GpuqError):
    """The request's protocol version is not the daemon's (``unsupported_version``)."""
    code = "unsupported_version"


class UnknownOp(GpuqError):
    """The daemon has no such operation (``unknown_op``): it may be older than this client."""
    code = "unknown_op"


class NotFound(GpuqError, LookupError):
    """No such buffer, job or device (``not_found``)."""
    code = "not_found"


class Exists(GpuqError):
    """A buffer of that name already exists on that device (``exists``)."""
    code = "exists"


class NoDevice(GpuqError):
    """The device is unhealthy, or there are none (``no_device``)."""
    code = "no_device"


class OutOfMemory(GpuqError, MemoryError):
    """The device (or the host backend's arena) cannot hold it (``out_of_memory``)."""
    code = "out_of_memory"


class Busy(GpuqError):
    """A queue is full, or the buffer is in use by another job (``busy``)."""
    code = "busy"


class PermissionDenied(GpuqError, PermissionError):
    """Another user's buffer or job, or a rule or quota refused (``permission_denied``)."""
    code = "permission_denied"


class Cancelled(GpuqError):
    """The job was cancelled (``cancelled``)."""
    code = "cancelled"


class Timeout(GpuqError, TimeoutError):
    """A wait ran out before the job finished; the job goes on (``timeout``),
    except an ``attach``, which is given up with its lease, and a
    ``put_array``/``get_array`` through the staging ring, which is cancelled
    (its job cannot go on without the client).

    ``error.job`` is the job as it stood: wait for it again, or cancel it.
    """
    code = "timeout"


class IoError(GpuqError, OSError):
    """Reading or writing the client's descriptor failed or ended early (``io_error``)."""
    code = "io_error"


class DeviceError(GpuqError):
    """The device reported an error; the message carries CUDA's (``device_error``)."""
    code = "device_error"


class ShuttingDown(GpuqError):
    """The daemon is stopping and takes no new jobs (``shutting_down``)."""
    code = "shutting_down"


class Internal(GpuqError):
    """A bug in gpuqd; the message says where (``internal``)."""
    code = "internal"


class Restarted(GpuqError):
    """gpuqd re-executed itself while the job was running, or queued and not replayable (``restarted``).

    Its buffers survive the restart; the job did not run, or ran only in
    part (a buffer it wrote is then listed ``suspect``). Submit it again.
    (A queued job that can be is replayed by the new gpuqd instead.)
    """
    code = "restarted"


class ProtocolError(ConnectionError):
    """The daemon sent something this client cannot read; the connection is closed."""


class ReplyTimeout(TimeoutError):
    """No reply came within the client's time limit.

    The request may still be carried out; the connection stays usable (a
    reply that arrives later is dropped). This is the client giving up, not
    the daemon's ``timeout`` code (:class:`Timeout`).
    """


#: Every protocol error code and the class it raises.
ERRORS: Dict[str, Type[GpuqError]] = {
    cls.code: cls for cls in (
        BadRequest, BadFrame, UnsupportedVersion, UnknownOp, NotFound, Exists,
        NoDevice, OutOfMemory, Busy, PermissionDenied, Cancelled, Timeout,
        IoError, DeviceError, ShuttingDown, Internal, Restarted)
}


def error_class(code: str) -> Type[GpuqError]:
    """The class that an error ``code`` raises (:class:`GpuqError` for one unknown)."""
    return ERRORS.get(code, GpuqError)


def error_from_map(error: Any, job: Optional["Job"] = None,
                   reply: Optional[Mapping[str, Any]] = None) -> GpuqError:
    """The exception for an ``error`` map (``code``, ``message``) from the daemon.

    A map that lacks either key still gives an exception that says what came.
    """
    if not isinstance(error, Mapping):
        return GpuqError(f"gpuqd reported a failure without an error map: {error!r}",
                         code="", job=job, reply=reply)
    code = error.get("code")
    message = error.get("message")
    code = code if isinstance(code, str) else ""
    if not isinstance(message, str) or not message:
        message = f"gpuqd reported {code or 'an error'} without a message"
    return error_class(code)(message, code=code, job=job, reply=reply)
