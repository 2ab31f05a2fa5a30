"""Framework integrations. Each module imports its framework only when it
is imported itself (never at ``import memprobe``):

- :mod:`memprobe.integrations.lightning`: ``MemprobeCallback``, a PyTorch
  Lightning callback logging per-step and per-epoch peaks.
- :mod:`memprobe.integrations.avalanche`: Avalanche's ``ram_usage_metrics`` and ``gpu_usage_metrics``
  (``MinibatchMaxRAM``, ``EpochMaxRAM``, ...) with exact peaks.
- :mod:`memprobe.integrations.torch`: exact sources over PyTorch's CUDA
  caching allocator (``allocator_sources()``), ``peak_since_start``, and
  ``empty_cache_release()``, a cache release callback.
- :mod:`memprobe.integrations.jax`: ``jax_sources()``, sampled sources over
  each JAX device's ``bytes_in_use`` (JAX cannot reset its peak).
- :mod:`memprobe.integrations.phases`: ``PhasePeaks``, the framework-free
  engine under the first two (one window per phase kind).
- :mod:`memprobe.integrations.transformers`: ``MemprobeCallback``, a Hugging
  Face ``TrainerCallback`` (exact step, interval, epoch, evaluation and stage
  peaks in the Trainer's logs, and its ``*_mem_*`` stage metrics).
- :mod:`memprobe.integrations.accelerate`: ``MemprobeAccelerate``, the same
  for an Accelerate loop, with cache release through Accelerate.
- :mod:`memprobe.integrations.loop`: ``LoopPeaks``, the framework-free
  engine under those two; :mod:`memprobe.integrations.trainer_stages`, the
  Trainer's stage metrics from memprobe's deltas.

With several ranks (``torch.distributed``) the Lightning, Transformers and
Accelerate integrations log the maximum across ranks at each log
(``_ranks``: one all-reduce then).
"""
