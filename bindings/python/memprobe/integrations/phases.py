"""Framework-free per-phase peaks: one independent window per phase kind
("step", "epoch", "validation", ...), so a step window inside an epoch
window inside a validation window each keep their own exact peak."""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Union

from ..sources import Source, as_sources
from ..units import MiB
from ..windows import Delta, RawDeltas, Window


_METRIC_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]")


class PhasePeaks:
    """Peaks of ``sources`` (default: this process's RSS) per phase::

        phases = PhasePeaks()
        phases.start("epoch")
        for batch in loader:
            phases.start("step")
            train(batch)
            step = phases.end("step")        # [Delta per source]
        epoch = phases.end("epoch")
    """

    def __init__(self, sources: Union[Source, Iterable[Source], None] = None):
        self.sources: List[Source] = as_sources(sources)
        self._windows: Dict[str, Window] = {}
        self._open: Dict[str, bool] = {}

    def start(self, phase: str) -> None:
        """Begins a phase now (a window is opened once per kind, then reset)."""
        w = self._windows.get(phase)
        if w is None:
            self._windows[phase] = Window(self.sources)
        else:
            w.restart()
        self._open[phase] = True

    def resume(self, phase: str) -> None:
        """Begins ``phase`` with no boundary of its own: its interval runs on
        from its last :meth:`end`, which started the next interval at the
        same instant (one boundary per phase instead of two, for phases that
        follow each other). A phase never ended is :meth:`start`-ed."""
        if phase not in self._windows:
            self.start(phase)
            return
        self._open[phase] = True

    def end(self, phase: str) -> List[Delta]:
        """Ends a phase: the ended interval of every source. A phase that was
        never started measures from the previous end (or its first use)."""
        w = self._windows.get(phase)
        if w is None:
            self._windows[phase] = w = Window(self.sources)
        self._open[phase] = False
        return w.reset()

    def end_raw(self, phase: str) -> RawDeltas:
        """:meth:`end`, the ended interval as the boundary read it
        (:meth:`memprobe.Window.reset_raw`: no ``Delta`` built)."""
        w = self._windows.get(phase)
        if w is None:
            self._windows[phase] = w = Window(self.sources)
        self._open[phase] = False
        return w.reset_raw()

    def is_open(self, phase: str) -> bool:
        return self._open.get(phase, False)

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
        for w in self._windows.values():
            w.close()
        self._windows.clear()
        self._open.clear()

    def __enter__(self) -> "PhasePeaks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



def check_unit(unit: str) -> str:
    """``"MiB"`` or ``"bytes"``, else ValueError."""
    if unit not in ("MiB", "bytes"):
        raise ValueError(f"unit must be 'MiB' or 'bytes', not {unit!r}")
    return unit
