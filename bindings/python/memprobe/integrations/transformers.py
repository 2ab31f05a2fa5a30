"""Hugging Face Transformers: ``MemprobeCallback``, a ``TrainerCallback``
logging exact memory peaks per step, logging interval, epoch and
evaluation, and Trainer's own stage metrics (``skip_memory_metrics=False``'s
keys) computed exactly::

    from memprobe.integrations.transformers import MemprobeCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MemprobeCallback()])

Sources: this process's RSS (``rss``) plus, when PyTorch has initialised
CUDA by the start of training, torch's allocator sources of every visible
device (``torch_alloc_N``, ``torch_reserved_N``); ``torch_sources=False``
leaves them out, ``sources=[...]`` chooses them.

At each of the Trainer's logs (``logging_steps``), keys are added to the
log itself, so every reporting callback (TensorBoard, W&B, MLflow, the
console) receives them, and so does ``trainer.state.log_history``
(``unit="MiB"`` by default, per source):

- ``memprobe/<source>/step_peak``, ``..._delta_used``, ``..._delta_peaked``:
  the step just ended (one boundary per optimizer step, at ``on_step_end``);
- ``memprobe/<source>/interval_peak`` (and deltas): exact over everything
  since the previous log, so no spike between two logs is lost;
- ``memprobe/<source>/epoch_*`` and ``.../eval_*``: every epoch and
  evaluation ended since the previous log;
- ``memprobe/<source>/train_*`` in the final training log, ``eval_*`` in an
  evaluation's log.

Trainer's names (transformers' ``TrainerMemoryTracker``, see
:mod:`.trainer_stages`): ``train_mem_cpu_alloc_delta``,
``train_mem_cpu_peaked_delta``, ``train_mem_gpu_alloc_delta``,
``train_mem_gpu_peaked_delta`` in the final training log (and so in
``trainer.train().metrics``), ``eval_mem_*`` in what ``evaluate()`` returns
(an evaluation outside training, as the Trainer), ``test_mem_*`` in what
``predict()`` returns; ``init_mem_*`` and ``before_init_mem_cpu`` with the
first of them. The ``init`` stage runs from the callback's creation to the
end of ``Trainer.__init__``; ``train`` from ``on_train_begin`` to the final
training log; an evaluation from the end of the step after which it runs
(the end of the previous stage outside training) to its log. Stages begin
and end after a garbage collection, as the Trainer's tracker does. When the
Trainer's own tracker is on too (``skip_memory_metrics=False``), its keys
stay as they are and memprobe's go beside them, under ``prefix``
(``memprobe/train_mem_cpu_peaked_delta``).

With ``torch.distributed`` initialised with several ranks, every value
logged is the maximum across ranks (one all-reduce of a few int64s per log,
never per step); ``callback.history`` keeps this rank's own phases and
``callback.ranks.history`` the maxima.

Cache release: ``release_every_n_steps=N`` / ``release_every_n_epochs=N``
run Accelerate's ``clear_device_cache()`` (``release_gc=True``: its
``release_memory()``, the garbage collector first), or ``release=fn``.

The phases are kept by a :class:`memprobe.Tracker` (``callback.tracker``):
under ``memprobe run`` every step, epoch, evaluation and stage reaches the
run's summary, JSON and chart, with its rank under a launcher.
``oom_report="oom.json"`` (or a dict of
:func:`memprobe.integrations.torch.report_oom`'s keyword arguments) writes
an out-of-memory report naming the open phases when a CUDA allocation fails.
``attribution=True`` names the tensors live at each epoch's peak step and
at every PyTorch out-of-memory error (``callback.attribution``; files per
epoch in ``<output_dir>/memprobe-attribution``:
:mod:`memprobe.integrations.torch_attribution`).

The callback puts itself first in the Trainer's callback list when
training begins, so that the reporting callbacks see the keys it adds.
transformers is imported when ``MemprobeCallback`` is first used, never at
``import memprobe``; :class:`MemprobeTrainerHooks` holds the hooks without it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from ..sources import Source
from ._lazy_class import LazyClass
from .loop import LoopPeaks, LoopViews


def _log_kind(logs: Dict[str, Any]) -> Tuple[str, str]:
    """What a Trainer log is: ("train", "train") for the final training log,
    ("eval", prefix) for an evaluation's, ("interval", "") otherwise."""
    if "train_runtime" in logs and "train_loss" in logs:
        return "train", "train"
    for key in logs:
        if key.endswith("_runtime") and key != "train_runtime":
            return "eval", key[: -len("_runtime")]
    return "interval", ""


class MemprobeTrainerHooks(LoopViews):
    """The callback's hooks, free of transformers (mixed into its ``TrainerCallback``)."""

    def __init__(
        self,
        sources: Union[Source, Iterable[Source], None] = None,
        *,
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
        super().__init__()
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
        self.prefix = prefix
        self.trainer_metrics = trainer_metrics
        self._in_train = False
        self._eval_ended = False
        self._first = False
        self._eval_named: Dict[str, int] = {}
        #: Every set of keys added to a log or to returned metrics, in order.
        self.logged: List[Dict[str, float]] = []

    def _put_first(self) -> None:
        """Moves this callback to the front of the Trainer's callback list
        (the CallbackHandler calling this hook), once, so the reporting
        callbacks after it receive the keys it adds to the logs. Safe while
        the handler iterates: the entries after this one keep their places."""
        if self._first:
            return
        self._first = True
        frame = sys._getframe(2)
        handler = frame.f_locals.get("self")
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and any(c is self for c in callbacks):
            callbacks.remove(self)
            callbacks.insert(0, self)

    def _add(
        self, args: Any, target: Dict[str, Any], metrics: Dict[str, float], named: Dict[str, int]
    ) -> Dict[str, float]:
        out: Dict[str, float] = dict(metrics)
        if self.trainer_metrics:
            # With the Trainer's own tracker on, its values keep its names
            # (it writes evaluate()'s and predict()'s after these hooks) and
            # memprobe's go beside them.
            own = getattr(args, "skip_memory_metrics", True) is False
            for key, value in named.items():
                out[f"{self.prefix}{key}" if own or key in target else key] = value
        target.update(out)
        self.logged.append(out)
        return out

    # --- TrainerCallback hooks ---------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._put_first()
        self.loop.init_end()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._put_first()
        self._in_train = True
        self.loop.attribution_beside(getattr(args, "output_dir", None))
        self.loop.stage_begin("train")

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.epoch_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.step_end_raw()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.epoch_end()

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if logs is None:
            return
        kind, _ = _log_kind(logs)
        if kind == "train":
            self.loop.stage_end("train")
            self._in_train = False
        elif kind == "eval":
            self.loop.eval_end(stage=not self._in_train)
            self._eval_ended = True
        metrics, named = self.loop.report(interval=kind != "eval" or self._in_train)
        # An evaluation's Trainer-named metrics go where the Trainer puts
        # them: in what evaluate() returns (on_evaluate), not in its log.
        eval_named = {k: v for k, v in named.items() if not k.startswith("train_")} if kind == "eval" else {}
        if eval_named:
            named = {k: v for k, v in named.items() if k not in eval_named}
            self._eval_named = eval_named
        added = self._add(args, logs, metrics, named)
        history = getattr(state, "log_history", None)
        # Trainer.log appended its copy of this log before calling on_log.
        last = history[-1] if history else None
        if isinstance(last, dict) and all(last.get(k) == v for k, v in logs.items() if k not in added):
            last.update(added)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> None:
        if not self._eval_ended:
            # An evaluation that logged nothing: it ends here.
            self.loop.eval_end(stage=not self._in_train)
            m, named = self.loop.report(interval=self._in_train)
            if metrics is not None:
                self._add(args, metrics, m, named)
        else:
            named = self._eval_named
            self._eval_named = {}
            if metrics is not None and named:
                self._add(args, metrics, {}, named)
        self._eval_ended = False

    def on_predict(
        self, args: Any, state: Any, control: Any, metrics: Optional[Dict[str, Any]] = None, **kwargs: Any
    ) -> None:
        self.loop.stage_end("test")
        m, named = self.loop.report(interval=False)
        if metrics is not None:
            self._add(args, metrics, m, named)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._in_train:
            # Training ended without its final log (a custom loop).
            self._in_train = False
            self.loop.stage_end("train")


def _callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError as e:
        raise ImportError(
            "memprobe.integrations.transformers.MemprobeCallback needs transformers: pip install transformers"
        ) from e
    base: type = TrainerCallback
    return base


_CALLBACK = LazyClass(
    __name__,
    "MemprobeCallback",
    MemprobeTrainerHooks,
    _callback_base,
    "Hugging Face TrainerCallback logging exact memory peaks per step, interval, "
    "epoch, evaluation and stage (see the module's documentation).",
)


def __getattr__(name: str) -> Any:
    return _CALLBACK.get(name)
