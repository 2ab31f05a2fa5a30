"""Avalanche: ``ram_usage_metrics`` with exact peaks.

Same classes, metric names, phases and units as Avalanche 0.6's
``avalanche.evaluation.metrics.ram_usage``:

====================  ==========================  ==========================
class                 metric name (``str(m)``)    reset and emitted at (mode)
====================  ==========================  ==========================
``MinibatchMaxRAM``   ``MaxRAMUsage_MB``          each iteration (train)
``EpochMaxRAM``       ``MaxRAMUsage_Epoch``       each epoch (train)
``ExperienceMaxRAM``  ``MaxRAMUsage_Experience``  each experience (eval)
``StreamMaxRAM``      ``MaxRAMUsage_Stream``      each stream (eval)
====================  ==========================  ==========================

Values are this process's peak RSS in MiB (float: bytes / 2^20), as
Avalanche's. Each metric is an independent memprobe window: the maximum is
the kernel's high-water mark, not a thread polling every ``every`` seconds,
so no spike is missed, a value is never below Avalanche's, and no thread
runs::

    from memprobe.integrations.avalanche import ram_usage_metrics
    eval_plugin = EvaluationPlugin(
        *ram_usage_metrics(minibatch=True, epoch=True, experience=True, stream=True),
        loggers=[InteractiveLogger()],
    )

Avalanche is imported when a plugin metric is first used, never at
``import memprobe``; :class:`MaxRAM` (the metric itself) does not need it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ..sources import Source, as_sources
from ..units import MiB
from ..windows import Window


class MaxRAM:
    """Avalanche's ``MaxRAM`` metric, exact: the peak of ``sources`` (default:
    this process's RSS) since the last :meth:`reset`, in MiB (float).
    ``every`` is accepted for compatibility and ignored (nothing is polled
    for exact sources; sampled sources follow the memprobe monitor)."""

    def __init__(self, every: Optional[float] = None, sources: Union[Source, Iterable[Source], None] = None):
        self.every = every
        self._sources = as_sources(sources)
        self._window: Optional[Window] = None

    def _w(self) -> Window:
        if self._window is None:
            self._window = Window(self._sources)
        return self._window

    def update(self) -> None:
        """Nothing to do: the peak is kept by the kernel (or the monitor)."""

    def reset(self) -> None:
        """Starts a new interval now."""
        if self._window is None:
            self._window = Window(self._sources)
        else:
            self._window.restart()

    def result(self) -> float:
        """The highest peak over the sources since the last reset, MiB."""
        return max(self._w().peaks()) / MiB

    def result_bytes(self) -> int:
        return max(self._w().peaks())

    # Avalanche's MaxRAM API, kept so code written for it runs unchanged.
    def start_thread(self) -> None:
        self._w()

    def stop_thread(self) -> None:
        pass

    def close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None


# class -> (metric name, reset_at, emit_at, mode), as in Avalanche 0.6
# (checked against the installed Avalanche by tests/test_avalanche.py).
_PLUGINS: Dict[str, Tuple[str, str, str, str]] = {
    "MinibatchMaxRAM": ("MaxRAMUsage_MB", "iteration", "iteration", "train"),
    "EpochMaxRAM": ("MaxRAMUsage_Epoch", "epoch", "epoch", "train"),
    "ExperienceMaxRAM": ("MaxRAMUsage_Experience", "experience", "experience", "eval"),
    "StreamMaxRAM": ("MaxRAMUsage_Stream", "stream", "stream", "eval"),
}
_CLASSES: Dict[str, type] = {}


def _generic_plugin_metric() -> type:
    try:
        from avalanche.evaluation import GenericPluginMetric
    except ImportError:
        try:
            from avalanche.evaluation.metric_definitions import GenericPluginMetric
        except ImportError as e:
            raise ImportError(
                "memprobe.integrations.avalanche plugin metrics need Avalanche: "
                "pip install avalanche-lib"
            ) from e
    return GenericPluginMetric


def _plugin_class(name: str) -> type:
    if name in _CLASSES:
        return _CLASSES[name]
    base: Any = _generic_plugin_metric()
    metric_name, reset_at, emit_at, mode = _PLUGINS[name]

    def __init__(self: Any, every: Optional[float] = None, sources: Union[Source, Iterable[Source], None] = None) -> None:
        base.__init__(self, MaxRAM(every, sources), reset_at=reset_at, emit_at=emit_at, mode=mode)

    def update(self: Any, strategy: Any) -> None:
        self._metric.update()

    def __str__(self: Any) -> str:
        return metric_name

    cls = type(
        name,
        (base,),
        {
            "__init__": __init__,
            "update": update,
            "__str__": __str__,
            "__module__": __name__,
            "__doc__": f"Avalanche's {name} ({metric_name}: reset at each {reset_at}, "
            f"{mode} mode) with exact peaks, MiB.",
        },
    )
    _CLASSES[name] = cls
    return cls


def ram_usage_metrics(
    *,
    every: Optional[float] = None,
    minibatch: bool = False,
    epoch: bool = False,
    experience: bool = False,
    stream: bool = False,
    sources: Union[Source, Iterable[Source], None] = None,
) -> List[Any]:
    """Avalanche's helper: the plugin metrics asked for, each over its own
    exact window. ``every`` is ignored (kept for compatibility); ``sources``
    defaults to this process's RSS."""
    out = []
    for flag, name in (
        (minibatch, "MinibatchMaxRAM"),
        (epoch, "EpochMaxRAM"),
        (experience, "ExperienceMaxRAM"),
        (stream, "StreamMaxRAM"),
    ):
        if flag:
            out.append(_plugin_class(name)(every, sources))
    return out


def __getattr__(name: str) -> Any:
    if name in _PLUGINS:
        return _plugin_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
