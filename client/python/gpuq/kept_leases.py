"""Revocable leases a client keeps between device copies (device_arrays.py).

``put_array``/``get_array`` of a device array copy through an attachment of
the buffer under a lease. Taking one per call costs an ``attach`` round trip,
more than copying 256 MiB on the H200 takes. A *revocable* lease
(docs/protocol.md, Revocable leases) is kept instead: gpuqd ends it by
itself when a job wants the buffer while this process is not using it, so a
repeated copy sends nothing while nobody else wants the buffer.

The lease's lock is a memfd sent with the attach: gpuqd holds a POSIX record
lock on its byte 0 for as long as the lease lives, and this process locks
byte 1 while it uses the buffer (gpuqd revokes the lease by taking byte 1).
Such locks belong to the process, not to a thread or a descriptor: threads
share the lock on byte 1 (uses are counted, and the last to end unlocks
it), closing any descriptor of the memfd drops the process's locks (one is
kept, and closed only once no use is in progress), and a forked child holds
none of its parent's.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Set, Tuple

__all__ = ["MAX_KEPT", "MAX_SHORTCUTS", "KeptLease", "KeptLeases", "new_lock", "close_lock"]

#: Kept leases per client; past this many the least recently used is released.
MAX_KEPT = 8

#: Shortcuts kept per client (a name may be copied both ways, and named two ways).
MAX_SHORTCUTS = 4 * MAX_KEPT

# struct flock as Linux lays it out on 64-bit machines: l_type, l_whence,
# l_start, l_len, l_pid, padded to 32 bytes.
_FLOCK = struct.Struct("hhqqi4x")


def new_lock() -> int:
    """A lease lock: a new memfd with byte 1 locked (a use from before the attach
    until the first copy ends, so that gpuqd cannot revoke the lease between
    its grant and that copy); -1 where memfds or record locks are not to be had."""
    try:
        fd = os.memfd_create("gpuq-lease-lock", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return -1
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1)
    except OSError:
        os.close(fd)
        return -1
    return fd


def close_lock(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _held_by_gpuqd(fd: int) -> bool:
    """Whether another process (gpuqd, while the lease lives) locks byte 0.
    F_GETLK answers F_UNLCK when no process but the caller holds it."""
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        return False
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


class KeptLease:
    """A revocable lease this client keeps on buffer ``label`` (NAME@GPU): its id,
    access, mapping (:class:`~gpuq.share.Attachment`, shared with the client's
    kept mappings), the attach job's record and the lock's descriptor.
    Made in use (byte 1 locked before the attach)."""

    def __init__(self, lease: int, label: str, writable: bool, att: Any,
                 record: Dict[str, Any], fd: int) -> None:
        self.lease = lease
        self.label = label
        self.writable = writable
        self.att = att
        self.record = record
        self.fd = fd
        self.uses = 1
        self.mutex = threading.Lock()
        self._retired = False  # out of the client's kept leases
        self._release_after = False  # retired in use: the last use's end releases it

    def __repr__(self) -> str:
        return (f"<gpuq kept lease {self.lease} on {self.label} "
                f"{'read-write' if self.writable else 'read'}, {self.uses} uses>")

    def begin_use(self) -> bool:
        """Starts a use of the buffer; False when the lease has ended (the caller
        attaches again) or was dropped."""
        with self.mutex:
            if self._retired:
                return False
            if self.uses == 0:
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1)
                except OSError:
                    return False  # gpuqd holds byte 1: it is revoking the lease
                if not _held_by_gpuqd(self.fd):
                    fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 1)
                    return False
            elif not _held_by_gpuqd(self.fd):
                return False  # broken, or its device reset, under another thread's use
            self.uses += 1
            return True

    def end_use(self) -> bool:
        """Ends a use, once the work on the device has finished; True when the
        caller is to send the lease's release now (it was dropped during the
        use, its release left to the use's end)."""
        with self.mutex:
            self.uses -= 1
            if self.uses:
                return False
            if self._retired:
                self._close()
                return self._release_after
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 1)
            except OSError:
                pass
            return False

    def retire(self, release: bool) -> bool:
        """Drops it (already out of the client's kept leases): its descriptor is
        closed once no use is in progress. True when the caller is to send the
        release now: ``release`` asked, no use in progress, and the lease still
        lives; with a use in progress the use's end does it."""
        with self.mutex:
            if self._retired:
                return False
            self._retired = True
            if self.uses:
                self._release_after = release
                return False
            alive = release and _held_by_gpuqd(self.fd)
            self._close()
            return alive

    def in_use(self) -> bool:
        with self.mutex:
            return self.uses > 0

    def _close(self) -> None:
        fd, self.fd = self.fd, -1
        close_lock(fd)


class KeptLeases:
    """A client's kept leases, by NAME@GPU, least recently used first."""

    def __init__(self) -> None:
        self._kept: "OrderedDict[str, KeptLease]" = OrderedDict()
        self._lock = threading.Lock()
        # Why gpuqd refused a revocable attach on this connection ("" while none
        # was): copies take a lease per call then, as with a gpuqd that has none.
        self.refused = ""
        # Copies a kept lease served, by what the caller named and whether it
        # wrote (device_arrays.py's shortcuts): each valid while its lease is kept.
        self.shortcuts: "OrderedDict[Any, Any]" = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, label: str) -> Optional[KeptLease]:
        return self._kept.get(label)

    def use(self, label: str, write: bool) -> Tuple[Optional[KeptLease], List[int]]:
        """The kept lease of ``label``, its use begun, when it gives the access a
        copy needs (``write``: read-write) and still lives; and the leases the
        caller is to release before it attaches (a read lease, for a write).
        One that has ended is dropped (nothing to release)."""
        with self._lock:
            kept = self._kept.get(label)
            if kept is None:
                return None, []
            if write and not kept.writable:
                del self._kept[label]
                return None, [kept.lease] if kept.retire(True) else []
            if kept.begin_use():
                self._kept.move_to_end(label)
                return kept, []
            del self._kept[label]
            kept.retire(False)
            return None, []

    def resume(self, kept: KeptLease) -> bool:
        """Begins a use of ``kept`` when it is still the kept lease of its buffer
        and lives; False otherwise (the caller takes :meth:`use`'s way, which
        drops it if it has ended)."""
        with self._lock:
            if self._kept.get(kept.label) is not kept or not kept.begin_use():
                return False
            self._kept.move_to_end(kept.label)
            return True

    def remember(self, key: Any, shortcut: Any) -> None:
        """Keeps ``shortcut`` under ``key``; past :data:`MAX_SHORTCUTS` the oldest goes."""
        with self._lock:
            self.shortcuts.pop(key, None)
            self.shortcuts[key] = shortcut
            while len(self.shortcuts) > MAX_SHORTCUTS:
                self.shortcuts.popitem(last=False)

    def keep(self, kept: KeptLease) -> List[int]:
        """Keeps ``kept`` (in use); the leases the caller is to release: one it
        replaces (another thread's of the same buffer) and the least recently
        used past :data:`MAX_KEPT`."""
        ended: List[int] = []
        with self._lock:
            old = self._kept.pop(kept.label, None)
            if old is not None and old.retire(True):
                ended.append(old.lease)
            self._kept[kept.label] = kept
            while len(self._kept) > MAX_KEPT:
                _, lru = self._kept.popitem(last=False)
                if lru.retire(True):
                    ended.append(lru.lease)
        return ended

    def drop(self, name: Optional[str], release: bool) -> Tuple[List[int], Set[int]]:
        """Drops the kept leases of buffers called ``name`` (NAME, on any GPU; None:
        all). Returns the leases the caller is to release (with ``release``;
        never after a reconnect or a fork, whose lease ids are not this
        connection's), and the ``id()`` of the mappings a use still copies
        through (not to be unmapped under it)."""
        ended: List[int] = []
        busy: Set[int] = set()
        with self._lock:
            for label in [k for k in self._kept
                          if name is None or k.partition("@")[0] == name]:
                kept = self._kept.pop(label)
                if kept.in_use():
                    busy.add(id(kept.att))
                if kept.retire(release):
                    ended.append(kept.lease)
        return ended, busy

    def drop_lease(self, lease: int) -> None:
        """Drops the kept lease ``lease`` (broken: gpuqd ended it)."""
        with self._lock:
            for label, kept in list(self._kept.items()):
                if kept.lease == lease:
                    del self._kept[label]
                    kept.retire(False)

    def in_child(self) -> "KeptLeases":
        """In a child forked from the process that kept these (forked.py): closes
        the child's copies of the locks (it holds none of the parent's locks,
        and the leases are the parent's: never released here) and returns an
        empty set. Takes no lock: another thread of the parent may have held
        one at the fork."""
        for kept in list(self._kept.values()):
            kept._close()
        return KeptLeases()
