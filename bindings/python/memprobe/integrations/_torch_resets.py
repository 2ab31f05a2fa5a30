"""The caller's own resets of torch's peak counters, carried.

memprobe owns torch's peak counters while allocator sources exist: every
window boundary folds them into the open windows, then resets them. A reset
of the caller's own (``torch.cuda.reset_peak_memory_stats()``, in every
other training script) would drop the part of each open window's interval
before it. So torch's reset functions are wrapped, once memprobe's first
group over an allocator exists: while the allocator has sources, the
caller's reset becomes a memprobe boundary over them, whose reset *is* the
caller's (torch's peaks are folded into every open window first). Without
sources, or inside memprobe's own reset, the wrapper calls torch's function
as it is.

Wrapped: ``reset_peak_memory_stats`` in ``torch.cuda`` and
``torch.cuda.memory`` (``reset_max_memory_allocated`` and
``reset_max_memory_cached`` call the latter), and under them the bindings
every Python reset comes down to, ``torch._C._cuda_resetPeakMemoryStats``
(so that a reference taken before memprobe wrapped, ``from torch.cuda import
reset_peak_memory_stats``, is carried too) and their host-memory
counterparts where torch has them. A reset from C++ goes around all of this.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

#: The attribute that marks memprobe's wrapper and holds torch's function.
_ORIGINAL = "_memprobe_original"

class _OwnReset(threading.local):
    """``with OWN_RESET:`` marks memprobe's own reset on this thread: the
    wrappers under it (``torch._C``'s) pass it through. A class rather than
    a generator context manager: it runs at every window boundary."""

    depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: Any) -> None:
        self.depth -= 1


OWN_RESET = _OwnReset()


def _inside_own_reset() -> bool:
    return OWN_RESET.depth > 0


def unwrapped(fn: Any) -> Any:
    """torch's function under memprobe's wrapper (``fn`` itself if it is not one)."""
    while hasattr(fn, _ORIGINAL):
        fn = getattr(fn, _ORIGINAL)
    return fn


Carry = Callable[[Any], bool]


def _mark(wrapper: Any, original: Any) -> Any:
    try:
        functools.update_wrapper(wrapper, original)
    except (AttributeError, TypeError):  # a builtin without some attribute
        pass
    setattr(wrapper, _ORIGINAL, original)
    return wrapper


def _python_device_reset(original: Any, carry: Carry, device_key: Callable[[Any], Optional[Any]]) -> Any:
    def reset_peak_memory_stats(device: Any = None) -> Any:
        if not _inside_own_reset():
            key = device_key(device)
            if key is not None and carry(key):
                return None
        return original(device)

    return _mark(reset_peak_memory_stats, original)


def _raw_device_reset(original: Any, carry: Carry) -> Any:
    def _cuda_resetPeakMemoryStats(device: Any) -> Any:
        if not _inside_own_reset() and isinstance(device, int) and carry(("cuda", device)):
            return None
        return original(device)

    return _mark(_cuda_resetPeakMemoryStats, original)


def _host_reset(original: Any, carry: Carry) -> Any:
    def reset_peak_host_memory_stats(*args: Any, **kwargs: Any) -> Any:
        if not _inside_own_reset() and not args and not kwargs and carry("pinned"):
            return None
        return original(*args, **kwargs)

    return _mark(reset_peak_host_memory_stats, original)


def _wrap(module: Any, name: str, make: Callable[[Any], Any]) -> None:
    fn = getattr(module, name, None)
    if fn is not None and not hasattr(fn, _ORIGINAL):
        setattr(module, name, make(fn))


def install(torch: Any, carry: Carry, device_key: Callable[[Any], Optional[Any]]) -> None:
    """Wraps torch's reset functions that are not wrapped yet (cheap when
    they are: called at every :func:`allocator_sources`). ``carry(key)``
    makes the boundary over allocator ``key`` (``("cuda", N)`` or
    ``"pinned"``) and says whether it did; ``device_key(device)`` gives the
    key of a device argument of ``reset_peak_memory_stats``, or None when
    memprobe has no sources at all (then the device is not even resolved)."""
    cuda = torch.cuda
    for module in (cuda, getattr(cuda, "memory", None)):
        if module is None:
            continue
        _wrap(module, "reset_peak_memory_stats", lambda fn: _python_device_reset(fn, carry, device_key))
        _wrap(module, "reset_peak_host_memory_stats", lambda fn: _host_reset(fn, carry))
    c = getattr(torch, "_C", None)
    if c is not None:
        _wrap(c, "_cuda_resetPeakMemoryStats", lambda fn: _raw_device_reset(fn, carry))
        _wrap(c, "_cuda_resetPeakHostMemoryStats", lambda fn: _host_reset(fn, carry))
