"""PyTorch Lightning: ``MemprobeCallback`` logs exact per-step and per-epoch
peaks (and fastai's deltas) of any memprobe sources::

    from memprobe.integrations.lightning import MemprobeCallback
    trainer = lightning.Trainer(callbacks=[MemprobeCallback()])

Sources: by default this process's RSS (``rss``) plus, when PyTorch has
initialised CUDA by the first training hook, the exact allocator sources of
every visible device (``torch_alloc:N``, ``torch_reserved:N``: see
:mod:`memprobe.integrations.torch`), so per-step and per-epoch GPU peaks are
exact; ``MemprobeCallback(torch_sources=False)`` leaves them out, and
``sources=[...]`` chooses them explicitly.

Metrics (``unit="MiB"`` by default), per source (``rss``, ``torch_alloc_0``
(the source ``torch_alloc:0``: characters metric stores refuse become ``_``), ...):

- ``memprobe/<source>/step_peak``, ``..._delta_used``, ``..._delta_peaked``
  (the step just ended) and ``memprobe/<source>/steps_peak`` (the highest
  step peak since the previous log, so no spike between two logs is lost),
  logged at the trainer's logging interval (``Trainer(log_every_n_steps=50)``
  by default), on the steps where Lightning writes to its loggers, straight
  to ``trainer.loggers`` (as Lightning's LearningRateMonitor does: step keys
  registered through ``log_dict`` would cost every later step); pass
  ``log_every_n_steps=N`` to choose another interval;
- ``memprobe/<source>/epoch_*`` (each training epoch) and
  ``memprobe/<source>/validation_*`` (each validation loop), through
  ``log_dict``, so they are in ``trainer.callback_metrics`` too.

``callback.history`` keeps every ended phase, every step included, whatever
is logged, as ``(phase, index, [Delta, ...])`` with exact peaks in bytes.

Lightning (``lightning.pytorch``, else ``pytorch_lightning``) is imported
when ``MemprobeCallback`` is first used, never at ``import memprobe``.
:class:`MemprobeHooks` holds the hooks without the framework.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ..sources import Source
from ..units import MiB
from ..windows import Delta
from .phases import PhasePeaks, check_unit


class MemprobeHooks:
    """The callback's hooks, free of Lightning (mixed into its ``Callback``)."""

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        log_steps: bool = True,
        log_epochs: bool = True,
        log_validation: bool = True,
        log_every_n_steps: Optional[int] = None,
        prefix: str = "memprobe/",
        unit: str = "MiB",
        prog_bar: bool = False,
        keep_history: bool = True,
        torch_sources: bool = True,
    ):
        super().__init__()
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError("log_every_n_steps must be >= 1 (or None: the trainer's)")
        self._sources = sources
        self.torch_sources = torch_sources
        self._phases: Optional[PhasePeaks] = None
        self.log_steps = log_steps
        self.log_epochs = log_epochs
        self.log_validation = log_validation
        self.log_every_n_steps = log_every_n_steps
        self.prefix = prefix
        self.unit = check_unit(unit)
        self.prog_bar = prog_bar
        self.keep_history = keep_history
        self.history: List[Tuple[str, int, List[Delta]]] = []
        self._counts = {"step": 0, "epoch": 0, "validation": 0}
        # The highest step peak per source since the last step log.
        self._steps_peak: List[int] = []

    @property
    def phases(self) -> PhasePeaks:
        if self._phases is None:
            sources = self._sources
            if sources is None:
                # Created at the first hook, when the model is on its device:
                # RSS plus torch's allocator per device if CUDA is initialised.
                from .torch import default_sources

                sources = default_sources(self.torch_sources)
            self._phases = PhasePeaks(sources)
        return self._phases

    def _should_log_step(self, trainer: Any) -> bool:
        """Whether this step's metrics are logged: at ``log_every_n_steps``
        when given, else when Lightning itself writes this step to its
        loggers (``Trainer(log_every_n_steps=...)``, 50 by default): metrics
        logged on other steps would only be overwritten."""
        if not self.log_steps:
            return False
        count = self._counts["step"]  # steps ended before this one
        if self.log_every_n_steps is not None:
            return (count + 1) % self.log_every_n_steps == 0
        # Lightning's own decision for this step (what update_train_step_metrics
        # uses right after this hook); the interval by our count otherwise.
        connector = getattr(trainer, "_logger_connector", None)
        try:
            decided = connector.should_update_logs if connector is not None else None
        except Exception:  # noqa: BLE001 - a Lightning without this property
            decided = None
        if isinstance(decided, bool):
            return decided
        n = getattr(trainer, "log_every_n_steps", 50) or 0
        return n > 0 and (count + 1) % n == 0

    def _ended(self, phase: str, pl_module: Any, log: bool, on_step: bool) -> List[Delta]:
        deltas = self.phases.end(phase)
        index = self._counts[phase]
        self._counts[phase] = index + 1
        if self.keep_history:
            self.history.append((phase, index, deltas))
        if log and pl_module is not None:
            metrics = self.phases.metrics(phase, deltas, prefix=self.prefix, unit=self.unit)
            self._log(pl_module, metrics, on_step=on_step)
        return deltas

    def _log(self, pl_module: Any, metrics: Dict[str, float], *, on_step: bool) -> None:
        """Step metrics go straight to the trainer's loggers at Lightning's own
        step, as Lightning's LearningRateMonitor does: a step key registered
        through ``log_dict`` is carried through Lightning's result collection
        at every later step, which cost a ~4 ms training step 8 % even when
        logging every 50th step. Epoch and validation metrics (once per
        epoch) and anything for the progress bar still go through
        ``log_dict``, so they are in ``trainer.callback_metrics`` for
        checkpointing and early stopping."""
        trainer = getattr(pl_module, "_trainer", None) if on_step else None
        loggers = getattr(trainer, "loggers", None) if trainer is not None else None
        if self.prog_bar or not loggers:
            pl_module.log_dict(
                metrics,
                on_step=on_step,
                on_epoch=not on_step,
                prog_bar=self.prog_bar,
                logger=True,
            )
            return
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        step = getattr(loop, "_batches_that_stepped", None)
        if not isinstance(step, int):
            step = int(getattr(trainer, "global_step", 0))
        for logger in loggers:
            logger.log_metrics(metrics, step=step)

    # --- Lightning hooks -------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.phases.start("epoch")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, *_: Any) -> None:
        self.phases.start("step")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        log = self._should_log_step(trainer)
        deltas = self._ended("step", pl_module, False, on_step=True)
        peaks = [d.peak for d in deltas]
        if len(self._steps_peak) != len(peaks):
            self._steps_peak = peaks
        else:
            self._steps_peak = [max(a, b) for a, b in zip(self._steps_peak, peaks)]
        if log and pl_module is not None:
            scale = MiB if self.unit == "MiB" else 1
            metrics = self.phases.metrics("step", deltas, prefix=self.prefix, unit=self.unit)
            for name, peak in zip(self.phases.names(), self._steps_peak):
                metrics[f"{self.prefix}{name}/steps_peak"] = peak / scale
            self._steps_peak = []
            self._log(pl_module, metrics, on_step=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._ended("epoch", pl_module, self.log_epochs, on_step=False)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.phases.start("validation")

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if getattr(trainer, "sanity_checking", False):
            self.phases.end("validation")
            return
        self._ended("validation", pl_module, self.log_validation, on_step=False)

    def teardown(self, trainer: Any, pl_module: Any, stage: Optional[str] = None) -> None:
        if self._phases is not None:
            self._phases.close()
            self._phases = None


def _lightning_callback_base() -> type:
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError as e:
            raise ImportError(
                "memprobe.integrations.lightning.MemprobeCallback needs PyTorch "
                "Lightning: pip install lightning"
            ) from e
    return pl.Callback


_CLASS = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "MemprobeCallback":
        if _CLASS is None:
            _CLASS = type(
                "MemprobeCallback",
                (MemprobeHooks, _lightning_callback_base()),
                {
                    "__doc__": "PyTorch Lightning callback logging exact memory peaks per step, "
                    "epoch and validation loop (see the module's documentation).",
                    "__module__": __name__,
                },
            )
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
