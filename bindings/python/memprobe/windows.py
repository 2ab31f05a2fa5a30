"""Peak windows: the peak of each source over an interval, exact for exact
sources. Windows are concurrent, nestable and independent."""

from __future__ import annotations

import struct
from ctypes import addressof, byref, c_char, c_size_t, c_uint32, c_uint64, c_void_p, sizeof
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Tuple, Union

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

#: One ``memprobe_delta`` as :func:`struct.unpack_from` reads it: its fields
#: in order (``used_start`` .. ``fidelity``), native sizes, no padding.
_DELTA_FORMAT = "QQQqQII"
_DELTA_FIELDS = 7
assert struct.calcsize("=" + _DELTA_FORMAT) == sizeof(_ffi.memprobe_delta)

#: The ended interval of every source of a window, as the boundary read it:
#: ``_DELTA_FIELDS`` integers per source, in :class:`Delta`'s field order
#: (see :func:`deltas_of`).
RawDeltas = Tuple[int, ...]


def deltas_of(raw: RawDeltas) -> List[Delta]:
    """The :class:`Delta` of each source from a window's raw reading
    (:meth:`Window.reset_raw`)."""
    out = []
    new = object.__new__
    for i in range(0, len(raw), _DELTA_FIELDS):
        obj = new(Delta)
        # As Delta._from_c: the frozen instance's __dict__ filled directly.
        obj.__dict__.update(
            used_start=raw[i],
            used_end=raw[i + 1],
            peak=raw[i + 2],
            delta_used=raw[i + 3],
            delta_peaked=raw[i + 4],
            kind=_KINDS.get(raw[i + 5], raw[i + 5]),
            fidelity=_FIDELITIES.get(raw[i + 6], raw[i + 6]),
        )
        out.append(obj)
    return out


def raw_of(deltas: Iterable[Delta]) -> RawDeltas:
    """The inverse of :func:`deltas_of` (for phases kept elsewhere than in a
    window: a tracker's)."""
    return tuple(
        int(v)
        for d in deltas
        for v in (d.used_start, d.used_end, d.peak, d.delta_used, d.delta_peaked, d.kind, d.fidelity)
    )


def peaks_of(raw: RawDeltas) -> RawDeltas:
    """The peak of each source from a raw reading."""
    return raw[2::_DELTA_FIELDS]


def _unbound_reset() -> Callable[..., int]:
    """``memprobe_window_reset`` without declared argument types: the
    boundary passes ctypes objects made once per window (the handle, the
    address of its result array, the count), which ctypes hands to the C
    function as they are; with ``argtypes`` it converts and checks each at
    every call, a fifth of a cold boundary's time. A library without the
    symbol gets the declared function (its error names what is missing)."""
    try:
        f = _ffi.lib["memprobe_window_reset"]
    except (AttributeError, KeyError):
        return C.memprobe_window_reset  # type: ignore[no-any-return]
    f.restype = c_uint32
    return f


_RESET = _unbound_reset()


_NONE = c_size_t(0)


def _result_array(n: int) -> Tuple[bytearray, c_void_p, Any]:
    """A boundary's result array for ``n`` sources (``memprobe_delta[n]``),
    its address as the argument passed to C, and the ctypes view that pins
    it (a bytearray with an exported buffer is never moved). A bytearray,
    not a ctypes array: struct reads it through Python's own buffer
    protocol, not ctypes' (a cold boundary paid for that at every unpack)."""
    arr = bytearray(sizeof(_ffi.memprobe_delta) * n)
    pin = c_char.from_buffer(arr)
    return arr, c_void_p(addressof(pin)), pin


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
        # The boundary's result array, made once and read back by one
        # struct unpack: a boundary then builds no ctypes object, and Python
        # objects only for what its caller keeps. It is kept in a list that
        # a boundary pops (atomic under the GIL) and gives back, so that two
        # threads resetting one window at once never share one.
        n = len(self._sources)
        self._outs: List[Tuple[bytearray, c_void_p, Any]] = [_result_array(n)]
        self._count = c_size_t(n)
        self._unpack: Callable[[Any], RawDeltas] = struct.Struct("=" + _DELTA_FORMAT * n).unpack_from
        self._reset = _RESET
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
        status = self._reset(self._arg, None, _NONE)
        if status:
            check_over(status, self._sources)

    def reset(self) -> List[Delta]:
        """Ends the interval and starts the next at the same instant; returns
        the ended interval of every source. Other windows keep their peaks."""
        return deltas_of(self.reset_raw())

    def reset_raw(self) -> RawDeltas:
        """:meth:`reset`, the ended interval as plain integers
        (:data:`RawDeltas`; :func:`deltas_of` makes the :class:`Delta` of
        each source): for a boundary whose result is kept but seldom read
        (a training step's), so that building the ``Delta`` objects waits
        until they are read."""
        try:
            out = self._outs.pop()
        except IndexError:  # another thread's boundary holds the array
            out = _result_array(len(self._sources))
        status = self._reset(self._arg, out[1], self._count)
        if status:
            self._outs.append(out)
            check_over(status, self._sources)
        raw = self._unpack(out[0])
        self._outs.append(out)
        return raw


    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self._sources if not s.closed) or "..."
        state = "closed" if self._closed else "open"
        return f"<memprobe.Window {state} over {names}>"
