"""Errors raised by memprobe: one class per ``memprobe_status``.

Every failed C call raises a :class:`MemprobeError` subclass carrying the
``status`` (a :class:`Status`) and the library's ``message``
(``memprobe_last_error()`` of the calling thread)::

    try:
        trace.stop()
    except memprobe.WrongOrderError as e:
        print(e.status, e.message)
"""

from __future__ import annotations

import enum
from typing import Dict, Type


class Status(enum.IntEnum):
    """``memprobe_status`` values (explicit, never reused)."""

    OK = 0
    NULL_POINTER = 1
    INVALID_ARGUMENT = 2
    INVALID_HANDLE = 3
    INVALID_ID = 4
    WRONG_ORDER = 5
    UNAVAILABLE = 6
    UNSUPPORTED = 7
    PERMISSION_DENIED = 8
    IO = 9
    PARSE = 10
    GPU_LOST = 11
    BUFFER_TOO_SMALL = 12
    PANIC = 13
    INTERNAL = 14
    OUT_OF_MEMORY = 15


class MemprobeError(Exception):
    """A memprobe call failed. ``status``: the :class:`Status` (an ``int``
    for values newer than this package); ``message``: why."""

    def __init__(self, status: int, message: str = ""):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        name = self.status.name.lower() if isinstance(self.status, Status) else self.status
        return f"{self.message} [{name}]" if self.message else f"[{name}]"


class NullPointerError(MemprobeError):
    """A required argument was missing (``NULL``)."""


class InvalidArgumentError(MemprobeError, ValueError):
    """An argument is out of range or malformed."""


class InvalidHandleError(MemprobeError):
    """The object was closed (its handle freed) or is of another type."""


class InvalidIdError(MemprobeError, LookupError):
    """An id (device, source index) names nothing that exists."""


class WrongOrderError(MemprobeError):
    """Not allowed in the current state (stop before start, double stop, ...)."""


class UnavailableError(MemprobeError):
    """Cannot be read here (no GPU, no driver, no cgroup, ...)."""


class UnsupportedError(MemprobeError):
    """The source does not support this operation."""


class PermissionDeniedError(MemprobeError):
    """The operating system refused."""


class IoError(MemprobeError):
    """An I/O error."""


class ParseError(MemprobeError):
    """A malformed /proc or cgroup file."""


class GpuLostError(MemprobeError):
    """A GPU fell off the bus."""


class BufferTooSmallError(MemprobeError):
    """An output buffer was too small (handled inside the binding)."""


class PanicError(MemprobeError):
    """A panic was caught inside memprobe (a bug: please report it)."""


class InternalError(MemprobeError):
    """An internal invariant broke (a bug: please report it)."""


class OutOfMemoryError(MemprobeError, MemoryError):
    """A step still ran out of memory after every retry
    (``memprobe_tracker_run_oom_retry``; :meth:`~memprobe.Tracker.run_oom_retry`
    returns its report instead of raising this)."""


ERRORS: Dict[int, Type[MemprobeError]] = {
    Status.NULL_POINTER: NullPointerError,
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.INVALID_HANDLE: InvalidHandleError,
    Status.INVALID_ID: InvalidIdError,
    Status.WRONG_ORDER: WrongOrderError,
    Status.UNAVAILABLE: UnavailableError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.IO: IoError,
    Status.PARSE: ParseError,
    Status.GPU_LOST: GpuLostError,
    Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.PANIC: PanicError,
    Status.INTERNAL: InternalError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
}


def error_for(status: int, message: str) -> MemprobeError:
    """The exception for a failed call's status."""
    return ERRORS.get(status, MemprobeError)(status, message)
