"""A training loop's exact peaks, free of any framework: what the Hugging
Face Transformers callback and the Accelerate loop helper measure, kept as
phases of the core :class:`memprobe.Tracker` (:class:`.phases.PhasePeaks`),
so that every step, epoch, evaluation and stage reaches the tracker's
observers: ``memprobe run``'s summary, JSON and chart (with the rank under
a launcher), the out-of-memory report (``oom_report``), leak trends and the
core's release policies.

Each kind of interval has its own exact peak:

- ``step``: one boundary per step (:meth:`LoopPeaks.step_end` ends a step
  and starts the next at the same instant);
- ``interval``: from one log to the next (every step between two logs,
  and whatever ran between them: logging, evaluation, checkpoints): a
  logging interval, not a phase of the loop, so a plain window beside the
  tracker;
- ``epoch``, ``eval`` (an evaluation), and the stages ``train``, ``eval``,
  ``test`` (Trainer's names, :mod:`.trainer_stages`: custom phases) and
  ``init`` (open from the engine's creation to the loop's start: a plain
  window, as the loop's sources are chosen later).

:meth:`LoopPeaks.report` gives what to log at a logging interval: the last
step, the interval, every epoch and evaluation ended since the previous
log, and a stage that ended. With a ``torch.distributed`` process group of
several ranks every value is the maximum across ranks (one all-reduce per
report, :mod:`._ranks`); ``history`` keeps this rank's own phases and
``ranks.history`` the maxima.

Cache release on a schedule (robo_orchard's ClearCacheHook), by the
tracker's release policies: a release callback (default: Accelerate's
``clear_device_cache``, which empties the cache of whatever accelerator
torch uses; with ``release_gc``, Accelerate's ``release_memory()``: the
garbage collector first) at the end of every ``release_every_n_steps``-th
step and ``release_every_n_epochs``-th epoch, after the boundary (the
release shows in the next step's numbers)."""

from __future__ import annotations

import dataclasses
import gc
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from ..sources import Source
from ..tracker import Tracker
from ..windows import Delta, RawDeltas, Window, deltas_of
from . import trainer_stages
from ._history import History, Record
from ._ranks import RankMaxima
from .phases import PhasePeaks, check_unit


def device_cache_release(gc_collect: bool = False) -> Callable[[], None]:
    """Accelerate's own cache release: ``release_memory()`` (the garbage
    collector, then the device cache) when ``gc_collect``, else
    ``clear_device_cache()`` (``torch.cuda.empty_cache()`` or the XPU, NPU,
    MPS, ... equivalent). Not ``Accelerator.free_memory()``: that also drops
    the accelerator's references to the prepared models and optimizers,
    which a release in the middle of training must keep."""
    try:
        from accelerate.utils import memory as acc_memory
    except ImportError as e:
        raise ImportError("the default cache release needs Accelerate: pip install accelerate") from e

    if gc_collect:

        def release() -> None:
            acc_memory.release_memory()

    else:

        def release() -> None:
            acc_memory.clear_device_cache()

    return release


class LoopPeaks:
    """Exact peaks of a training loop (see the module's documentation).

    ``sources``: None for this process's RSS plus, when PyTorch has
    initialised CUDA by the first phase, torch's allocator sources of every
    visible device (``torch_sources=False`` leaves them out)."""

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        torch_sources: bool = True,
        prefix: str = "memprobe/",
        unit: str = "MiB",
        keep_history: bool = True,
        stage_gc: bool = True,
        release: Optional[Callable[[], Any]] = None,
        release_every_n_steps: Optional[int] = None,
        release_every_n_epochs: Optional[int] = None,
        release_gc: bool = False,
        oom_report: Any = None,
        attribution: Any = None,
    ):
        schedule = (
            ("release_every_n_steps", release_every_n_steps),
            ("release_every_n_epochs", release_every_n_epochs),
        )
        for name, n in schedule:
            if n is not None and n < 1:
                raise ValueError(f"{name} must be >= 1 (or None: never)")
        self._sources = None if sources is None else list(sources) if not isinstance(sources, Source) else [sources]
        self.torch_sources = torch_sources
        self.prefix = prefix
        self.unit = check_unit(unit)
        self.keep_history = keep_history
        self.stage_gc = stage_gc
        self.release_every_n_steps = release_every_n_steps
        self.release_every_n_epochs = release_every_n_epochs
        self.release_gc = release_gc
        self._release = release
        self._release_added = False
        self._releases_closed = 0
        #: :func:`memprobe.integrations.torch.report_oom`'s ``path`` (or a
        #: dict of its keyword arguments): the tracker's out-of-memory report.
        self.oom_report = oom_report
        #: Which tensors made each epoch's peak (:mod:`.torch_attribution`).
        self.attribution_options = attribution
        #: The tracker's Attribution (kept after close; None when off).
        self.attribution: Any = None
        self._interval: Optional[Window] = None
        self._history = History()
        self.ranks = RankMaxima()
        #: Trainer-named metrics of each ended stage (bytes; maxima across ranks with several).
        self.stage_metrics: Dict[str, Dict[str, int]] = {}
        self._counts: Dict[str, int] = {}
        self._phases: Optional[PhasePeaks] = None
        self._last_step: Optional[RawDeltas] = None
        self._pending: List[Record] = []
        self._stages: List[Tuple[str, List[Delta]]] = []
        # Trainer's "init" stage: open from now (RSS, and the allocator
        # sources when CUDA is already initialised), ended by init_end().
        self._init_sources = self._choose_sources()
        self._init: Optional[Window] = Window(self._init_sources)
        self._init_cuda = any(s.name.startswith("torch_alloc:") for s in self._init_sources)
        self._init_report: Dict[str, int] = {}

    def _choose_sources(self) -> List[Source]:
        if self._sources is not None:
            return list(self._sources)
        from .torch import default_sources

        return default_sources(self.torch_sources)

    @property
    def history(self) -> List[Record]:
        """This rank's ended phases, ``(phase, index, [Delta, ...])``, exact
        bytes: the steps' records are kept as read and made into ``Delta``
        objects when the list is used (a reference kept from before sees the
        steps ended since)."""
        return self._history.records()

    @history.setter
    def history(self, records: List[Record]) -> None:
        self._history.replace(records)

    @property
    def phases(self) -> PhasePeaks:
        """The phases, kept by a :class:`memprobe.Tracker` (created at the
        first phase, when the model is on its device)."""
        if self._phases is None:
            phases = PhasePeaks(
                self._choose_sources(), oom_report=self.oom_report, attribution=self.attribution_options
            )
            t = phases.tracker
            self.attribution = t.attribution or self.attribution
            if self.release_every_n_steps is not None or self.release_every_n_epochs is not None:
                self._add_release(t)
            if self.release_every_n_steps is not None:
                t.release_every("step", self.release_every_n_steps)
            if self.release_every_n_epochs is not None:
                t.release_every("epoch", self.release_every_n_epochs)
            self._phases = phases
        return self._phases

    @property
    def tracker(self) -> Tracker:
        """The :class:`memprobe.Tracker` keeping the phases."""
        return self.phases.tracker

    def attribution_beside(self, folder: Optional[str]) -> None:
        """Attribution's records go to ``folder/memprobe-attribution`` (the
        run's logs: Trainer's ``output_dir``, Accelerate's project) unless
        the options name a directory (``MEMPROBE_ATTRIBUTION_DIR`` still
        wins). Before the first phase only."""
        if not folder or self._phases is not None:
            return
        from .torch_attribution import as_options

        options = as_options(self.attribution_options)
        if options is not None and options.directory is None:
            self.attribution_options = dataclasses.replace(
                options, directory=os.path.join(str(folder), "memprobe-attribution")
            )

    def _add_release(self, t: Tracker) -> None:
        if self._release_added:
            return
        if self._release is None:
            self._release = device_cache_release(self.release_gc)
        t.add_release(self._release, "release")
        self._release_added = True

    @property
    def releases(self) -> int:
        """Releases run (by the schedule and :meth:`release_now`)."""
        if self._phases is None:
            return self._releases_closed
        return self._releases_closed + self._phases.tracker.releases_fired

    def _raise_release_error(self) -> None:
        """A release callback's exception (kept by the tracker) goes to the
        caller, as the callback's own call would have raised it."""
        errors = self._phases.tracker.callback_errors if self._phases is not None else None
        if errors:
            raise errors.pop(0)

    def _ended(self, phase: str, deltas: List[Delta], pending: bool, stage: Optional[str] = None) -> Record:
        index = self._counts.get(phase, 0)
        self._counts[phase] = index + 1
        rec = (phase, index, deltas)
        if self.keep_history:
            self._history.add(phase, index, deltas)
        if pending:
            self._pending.append(rec)
        if stage is not None:
            self._stages.append((stage, deltas))
        return rec

    def count(self, phase: str) -> int:
        """How many ``phase`` ended so far."""
        return self._counts.get(phase, 0)

    # --- the phases ------------------------------------------------------------

    def init_end(self) -> Dict[str, int]:
        """Ends Trainer's ``init`` stage (once); its metrics go with the
        first stage reported, as the Trainer does."""
        if self._init is None:
            return {}
        deltas = self._init.reset()
        self._init.close()
        self._init = None
        rec = self._ended("init", deltas, False)
        m = trainer_stages.stage_metrics("init", self._init_sources, rec[2])
        m.update(trainer_stages.before_init(self._init_sources, rec[2]))
        if not self._init_cuda:
            m.update(trainer_stages.torch_init_gpu("init"))
        self._init_report = m
        self.stage_metrics["init"] = dict(m)
        return m

    def stage_begin(self, stage: str) -> None:
        """Begins a stage (``train``, ``eval``, ``test``): after a garbage
        collection (``stage_gc``), as the Trainer's tracker measures."""
        self.init_end()
        if self.stage_gc:
            gc.collect()
        phases = self.phases
        phases.start(stage)
        if stage == "train":
            phases.mark("step")
            self._interval_window().restart()

    def _interval_window(self) -> Window:
        if self._interval is None:
            self._interval = Window(self.phases.sources)
        return self._interval

    def stage_end(self, stage: str) -> List[Delta]:
        """Ends a stage (one never begun measures from the previous
        boundary of the step window: the end of the last step, evaluation or
        stage). Its Trainer-named metrics go with the next :meth:`report`."""
        self.init_end()
        if self.stage_gc:
            gc.collect()
        phases = self.phases
        # What follows (a standalone evaluation, a prediction) begins here.
        if phases.is_open(stage):
            deltas = phases.end(stage, into="step")
        else:
            deltas = phases.end(stage, since="step", into="step")
        self._ended(stage, deltas, True, stage)
        return deltas

    def step_end(self) -> List[Delta]:
        """Ends a step and begins the next (the one boundary per step)."""
        raw = self.phases.end_raw("step")
        deltas = deltas_of(raw)
        self._step_ended(raw, deltas)
        return deltas

    def step_end_raw(self) -> RawDeltas:
        """:meth:`step_end`, the step as the boundary read it (no ``Delta``
        is built until the step is reported or the history read)."""
        raw = self.phases.end_raw("step")
        self._step_ended(raw, None)
        return raw

    def _step_ended(self, raw: RawDeltas, deltas: Optional[List[Delta]]) -> None:
        self._last_step = raw
        index = self._counts.get("step", 0)
        self._counts["step"] = index + 1
        if self.keep_history:
            if deltas is None:
                self._history.add_raw("step", index, raw)
            else:
                self._history.add("step", index, deltas)
        if self.release_every_n_steps is not None:
            self._raise_release_error()

    def epoch_begin(self) -> None:
        phases = self.phases
        phases.start("epoch")
        phases.mark("step")

    def epoch_end(self) -> List[Delta]:
        deltas = self.phases.end("epoch")
        self._ended("epoch", deltas, True)
        if self.release_every_n_epochs is not None:
            self._raise_release_error()
        return deltas

    def eval_begin(self) -> None:
        self.phases.start("eval")

    def eval_end(self, stage: bool = False) -> List[Delta]:
        """Ends an evaluation: from :meth:`eval_begin`, or when none was
        made, from the previous boundary of the step window (during training,
        the end of the step after which it ran); the next step then begins
        here. ``stage``: it is Trainer's ``eval`` stage too (an evaluation
        outside training: the Trainer names no evaluation inside it)."""
        phases = self.phases
        if phases.is_open("eval"):
            deltas = phases.end("eval", into="step")
        else:
            deltas = phases.end("eval", since="step", into="step")
        self._ended("eval", deltas, True, "eval" if stage else None)
        return deltas

    def release_now(self) -> None:
        """Runs the release callback now (through the tracker)."""
        t = self.phases.tracker
        self._add_release(t)
        t.release_now()
        self._raise_release_error()

    # --- what is logged -----------------------------------------------------------

    def report(
        self, *, interval: bool = True, last_step: bool = True, trainer_names: bool = True
    ) -> Tuple[Dict[str, float], Dict[str, int]]:
        """What to log now: ``({"<prefix><source>/<phase>_peak": ..., ...},
        {"train_mem_cpu_alloc_delta": ..., ...})``. The first holds the last
        step, the interval since the previous report (``interval``: this
        report ends it) and every epoch, evaluation and stage ended since;
        the second the Trainer-named metrics of the stages ended since
        (bytes, as the Trainer logs them; with the first stage, ``init``'s).
        With several ranks every value is the maximum across ranks, from one
        all-reduce: every rank must call at the same point."""
        phases = self.phases
        records: List[Record] = []
        if self._last_step is not None and last_step:
            records.append(("step", self.count("step") - 1, deltas_of(self._last_step)))
            self._last_step = None
        if interval:
            records.append(self._ended("interval", self._interval_window().reset(), False))
        records.extend(self._pending)
        self._pending = []
        named: Dict[str, int] = {}
        if trainer_names:
            for stage, deltas in self._stages:
                if self._init_report:
                    named.update(self._init_report)
                    self._init_report = {}
                metrics_of = trainer_stages.stage_metrics(stage, phases.sources, deltas)
                self.stage_metrics[stage] = metrics_of
                named.update(metrics_of)
        self._stages = []
        # One all-reduce for everything in this report.
        flat = [d for _, _, ds in records for d in ds]
        keys = list(named)
        maxima, extra = self.ranks.reduce("report", self.count("report"), flat, [named[k] for k in keys])
        self._counts["report"] = self.count("report") + 1
        if self.ranks.world_size > 1:
            named = dict(zip(keys, extra))
            for phase in ("train", "eval", "test"):
                if any(k.startswith(f"{phase}_mem_") for k in keys):
                    self.stage_metrics[phase] = {k: v for k, v in named.items() if k.startswith(f"{phase}_mem_")}
        metrics: Dict[str, float] = {}
        at = 0
        for phase, _, deltas in records:
            n = len(deltas)
            metrics.update(phases.metrics(phase, maxima[at : at + n], prefix=self.prefix, unit=self.unit))
            at += n
        return metrics, named

    def close(self) -> None:
        if self._init is not None:
            self._init.close()
            self._init = None
        if self._interval is not None:
            self._interval.close()
            self._interval = None
        if self._phases is not None:
            self._releases_closed += self._phases.tracker.releases_fired
            self._phases.close()
            self._phases = None


class LoopViews:
    """What an integration built on a :class:`LoopPeaks` (its ``loop``)
    shows its users: the Transformers callback and the Accelerate helper."""

    loop: LoopPeaks

    @property
    def history(self) -> List[Tuple[str, int, List[Delta]]]:
        """This rank's ended phases, ``(phase, index, [Delta, ...])``, exact bytes."""
        return self.loop.history

    @property
    def ranks(self) -> RankMaxima:
        return self.loop.ranks

    @property
    def tracker(self) -> Tracker:
        """The :class:`memprobe.Tracker` keeping the phases."""
        return self.loop.tracker

    @property
    def stage_metrics(self) -> Dict[str, Dict[str, int]]:
        """Trainer-named metrics of each ended stage (bytes)."""
        return self.loop.stage_metrics

    @property
    def attribution(self) -> Any:
        """Which tensors made each epoch's peak
        (:class:`~memprobe.integrations.torch_attribution.Attribution`; None
        when off): ``attribution.epochs[E]``."""
        return self.loop.attribution
