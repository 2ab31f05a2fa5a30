"""Peak windows: the peak of each source over an interval, exact for exact
sources. Windows are concurrent, nestable and independent."""

from __future__ import annotations

from ctypes import byref, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple, Union

from . import _ffi
from ._ffi import C, check
from ._owned import Owned
from .sources import Fidelity, Source, SourceKind, as_sources, check_over
from .units import b2mb


@dataclass(frozen=True)
class Delta:
    """What one source did over an interval (a window, a trace), in bytes."""

    #: Used when the interval (last) started.
    used_start: int
    #: Used at the end, or now for an interval still open.
    used_end: int
    #: Highest used over the interval (Avalanche's MaxRAM).
    peak: int
    #: used_end - used_start (negative when memory was released).
    delta_used: int
    #: fastai's delta peaked: max(0, peak - used_start), minus delta_used
    #: when delta_used > 0 (the blip above the net growth).
    delta_peaked: int
    kind: SourceKind
    #: How exact ``peak`` is.
    fidelity: Fidelity

    @property
    def delta_used_mb(self) -> int:
        return b2mb(self.delta_used)

    @property
    def delta_peaked_mb(self) -> int:
        return b2mb(self.delta_peaked)

    @property
    def peak_mb(self) -> int:
        return b2mb(self.peak)

    @classmethod
    def _from_c(cls, d: _ffi.memprobe_delta) -> "Delta":
        # Fills the frozen instance's __dict__ directly: the generated
        # __init__ goes through object.__setattr__ field by field, several
        # times slower, and this runs at every step boundary.
        obj = cls.__new__(cls)
        obj.__dict__.update(
            used_start=d.used_start,
            used_end=d.used_end,
            peak=d.peak,
            delta_used=d.delta_used,
            delta_peaked=d.delta_peaked,
            # A value newer than this package stays an int.
            kind=_KINDS.get(d.kind, d.kind),
            fidelity=_FIDELITIES.get(d.fidelity, d.fidelity),
        )
        return obj


_KINDS: Dict[int, SourceKind] = {int(k): k for k in SourceKind}
_FIDELITIES: Dict[int, Fidelity] = {int(f): f for f in Fidelity}


class Window(Owned):
    """An open peak window over one or more sources (default: this
    process's RSS)::

        with memprobe.Window([rss]) as step:
            for batch in loader:
                train(batch)
                ended = step.reset()          # ends this step, starts the next
                print(ended[0].peak)

    Opening, resetting or closing one window never changes another's peak.
    """

    _FREE = "memprobe_window_free"

    def __init__(self, sources: Union[Source, Iterable[Source], None] = None):
        self._sources: Tuple[Source, ...] = tuple(as_sources(sources))
        arr, n = _ffi.handles(self._sources)
        h = _ffi.out_handle()
        check_over(C.memprobe_window_open(arr, n, byref(h)), self._sources)
        self._handle = h.value
        # The handle as the argument ctypes passes as is (an int is converted
        # to a new c_void_p at every call), and the boundary's function.
        self._arg = c_void_p(h.value)
        self._reset = C.memprobe_window_reset
        self._closed = False

    @classmethod
    def open(cls, sources: Union[Source, Iterable[Source], None] = None) -> "Window":
        """Same as ``Window(sources)``."""
        return cls(sources)

    @property
    def sources(self) -> Tuple[Source, ...]:
        return self._sources

    def __len__(self) -> int:
        n = c_size_t()
        check(C.memprobe_window_source_count(self._handle, byref(n)))
        return int(n.value)

    def peak(self, index: int = 0) -> int:
        """The peak of source ``index`` since the window (last) started, bytes."""
        out = c_uint64()
        check_over(C.memprobe_window_peak(self._handle, index, byref(out)), self._sources)
        return int(out.value)

    def peaks(self) -> List[int]:
        """The peak of every source, in the order given at open."""
        return [self.peak(i) for i in range(len(self._sources))]

    def measure(self, index: int = 0) -> Delta:
        """Start, now, peak and fastai's deltas of source ``index``, without
        ending the interval."""
        d = _ffi.memprobe_delta()
        check_over(C.memprobe_window_measure(self._handle, index, byref(d)), self._sources)
        return Delta._from_c(d)

    def measures(self) -> List[Delta]:
        return [self.measure(i) for i in range(len(self._sources))]

    def restart(self) -> None:
        """Starts a new interval now, discarding the one that ends (the
        cheapest boundary: no result is built)."""
        status = self._reset(self._arg, None, 0)
        if status:
            check_over(status, self._sources)

    def reset(self) -> List[Delta]:
        """Ends the interval and starts the next at the same instant; returns
        the ended interval of every source. Other windows keep their peaks."""
        n = len(self._sources)
        arr = (_ffi.memprobe_delta * n)()
        status = self._reset(self._arg, arr, n)
        if status:
            check_over(status, self._sources)
        return [Delta._from_c(d) for d in arr]


    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self._sources if not s.closed) or "..."
        state = "closed" if self._closed else "open"
        return f"<memprobe.Window {state} over {names}>"
