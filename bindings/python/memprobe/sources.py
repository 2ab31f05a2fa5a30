"""Sources: what memprobe measures, and one reading of it."""

from __future__ import annotations

import atexit
import enum
from ctypes import byref, c_uint64
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Union

from . import _ffi
from ._ffi import C, check
from ._owned import Owned
from .errors import MemprobeError, Status
from .units import b2mb


class SourceKind(enum.IntEnum):
    """``memprobe_source_kind``: what a source measures."""

    PROCESS = 0
    PROCESS_TREE = 1
    SYSTEM_RAM = 2
    CGROUP = 3
    GPU_DEVICE = 4
    GPU_PROCESS = 5
    CUSTOM = 6
    PROCESS_PSS = 7
    PROCESS_USS = 8
    #: This process's memory on one GPU, counted by the driver-API interposer.
    GPU_EXACT = 9
    #: The PSS of this process and its descendants (shared pages once).
    PROCESS_TREE_PSS = 10
    #: The USS of this process and its descendants.
    PROCESS_TREE_USS = 11


class Fidelity(enum.IntEnum):
    """``memprobe_fidelity``: how exact a source's peaks are."""

    #: A kernel or driver high-water mark: no spike is missed.
    EXACT = 0
    #: Values pushed by the caller: as exact as the pushes.
    PUSHED = 1
    #: Polled by the monitor: spikes shorter than its interval can be missed.
    SAMPLED = 2


def _enum(cls: Any, value: int) -> Any:
    """``cls(value)``, or the plain value when it is newer than this package."""
    try:
        return cls(value)
    except ValueError:  # a value newer than this package
        return value


@dataclass(frozen=True)
class Sample:
    """One reading, in bytes. Fields the source cannot supply are ``None``."""

    used: int
    total: Optional[int]
    free: Optional[int]
    limit: Optional[int]
    reserved: Optional[int]
    #: When the reading was taken, CLOCK_MONOTONIC nanoseconds.
    taken_at_ns: int
    #: How long the read took, nanoseconds.
    read_ns: int

    @property
    def used_mb(self) -> int:
        """``used`` in MiB, rounded down (fastai's ``b2mb``)."""
        return b2mb(self.used)

    @classmethod
    def _from_c(cls, s: _ffi.memprobe_sample) -> "Sample":
        # The hot path of every read: fill the frozen instance's __dict__
        # directly (a frozen dataclass's __init__ costs 4x more).
        v = s.valid
        obj = _new(cls)
        obj.__dict__.update(
            used=s.used,
            total=s.total if v & _ffi.MEMPROBE_SAMPLE_TOTAL else None,
            free=s.free if v & _ffi.MEMPROBE_SAMPLE_FREE else None,
            limit=s.limit if v & _ffi.MEMPROBE_SAMPLE_LIMIT else None,
            reserved=s.reserved if v & _ffi.MEMPROBE_SAMPLE_RESERVED else None,
            taken_at_ns=s.taken_at_ns,
            read_ns=s.read_ns,
        )
        return obj


_new = object.__new__


@dataclass(frozen=True)
class SourceInfo:
    """Name, kind and peak fidelity of a source."""

    name: str
    kind: SourceKind
    fidelity: Fidelity


_finalizing = False
_read = C.memprobe_source_read
_read_used = C.memprobe_source_read_used


@atexit.register
def _stop_monitor_at_exit() -> None:
    # Callback sources run Python on the monitor thread; stop it before the
    # interpreter goes away. It restarts only if a window opens again.
    global _finalizing
    _finalizing = True
    try:
        C.memprobe_monitor_stop()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


class Source(Owned):
    """A source of readings. Create one with a class method
    (:meth:`process`, :meth:`pushed`, ...); release it with :meth:`close`
    or a ``with`` block (it is also released when garbage-collected).
    Windows and traces over a source keep it alive until they close."""

    _FREE = "memprobe_source_free"

    __slots__ = ("_handle", "_closed", "_info", "_keep", "_callback_error", "__weakref__")

    def __init__(self, _handle: Optional[int], _keep: object = None):
        # Private: use the class methods.
        self._handle = _handle
        self._closed = False
        self._info: Optional[SourceInfo] = None
        self._keep = _keep  # a ctypes callback that must outlive the handle
        self._callback_error: List[BaseException] = []

    @classmethod
    def _new(cls, fn: Callable[..., int], *args: Any, keep: object = None) -> "Source":
        h = _ffi.out_handle()
        check(fn(*args, byref(h)))
        return cls(h.value, keep)

    @classmethod
    def process(cls, *, preserve_hwm: bool = False) -> "Source":
        """This process's RSS. Its peak is exact (the kernel's high-water
        mark) unless ``preserve_hwm``: then ``VmHWM`` is never reset and the
        peak is sampled by the monitor."""
        flags = _ffi.MEMPROBE_PROCESS_PRESERVE_HWM if preserve_hwm else 0
        return cls._new(C.memprobe_source_new_process, flags)

    @classmethod
    def process_tree(cls) -> "Source":
        """This process and all its descendants (e.g. DataLoader workers); sampled."""
        return cls._new(C.memprobe_source_new_process_tree)

    @classmethod
    def system_ram(cls) -> "Source":
        """The machine's RAM: used = MemTotal - MemAvailable; sampled."""
        return cls._new(C.memprobe_source_new_system_ram)

    @classmethod
    def cgroup(cls) -> "Source":
        """The container's memory cgroup (v1 or v2): usage and limit.
        :class:`~memprobe.UnavailableError` when there is none."""
        return cls._new(C.memprobe_source_new_cgroup)

    @classmethod
    def smaps(cls, metric: str = "pss") -> "Source":
        """This process's PSS (``"pss"``) or USS (``"uss"``) from
        ``/proc/self/smaps_rollup`` (costs milliseconds per GiB mapped)."""
        return cls._new(C.memprobe_source_new_smaps, _smaps_code(metric))

    @classmethod
    def process_tree_smaps(cls, metric: str = "pss") -> "Source":
        """The PSS (``"pss"``) or USS (``"uss"``) of this process and all its
        descendants: the sum of each one's ``/proc/<pid>/smaps_rollup``;
        sampled. Pages that DataLoader workers share copy-on-write with the
        trainer count once (PSS), where the tree's summed RSS counts them once
        per process. Each read walks every mapping of every process of the
        tree (milliseconds for big processes); processes that exit during a
        read are skipped. :class:`~memprobe.PermissionDeniedError` when a
        process of the tree belongs to another user."""
        return cls._new(C.memprobe_source_new_process_tree_smaps, _smaps_code(metric))

    @classmethod
    def pushed(cls, name: str) -> "Source":
        """A source whose value you push with :meth:`push` (e.g. a framework
        allocator's allocated bytes). ``name``: 1 to 64 printable bytes."""
        return cls._new(C.memprobe_source_new_pushed, name.encode())

    @classmethod
    def callback(cls, name: str, read: Callable[[], int]) -> "Source":
        """A custom source: ``read()`` returns the bytes in use. It is called
        by :meth:`read` and, while a window is open over the source, by the
        monitor thread (so it must be thread-safe and quick). An exception
        in ``read`` fails that reading; :meth:`read` re-raises it as the
        cause of an :class:`~memprobe.UnavailableError`."""
        errors: List[BaseException] = []

        def c_read(_user_data: Any, out: Any) -> int:
            if _finalizing:
                return 1
            try:
                value = int(read())
                if value < 0:
                    raise ValueError(f"read() returned {value} bytes")
                out[0] = value
                return 0
            except BaseException as e:  # noqa: BLE001 - reported through the status
                errors[:] = [e]
                return 1

        fn = _ffi.memprobe_read_fn(c_read)
        src = cls._new(C.memprobe_source_new_callback, name.encode(), fn, None, keep=fn)
        src._callback_error = errors
        return src

    @classmethod
    def gpu_device(cls, id: int = 0) -> "Source":
        """Device ``id``'s memory ("gpu<id>"): used, total, free, reserved.
        Sampled: the monitor polls it while a window is open over it."""
        return cls._new(C.memprobe_source_new_gpu_device, int(id))

    @classmethod
    def gpu_process(cls, id: int = 0) -> "Source":
        """This process's memory on device ``id`` ("gpu<id>.proc"), from
        the driver's process list; sampled."""
        return cls._new(C.memprobe_source_new_gpu_process, int(id))

    @classmethod
    def gpu_exact(cls, id: int = 0) -> "Source":
        """This process's memory on CUDA device ``id`` ("gpu_exact:<id>"),
        counted by the driver-API interposer ``libmemprobe_interpose.so`` at
        every allocation and free, whatever allocates (PyTorch, JAX, cuBLAS
        workspaces, NCCL). Exact: the interposer keeps a high-water mark per
        source, folded at every window boundary; no polling.
        :class:`~memprobe.UnavailableError` (with the library's message)
        when the interposer is not loaded in this process: run the program
        under ``memprobe run --gpu-exact -- python train.py`` or with
        ``LD_PRELOAD=libmemprobe_interpose.so``."""
        return cls._new(C.memprobe_source_new_gpu_exact, int(id))

    def last_error(self) -> Optional[MemprobeError]:
        """Why the source's last read failed — by :meth:`read`, a window
        boundary or the monitor thread (e.g. :class:`~memprobe.GpuLostError`
        for a GPU lost while polled) — or ``None`` when it succeeded."""
        return _ffi.stored_error(lambda err, buf, size, needed: int(C.memprobe_source_get_last_error(self._handle, err, buf, size, needed)))

    def read(self) -> Sample:
        """Takes one reading now (a pushed source returns its last value)."""
        s = _ffi.memprobe_sample()
        status = _read(self._handle, byref(s))
        if status:
            self._raise_read_error(status)
        return Sample._from_c(s)

    def used(self) -> int:
        """Bytes in use now: the cheapest read, e.g. in a hot loop (no
        :class:`Sample`, no clock read; it still counts towards the peak of
        every open window)."""
        out = c_uint64()
        status = _read_used(self._handle, byref(out))
        if status:
            self._raise_read_error(status)
        return int(out.value)

    def _raise_read_error(self, status: int) -> None:
        check_over(status, (self,))

    def push(self, used: int) -> None:
        """Pushes the current value of a pushed source, in bytes."""
        check(C.memprobe_source_push(self._handle, int(used)))

    def info(self) -> SourceInfo:
        """Name, kind and fidelity (from the library)."""
        if self._info is None:
            i = _ffi.memprobe_source_info()
            check(C.memprobe_source_get_info(self._handle, byref(i)))
            self._info = SourceInfo(
                name=i.name.decode("utf-8", "replace"),
                kind=_enum(SourceKind, i.kind),
                fidelity=_enum(Fidelity, i.fidelity),
            )
        return self._info

    @property
    def name(self) -> str:
        return self.info().name

    @property
    def kind(self) -> SourceKind:
        return self.info().kind

    @property
    def fidelity(self) -> Fidelity:
        return self.info().fidelity


    def __repr__(self) -> str:
        if self._closed:
            return "<memprobe.Source (closed)>"
        try:
            i = self.info()
            return f"<memprobe.Source {i.name!r} {i.kind.name.lower()} {i.fidelity.name.lower()}>"
        except MemprobeError:
            return "<memprobe.Source>"


def check_over(status: int, sources: Iterable[Source]) -> None:
    """:func:`check` for a call over ``sources``: a failure caused by an
    exception in one of their Python callbacks (a callback source, a
    :class:`~memprobe.MarkGroup`) is raised with that exception as its
    ``__cause__``."""
    if status == Status.OK:
        return
    try:
        check(status)
    except MemprobeError as e:
        for s in sources:
            if s._callback_error:
                raise e from s._callback_error.pop()
        raise


def as_sources(sources: Union[None, Source, Iterable[Source]]) -> List[Source]:
    """A list of sources from one source, an iterable of them, or None
    (this process's RSS)."""
    if sources is None:
        return [Source.process()]
    if isinstance(sources, Source):
        return [sources]
    out = list(sources)
    if not out:
        raise ValueError("at least one source is needed")
    for s in out:
        if not isinstance(s, Source):
            raise TypeError(f"expected memprobe.Source, got {type(s).__name__}")
    return out


def _smaps_code(metric: str) -> int:
    codes = {"pss": _ffi.MEMPROBE_SMAPS_PSS, "uss": _ffi.MEMPROBE_SMAPS_USS}
    code = codes.get(metric.lower()) if isinstance(metric, str) else metric
    if code is None:
        raise ValueError(f"metric must be 'pss' or 'uss', not {metric!r}")
    return code
