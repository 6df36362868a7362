"""Device arrays (torch CUDA tensors, CuPy arrays) in and out of buffers: one
device-to-device copy through an attachment of a shareable buffer
(arrays.py hands them here; a buffer that is not shareable goes through
the host).

The copy runs under a lease: one the caller holds (``client.attach``), else
a revocable one the client keeps between copies (kept_leases.py), else one
per call. The mapping of a buffer is kept across calls, reused while
gpuqd's attach reply names the same buffer (its ``generation``), and the
copy is one ``copy_`` and one synchronize. torch and CuPy are imported only
when an array of theirs is met.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Tuple

from . import kept_leases, share
from .buffer_rows import base_name, bytes_shape, check_fit, find_or_alloc_plan, product, \
    refuse_empty
from .dispatch import Call
from .dtypes import SIZES, gpuq_dtype
from .errors import BadRequest, Busy, Restarted
from .job import Job, timeout_ms

if TYPE_CHECKING:  # pragma: no cover
    from .api import Api

__all__ = ["array_module", "is_device_array", "put_plan", "get_plan", "shortcut",
           "shortcut_plan", "held_attachment", "drop_mappings", "to_host", "host_into_device"]

Plan = Generator[Call, Any, Any]


# Kinds of arrays ------------------------------------------------------------------

def array_module(obj: Any) -> str:
    """The top-level module of ``obj``'s type (``"torch"``, ``"cupy"``, ``"numpy"``)."""
    return type(obj).__module__.split(".")[0]


def is_device_array(obj: Any) -> bool:
    """A torch CUDA tensor or a CuPy array (device memory this process holds)."""
    mod = array_module(obj)
    if mod == "torch":
        return bool(getattr(obj, "is_cuda", False))
    if mod == "cupy":
        return True
    return hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__")


def to_host(arr: Any) -> Any:
    """A device array's copy in host memory (for buffers that cannot be attached)."""
    if array_module(arr) == "torch":
        return arr.detach().cpu()
    import cupy
    return cupy.asnumpy(arr)


def _device_dtype(arr: Any) -> str:
    return gpuq_dtype(arr.dtype)


# put_array and get_array of a device array ------------------------------------------


def put_plan(api: "Api", spec: str, name: str, device: Optional[int], arr: Any,
             dtype: Any, job: Dict[str, Any], used: List[bool], create: bool) -> Plan:
    """A device array into a shareable buffer with one device-to-device copy; None
    when the buffer exists and is not shareable (the caller goes through the host)."""
    gd = gpuq_dtype(dtype) if dtype is not None else _device_dtype(arr)
    shape = [int(n) for n in arr.shape]
    refuse_empty(shape)
    count = product(shape)
    nbytes = count * SIZES[_device_dtype(arr)]
    size: Dict[str, Any] = {"bytes": nbytes} if gd == "bytes" else {"count": count, "dtype": gd}
    buf = yield from find_or_alloc_plan(
        api, spec, name, device, size,
        shape if gd != "bytes" else bytes_shape(shape, SIZES[_device_dtype(arr)], 1),
        True, job, used, create)
    check_fit(buf, nbytes, count, gd)
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


def get_plan(api: "Api", spec: str, key: Tuple[str, Optional[int]], label: str,
             buf: Dict[str, Any], out: Any, job: Dict[str, Any]) -> Plan:
    """A shareable buffer into device array ``out`` with one copy: ``out``; None for a
    buffer that is not shareable (the caller goes through the host)."""
    nbytes = product(out.shape) * SIZES[_device_dtype(out)]
    if nbytes != int(buf["bytes"]):
        raise BadRequest(f"out= holds {nbytes} bytes; buffer '{label}' holds {buf['bytes']}")
    if not buf.get("shareable"):
        return None
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


def shortcut(api: "Api", key: Tuple[str, bool], arr: Any) -> Optional[_Shortcut]:
    """The shortcut of a copy like ``arr``'s (see above), its lease's use begun; or
    None: the call takes the whole plan."""
    cut = api._kept.shortcuts.get(key)
    if (cut is None or api._held or type(arr) is not cut.kind or arr.dtype != cut.dtype
            or tuple(arr.shape) != cut.shape or api._rows.get(cut.row_key) is not cut.row
            or not is_device_array(arr) or not api._kept.resume(cut.kept)):
        return None
    return cut


def shortcut_plan(api: "Api", cut: _Shortcut, arr: Any, write: bool) -> Plan:
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


# Leases and mappings -------------------------------------------------------------

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


# The copies ----------------------------------------------------------------------

def host_into_device(host: Any, out: Any) -> None:
    """Fills device array ``out`` from ``host``, the bytes of a buffer read through
    the host (one that is not shareable)."""
    if array_module(out) == "torch":
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
        src = to_host(arr)
        if into_attachment:
            import numpy
            host[:] = numpy.asarray(src).reshape(-1).view("u1")
        else:
            host_into_device(host, arr)
        return
    # The mapping's bytes, never marked read-only: torch refuses such an interface
    # outright, and a read lease's memory is only read below (the copy's source).
    if array_module(arr) == "torch":
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
