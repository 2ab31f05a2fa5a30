"""Avalanche: ``ram_usage_metrics`` and ``gpu_usage_metrics`` with exact peaks.

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

``gpu_usage_metrics`` (``MinibatchMaxGPU`` ``MaxGPU<id>Usage_MB``,
``EpochMaxGPU`` ``MaxGPU<id>Usage_Epoch``, ``ExperienceMaxGPU``
``MaxGPU<id>Usage_Experience``, ``StreamMaxGPU`` ``MaxGPU<id>Usage_Stream``;
same phases and modes as Avalanche's) report the exact peak of PyTorch's
caching allocator on CUDA device ``<id>`` in MiB, through memprobe's torch
allocator sources (:mod:`memprobe.integrations.torch`). ``<id>`` is torch's
ordinal, so ``CUDA_VISIBLE_DEVICES`` applies. Avalanche 0.6's own
``MaxGPU`` polls GPUtil every ``every`` seconds and, despite its names and
documentation saying MB, records the device's *load* percentage; the
drop-in records memory, as the names say.

Avalanche is imported when a plugin metric is first used, never at
``import memprobe``; :class:`MaxRAM` (the metric itself) does not need it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ..sources import Source, as_sources
from ..units import MiB
from ..windows import Window


class _PeakMetric:
    """An Avalanche-style metric over one memprobe window: ``reset`` starts a
    new interval, ``result`` is the peak since, in MiB. Subclasses say how
    the window is opened (``_open``; None while there is nothing to measure)
    and how its peaks make one figure (``result_bytes``)."""

    _window: Optional[Window] = None

    def _open(self) -> Optional[Window]:
        raise NotImplementedError

    def _w(self) -> Optional[Window]:
        if self._window is None:
            self._window = self._open()
        return self._window

    def reset(self) -> None:
        """Starts a new interval now."""
        if self._window is None:
            self._w()
        else:
            self._window.restart()

    def result_bytes(self) -> int:
        raise NotImplementedError

    def result(self) -> float:
        """The peak since the last reset, MiB."""
        return self.result_bytes() / MiB

    # Avalanche's API for these metrics, kept so code written for it runs unchanged.
    def start_thread(self) -> None:
        self._w()

    def stop_thread(self) -> None:
        pass

    def close(self) -> None:
        if self._window is not None:
            self._window.close()
            self._window = None


class MaxRAM(_PeakMetric):
    """Avalanche's ``MaxRAM`` metric, exact: the peak of ``sources`` (default:
    this process's RSS) since the last :meth:`reset`, in MiB (float).
    ``every`` is accepted for compatibility and ignored (nothing is polled
    for exact sources; sampled sources follow the memprobe monitor)."""

    def __init__(self, every: Optional[float] = None, sources: Union[Source, Iterable[Source], None] = None):
        self.every = every
        self._sources = as_sources(sources)
        self._window = None

    def _open(self) -> Window:
        return Window(self._sources)

    def update(self) -> None:
        """Nothing to do: the peak is kept by the kernel (or the monitor)."""

    def result_bytes(self) -> int:
        """The highest peak over the sources since the last reset, bytes."""
        w = self._w()  # MaxRAM always opens one
        return 0 if w is None else max(w.peaks())


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
    base: type = GenericPluginMetric  # untyped: Any to mypy
    return base


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
    if name in _GPU_PLUGINS:
        return _gpu_plugin_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- GPU: gpu_usage_metrics with exact allocator peaks ----------------------------


class MaxGPU(_PeakMetric):
    """Avalanche's ``MaxGPU`` metric, exact: the peak of PyTorch's caching
    allocator on CUDA device ``gpu_id`` since the last :meth:`reset`, in MiB
    (float). ``gpu_id`` is torch's device ordinal, so ``CUDA_VISIBLE_DEVICES``
    applies (Avalanche's GPUtil index does not honour it). ``stat``:
    ``"allocated"`` (tensors, ``torch_alloc:N``) or ``"reserved"`` (the
    allocator's cache, ``torch_reserved:N``). ``every`` is accepted and
    ignored: nothing is polled.

    Until PyTorch initialises CUDA nothing is on the GPU and the result is 0
    (memprobe never initialises CUDA); the window opens at the first
    :meth:`reset` (Avalanche resets at the start of each phase) after it."""

    def __init__(self, gpu_id: int, every: Optional[float] = 0.5, *, stat: str = "allocated"):
        if stat not in ("allocated", "reserved"):
            raise ValueError(f"stat must be 'allocated' or 'reserved', not {stat!r}")
        self.gpu_id = gpu_id
        self.every = every
        self.stat = stat
        self._sources: Optional[List[Source]] = None
        self._window: Optional[Window] = None

    def _open(self) -> Optional[Window]:
        from .torch import allocator_sources, cuda_initialized

        if not cuda_initialized():
            return None
        srcs = allocator_sources(self.gpu_id, reserved=self.stat == "reserved")
        src = srcs[-1]
        srcs.close()  # no since-start window needed here
        self._sources = [src]
        return Window(self._sources)

    def update(self) -> None:
        """Nothing to do: torch keeps the mark."""
        self._w()

    def result_bytes(self) -> int:
        """The allocator's peak since the last reset, bytes (0 before CUDA)."""
        w = self._w()
        return 0 if w is None else w.peak(0)

    def close(self) -> None:
        super().close()
        self._sources = None


# class -> (name suffix, reset_at, emit_at, mode), as in Avalanche 0.6's
# gpu_usage module; the name is f"MaxGPU{gpu_id}Usage_{suffix}".
_GPU_PLUGINS: Dict[str, Tuple[str, str, str, str]] = {
    "MinibatchMaxGPU": ("MB", "iteration", "iteration", "train"),
    "EpochMaxGPU": ("Epoch", "epoch", "epoch", "train"),
    "ExperienceMaxGPU": ("Experience", "experience", "experience", "eval"),
    "StreamMaxGPU": ("Stream", "stream", "stream", "eval"),
}


def _gpu_plugin_class(name: str) -> type:
    if name in _CLASSES:
        return _CLASSES[name]
    base: Any = _generic_plugin_metric()
    suffix, reset_at, emit_at, mode = _GPU_PLUGINS[name]

    def __init__(self: Any, gpu_id: int, every: Optional[float] = 0.5, *, stat: str = "allocated") -> None:
        self.gpu_id = gpu_id
        base.__init__(self, MaxGPU(gpu_id, every, stat=stat), reset_at=reset_at, emit_at=emit_at, mode=mode)

    def update(self: Any, strategy: Any) -> None:
        self._metric.update()

    def __str__(self: Any) -> str:
        return f"MaxGPU{self.gpu_id}Usage_{suffix}"

    cls = type(
        name,
        (base,),
        {
            "__init__": __init__,
            "update": update,
            "__str__": __str__,
            "__module__": __name__,
            "__doc__": f"Avalanche's {name} (MaxGPU<id>Usage_{suffix}: reset at each {reset_at}, "
            f"{mode} mode) with the exact peak of PyTorch's allocator, MiB.",
        },
    )
    _CLASSES[name] = cls
    return cls


def gpu_usage_metrics(
    gpu_id: int,
    every: Optional[float] = 0.5,
    minibatch: bool = False,
    epoch: bool = False,
    experience: bool = False,
    stream: bool = False,
    *,
    stat: str = "allocated",
) -> List[Any]:
    """Avalanche's ``gpu_usage_metrics``: the plugin metrics asked for, each
    an exact window over PyTorch's allocator on device ``gpu_id`` (torch's
    ordinal). ``every`` is ignored (kept for compatibility)."""
    out = []
    for flag, name in (
        (minibatch, "MinibatchMaxGPU"),
        (epoch, "EpochMaxGPU"),
        (experience, "ExperienceMaxGPU"),
        (stream, "StreamMaxGPU"),
    ):
        if flag:
            out.append(_gpu_plugin_class(name)(gpu_id, every, stat=stat))
    return out
