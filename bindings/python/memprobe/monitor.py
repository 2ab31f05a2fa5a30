"""The background monitor: the thread that polls sampled sources (process
tree, system RAM, GPUs, callback sources) while a window or trace is open
over them. Exact sources need no polling."""

from __future__ import annotations

from ctypes import byref
from dataclasses import dataclass

from . import _ffi
from ._ffi import C, check

#: Shortest and longest accepted intervals, nanoseconds.
MIN_INTERVAL_NS = _ffi.MEMPROBE_MONITOR_MIN_INTERVAL_NS
MAX_INTERVAL_NS = _ffi.MEMPROBE_MONITOR_MAX_INTERVAL_NS


@dataclass(frozen=True)
class MonitorStats:
    """Counters of the monitor."""

    #: Whether the monitor thread runs in this process.
    running: bool
    #: Sampled sources with open windows, polled at each tick.
    watched: int
    #: Polling rounds so far.
    ticks: int
    #: Successful reads by the monitor.
    reads: int
    #: Failed reads by the monitor (e.g. a GPU lost).
    errors: int
    #: Polling interval, nanoseconds.
    interval_ns: int

    @property
    def interval(self) -> float:
        """Polling interval, seconds."""
        return self.interval_ns / 1e9


def set_interval(seconds: float) -> None:
    """Sets how often sampled sources are polled (default 10 ms; 100 µs to 1 h)."""
    set_interval_ns(int(round(seconds * 1e9)))


def set_interval_ns(interval_ns: int) -> None:
    """:func:`set_interval` in nanoseconds."""
    check(C.memprobe_monitor_set_interval_ns(int(interval_ns)))


def stats() -> MonitorStats:
    """The monitor's counters."""
    s = _ffi.memprobe_monitor_stats()
    check(C.memprobe_monitor_get_stats(byref(s)))
    return MonitorStats(
        running=bool(s.running),
        watched=int(s.watched),
        ticks=int(s.ticks),
        reads=int(s.reads),
        errors=int(s.errors),
        interval_ns=int(s.interval_ns),
    )


def stop() -> None:
    """Stops the monitor thread and waits for it; it restarts when a window
    next opens over a sampled source."""
    check(C.memprobe_monitor_stop())
