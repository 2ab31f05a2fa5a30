"""The caller's view of torch's peak counters while memprobe owns them.

memprobe resets torch's peak counters at every window boundary (see
:mod:`.torch`), so without more ``torch.cuda.max_memory_allocated()`` would
answer the peak since memprobe's last boundary. Instead, just before each
of its own resets, memprobe folds every peak torch reports
(``memory_stats_as_nested_dict``: ``allocated_bytes``, ``reserved_bytes``,
``active_bytes``, ``requested_bytes``, the block and segment counts, each
pool) into the caller's *carried* peaks of that device; the caller's own
reset (carried by memprobe, :mod:`._torch_resets`) clears them, as torch's
reset would. ``torch._C._cuda_memoryStats`` — what ``memory_stats``,
``memory_stats_as_nested_dict``, ``max_memory_allocated`` and
``max_memory_reserved`` all come down to — is wrapped to answer each peak
as the larger of torch's (since memprobe's last reset) and the carried one
(since the caller's last reset, or the start): exactly what torch would
have answered without memprobe. memprobe's own reads call torch's function
under the wrapper.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from ._torch_resets import _inside_own_reset, _mark, unwrapped

__all__ = ["any_carried", "carried", "clear", "fold", "install", "unwrapped"]

#: (pid, device) -> {stat: {pool: peak}}: the peaks torch reported before
#: memprobe's resets since the caller's last reset. The pid: a forked child
#: inherits the dictionary, never the counters.
_CARRIED: Dict[Tuple[int, int], Dict[str, Dict[str, int]]] = {}


def any_carried() -> bool:
    """Whether any device has carried peaks (in any process's entry)."""
    return bool(_CARRIED)


def carried(device: int) -> Optional[Dict[str, Dict[str, int]]]:
    """The carried peaks of ``device`` in this process, if any."""
    return _CARRIED.get((os.getpid(), device))


def clear(device: int) -> None:
    """The caller reset ``device``'s peaks: nothing before it counts."""
    _CARRIED.pop((os.getpid(), device), None)


def fold(device: int, stats: Dict[str, Any]) -> None:
    """Keeps every peak of ``stats`` (a nested dict as torch gives it, read
    just before memprobe resets ``device``'s counters)."""
    key = (os.getpid(), device)
    into = _CARRIED.get(key)
    if into is None:
        into = _CARRIED[key] = {}
    for stat, pools in stats.items():
        if type(pools) is not dict:
            continue
        kept = into.get(stat)
        if kept is None:
            kept = into[stat] = {}
        for pool, values in pools.items():
            peak = values.get("peak") if type(values) is dict else None
            if peak is not None and peak > kept.get(pool, 0):
                kept[pool] = peak


def _view(stats: Any, device: Any) -> Any:
    if not _CARRIED or type(stats) is not dict or not isinstance(device, int):
        return stats
    kept = _CARRIED.get((os.getpid(), device))
    if not kept:
        return stats
    for stat, pools in kept.items():
        now = stats.get(stat)
        if type(now) is not dict:
            continue
        for pool, peak in pools.items():
            values = now.get(pool)
            if type(values) is dict and values.get("peak", peak) < peak:
                values["peak"] = peak
    return stats


def _memory_stats(original: Any) -> Any:
    def _cuda_memoryStats(device: Any) -> Any:
        stats = original(device)
        if _inside_own_reset():
            return stats
        return _view(stats, device)

    return _mark(_cuda_memoryStats, original)


def install(torch: Any) -> None:
    """Wraps ``torch._C._cuda_memoryStats`` (once; a torch without it keeps
    its own answers: the peak since memprobe's last boundary)."""
    c = getattr(torch, "_C", None)
    fn = getattr(c, "_cuda_memoryStats", None) if c is not None else None
    if fn is not None and unwrapped(fn) is fn:
        setattr(c, "_cuda_memoryStats", _memory_stats(fn))
