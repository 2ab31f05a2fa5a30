"""Hugging Face Accelerate: ``MemprobeAccelerate``, exact memory peaks of an
Accelerate training loop per step, logging interval, epoch and evaluation,
logged through ``accelerator.log`` (the trackers of
``accelerator.init_trackers``: TensorBoard, W&B, MLflow, ...)::

    from memprobe.integrations.accelerate import MemprobeAccelerate

    probe = MemprobeAccelerate(accelerator, log_every_n_steps=50)
    with probe.train():
        for epoch in range(epochs):
            with probe.epoch():
                for batch in loader:
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step(); optimizer.zero_grad()
                    probe.step()              # one boundary per step
            with probe.evaluation():
                evaluate(model)

Sources: this process's RSS (``rss``) plus, when PyTorch has initialised
CUDA by the first phase (``accelerator.prepare`` has moved the model),
torch's allocator sources of every visible device (``torch_alloc_N``,
``torch_reserved_N``: several devices in one process are each measured);
``torch_sources=False`` leaves them out, ``sources=[...]`` chooses them.

Logged (``unit="MiB"``), per source: at every ``log_every_n_steps``-th
step ``memprobe/<source>/step_*`` (the step just ended) and
``memprobe/<source>/interval_*`` (exact over everything since the previous
log); at the end of an epoch ``.../epoch_*``, of an evaluation
``.../eval_*``, of ``train()`` ``.../train_*`` and the Trainer's names
(:mod:`.trainer_stages`: ``train_mem_cpu_alloc_delta``,
``train_mem_cpu_peaked_delta``, ``train_mem_gpu_*``, with ``init_mem_*``
and ``before_init_mem_cpu``; ``eval_mem_*`` for an evaluation outside
``train()``, ``test_mem_*`` for ``predict()``), exact where the Trainer's
tracker samples. ``probe.logged`` keeps every ``(step, metrics)`` logged,
``probe.history`` every ended phase (``(phase, index, [Delta, ...])``, bytes).

Ranks: under ``accelerate launch`` / ``torchrun`` (a ``torch.distributed``
group of several ranks), every value logged is the maximum across ranks, by
one all-reduce of a few int64s at each log (never per step): every rank
must make the same calls (they do in an Accelerate loop);
``probe.history`` keeps this rank's own phases, ``probe.ranks.history`` the
maxima.

Cache release on a schedule (robo_orchard's ClearCacheHook):
``release_every_n_steps=N`` / ``release_every_n_epochs=N`` run Accelerate's
own ``clear_device_cache()`` after the step's (epoch's) boundary, or with
``release_gc=True`` its ``release_memory()`` (the garbage collector first);
``release=fn`` runs ``fn`` instead. ``Accelerator.free_memory()`` is left
to the end of training: it also drops the accelerator's references to the
prepared models and optimizers.

The phases are kept by a :class:`memprobe.Tracker` (``probe.tracker``):
under ``memprobe run`` (and ``torchrun`` / ``accelerate launch``) every
step, epoch, evaluation and stage reaches the run's summary, JSON and
chart, each rank named. ``oom_report="oom.json"`` (or a dict of
:func:`memprobe.integrations.torch.report_oom`'s keyword arguments) writes
an out-of-memory report naming the open phases when a CUDA allocation fails.
``attribution=True`` names the tensors live at each epoch's peak step and
at every PyTorch out-of-memory error (``probe.attribution``; files per
epoch in the accelerator's ``logging_dir`` (else ``project_dir``) under
``memprobe-attribution``: :mod:`memprobe.integrations.torch_attribution`).

Accelerate is imported only for the default cache release; the probe needs
only the ``accelerator`` object given (any object with ``log(dict,
step=...)``), or none (nothing logged, histories kept).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from ..sources import Source
from ..windows import Delta
from .loop import LoopPeaks, LoopViews


class MemprobeAccelerate(LoopViews):
    """Exact peaks of an Accelerate loop (see the module's documentation)."""

    def __init__(
        self,
        accelerator: Any = None,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
        log_every_n_steps: Optional[int] = 50,
        prefix: str = "memprobe/",
        unit: str = "MiB",
        keep_history: bool = True,
        torch_sources: bool = True,
        trainer_metrics: bool = True,
        stage_gc: bool = True,
        release: Optional[Callable[[], Any]] = None,
        release_every_n_steps: Optional[int] = None,
        release_every_n_epochs: Optional[int] = None,
        release_gc: bool = False,
        oom_report: Any = None,
        attribution: Any = None,
    ):
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError("log_every_n_steps must be >= 1 (or None: no step logs)")
        self.accelerator = accelerator
        self.log_every_n_steps = log_every_n_steps
        self.trainer_metrics = trainer_metrics
        self.loop = LoopPeaks(
            sources,
            torch_sources=torch_sources,
            prefix=prefix,
            unit=unit,
            keep_history=keep_history,
            stage_gc=stage_gc,
            release=release,
            release_every_n_steps=release_every_n_steps,
            release_every_n_epochs=release_every_n_epochs,
            release_gc=release_gc,
            oom_report=oom_report,
            attribution=attribution,
        )
        # Attribution's records beside the project's logs, when it has any.
        self.loop.attribution_beside(
            getattr(accelerator, "logging_dir", None) or getattr(accelerator, "project_dir", None)
        )
        #: Steps ended so far.
        self.global_step = 0
        #: Every ``(step, metrics)`` logged, in order (maxima across ranks with several).
        self.logged: List[Tuple[int, Dict[str, float]]] = []
        self._in_train = False

    def _log(self, **report: bool) -> Dict[str, float]:
        metrics, named = self.loop.report(**report)
        out: Dict[str, float] = dict(metrics)
        if self.trainer_metrics:
            out.update(named)
        self.logged.append((self.global_step, out))
        if self.accelerator is not None and out:
            self.accelerator.log(out, step=self.global_step)
        return out

    # --- the loop ------------------------------------------------------------------

    def step(self) -> List[Delta]:
        """Ends a step (and begins the next: one boundary); logs at every
        ``log_every_n_steps``-th. Returns this rank's step, one Delta per source."""
        deltas = self.loop.step_end()
        self.global_step += 1
        n = self.log_every_n_steps
        if n is not None and self.global_step % n == 0:
            self._log()
        return deltas

    @contextlib.contextmanager
    def train(self) -> Iterator["MemprobeAccelerate"]:
        """Trainer's ``train`` stage (logged with its names at the end)."""
        self._in_train = True
        self.loop.stage_begin("train")
        try:
            yield self
        finally:
            self._in_train = False
            self.loop.stage_end("train")
            self._log(last_step=False)

    @contextlib.contextmanager
    def epoch(self) -> Iterator["MemprobeAccelerate"]:
        """An epoch, logged at its end."""
        self.loop.epoch_begin()
        try:
            yield self
        finally:
            self.loop.epoch_end()
            self._log(interval=False, last_step=False)

    @contextlib.contextmanager
    def evaluation(self) -> Iterator["MemprobeAccelerate"]:
        """An evaluation, logged at its end (Trainer's ``eval`` stage when
        outside :meth:`train`); the next step begins at its end."""
        self.loop.eval_begin()
        try:
            yield self
        finally:
            self.loop.eval_end(stage=not self._in_train)
            self._log(interval=False, last_step=False)

    @contextlib.contextmanager
    def predict(self) -> Iterator["MemprobeAccelerate"]:
        """Trainer's ``test`` stage (its ``predict``), logged at its end."""
        self.loop.stage_begin("test")
        try:
            yield self
        finally:
            self.loop.stage_end("test")
            self._log(interval=False, last_step=False)

    def release_now(self) -> None:
        """Runs the cache release now."""
        self.loop.release_now()

    def close(self) -> None:
        self.loop.close()

    def __enter__(self) -> "MemprobeAccelerate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
