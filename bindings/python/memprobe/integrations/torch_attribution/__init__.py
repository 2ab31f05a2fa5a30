"""Which tensors made the peak: PyTorch's live blocks at each epoch's peak
step and at every out-of-memory error, with the Python lines that
allocated them.

Turn it on with ``attribution=True`` (or an :class:`AttributionOptions`:
``top``, ``max_entries``, ``cpp_stacks``, ``directory``, ``modules``) on any
of::

    memprobe.Tracker(sources, attribution=True)
    memprobe.integrations.torch.allocator_sources(attribution=True)   # a Tracker over them attributes
    memprobe.integrations.lightning.MemprobeCallback(attribution=True)
    memprobe.integrations.transformers.MemprobeCallback(attribution=True)
    memprobe.integrations.accelerate.MemprobeAccelerate(attribution=True)
    memprobe.notebook.load(attribution=True)    # %load_ext memprobe.notebook: set_attribution(True)

Off by default. When on, memprobe calls
``torch.cuda.memory._record_memory_history(max_entries=..., stacks="python")``
(torch records every allocation and free with its Python stack, in a ring
buffer), and watches the tracker's steps: a step whose exact peak of
``torch_alloc:N`` is the highest of its epoch so far takes ONE
``torch.cuda.memory._snapshot()``, replays the history back to the moment
of that peak (:func:`replay.replay_peak`) and keeps the table, replacing the
earlier step's. At the epoch's end the table is written and one line logged
(logger ``memprobe.attribution``, INFO).

Where the results are:

- ``tracker.attribution`` (:class:`Attribution`; every integration has it
  as ``.attribution``): ``epochs[E]`` (the record of epoch ``E``),
  ``records``, ``files``, ``snapshots`` (count), ``cost_ms`` (their total
  time), ``lines``;
- files, one per epoch, ``epoch-<E>-rank-<R>.json``, and one per PyTorch
  out-of-memory error, ``oom-<N>-rank-<R>.json`` (a process measuring
  several devices names the one with the epoch's highest peak so and adds
  ``-device-<D>`` for the others), in ``$MEMPROBE_ATTRIBUTION_DIR`` (set by
  ``memprobe run``) else ``AttributionOptions.directory`` else beside the
  run's logs (Transformers: ``<output_dir>/memprobe-attribution``;
  Accelerate: under its ``logging_dir`` or ``project_dir``) else
  ``./memprobe-attribution``; the format is :mod:`.record`'s
  (``memprobe.torch_attribution/1``): ``blocks`` (``bytes``, ``stream``,
  ``address``, ``frames`` — user files first, torch's and memprobe's left
  out — and ``module`` for a frameless backward block) plus ``rest`` sum to
  ``peak_bytes``, the step's exact peak, to the byte, whenever
  ``history.complete``; a ring buffer that lost the step's start says
  ``complete: false`` and names nothing.
- An out-of-memory report (``report_oom``) names the ``oom`` record's path
  in its detail.

What it cannot see: memory outside torch's caching allocator (the CUDA
context, NCCL, cuBLAS workspaces, other libraries): ``memprobe run``'s
origin lines (docs/attribution.md).
"""

from .engine import Attribution, AttributionWarning
from .options import AttributionOptions, as_options
from .record import DIR_ENV, MAX_BYTES, SCHEMA
from .replay import Block, Replay, block_size, replay_peak

__all__ = [
    "Attribution",
    "AttributionOptions",
    "AttributionWarning",
    "Block",
    "DIR_ENV",
    "MAX_BYTES",
    "Replay",
    "SCHEMA",
    "as_options",
    "block_size",
    "replay_peak",
]
