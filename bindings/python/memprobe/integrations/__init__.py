"""Framework integrations. Each module imports its framework only when it
is imported itself (never at ``import memprobe``):

- :mod:`memprobe.integrations.lightning`: ``MemprobeCallback``, a PyTorch
  Lightning callback logging per-step and per-epoch peaks.
- :mod:`memprobe.integrations.avalanche`: Avalanche's ``ram_usage_metrics``
  (``MinibatchMaxRAM``, ``EpochMaxRAM``, ...) with exact peaks.
- :mod:`memprobe.integrations.torch`: ``empty_cache_release()``, a cache
  release callback calling ``torch.cuda.empty_cache()``.
- :mod:`memprobe.integrations.phases`: ``PhasePeaks``, the framework-free
  engine under the first two (one window per phase kind).
"""
