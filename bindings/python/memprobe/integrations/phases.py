"""Framework-free per-phase peaks, kept by the core :class:`memprobe.Tracker`:
a phase is named ("step", "epoch", "validation", ...), each keeps its own
exact peak, and every boundary reaches the tracker's observers (phases in
``memprobe run``, out-of-memory reports, leak trends, release policies).

``"step"`` and ``"epoch"`` are the tracker's step and epoch phases, any
other name a custom phase; phases nest (a step inside an epoch inside a
validation loop), and ending one ends those still open inside it. A phase
ends into its *tail* (:meth:`memprobe.Tracker.end_into`): its window runs
on from its end, so a phase :meth:`~PhasePeaks.resume`-d, or ended without
being started, measures from its previous end — one boundary per step."""

from __future__ import annotations

import re
from ctypes import c_size_t
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .._ffi import C
from ..errors import WrongOrderError
from ..sources import Source, as_sources, check_over
from ..tracker import _END_TAIL, PhaseKind, Tracker, _kind
from ..units import MiB
from ..windows import Delta, RawDeltas, _result_array, deltas_of

_METRIC_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]")

#: A tracker phase's kind and name as the C calls take them.
Code = Tuple[int, Optional[bytes]]

#: :meth:`PhasePeaks.tail_call`: the library function, its arguments, the
#: result array it fills, the tracker (whose ``_flush`` says to flush the
#: standard streams first) and what pins the array.
TailCall = Tuple[Callable[..., int], Tuple[Any, ...], bytearray, Tracker, Any]

#: A phase's name -> the tracker's (kind, name).
_KINDS: Dict[str, Tuple[Any, Optional[str]]] = {
    "step": (PhaseKind.STEP, None),
    "epoch": (PhaseKind.EPOCH, None),
}


def tracker_phase(phase: str) -> Tuple[Any, Optional[str]]:
    """The tracker's (kind, name) of a phase named ``phase``."""
    hit = _KINDS.get(phase)
    return hit if hit is not None else (PhaseKind.CUSTOM, phase)


class PhasePeaks:
    """Peaks of ``sources`` (default: this process's RSS) per phase::

        phases = PhasePeaks()
        phases.start("epoch")
        for batch in loader:
            phases.start("step")
            train(batch)
            step = phases.end("step")        # [Delta per source]
        epoch = phases.end("epoch")

    ``tracker``: the :class:`memprobe.Tracker` over ``sources`` that keeps
    the phases (configure its sinks, release policies, out-of-memory
    report). ``oom_report``: configures that report at once
    (:func:`memprobe.integrations.torch.report_oom`'s ``path``, or a dict of
    its keyword arguments). ``attribution``: the tracker's (which tensors
    made each epoch's peak, :mod:`.torch_attribution`)."""

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        oom_report: Any = None,
        attribution: Any = None,
    ):
        self.sources: List[Source] = as_sources(sources)
        self.tracker = Tracker(self.sources, attribution=attribution)
        # The open phases, outermost first (the tracker's stack, by name).
        self._stack: List[str] = []
        # Phases that ended or were marked: their tails run (resume takes one).
        self._tails: Dict[str, bool] = {}
        # Per phase: the tracker's (kind, name) as the C call takes them,
        # resolved once (a step's boundary is a hot path).
        self._codes: Dict[str, Code] = {}
        #: Whether :meth:`resume` leaves the tracker's begin to the phase's end.
        self.lazy = oom_report is None
        if oom_report is not None:
            from .torch import report_oom

            kwargs = dict(oom_report) if isinstance(oom_report, dict) else {"path": oom_report}
            report_oom(self.tracker, **kwargs)

    def _code(self, phase: str) -> Code:
        code = self._codes.get(phase)
        if code is None:
            kind, name = tracker_phase(phase)
            code = self._codes[phase] = _kind(kind, name)
        return code

    def _begin(self, phase: str, resume: bool, since: Optional[str] = None) -> None:
        k, n = self._code(phase)
        t = self.tracker
        try:
            if resume:
                fk, fn = self._code(since or phase)
                t._resume(k, n, fk, fn)
            else:
                t._begin_code(k, n)
        except WrongOrderError:
            # A step or epoch where the tracker's nesting refuses one (an
            # epoch inside a step): a custom phase of that name from now on.
            if k == PhaseKind.CUSTOM:
                raise
            self._codes[phase] = _kind(PhaseKind.CUSTOM, phase)
            t.begin(PhaseKind.CUSTOM, phase)
        self._tails.pop(since or phase, None)
        self._stack.append(phase)

    def start(self, phase: str) -> None:
        """Begins a phase now (ending it first if it is open)."""
        if phase in self._stack:
            self._close_to(phase)
            self._end(phase, None, None)
        self._begin(phase, False)

    def resume(self, phase: str) -> None:
        """Begins ``phase`` with no boundary of its own: its interval runs on
        from its last :meth:`end`, which started the next interval at the
        same instant (one boundary per phase instead of two, for phases that
        follow each other). A phase never ended is :meth:`start`-ed. With
        ``lazy`` (no out-of-memory report configured) the tracker is told
        when the phase ends, in the same call: nothing but the report reads
        a phase while it is open."""
        if phase in self._stack:
            return
        if self.lazy and phase in self._tails:
            return
        self._begin(phase, phase in self._tails)

    def mark(self, phase: str) -> None:
        """Starts ``phase``'s next interval now without beginning it: the
        next :meth:`resume` (or :meth:`end` of it unstarted) measures from
        here."""
        k, n = self._code(phase)
        check_over(C.memprobe_tracker_mark_tail(self.tracker._arg, k, n), self.sources)
        self._tails[phase] = True

    def _close_to(self, phase: str) -> None:
        """Ends the phases open inside ``phase`` (innermost first), keeping
        their tails."""
        stack = self._stack
        while stack and stack[-1] != phase:
            inner = stack[-1]
            k, n = self._code(inner)
            self.tracker._end_into_raw(k, n, k, n)
            stack.pop()
            self._tails[inner] = True

    def _end(self, phase: str, into: Optional[str], since: Optional[str]) -> RawDeltas:
        stack = self._stack
        if since is None and phase in self._tails and phase not in stack:
            # Began on its own tail, ends now: one call (a step's hot path).
            k, n = self._code(phase)
            nxt = phase if into is None else into
            nk, nn = (k, n) if into is None else self._code(into)
            try:
                raw = self.tracker._end_into_raw(k, n, nk, nn, _END_TAIL)
            except WrongOrderError:
                raw = None  # as a custom phase, below
            if raw is not None:
                del self._tails[phase]
                self._tails[nxt] = True
                return raw
        if not stack or stack[-1] != phase:
            if phase not in stack:
                # Never started: from the previous end of ``since`` (its
                # tail), or an empty interval from now.
                self._begin(phase, True, since)
            else:
                self._close_to(phase)
        k, n = self._code(phase)
        nxt = phase if into is None else into
        nk, nn = (k, n) if into is None else self._code(into)
        raw = self.tracker._end_into_raw(k, n, nk, nn)
        stack.pop()
        self._tails[nxt] = True
        return raw

    def end(self, phase: str, *, into: Optional[str] = None, since: Optional[str] = None) -> List[Delta]:
        """Ends a phase: the ended interval of every source. A phase that was
        never started measures from the previous end of ``since`` (default:
        itself; or an empty interval from now). The next interval of
        ``into`` (default: the phase itself) begins at this end."""
        return deltas_of(self._end(phase, into, since))

    def end_raw(self, phase: str, *, into: Optional[str] = None, since: Optional[str] = None) -> RawDeltas:
        """:meth:`end`, the ended interval as the boundary read it
        (:data:`memprobe.windows.RawDeltas`: no ``Delta`` built)."""
        return self._end(phase, into, since)

    def tail_call(self, phase: str) -> TailCall:
        """The one library call that :meth:`end_raw` makes for ``phase``
        when it runs on its own tail (it ended or was marked, and has not
        begun since but by a ``lazy`` :meth:`resume`) and ends now, made
        ready once: a step's
        hook calls ``fn(*args)`` itself, with no Python between it and the
        library (a cold step paid several µs for the way through
        :meth:`end_raw`). Status 0: the phase ended, its interval is in
        ``out`` (``memprobe_delta`` per source: :data:`RawDeltas` once
        unpacked), and these phases are as :meth:`end_raw` leaves them.
        Else nothing changed: call :meth:`end_raw`, which says why (or ends
        it as a custom phase). ``out`` is this call's own: one thread.
        When ``tracker._flush`` is set, flush ``sys.stdout`` and
        ``sys.stderr`` first, as the tracker does (a sink writes to them)."""
        k, n = self._code(phase)
        count = len(self.sources)
        out, address, pin = _result_array(count)
        t = self.tracker
        return (_END_TAIL, (t._arg, k, n, k, n, None, address, c_size_t(count)), out, t, pin)

    def is_open(self, phase: str) -> bool:
        return phase in self._stack

    def names(self) -> List[str]:
        """Metric-friendly names of the sources (``rss``, ``tree``,
        ``torch_alloc_0``, ...): a character that metric stores refuse
        (MLflow takes only letters, digits, ``_-. /``) becomes ``_``, so
        ``torch_alloc:0`` is logged as ``torch_alloc_0``."""
        return [_METRIC_UNSAFE.sub("_", s.name) for s in self.sources]

    def metrics(
        self,
        phase: str,
        deltas: List[Delta],
        *,
        prefix: str = "memprobe/",
        unit: str = "MiB",
    ) -> Dict[str, float]:
        """``{"<prefix><source>/<phase>_peak": ..., ..._delta_used, ..._delta_peaked}``
        in ``unit`` (``"MiB"`` or ``"bytes"``)."""
        scale = MiB if unit == "MiB" else 1
        out: Dict[str, float] = {}
        for name, d in zip(self.names(), deltas):
            base = f"{prefix}{name}/{phase}"
            out[f"{base}_peak"] = d.peak / scale
            out[f"{base}_delta_used"] = d.delta_used / scale
            out[f"{base}_delta_peaked"] = d.delta_peaked / scale
        return out

    def close(self) -> None:
        self._stack.clear()
        self._tails.clear()
        self.tracker.close()

    def __enter__(self) -> "PhasePeaks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_unit(unit: str) -> str:
    """``"MiB"`` or ``"bytes"``, else ValueError."""
    if unit not in ("MiB", "bytes"):
        raise ValueError(f"unit must be 'MiB' or 'bytes', not {unit!r}")
    return unit
