"""Hugging Face Trainer's stage memory metrics, from memprobe's exact
windows: the names and definitions of transformers' ``TrainerMemoryTracker``
(``Trainer(skip_memory_metrics=False)``), for a stage (``init``, ``train``,
``eval``, ``test`` — ``Trainer.predict``'s stage is named ``test``):

- ``<stage>_mem_cpu_alloc_delta``: RSS at the end minus RSS at the start;
- ``<stage>_mem_cpu_peaked_delta``: ``max(0, peak - end)`` (the peak above
  what is still held at the end; alloc + peaked is what the stage needed);
- ``<stage>_mem_gpu_alloc_delta`` / ``..._peaked_delta``: the same over
  ``torch.cuda.memory_allocated()`` of the current device (the
  ``torch_alloc:N`` source), when the window has it;
- with the first stage reported: ``before_init_mem_cpu`` (and
  ``before_init_mem_gpu``), what was used when ``init`` began.

The Trainer's peak comes from a thread that spins without sleeping (a core
busy the whole stage) and still misses what lives between two reads;
memprobe's is the kernel's and torch's high-water mark over the window."""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

from ..sources import Source, SourceKind
from ..windows import Delta
from .torch import cuda_initialized


def _cpu_index(sources: Sequence[Source]) -> Optional[int]:
    for i, s in enumerate(sources):
        if s.kind == SourceKind.PROCESS:
            return i
    return None


def _gpu_index(sources: Sequence[Source]) -> Optional[int]:
    """The ``torch_alloc:N`` source of torch's current device, if any."""
    if not cuda_initialized():
        return None
    torch = sys.modules["torch"]
    names = [s.name for s in sources]
    try:
        name = f"torch_alloc:{int(torch.cuda.current_device())}"
    except Exception:  # noqa: BLE001 - a torch without CUDA
        return None
    return names.index(name) if name in names else None


def stage_metrics(stage: str, sources: Sequence[Source], deltas: Sequence[Delta]) -> Dict[str, int]:
    """``{"<stage>_mem_cpu_alloc_delta": ..., ...}`` in bytes, for the
    sources the window has (RSS; torch's allocated bytes of the current
    device)."""
    out: Dict[str, int] = {}
    for which, index in (("cpu", _cpu_index(sources)), ("gpu", _gpu_index(sources))):
        if index is None or index >= len(deltas):
            continue
        d = deltas[index]
        out[f"{stage}_mem_{which}_alloc_delta"] = d.used_end - d.used_start
        out[f"{stage}_mem_{which}_peaked_delta"] = max(0, d.peak - d.used_end)
    return out


def before_init(sources: Sequence[Source], deltas: Sequence[Delta]) -> Dict[str, int]:
    """``before_init_mem_cpu`` (and ``_gpu``): used when ``init`` began."""
    out: Dict[str, int] = {}
    for which, index in (("cpu", _cpu_index(sources)), ("gpu", _gpu_index(sources))):
        if index is not None and index < len(deltas):
            out[f"before_init_mem_{which}"] = deltas[index].used_start
    return out


def torch_init_gpu(stage: str = "init") -> Dict[str, int]:
    """The GPU metrics of a stage during which PyTorch initialised CUDA
    (memprobe had no allocator source when it began): it began at 0 bytes
    and torch's own peak counter covers it since CUDA's initialisation."""
    if not cuda_initialized():
        return {}
    torch = sys.modules["torch"]
    try:
        dev = int(torch.cuda.current_device())
        now = int(torch.cuda.memory_allocated(dev))
        peak = int(torch.cuda.max_memory_allocated(dev))
    except Exception:  # noqa: BLE001
        return {}
    return {
        f"{stage}_mem_gpu_alloc_delta": now,
        f"{stage}_mem_gpu_peaked_delta": max(0, peak - now),
        "before_init_mem_gpu": 0,
    }


__all__: List[str] = ["before_init", "stage_metrics", "torch_init_gpu"]
