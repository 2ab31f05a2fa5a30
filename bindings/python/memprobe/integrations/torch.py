"""PyTorch helpers. torch is imported when a helper is called, never at
``import memprobe``."""

from __future__ import annotations

import gc
from typing import Callable


def empty_cache_release(*, gc_collect: bool = False) -> Callable[[], None]:
    """A cache-release callback: ``torch.cuda.empty_cache()`` (after
    ``gc.collect()`` when ``gc_collect``), returning the caching allocator's
    unused blocks to the driver. Register it where memprobe releases caches
    (e.g. :func:`memprobe.gpu.set_cache_release`, which the ``*_no_cache``
    readings call first)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("memprobe.integrations.torch needs PyTorch: pip install torch") from e

    def release() -> None:
        if gc_collect:
            gc.collect()
        torch.cuda.empty_cache()  # a no-op until CUDA is initialised

    release.__name__ = "empty_cache_release"
    release.__qualname__ = "empty_cache_release"
    return release


def install_cache_release(*, gc_collect: bool = False) -> Callable[[], None]:
    """Registers :func:`empty_cache_release` as memprobe's GPU cache-release
    callback, so that fastai's ``gpu_mem_get_*_no_cache`` readings empty
    PyTorch's caching allocator first (as fastai's do). Returns the callback."""
    from ..gpu import set_cache_release

    release = empty_cache_release(gc_collect=gc_collect)
    set_cache_release(release)
    return release
