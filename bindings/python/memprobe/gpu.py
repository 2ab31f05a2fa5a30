"""GPUs: fastai's ``utils.mem`` functions, and the readings in bytes.

The fastai names keep fastai's units and conventions — MiB (``b2mb``), and
zeros instead of an exception when a reading fails (no GPU, no such id, a
driver error)::

    from memprobe.gpu import gpu_mem_get, gpu_mem_get_all, gpu_with_max_free_mem
    gpu_mem_get()            # GPUMemory(total=81559, free=80754, used=805)
    gpu_mem_get_all()        # [GPUMemory(...), ...]; [] without a GPU
    gpu_with_max_free_mem()  # (0, 80754); (None, 0) without a GPU

The rest speaks bytes and raises :class:`~memprobe.MemprobeError` subclasses:
:func:`memory`, :func:`memory_all`, :func:`count`, :func:`info`,
:class:`Device` (a pre-resolved handle, fastai's ``gpu_handle``),
``Source.gpu_device(id)`` / ``Source.gpu_process(id)`` for windows, traces
and trackers.

Device ids are CUDA's, as this process sees them (``CUDA_VISIBLE_DEVICES``
applied). NVML is the default backend (no CUDA context); see
:func:`configure` and ``MEMPROBE_GPU_BACKEND``.
"""

from __future__ import annotations

import enum
import functools
import warnings
from collections import namedtuple
from ctypes import byref, c_int64, c_size_t, c_uint32, c_uint64
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple, TypeVar, Union, cast

from . import _ffi
from ._ffi import C, check
from ._owned import Owned
from .errors import MemprobeError, Status
from .sources import Source
from .trace import Trace
from .units import b2mb

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])

#: fastai's namedtuple, in MiB.
GPUMemory = namedtuple("GPUMemory", ["total", "free", "used"])

CURRENT_DEVICE = -1


class Backend(enum.IntEnum):
    """``memprobe_gpu_backend``."""

    AUTO = 0
    NVML = 1
    CUDART = 2
    NONE = 3


@dataclass(frozen=True)
class GpuMemoryInfo:
    """One reading of a GPU's memory, bytes. ``reserved`` is ``None``
    unless the driver reports it apart (NVML's v2 query)."""

    total: int
    free: int
    used: int
    reserved: Optional[int]
    taken_at_ns: int
    read_ns: int

    def mb(self) -> GPUMemory:
        """fastai's ``GPUMemory(total, free, used)`` in MiB."""
        return GPUMemory(b2mb(self.total), b2mb(self.free), b2mb(self.used))

    @classmethod
    def _from_c(cls, m: "_ffi.memprobe_gpu_memory") -> "GpuMemoryInfo":
        return cls(
            total=int(m.total),
            free=int(m.free),
            used=int(m.used),
            reserved=int(m.reserved) if m.valid & _ffi.MEMPROBE_GPU_MEMORY_RESERVED else None,
            taken_at_ns=int(m.taken_at_ns),
            read_ns=int(m.read_ns),
        )


@dataclass(frozen=True)
class GpuInfo:
    """What is known about a device; unknown strings are ``None``."""

    id: int
    backend: Backend
    nvml_index: Optional[int]
    name: Optional[str]
    uuid: Optional[str]
    pci_bus_id: Optional[str]


def _text(raw: bytes, ok: bool) -> Optional[str]:
    return raw.decode("utf-8", "replace") if ok else None


# --- configuration ----------------------------------------------------------


def configure(backend: Union[str, int] = "auto", nvml_path: Optional[str] = None, cudart_path: Optional[str] = None) -> None:
    """Chooses the backend (``"auto"``, ``"nvml"``, ``"cudart"``, ``"none"``
    or a :class:`Backend`) and libraries instead of the environment. Call it
    before any other GPU call (else :class:`~memprobe.WrongOrderError`)."""
    b = Backend[backend.upper()] if isinstance(backend, str) else Backend(backend)
    check(
        C.memprobe_gpu_configure(
            int(b),
            None if nvml_path is None else str(nvml_path).encode(),
            None if cudart_path is None else str(cudart_path).encode(),
        )
    )


def backend() -> Backend:
    """The backend in use (``Backend.NONE`` when there is none)."""
    out = c_uint32()
    check(C.memprobe_gpu_get_backend(byref(out)))
    return Backend(out.value)


def count() -> int:
    """How many GPUs this process sees; 0 when there is no backend."""
    out = c_uint32()
    status = C.memprobe_gpu_count(byref(out))
    if status not in (Status.OK, Status.UNAVAILABLE):
        check(status)
    return int(out.value)


def info(id: int) -> GpuInfo:
    """Name, UUID, PCI bus id, NVML index and backend of device ``id``."""
    i = _ffi.memprobe_gpu_info()
    check(C.memprobe_gpu_get_info(int(id), byref(i)))
    v = i.valid
    return GpuInfo(
        id=int(i.id),
        backend=Backend(i.backend),
        nvml_index=int(i.nvml_index) if v & _ffi.MEMPROBE_GPU_INFO_NVML_INDEX else None,
        name=_text(i.name, v & _ffi.MEMPROBE_GPU_INFO_NAME),
        uuid=_text(i.uuid, v & _ffi.MEMPROBE_GPU_INFO_UUID),
        pci_bus_id=_text(i.pci_bus_id, v & _ffi.MEMPROBE_GPU_INFO_PCI_BUS_ID),
    )


def devices() -> List[GpuInfo]:
    """Every device this process sees."""
    return [info(i) for i in range(count())]


def current_device() -> int:
    out = c_uint32()
    check(C.memprobe_gpu_get_current_device(byref(out)))
    return int(out.value)


def set_current_device(id: int) -> None:
    """The device of the readings that take none (NVML: memprobe's own
    setting; CUDA runtime: ``cudaSetDevice`` on this thread)."""
    check(C.memprobe_gpu_set_current_device(int(id)))


_release_keep: List[Any] = []


def set_cache_release(fn: Optional[Callable[[], object]]) -> None:
    """Registers the cache-release callback that the ``*_no_cache``
    readings call first (e.g. :func:`memprobe.integrations.torch.empty_cache_release`);
    ``None`` removes it. One per process."""
    if fn is None:
        check(C.memprobe_gpu_set_cache_release(_ffi.memprobe_release_fn(), None))  # NULL
        _release_keep.clear()
        return

    def c_release(_ud: Any) -> int:
        try:
            fn()
            return 0
        except BaseException:  # noqa: BLE001 - reported as a failed release
            return 1

    cb = _ffi.memprobe_release_fn(c_release)
    check(C.memprobe_gpu_set_cache_release(cb, None))
    _release_keep[:] = [cb]  # the library calls it until replaced


def preload() -> None:
    """Creates the CUDA context on the current device now (cudaFree(0)),
    so that later readings do not jump when the framework creates it."""
    check(C.memprobe_gpu_preload())


def live_devices() -> int:
    """Live :class:`Device` handles (leak checks)."""
    out = c_uint64()
    check(C.memprobe_gpu_debug_live_devices(byref(out)))
    return int(out.value)


# --- readings in bytes --------------------------------------------------------


def memory(id: Optional[int] = None) -> GpuMemoryInfo:
    """Total, free, used and reserved bytes of device ``id`` (None: the
    current one). Raises :class:`~memprobe.UnavailableError` without a GPU,
    :class:`~memprobe.InvalidIdError` for no such id."""
    m = _ffi.memprobe_gpu_memory()
    check(C.memprobe_gpu_mem_get(CURRENT_DEVICE if id is None else int(id), byref(m)))
    return GpuMemoryInfo._from_c(m)


def memory_all() -> List[GpuMemoryInfo]:
    """The reading of every device, in id order ([] without a GPU)."""
    n = c_size_t()
    status = C.memprobe_gpu_mem_get_all(None, 0, byref(n))
    if status == Status.UNAVAILABLE:
        return []
    if status not in (Status.OK, Status.BUFFER_TOO_SMALL):
        check(status)
    while True:
        cap = max(int(n.value), 1)
        arr = (_ffi.memprobe_gpu_memory * cap)()
        status = C.memprobe_gpu_mem_get_all(arr, cap, byref(n))
        if status == Status.BUFFER_TOO_SMALL and n.value > cap:
            continue  # a device appeared meanwhile
        check(status)
        return [GpuMemoryInfo._from_c(arr[i]) for i in range(int(n.value))]


def _bytes_reading(fn: Callable[..., int]) -> int:
    out = c_uint64()
    check(fn(byref(out)))
    return int(out.value)


class Device(Owned):
    """A pre-resolved GPU (fastai's ``gpu_handle``): readings through it do
    no lookup. Close it, or use ``with``."""

    _FREE = "memprobe_gpu_device_free"

    def __init__(self, id: int):
        h = _ffi.out_handle()
        check(C.memprobe_gpu_device_open(int(id), byref(h)))
        self.id = int(id)
        self._handle = h.value
        self._closed = False

    def used_fast(self) -> int:
        """Used bytes: one driver query, no lookup."""
        out = c_uint64()
        check(C.memprobe_gpu_mem_get_used_fast(self._handle, byref(out)))
        return int(out.value)

    def memory(self) -> GpuMemoryInfo:
        m = _ffi.memprobe_gpu_memory()
        check(C.memprobe_gpu_device_mem_get(self._handle, byref(m)))
        return GpuMemoryInfo._from_c(m)

    def process_used(self) -> int:
        """Bytes this process uses on the device (0 without a context there)."""
        out = c_uint64()
        check(C.memprobe_gpu_device_process_used(self._handle, byref(out)))
        return int(out.value)


    def __repr__(self) -> str:
        return f"<memprobe.gpu.Device {self.id}{' (closed)' if self._closed else ''}>"


# --- fastai's utils.mem, in MiB -------------------------------------------------

def _zero_on_no_gpu(fn: Callable[[], _T], zero: _T) -> _T:
    # fastai's functions answer zeros for any failure (no GPU, an invalid
    # id, a driver error); the bytes-level functions raise instead.
    try:
        return fn()
    except MemprobeError:
        return zero


def gpu_mem_get(id: Optional[int] = None) -> GPUMemory:
    """fastai: ``GPUMemory(total, free, used)`` in MiB of device ``id``
    (default: the current one); ``GPUMemory(0, 0, 0)`` without a GPU or for
    an invalid id."""
    return _zero_on_no_gpu(lambda: memory(id).mb(), GPUMemory(0, 0, 0))


def gpu_mem_get_all() -> List[GPUMemory]:
    """fastai: ``[GPUMemory(...), ...]`` in MiB for every device; ``[]`` without a GPU."""
    none: List[GpuMemoryInfo] = []
    return [m.mb() for m in _zero_on_no_gpu(memory_all, none)]


def gpu_mem_get_free() -> int:
    """fastai: free MiB on the current device, caches untouched."""
    return _zero_on_no_gpu(lambda: b2mb(_bytes_reading(C.memprobe_gpu_mem_get_free)), 0)


def gpu_mem_get_free_no_cache() -> int:
    """fastai: free MiB on the current device after the cache-release
    callback (:func:`set_cache_release`) ran."""
    return _zero_on_no_gpu(lambda: b2mb(_bytes_reading(C.memprobe_gpu_mem_get_free_no_cache)), 0)


def gpu_mem_get_used() -> int:
    """fastai: used MiB on the current device, caches untouched."""
    return _zero_on_no_gpu(lambda: b2mb(_bytes_reading(C.memprobe_gpu_mem_get_used)), 0)


def gpu_mem_get_used_no_cache() -> int:
    """fastai: used MiB on the current device after the cache-release callback ran."""
    return _zero_on_no_gpu(lambda: b2mb(_bytes_reading(C.memprobe_gpu_mem_get_used_no_cache)), 0)


def gpu_mem_get_used_fast(gpu_handle: Device) -> int:
    """fastai: used MiB of a pre-resolved device (``Device(id)``)."""
    return b2mb(gpu_handle.used_fast())


def gpu_with_max_free_mem() -> Tuple[Optional[int], int]:
    """fastai: ``(id, free MiB)`` of the first device with the most free
    memory; ``(None, 0)`` without a GPU."""
    id_, free = c_int64(), c_uint64()
    C.memprobe_gpu_with_max_free_mem(byref(id_), byref(free))
    if id_.value == _ffi.MEMPROBE_GPU_NO_DEVICE:
        return None, 0
    return int(id_.value), b2mb(free.value)


def preload_pytorch() -> None:
    """fastai: create the CUDA context now (about 0.5 GB), so that later
    measurements do not include it. Needs no torch import: the context
    memprobe creates through the CUDA runtime is the one PyTorch uses."""
    preload()


def gpu_source(id: Optional[int] = None) -> Source:
    """A source over device ``id`` (default: the current one)."""
    return Source.gpu_device(current_device() if id is None else id)


class NoGPUWarning(UserWarning):
    """Issued once per process when a fastai-style trace finds no GPU and
    reports zeros instead, as fastai does on a CPU."""


_no_gpu_noted = False


def _gpu_source_or_zeros() -> Source:
    """The current GPU's source; where it cannot be read (no GPU, no
    driver, an invalid current device), a source that stays at 0 bytes, so
    that fastai's traces report ``0 0`` as fastai's own do on a CPU (its
    ``gpu_mem_get_used_no_cache()`` answers 0 there). Noted once."""
    global _no_gpu_noted
    try:
        return gpu_source()
    except MemprobeError as e:
        if not _no_gpu_noted:
            _no_gpu_noted = True
            warnings.warn(
                f"memprobe.gpu: no GPU readings ({e}); GPUMemTrace and gpu_mem_trace report zeros, as fastai does without a GPU",
                NoGPUWarning,
                stacklevel=3,
            )
        zeros = Source.pushed("gpu")
        zeros.push(0)
        return zeros


class GPUMemTrace(Trace):
    """fastai's ``GPUMemTrace(silent=False, ctx=None, on_exit_report=True)``:
    a :class:`~memprobe.Trace` over the current GPU's used memory (sampled
    by the monitor while the trace runs). Without a GPU it follows fastai:
    no exception, every figure 0 (a :class:`NoGPUWarning` once per
    process)."""

    def __init__(self, silent: bool = False, ctx: Optional[str] = None, on_exit_report: bool = True, **kw: Any) -> None:
        super().__init__(_gpu_source_or_zeros(), silent=silent, ctx=ctx, on_exit_report=on_exit_report, **kw)


def gpu_mem_trace(func: _F) -> _F:
    """fastai's decorator: runs the function in a :class:`GPUMemTrace` that
    reports ``(<qualname>: exit)``."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = GPUMemTrace(ctx=func.__qualname__, start=False)
        try:
            with t:
                return func(*args, **kwargs)
        finally:
            t.close()

    return cast(_F, wrapper)


__all__ = [
    "Backend",
    "Device",
    "GPUMemTrace",
    "GPUMemory",
    "GpuInfo",
    "GpuMemoryInfo",
    "NoGPUWarning",
    "b2mb",
    "configure",
    "count",
    "current_device",
    "devices",
    "gpu_mem_get",
    "gpu_mem_get_all",
    "gpu_mem_get_free",
    "gpu_mem_get_free_no_cache",
    "gpu_mem_get_used",
    "gpu_mem_get_used_fast",
    "gpu_mem_get_used_no_cache",
    "gpu_mem_trace",
    "gpu_source",
    "gpu_with_max_free_mem",
    "info",
    "live_devices",
    "memory",
    "memory_all",
    "preload",
    "preload_pytorch",
    "set_cache_release",
    "set_current_device",
]
