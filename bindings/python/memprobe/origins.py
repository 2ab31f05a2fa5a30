"""Who holds this process's GPU memory: the origins the driver-API
interposer names for every allocation it counts (the first library outside
the CUDA driver and runtime on the allocating stack), now and at each
device's peak::

    from memprobe import origins
    for o in origins.live(0):                # device 0, largest first
        print(o.file_name, o.bytes)          # libc10_cuda.so 70254592 ...
    peak = origins.at_peak(0)                # the breakdown at the peak
    print(peak.peak, [(o.file_name, o.bytes) for o in peak.by_origin])
    oom = origins.at_oom()                   # what was live at the last OOM
    if oom is not None:
        print(oom.device, oom.held, [(o.file_name, o.bytes) for o in oom.by_origin])

Needs the interposer in this process (``memprobe run --gpu-exact -- CMD``);
without it every call raises :class:`~memprobe.errors.UnavailableError`.
``origins.HOST_PINNED`` as the device reads pinned host memory.
"""

from __future__ import annotations

from ctypes import byref, c_int32, c_size_t, c_uint64
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from . import _ffi
from ._ffi import C, check
from .errors import Status

#: The ``device`` that reads pinned host memory instead of a device.
HOST_PINNED = _ffi.MEMPROBE_GPU_ORIGINS_HOST_PINNED


@dataclass(frozen=True)
class Origin:
    """The bytes one origin holds (now, or at the peak)."""

    id: int
    library: str
    symbol: Optional[str]
    bytes: int
    address: int
    offset: int
    #: Whether the library is this process's own executable.
    program: bool = False

    @property
    def file_name(self) -> str:
        """The library's file name (``libnccl.so.2``)."""
        return self.library.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class PeakOrigins:
    """The bytes by origin at a device's highest use so far."""

    peak: int
    at_ns: int
    by_origin: List[Origin]


@dataclass(frozen=True)
class OomOrigins:
    """What this process held by origin when an allocation last failed with
    out-of-memory."""

    #: The failing device (:data:`HOST_PINNED` for pinned host memory).
    device: int
    #: What the process held there then (the sum of ``by_origin``).
    held: int
    #: When it failed, ``CLOCK_MONOTONIC`` nanoseconds.
    at_ns: int
    by_origin: List[Origin]


def _origin(c: Any) -> Origin:
    return Origin(
        id=int(c.id),
        library=bytes(c.library).decode(errors="replace"),
        symbol=bytes(c.symbol).decode(errors="replace") if c.has_symbol else None,
        bytes=int(c.bytes),
        address=int(c.address),
        offset=int(c.offset),
        program=bool(c.is_program),
    )


def _read(call: Callable[[Any, int, Any], int]) -> List[Origin]:
    n = c_size_t(0)
    status = call(None, 0, byref(n))
    if status not in (Status.OK, Status.BUFFER_TOO_SMALL):
        check(status)
    while True:
        cap = max(int(n.value), 1)
        arr = (_ffi.memprobe_gpu_origin * cap)()
        status = call(arr, cap, byref(n))
        if status == Status.BUFFER_TOO_SMALL and n.value > cap:
            continue  # an origin appeared meanwhile
        check(status)
        return [_origin(arr[i]) for i in range(int(n.value))]


def live(device: int) -> List[Origin]:
    """``memprobe_gpu_origins_live``: the bytes held now on ``device`` (or
    :data:`HOST_PINNED`), by origin, largest first."""
    return _read(lambda out, cap, n: int(C.memprobe_gpu_origins_live(int(device), out, cap, n)))


def at_peak(device: int) -> PeakOrigins:
    """``memprobe_gpu_origins_at_peak``: the bytes by origin at ``device``'s
    peak so far (``peak`` 0 and no origins before anything was counted)."""
    peak, at = c_uint64(0), c_uint64(0)

    def call(out: Any, cap: int, n: Any) -> int:
        return int(
            C.memprobe_gpu_origins_at_peak(int(device), out, cap, n, byref(peak), byref(at))
        )

    by_origin = _read(call)
    return PeakOrigins(peak=int(peak.value), at_ns=int(at.value), by_origin=by_origin)


def at_oom() -> Optional[OomOrigins]:
    """``memprobe_gpu_origins_at_oom``: the bytes by origin on the device of
    the last allocation that failed with out-of-memory, as the interposer
    copied them inside that allocation; ``None`` before any failure."""
    device, held, at = c_int32(0), c_uint64(0), c_uint64(0)

    def call(out: Any, cap: int, n: Any) -> int:
        return int(C.memprobe_gpu_origins_at_oom(out, cap, n, byref(device), byref(held), byref(at)))

    by_origin = _read(call)
    if device.value == _ffi.MEMPROBE_GPU_ORIGINS_NO_OOM:
        return None
    return OomOrigins(device=int(device.value), held=int(held.value), at_ns=int(at.value), by_origin=by_origin)
