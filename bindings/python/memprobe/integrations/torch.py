"""PyTorch: exact sources over the CUDA caching allocator, and cache release.

torch is imported when a helper is called, never at ``import memprobe`` (nor
at ``import memprobe.integrations.torch``), and CUDA is never initialised by
memprobe: the allocator sources exist once PyTorch has initialised CUDA.

Allocator sources (:func:`allocator_sources`), per visible CUDA device ``N``
(torch's ordinal, so ``CUDA_VISIBLE_DEVICES`` applies; a device is named as
torch names it: ``N``, ``"cuda:N"``, ``"cuda"``, ``torch.device``):

- ``torch_alloc:N``: bytes allocated to tensors (``memory_allocated`` /
  ``max_memory_allocated``);
- ``torch_reserved:N``: bytes the caching allocator holds from the driver
  (``memory_reserved`` / ``max_memory_reserved``);
- ``torch_active:N`` (``active=True``): bytes in active blocks
  (``active_bytes``).

All are exact (fidelity ``EXACT``): the sources of one device form one
:class:`~memprobe.MarkGroup` whose reset is
``torch.cuda.reset_peak_memory_stats(N)``. At every window boundary memprobe
folds torch's high-water marks into every open window, carries the other
members' marks, then resets torch's peaks, so any number of nested and
concurrent windows (step, epoch, evaluation) keep exact peaks: a temporary
tensor that lives for a microsecond between two boundaries is in the peak.

There is one group per device per process, shared by every caller (every
:func:`allocator_sources` list, tracker, callback): torch has one peak
counter per device, and two groups over it would reset each other's peaks.
The sources are released when nothing holds them any more (no list, window,
trace or tracker); their :meth:`~memprobe.Source.close` does nothing, so
that one caller cannot take them from under another's windows.

Nothing changes for code that calls ``torch.cuda.max_memory_allocated`` /
``max_memory_reserved`` / ``memory_stats`` itself: memprobe resets torch's
peaks at each boundary, but keeps what they were just before (every peak
key, every pool) and answers each peak as torch would have without it —
the peak since the caller's last ``reset_peak_memory_stats`` (or the start),
exact (:mod:`._torch_user_peaks`; needs ``torch._C._cuda_memoryStats``,
which every CUDA build of torch has). :meth:`AllocatorSources.peak_since_start`
gives the peak since the sources were created.

The caller's own resets are carried: while a device's sources exist,
``torch.cuda.reset_peak_memory_stats`` (and ``torch.cuda.memory``'s, and
``reset_max_memory_allocated`` / ``reset_max_memory_cached``, which call
it, and ``torch._C._cuda_resetPeakMemoryStats`` under all of them, so that
a reference taken before memprobe wrapped them, as with
``from torch.cuda import reset_peak_memory_stats``, is carried too) is made a
memprobe boundary whose reset is the caller's: torch's peaks are folded into
every open window first, then reset as asked. What memprobe cannot carry is
a reset made from C++ (``c10::cuda::CUDACachingAllocator::resetPeakStats``
called by an extension): the part of the interval before it is lost. When
memprobe sees the evidence of one — a peak below a value it read since its
own last reset — it counts it (:func:`foreign_resets`) and warns once per
device (:class:`ForeignResetWarning`): the peaks of the windows open across
it may be low.

Sources made before ``os.fork()`` raise in the child
(:class:`~memprobe.UnavailableError`, caused by a RuntimeError saying so):
torch's CUDA state does not survive a fork, and torch would read 0 there.

Out-of-memory reports (:func:`report_oom`): one line attaches PyTorch's
out-of-memory observer to a tracker's report, written before
``torch.cuda.OutOfMemoryError`` is raised. With attribution on
(:mod:`.torch_attribution`), the same observer writes the table of what was
live at the failing allocation first, and the report's detail names it.

Host pinned memory (:func:`pinned_sources`, ``torch_pinned``) needs
``torch.cuda.host_memory_stats`` and ``reset_peak_host_memory_stats``, which
PyTorch 2.5 does not have (later releases do): it raises a clear error on a
torch without them.
"""

from __future__ import annotations

import gc
import operator
import os
import sys
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import MemprobeError
from ..marks import MarkGroup

if TYPE_CHECKING:
    from ..tracker import OomCache
from ..sources import Source
from ..windows import Window
from . import _torch_resets, _torch_user_peaks

#: Mark index -> (source name prefix, torch's stat name).
_DEVICE_MARKS = (
    ("torch_alloc", "allocated_bytes"),
    ("torch_reserved", "reserved_bytes"),
    ("torch_active", "active_bytes"),
)


class ForeignResetWarning(RuntimeWarning):
    """torch's peak counters were reset behind memprobe's back (from C++:
    a reset through torch's Python API is carried): the peaks of the windows
    open at the time may be low. Issued once per device and process;
    :func:`foreign_resets` counts every one seen."""


#: Bumped in a forked child: marks made before the fork refuse to read.
_FORKS = [0]


def _after_fork_in_child() -> None:
    _FORKS[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def _forked_error(made_in: int) -> RuntimeError:
    return RuntimeError(
        f"these PyTorch allocator sources were made in process {made_in}, before a fork: this is a "
        f"forked child (pid {os.getpid()}), where PyTorch's CUDA state is not usable (torch would read "
        "0 bytes here). Measure in the parent, or start workers with the 'spawn' method and make "
        "allocator sources there once CUDA is initialised"
    )


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError("memprobe.integrations.torch needs PyTorch: pip install torch") from e
    return torch


def cuda_initialized() -> bool:
    """Whether PyTorch has initialised CUDA in this process, without
    importing torch when it is not imported yet (then it has not)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False


class _DeviceMarks:
    """The caching allocator's marks of one device. One
    ``memory_stats_as_nested_dict(device)`` gives every mark of the device,
    so the group reads them all at once (:meth:`MarkGroup.many`): a window
    boundary over ``torch_alloc:N`` and ``torch_reserved:N`` makes two such
    reads and one ``reset_peak_memory_stats(N)``. The nested dictionary is
    the cheaper read: torch's own ``memory_allocated`` builds it and then
    flattens and sorts it.

    It also watches for resets it did not make: torch's peak never goes
    below any value read since the last reset, so a peak below the highest
    value memprobe read since its own last reset is a reset made elsewhere
    (from C++; a Python reset is carried, see the module's documentation)."""

    def __init__(self, torch: Any, device: int):
        cuda = torch.cuda
        self.device = device
        self._pid = os.getpid()
        self._forks = _FORKS[0]
        nested = getattr(cuda, "memory_stats_as_nested_dict", None)
        if nested is None:  # pragma: no cover - every torch since 1.4 has it
            flat = cuda.memory_stats

            def nested(d: int) -> Dict[str, Any]:
                out: Dict[str, Any] = {}
                for key, v in flat(d).items():
                    name, _, rest = key.partition(".all.")
                    if rest:
                        out.setdefault(name, {}).setdefault("all", {})[rest] = v
                return out

        # torch's own read under memprobe's caller view (the binding that
        # memory_stats_as_nested_dict(N) calls for an int N; one Python call
        # less at every boundary), else that function itself.
        raw_stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
        self._nested: Callable[[int], Dict[str, Any]] = (
            _torch_resets.unwrapped(raw_stats) if raw_stats is not None else nested
        )
        #: The statistics of the last peak read: folded into the caller's
        #: peaks at memprobe's reset that follows it (the same boundary).
        self._last: Optional[Dict[str, Any]] = None
        #: Set while the boundary is the caller's own reset, carried.
        self.user_reset = False
        # torch's own reset, not memprobe's carrying wrapper around it: the
        # binding that reset_peak_memory_stats(N) calls for an int N (one
        # Python call less at every boundary), else that function itself,
        # with the wrappers under it told that the reset is memprobe's.
        raw = getattr(getattr(torch, "_C", None), "_cuda_resetPeakMemoryStats", None)
        self._guarded = raw is None
        self._reset = _torch_resets.unwrapped(cuda.reset_peak_memory_stats if raw is None else raw)
        #: Per mark index: the highest value read since memprobe's last reset.
        self._floor = [0] * len(_DEVICE_MARKS)
        self.foreign_resets = 0
        self._warned = False

    def read_many(self, what: str, indices: Sequence[int]) -> List[int]:
        if self._forks != _FORKS[0]:
            raise _forked_error(self._pid)
        stats = self._nested(self.device)
        if what == "peak":
            self._last = stats
        # An allocator that never allocated has no entry yet: 0 bytes.
        values = [int(stats.get(_DEVICE_MARKS[i][1], {}).get("all", {}).get(what, 0)) for i in indices]
        floor = self._floor
        lost = False
        for i, v in zip(indices, values):
            if v > floor[i]:
                floor[i] = v
            elif v < floor[i] and what == "peak":
                lost = True
                floor[i] = v
        if lost:
            self._lost_reset()
        return values

    def _lost_reset(self) -> None:
        self.foreign_resets += 1
        if self._warned:
            return
        self._warned = True
        try:
            warnings.warn(
                ForeignResetWarning(
                    f"torch's peak memory statistics of cuda:{self.device} were reset outside memprobe "
                    "(from C++, e.g. c10::cuda::CUDACachingAllocator::resetPeakStats): the peaks of the "
                    "windows open across that reset may be low. Resets through torch's Python API are "
                    "carried; memprobe.integrations.torch.foreign_resets() counts the others"
                ),
                stacklevel=2,
            )
        except Exception:  # noqa: BLE001 - a warnings filter set to "error": counted all the same
            pass

    def reset(self) -> None:
        if self._forks != _FORKS[0]:
            raise _forked_error(self._pid)
        last, self._last = self._last, None
        if self._guarded:
            with _torch_resets.OWN_RESET:
                self._reset(self.device)
        else:
            self._reset(self.device)
        # The caller's view keeps what this reset dropped (not when the
        # reset is the caller's own: nothing before it counts then).
        if last is not None and not self.user_reset:
            _torch_user_peaks.fold(self.device, last)
        self._floor = [0] * len(_DEVICE_MARKS)


class _HostMarks:
    """The pinned host allocator's mark (``host_memory_stats``)."""

    def __init__(self, cuda: Any):
        self._pid = os.getpid()
        self._forks = _FORKS[0]
        self._stats = cuda.host_memory_stats
        self._reset = _torch_resets.unwrapped(cuda.reset_peak_host_memory_stats)
        self.foreign_resets = 0

    def _read(self) -> Dict[str, Any]:
        if self._forks != _FORKS[0]:
            raise _forked_error(self._pid)
        stats: Dict[str, Any] = self._stats()
        return stats

    def current(self, index: int) -> int:
        return int(self._read().get("allocated_bytes.current", 0))

    def peak(self, index: int) -> int:
        return int(self._read().get("allocated_bytes.peak", 0))

    def reset(self) -> None:
        if self._forks != _FORKS[0]:
            raise _forked_error(self._pid)
        with _torch_resets.OWN_RESET:
            self._reset()


class _SharedSource(Source):
    """An allocator source: one per mark per process, shared by every caller.
    It is released when nothing holds it any more; :meth:`close` does
    nothing, so that one caller cannot end the sources (and with them the
    group) under another caller's windows."""

    __slots__ = ()

    def close(self) -> None:
        """Does nothing: the source is shared by every caller in the process
        and released when no list, window, trace or tracker holds it."""


class _Shared:
    """One mark group per allocator (a device, or pinned host memory) for
    the whole process: torch has one peak counter per allocator, so two
    groups over it would reset each other's peaks. Its sources are shared
    by every caller and released when none of them holds one any more."""

    def __init__(self, marks: Any, names: List[str]):
        self.marks = marks
        self.names = names
        if hasattr(marks, "read_many"):
            self.group = MarkGroup.many(marks.read_many, marks.reset)
        else:
            self.group = MarkGroup(marks.current, marks.peak, marks.reset)
        self.members: Dict[int, "weakref.ref[Source]"] = {}

    def live(self) -> List[Source]:
        """The sources over the group that something still holds."""
        out = []
        for ref in list(self.members.values()):
            s = ref()
            if s is not None and not s.closed:
                out.append(s)
        return out

    def source(self, index: int) -> Source:
        ref = self.members.get(index)
        s = ref() if ref is not None else None
        if s is None or s.closed:
            s = self.group._source(index, self.names[index], _SharedSource)
            self.members[index] = weakref.ref(s)
        return s


#: (pid, allocator) -> its group. The pid: a forked child inherits this
#: dictionary, never the groups in it (see _forked_error).
_SHARED: Dict[Tuple[int, Any], _Shared] = {}
_LOCK = threading.Lock()


def _shared(key: Any, make: Callable[[], _Shared]) -> _Shared:
    full = (os.getpid(), key)
    entry = _SHARED.get(full)
    if entry is None or not entry.live():
        if entry is not None:
            entry.group.close()
        entry = _SHARED[full] = make()
    return entry


def _carry(key: Any) -> bool:
    """Makes a boundary over every live source of allocator ``key``: folds
    torch's peaks into every open window, then resets them (the caller's
    reset, done by memprobe). False when there is no such source or the
    boundary failed (the caller then makes the reset itself)."""
    if isinstance(key, tuple):
        _torch_user_peaks.clear(key[1])  # the caller's reset: its peaks start over
    with _LOCK:
        entry = _SHARED.get((os.getpid(), key))
        members = entry.live() if entry is not None else []
    if not members:
        return False
    marks = entry.marks if entry is not None else None
    if isinstance(marks, _DeviceMarks):
        marks.user_reset = True
    try:
        Window(members).close()
    except MemprobeError:
        return False
    finally:
        if isinstance(marks, _DeviceMarks):
            marks.user_reset = False
    return True


def _reset_key(device: Any) -> Optional[Tuple[str, int]]:
    """The allocator a caller's ``reset_peak_memory_stats(device)`` resets,
    when memprobe has sources over some device (None otherwise, without
    resolving ``device``: ``None`` or ``"cuda"`` would ask torch for its
    current device)."""
    pid = os.getpid()
    with _LOCK:
        if not any(p == pid and e.live() for (p, _), e in _SHARED.items()) and not _torch_user_peaks.any_carried():
            return None
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return ("cuda", _device_index(torch, device))
    except Exception:  # noqa: BLE001 - torch's own function says what is wrong
        return None


def foreign_resets(device: Any = None) -> int:
    """How many resets of torch's peak counters memprobe saw evidence of
    but did not carry (resets from C++; see the module's documentation), on
    ``device`` (None: every device) since its sources were made."""
    torch = sys.modules.get("torch")
    wanted = None if device is None or torch is None else _device_index(torch, device)
    with _LOCK:
        entries = [e for (pid, key), e in _SHARED.items() if pid == os.getpid()]
    return sum(
        e.marks.foreign_resets for e in entries if wanted is None or getattr(e.marks, "device", None) == wanted
    )


class AllocatorSources(List[Source]):
    """A list of allocator sources (use it wherever sources are taken)
    that also keeps a window open since it was created, so that
    :meth:`peak_since_start` still gives the peaks that
    ``torch.cuda.max_memory_*`` gave before memprobe owned torch's peak
    counters. The sources of one device are shared by every list made over
    it (one group per allocator); :meth:`close` closes this list's window,
    and the sources go when nothing holds them any more."""

    def __init__(self, sources: Iterable[Source], attribution: Any = None):
        super().__init__(sources)
        self._since_start: Optional[Window] = Window(list(self)) if len(self) else None
        #: ``allocator_sources(attribution=...)``: a :class:`memprobe.Tracker`
        #: made over this list attributes each epoch's peak.
        self.attribution = attribution

    def names(self) -> List[str]:
        return [s.name for s in self]

    def since_start(self) -> Window:
        """The window open since this list was created (one delta per
        source, in the list's order): ``since_start().reset()`` ends it and
        starts it over without disturbing other windows."""
        if self._since_start is None:
            raise ValueError("these allocator sources are closed (or empty)")
        return self._since_start

    def peak_since_start(self, name: Optional[str] = None) -> Union[int, Dict[str, int]]:
        """The peak of each source since this list was created (or since
        ``since_start().reset()``), bytes (``{"torch_alloc:0": ..., ...}``),
        or the peak of source ``name``."""
        peaks = dict(zip(self.names(), self.since_start().peaks()))
        if name is None:
            return peaks
        try:
            return peaks[name]
        except KeyError:
            raise KeyError(f"no allocator source named {name!r} (have {sorted(peaks)})") from None

    def close(self) -> None:
        if self._since_start is not None:
            self._since_start.close()
            self._since_start = None

    def __enter__(self) -> "AllocatorSources":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _require_cuda_initialized(torch: Any) -> None:
    if torch.cuda.is_initialized():
        return
    bad_fork = getattr(torch.cuda, "_is_in_bad_fork", None)
    if bad_fork is not None and bad_fork():
        raise RuntimeError(
            f"this is a process forked (pid {os.getpid()}) after PyTorch initialised CUDA in its parent: "
            "CUDA cannot be used here, so there is nothing for memprobe to measure (torch would read 0 "
            "bytes). Measure in the parent, or start workers with the 'spawn' method"
        )
    raise RuntimeError(
        "PyTorch has not initialised CUDA in this process: memprobe does not "
        "initialise it for you (that would take GPU memory and time). Create "
        "the allocator sources after the model or a tensor is on the GPU "
        "(torch.cuda.init() initialises it explicitly)."
    )


def _device_index(torch: Any, device: Any) -> int:
    """A CUDA ordinal from a device as torch names it: ``N``, ``"cuda:N"``,
    ``"cuda"`` (the current device), ``torch.device``, ``torch.cuda.device``."""
    if isinstance(device, bool):
        raise TypeError(f"a CUDA device is an int, 'cuda:N' or torch.device, not {device!r}")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"not a CUDA device: {device!r} ({e})") from None
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"not a CUDA device: {str(device)!r}")
        return int(torch.cuda.current_device()) if device.index is None else int(device.index)
    idx = getattr(device, "idx", None)  # torch.cuda.device(N)
    if isinstance(idx, int) and not isinstance(idx, bool):
        return idx
    try:
        return operator.index(device)  # numpy integers
    except TypeError:
        raise TypeError(
            f"a CUDA device is an int, 'cuda', 'cuda:N' or torch.device, not {type(device).__name__} {device!r}"
        ) from None


def _devices(torch: Any, device: Any, count: int) -> List[int]:
    if device is None:
        return list(range(count))
    if isinstance(device, (str, int)) or isinstance(device, torch.device) or hasattr(device, "idx"):
        devices = [_device_index(torch, device)]
    else:
        try:
            items = list(device)
        except TypeError:
            devices = [_device_index(torch, device)]
        else:
            devices = [_device_index(torch, d) for d in items]
    for d in devices:
        if not 0 <= d < count:
            raise ValueError(f"no CUDA device {d}: {count} visible")
    return devices


def allocator_sources(
    device: Any = None, *, reserved: bool = True, active: bool = False, attribution: Any = None
) -> AllocatorSources:
    """Exact sources over PyTorch's CUDA caching allocator: ``torch_alloc:N``,
    (``reserved``) ``torch_reserved:N`` and (``active``) ``torch_active:N``
    for device ``N``: an ordinal, ``"cuda:N"``, ``"cuda"`` (the current
    device), a ``torch.device``, a list of them, or None (every visible
    device). Only once CUDA is initialised (``torch.cuda.is_initialized()``),
    else RuntimeError: memprobe never initialises CUDA. See the module's
    documentation for what changes for code that reads
    ``torch.cuda.max_memory_*`` or resets it itself. ``attribution``
    (True, or an :class:`~memprobe.integrations.torch_attribution.AttributionOptions`):
    a :class:`memprobe.Tracker` made over these sources names the tensors
    live at each epoch's peak step (:mod:`.torch_attribution`)."""
    if attribution is not None and attribution is not False:
        from .torch_attribution import as_options

        attribution = as_options(attribution)  # a bad value fails here, not at the tracker
    torch = _torch()
    _require_cuda_initialized(torch)
    cuda = torch.cuda
    devices = _devices(torch, device, int(cuda.device_count()))
    wanted = [0] + ([1] if reserved else []) + ([2] if active else [])
    sources: List[Source] = []
    with _LOCK:
        _torch_resets.install(torch, _carry, _reset_key)
        _torch_user_peaks.install(torch)
        for d in devices:

            def make(d: int = d) -> _Shared:
                return _Shared(_DeviceMarks(torch, d), [f"{prefix}:{d}" for prefix, _ in _DEVICE_MARKS])

            entry = _shared(("cuda", d), make)
            for index in wanted:
                sources.append(entry.source(index))
    return AllocatorSources(sources, attribution)


def pinned_sources() -> AllocatorSources:
    """An exact source ``torch_pinned`` over PyTorch's pinned host-memory
    allocator (``host_memory_stats()['allocated_bytes.*']``, reset by
    ``reset_peak_host_memory_stats``). Needs a torch that has those
    functions (not 2.5) and CUDA initialised, else RuntimeError."""
    torch = _torch()
    cuda = torch.cuda
    if not (hasattr(cuda, "host_memory_stats") and hasattr(cuda, "reset_peak_host_memory_stats")):
        raise RuntimeError(
            f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.host_memory_stats / "
            "reset_peak_host_memory_stats: pinned host memory cannot be measured exactly"
        )
    _require_cuda_initialized(torch)
    with _LOCK:
        _torch_resets.install(torch, _carry, _reset_key)
        entry = _shared("pinned", lambda: _Shared(_HostMarks(cuda), ["torch_pinned"]))
        return AllocatorSources([entry.source(0)])


def peak_since_start(sources: AllocatorSources, name: Optional[str] = None) -> Union[int, Dict[str, int]]:
    """``sources.peak_since_start(name)``: the true peak since the allocator
    sources were created, per source (bytes)."""
    return sources.peak_since_start(name)


def default_sources(torch_sources: bool = True) -> List[Source]:
    """What the integrations measure by default: this process's RSS, plus
    the allocator sources of every visible device when ``torch_sources`` and
    PyTorch has initialised CUDA (never initialising it)."""
    out: List[Source] = [Source.process()]
    if torch_sources and cuda_initialized():
        out.extend(allocator_sources())
    return out


def empty_cache_release(*, gc_collect: bool = False) -> Callable[[], None]:
    """A cache-release callback: ``torch.cuda.empty_cache()`` (after
    ``gc.collect()`` when ``gc_collect``), returning the caching allocator's
    unused blocks to the driver. Register it where memprobe releases caches
    (e.g. :func:`memprobe.gpu.set_cache_release`, which the ``*_no_cache``
    readings call first)."""
    torch = _torch()

    def release() -> None:
        if gc_collect:
            gc.collect()
        torch.cuda.empty_cache()  # a no-op until CUDA is initialised

    release.__name__ = "empty_cache_release"
    release.__qualname__ = "empty_cache_release"
    return release


def install_cache_release(*, gc_collect: bool = False) -> Callable[[], None]:
    """Registers :func:`empty_cache_release` as memprobe's GPU cache-release
    callback, so that fastai's ``gpu_mem_get_*_no_cache`` readings empty
    PyTorch's caching allocator first (as fastai's do). Returns the callback."""
    from ..gpu import set_cache_release

    release = empty_cache_release(gc_collect=gc_collect)
    set_cache_release(release)
    return release


# --- out-of-memory reports ------------------------------------------------------

#: Trackers whose reports torch's out-of-memory observer feeds (weakly held:
#: torch cannot detach an observer, so the one observer outlives them).
_OOM_TRACKERS: List["weakref.ref[Any]"] = []
#: Attributions (torch_attribution.Attribution) that table every
#: out-of-memory error, weakly held too.
_OOM_ATTRIBUTIONS: List["weakref.ref[Any]"] = []
_OOM_OBSERVER = {"attached": False, "queued": False}


def _stat(stats: Dict[str, Any], key: str) -> Optional[int]:
    v = stats.get(key)
    return int(v) if v is not None else None


def _torch_caches(cuda: Any) -> List["OomCache"]:
    """Each visible device's caching allocator, from ``memory_stats``:
    reserved, allocated, and what ``empty_cache()`` could give back —
    reserved minus active minus ``inactive_split`` (free blocks inside
    segments still in use, which cannot be released), torch's own
    categories. A device whose stats cannot be read is left out."""
    from ..tracker import OomCache

    out: List[OomCache] = []
    try:
        count = int(cuda.device_count())
    except Exception:  # noqa: BLE001 - report what can be had
        return out
    for d in range(count):
        try:
            stats = cuda.memory_stats(d)
        except Exception:  # noqa: BLE001
            continue
        reserved = _stat(stats, "reserved_bytes.all.current")
        allocated = _stat(stats, "allocated_bytes.all.current")
        active = _stat(stats, "active_bytes.all.current")
        split = _stat(stats, "inactive_split_bytes.all.current")
        releasable = None
        if reserved is not None and active is not None and split is not None:
            releasable = max(reserved - active - split, 0)
        if reserved is None and allocated is None:
            continue
        out.append(OomCache(device=d, reserved=reserved, allocated=allocated, releasable=releasable))
    return out


def _first_record_text(paths: List[str]) -> Optional[str]:
    """The first readable table's JSON, as written (the report embeds it
    and checks it; it is never rebuilt here). None when there is none."""
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            continue
    return None


def _on_torch_oom(device: int, alloc: int, device_total: int, device_free: int) -> None:
    """PyTorch's out-of-memory observer: called by the caching allocator
    when it gives up on an allocation (after freeing its cache and retrying),
    before it raises ``torch.cuda.OutOfMemoryError``. Nothing may escape: an
    exception here would replace torch's error."""
    try:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        # What was live at the failing allocation (attribution on): one
        # table each, written before the report that names it.
        tables = []
        for att in [a for a in (r() for r in list(_OOM_ATTRIBUTIONS)) if a is not None and a.active]:
            path = att.on_oom(int(device), int(alloc))
            if path is not None:
                tables.append(path)
        trackers = [t for t in (r() for r in list(_OOM_TRACKERS)) if t is not None and not t.closed]
        if not trackers:
            return
        caches = _torch_caches(cuda) if cuda is not None else []
        detail = (
            f"torch.cuda.OutOfMemoryError: tried to allocate {int(alloc)} bytes on cuda:{int(device)}; "
            f"{int(device_free)} bytes free of {int(device_total)}"
        )
        if tables:
            detail += "; live blocks: " + ", ".join(tables)
        live = _first_record_text(tables)
        for t in trackers:
            try:
                t.report_oom(
                    int(device),
                    int(alloc),
                    detail,
                    reported_by="torch",
                    device_total=int(device_total),
                    device_free=int(device_free),
                    caches=caches,
                    live_blocks_json=live,
                )
            except Exception:  # noqa: BLE001 - its report is not configured any more
                pass
    except BaseException:  # noqa: BLE001 - never through torch's allocator
        pass


def _attach_observer(torch: Any) -> None:
    if _OOM_OBSERVER["attached"]:
        return
    _OOM_OBSERVER["attached"] = True
    torch._C._cuda_attach_out_of_memory_observer(_on_torch_oom)


def _observe_oom(torch: Any) -> None:
    """Attaches the one out-of-memory observer (held by ``_LOCK``): now when
    CUDA is initialised, else when PyTorch initialises it."""
    if _OOM_OBSERVER["attached"]:
        return
    if cuda_initialized():
        _attach_observer(torch)
    elif not _OOM_OBSERVER["queued"]:
        _OOM_OBSERVER["queued"] = True
        lazy = getattr(torch.cuda, "_lazy_call", None)
        if lazy is not None:
            lazy(lambda: _attach_observer(torch))
        else:  # pragma: no cover - every torch since 1.0 has it
            _attach_observer(torch)


def watch_oom(attribution: Any) -> None:
    """Tables every PyTorch out-of-memory error for ``attribution`` (a
    :class:`~memprobe.integrations.torch_attribution.Attribution`), with or
    without an out-of-memory report configured."""
    torch = _torch()
    if not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        return  # torch < 2.0: no observer; epochs are still tabled
    with _LOCK:
        _OOM_ATTRIBUTIONS[:] = [r for r in _OOM_ATTRIBUTIONS if r() is not None and r() is not attribution]
        _OOM_ATTRIBUTIONS.append(weakref.ref(attribution))
        _observe_oom(torch)


def report_oom(
    tracker: Any,
    path: Union[str, "os.PathLike[str]", None] = None,
    *,
    fd: Optional[int] = None,
    summary_fd: Optional[int] = None,
    callback: Optional[Callable[[str, str], None]] = None,
    keep_ended: int = 8,
    driver: bool = False,
) -> Any:
    """One line to explain a PyTorch out-of-memory death::

        report_oom(tracker, path="oom.json")

    Configures ``tracker``'s out-of-memory report (see
    :meth:`memprobe.Tracker.set_oom_report`; the caller's trigger, plus the
    driver's when ``driver`` and memprobe's interposer is loaded) and attaches
    PyTorch's out-of-memory observer
    (``torch._C._cuda_attach_out_of_memory_observer``, torch >= 2.0): when the
    caching allocator gives up on an allocation, the report is written
    before ``torch.cuda.OutOfMemoryError`` is raised — the failing device and
    size, the device's total and free bytes as torch saw them, each device's
    cache (reserved, allocated, and what ``empty_cache()`` could still give
    back), the open phases and the last ended ones. Returns ``tracker``.

    Attaching the observer needs CUDA initialised (torch initialises it for
    the call): before that, it is queued with ``torch.cuda._lazy_call`` and
    attached when PyTorch initialises CUDA, so memprobe never initialises it.
    Torch cannot detach an observer: memprobe attaches one per process, which
    feeds every tracker given here while it is open and configured."""
    torch = _torch()
    if not hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        raise RuntimeError(
            f"torch {getattr(torch, '__version__', '?')} has no out-of-memory observer "
            "(torch._C._cuda_attach_out_of_memory_observer, torch >= 2.0)"
        )
    tracker.set_oom_report(
        path,
        fd=fd,
        summary_fd=summary_fd,
        callback=callback,
        keep_ended=keep_ended,
        driver=driver,
        caller=True,
    )
    with _LOCK:
        _OOM_TRACKERS[:] = [r for r in _OOM_TRACKERS if r() is not None and r() is not tracker]
        _OOM_TRACKERS.append(weakref.ref(tracker))
        _observe_oom(torch)
    return tracker


__all__ = [
    "AllocatorSources",
    "ForeignResetWarning",
    "allocator_sources",
    "cuda_initialized",
    "default_sources",
    "empty_cache_release",
    "foreign_resets",
    "install_cache_release",
    "peak_since_start",
    "pinned_sources",
    "report_oom",
]
