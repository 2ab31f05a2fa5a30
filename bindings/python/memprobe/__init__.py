"""memprobe: exact memory measurement for machine-learning training.

Python bindings (ctypes) over libmemprobe's C ABI::

    import memprobe

    rss = memprobe.Source.process()          # this process's RSS, exact peaks
    print(rss.read().used)

    with memprobe.Window(rss) as step:       # concurrent, nestable windows
        train_step()
        print(step.peak())

    with memprobe.Trace(ctx="eval"):         # fastai's GPUMemTrace, any source
        evaluate()                            # △Used Peaked MB: ... (eval: exit)

Every quantity is in bytes; ``b2mb`` and the ``*_mb`` helpers give fastai's
MiB. Failures raise :class:`MemprobeError` subclasses carrying the status.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _deprecated, gpu, monitor
from ._ffi import FOUND_BY as _FOUND_BY
from ._ffi import LIBRARY_PATH as _LIBRARY_PATH
from ._ffi import C as _C
from ._ffi import check as _check
from ._ffi import status_name
from ._ffi import version as library_version
from . import _loader
from ._loader import LibraryNotFoundError
from ._version import ABI, __version__
from .exporter import Exporter
from .marks import MarkGroup
from .errors import (
    BufferTooSmallError,
    GpuLostError,
    InternalError,
    InvalidArgumentError,
    InvalidHandleError,
    InvalidIdError,
    IoError,
    MemprobeError,
    NullPointerError,
    OutOfMemoryError,
    PanicError,
    ParseError,
    PermissionDeniedError,
    Status,
    UnavailableError,
    UnsupportedError,
    WrongOrderError,
)
from .monitor import MonitorStats
from .notebook import load_ipython_extension, unload_ipython_extension
from .sources import Fidelity, Sample, Source, SourceInfo, SourceKind
from .trace import Trace, mem_trace
from .tracker import (
    LeakStatus,
    OomCache,
    OomReportStatus,
    OomRetryResult,
    PhaseKind,
    PhaseRecord,
    Tracker,
)
from .units import MiB, b2mb
from .windows import Delta, Window


def __getattr__(name: str) -> Any:
    return _deprecated.old_name(__name__, name, globals())


def library_path() -> str:
    """The libmemprobe.so file this package loaded."""
    return _LIBRARY_PATH


def library_found_by() -> str:
    """How the library was found: ``MEMPROBE_LIBRARY``, ``bundled``, ..."""
    return _FOUND_BY


def interposer_library() -> Optional[str]:
    """The GPU driver-API interposer this package carries
    (``memprobe/_lib/libmemprobe_interpose.abi3.so``; None when the package
    was not built with it): ``LD_PRELOAD`` it to count every device
    allocation of a program exactly (docs/gpu.md). ``memprobe run
    --gpu-exact`` finds it by itself."""
    p = _loader.bundled_interposer()
    return None if p is None else str(p)


def soname() -> str:
    """The loaded library's SONAME, e.g. ``libmemprobe.so.0.1``."""
    return str(_C.memprobe_soname().decode())


def live_handles() -> Tuple[int, int, int, int]:
    """``(sources, windows, traces, trackers)`` handles alive in the library
    (for leak checks)."""
    from ctypes import byref, c_uint64

    s, w, t, k = c_uint64(), c_uint64(), c_uint64(), c_uint64()
    _check(_C.memprobe_debug_live_handles(byref(s), byref(w), byref(t), byref(k)))
    return int(s.value), int(w.value), int(t.value), int(k.value)


__all__ = [
    "ABI",
    "BufferTooSmallError",
    "Delta",
    "Exporter",
    "Fidelity",
    "GpuLostError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "InvalidIdError",
    "IoError",
    "LeakStatus",
    "LibraryNotFoundError",
    "MarkGroup",
    "MemprobeError",
    "MiB",
    "MonitorStats",
    "NullPointerError",
    "OomCache",
    "OomReportStatus",
    "OomRetryResult",
    "OutOfMemoryError",
    "PanicError",
    "ParseError",
    "PermissionDeniedError",
    "PhaseKind",
    "PhaseRecord",
    "Sample",
    "Source",
    "SourceInfo",
    "SourceKind",
    "Status",
    "Trace",
    "Tracker",
    "UnavailableError",
    "UnsupportedError",
    "Window",
    "WrongOrderError",
    "__version__",
    "b2mb",
    "gpu",
    "interposer_library",
    "library_found_by",
    "library_path",
    "library_version",
    "live_handles",
    "load_ipython_extension",
    "mem_trace",
    "monitor",
    "soname",
    "status_name",
    "unload_ipython_extension",
]
