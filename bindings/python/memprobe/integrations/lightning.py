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
is logged, as ``(phase, index, [Delta, ...])`` with exact peaks in bytes (a
step's ``Delta`` objects are built when the history is first read; a
reference kept from before sees the steps ended since).

A step's interval runs from the end of the step before it to its own end
(``on_train_batch_end``): one window boundary per step, and nothing
between two steps goes unmeasured (the next batch's loading, other
callbacks' per-batch work are in the step that follows). The first step of
an epoch, and the first after a validation loop, begin at their
``on_train_batch_start``. Per step the hooks make that boundary and keep
the history; metrics are built only on the steps that log.

Ranks (DDP and the other strategies over ``torch.distributed``): with a
process group of several ranks, every value logged is the maximum across
ranks (one all-reduce of a few int64s at each log, never per step), so rank
0's loggers show the rank that used the most; ``callback.history`` keeps
this rank's own phases and ``callback.ranks.history`` the maxima logged.

The phases are kept by a :class:`memprobe.Tracker` (``callback.tracker``):
under ``memprobe run`` every epoch, step and validation loop reaches the
run's summary, JSON and chart, with its rank under a launcher.

Out-of-memory reports: ``MemprobeCallback(oom_report="oom.json")``
attaches PyTorch's out-of-memory observer to the tracker's report
(:func:`memprobe.integrations.torch.report_oom`): when a CUDA allocation
fails, ``oom.json`` says which epoch and step were running, their peaks so
far, the last ended steps, each GPU's processes and what releasing caches
would free. A dict instead of a path gives :func:`report_oom`'s keyword
arguments (``{"path": ..., "summary_fd": 2, "driver": True}``). An
out-of-memory exception that reaches Lightning without a report (raised
outside torch's allocator) is reported from ``on_exception``.

Lightning (``lightning.pytorch``, else ``pytorch_lightning``) is imported
when ``MemprobeCallback`` is first used, never at ``import memprobe``.
:class:`MemprobeHooks` holds the hooks without the framework.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any, Dict, Iterable, List, Optional, Union

from ..sources import Source
from ..units import MiB
from ..windows import _DELTA_FIELDS, _DELTA_FORMAT, Delta, deltas_of
from ._history import History, Record
from ._lazy_class import LazyClass
from ._ranks import RankMaxima
from .phases import PhasePeaks, TailCall, check_unit


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
        oom_report: Union[str, "os.PathLike[str]", Dict[str, Any], None] = None,
        attribution: Any = None,
    ):
        super().__init__()
        #: Which tensors made each epoch's peak (memprobe.integrations.torch_attribution).
        self.attribution_options = attribution
        self._attribution: Any = None
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError("log_every_n_steps must be >= 1 (or None: the trainer's)")
        self._sources = sources
        self.torch_sources = torch_sources
        self.oom_report = oom_report
        self._phases: Optional[PhasePeaks] = None
        self.log_steps = log_steps
        self.log_epochs = log_epochs
        self.log_validation = log_validation
        self.log_every_n_steps = log_every_n_steps
        self.prefix = prefix
        self.unit = check_unit(unit)
        self.prog_bar = prog_bar
        self._history = History()
        self._counts = {"step": 0, "epoch": 0, "validation": 0}
        # A step's record is the library's result array, appended as bytes
        # (no Python object per step): to the history's steps when kept,
        # else here until the next step log. The highest step peak since
        # that log (steps_peak) is read from them at the log.
        self._unkept = bytearray()
        self._sink = self._unkept
        # Offset in the history's steps of the first step since the last log.
        self._log_from = 0
        # How a record reads: one memprobe_delta per source (with the phases).
        self._record: Optional[struct.Struct] = None
        # The step's end when it runs on its own tail (PhasePeaks.tail_call).
        self._tail: Optional[TailCall] = None
        self._keep = False
        self.keep_history = keep_history
        # Whether the step window's last boundary was the previous step's
        # end, with nothing measured apart since (no epoch, no validation):
        # the next step then runs on from it, one boundary per step. With
        # lazy phases the batch start leaves it set, and the step's end is
        # then the one library call.
        self._step_chained = False
        #: This rank, the world size and the maxima logged (several ranks).
        self.ranks = RankMaxima()

    @property
    def phases(self) -> PhasePeaks:
        if self._phases is None:
            sources = self._sources
            if sources is None:
                # Created at the first hook, when the model is on its device:
                # RSS plus torch's allocator per device if CUDA is initialised.
                from .torch import default_sources

                sources = default_sources(self.torch_sources)
            # The phases are the core tracker's: run channel, OOM report,
            # leak trends and release policies see every one.
            self._phases = PhasePeaks(sources, oom_report=self.oom_report, attribution=self.attribution_options)
            self._attribution = self._phases.tracker.attribution or self._attribution
            self._steps_setup(self._phases)
        return self._phases

    @property
    def attribution(self) -> Any:
        """The tracker's :class:`~memprobe.integrations.torch_attribution.Attribution`
        (kept after teardown; None when off): ``attribution.epochs[E]``."""
        return self._attribution

    def _steps_setup(self, phases: PhasePeaks) -> None:
        """A new tracker's steps: how their records read, their one call."""
        record = struct.Struct("=" + _DELTA_FORMAT * len(phases.sources))
        if self._record is None or record.size != self._record.size:
            # Other sources: the steps since the last log count no more.
            self._log_from = len(self._history.steps)
            del self._unkept[:]
        self._record = record
        self._tail = phases.tail_call("step")
        if self._keep:
            self._steps_begin()

    def _steps_begin(self) -> None:
        """The next step record kept in the history is step ``count``."""
        assert self._record is not None
        self._history.steps_begin("step", self._counts["step"], self._record.size, self._record.unpack_from)

    @property
    def keep_history(self) -> bool:
        """Whether every ended phase is kept in :attr:`history`."""
        return self._keep

    @keep_history.setter
    def keep_history(self, keep: bool) -> None:
        keep = bool(keep)
        if keep and not self._keep and self._record is not None:
            self._steps_begin()  # steps were left out until now
        self._keep = keep
        self._sink = self._history.steps if keep else self._unkept

    @property
    def history(self) -> List[Record]:
        """Every ended phase, ``(phase, index, [Delta, ...])``, exact bytes:
        the steps' records are kept as read and made into ``Delta`` objects
        when the list is used (a reference kept from before sees the steps
        ended since)."""
        return self._history.records()

    @history.setter
    def history(self, records: List[Record]) -> None:
        self._history.replace(records)

    @property
    def tracker(self) -> Any:
        """The :class:`memprobe.Tracker` keeping the phases (from the first
        hook to teardown), else None."""
        return getattr(self._phases, "tracker", None)

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
        # uses right after this hook): _LoggerConnector.should_update_logs,
        # taken here from the attributes it reads during training (its
        # active loop is then the fit loop): the property itself, through
        # trainer.training and the active loop, cost a cold step ~9 µs.
        try:
            n = trainer.log_every_n_steps
            step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
            stop = trainer.should_stop
        except AttributeError:
            pass
        else:
            if isinstance(n, int) and isinstance(step, int):
                return n != 0 and (step % n == 0 or bool(stop))
        # A trainer without those attributes: its connector's answer, else
        # the interval by our count.
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
            self._history.add(phase, index, deltas)
        if log and pl_module is not None:
            logged, _ = self.ranks.reduce(phase, index, deltas)
            metrics = self.phases.metrics(phase, logged, prefix=self.prefix, unit=self.unit)
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
        self._step_chained = False
        self.phases.start("epoch")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, *_: Any) -> None:
        # One boundary per step: the previous step's end (a window reset)
        # started this step's interval already, so what runs between two
        # batches (the next batch's loading, other callbacks' per-batch
        # work) is in the step that follows it. The first step of an epoch,
        # or after a validation loop, starts here.
        if self._step_chained:
            phases = self._phases or self.phases
            phases.resume("step")
            # Lazy phases tell the tracker nothing here (only an
            # out-of-memory report reads an open step): the step still runs
            # on its tail, and its end is the one call.
            self._step_chained = phases.lazy
        else:
            self.phases.start("step")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, *_: Any
    ) -> None:
        # Per step: the boundary (one library call when the step ran on the
        # previous one's tail), its record appended as bytes and a count;
        # no Python object is made, and metrics only at the logging
        # interval. (Every lookup counts here: the hook runs cold, right
        # after the model's work evicted the interpreter's caches.)
        log = self._should_log_step(trainer)
        tail = self._tail
        out: Union[bytes, bytearray]
        if self._step_chained and tail is not None:
            fn, args, out, tracker, _ = tail
            if tracker._flush:
                sys.stdout.flush()
                sys.stderr.flush()
            if fn(*args):
                out = self._end_step()  # refused: the general way says why
        else:
            out = self._end_step()
        self._sink += out
        counts = self._counts
        index = counts["step"]
        counts["step"] = index + 1
        self._step_chained = True
        if log and pl_module is not None:
            self._log_step(pl_module, index, out)

    def _end_step(self) -> bytes:
        """The step's end the general way (a step its batch start began,
        phases that are not lazy), its record as the library's bytes."""
        raw = self.phases.end_raw("step")
        assert self._record is not None
        return self._record.pack(*raw)

    def _log_step(self, pl_module: Any, index: int, out: Any) -> None:
        """Logs step ``index`` (record ``out``) and the highest peak of the
        steps since the previous log, then starts the next interval."""
        record = self._record
        assert record is not None
        size, unpack = record.size, record.unpack_from
        steps, unkept = self._history.steps, self._unkept
        peaks: Any = None
        for buf, start in ((steps, self._log_from), (unkept, 0)):
            for at in range(start, len(buf), size):
                p = unpack(buf, at)[2::_DELTA_FIELDS]
                peaks = p if peaks is None else tuple(map(max, peaks, p))
        scale = MiB if self.unit == "MiB" else 1
        # The maxima across ranks (one all-reduce; unchanged with one rank).
        deltas, steps_peak = self.ranks.reduce("step", index, deltas_of(record.unpack(out)), peaks or ())
        metrics = self.phases.metrics("step", deltas, prefix=self.prefix, unit=self.unit)
        for name, peak in zip(self.phases.names(), steps_peak):
            metrics[f"{self.prefix}{name}/steps_peak"] = peak / scale
        # What a reader of the history took is dropped from its steps.
        self._history.trim()
        self._log_from = len(steps)
        del unkept[:]
        self._log(pl_module, metrics, on_step=True)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._step_chained = False
        self._ended("epoch", pl_module, self.log_epochs, on_step=False)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._step_chained = False
        self.phases.start("validation")

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if getattr(trainer, "sanity_checking", False):
            self.phases.end("validation")
            return
        self._ended("validation", pl_module, self.log_validation, on_step=False)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """The run ends with an exception (Lightning calls no ``teardown``
        then): an out-of-memory error with no report written yet (raised
        outside torch's allocator, so its observer never ran) is reported
        now, while the phases are still open; then the phases are closed."""
        from ..tracker import default_is_oom

        t = self.tracker
        try:
            if t is not None and not t.closed and default_is_oom(exception):
                if t.oom_status().reports_written == 0:
                    t.report_oom(detail=f"{type(exception).__name__}: {exception}", reported_by="lightning")
        except Exception:  # noqa: BLE001 - never hide the training's own error
            pass
        try:
            self.teardown(trainer, pl_module)
        except Exception:  # noqa: BLE001
            pass

    def teardown(self, trainer: Any, pl_module: Any, stage: Optional[str] = None) -> None:
        self._step_chained = False
        self._tail = None
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
    base: type = pl.Callback  # untyped: Any to mypy
    return base


_CALLBACK = LazyClass(
    __name__,
    "MemprobeCallback",
    MemprobeHooks,
    _lightning_callback_base,
    "PyTorch Lightning callback logging exact memory peaks per step, "
    "epoch and validation loop (see the module's documentation).",
)


def __getattr__(name: str) -> Any:
    return _CALLBACK.get(name)
