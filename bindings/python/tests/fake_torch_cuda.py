"""A scripted stand-in for ``torch.cuda``'s caching-allocator statistics.

CI has no GPU and a CPU build of torch (``torch.cuda.is_initialized()`` is
False there). :meth:`FakeCuda.install` patches the statistics functions onto
the real ``torch.cuda`` and ``torch.cuda.memory`` modules (as PyTorch's own
would behave: one allocated, one reserved and one active counter per device,
each with a high-water mark that ``reset_peak_memory_stats(device)`` resets
to the current value), and the test scripts allocations with :meth:`alloc` /
:meth:`free`. As in PyTorch, ``reset_peak_memory_stats`` resolves the device
(``None``: the current one) and calls ``torch._C._cuda_resetPeakMemoryStats``,
looked up at each call; torch's own ``reset_max_memory_allocated`` /
``reset_max_memory_cached`` call ``torch.cuda.memory.reset_peak_memory_stats``.
Every read of the statistics (``memory_stats``, ``max_memory_allocated``,
...) comes down to ``torch._C._cuda_memoryStats``, as in PyTorch.

Out-of-memory: :meth:`oom` does what the caching allocator does when it
gives up on an allocation — calls every observer attached through
``torch._C._cuda_attach_out_of_memory_observer`` (patched in by
:meth:`install`; like torch's, observers stay for the whole process) with
``(device, alloc, device_total, device_free)``, then raises
``torch.cuda.OutOfMemoryError``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

BLOCK = 2 << 20  # the allocator reserves whole 2 MiB segments


class FakeCuda:
    #: Observers attached in this process (torch cannot detach them either).
    observers: List[Callable[[int, int, int, int], None]] = []

    def __init__(self, devices: int = 1, total: int = 16 << 30):
        self.devices = devices
        self.total = total
        #: Free blocks inside segments still in use, per device (torch's
        #: ``inactive_split_bytes``): cached, but not releasable.
        self.split = [0] * devices
        self.now: List[Dict[str, int]] = [{"allocated": 0, "reserved": 0, "active": 0} for _ in range(devices)]
        self.peak: List[Dict[str, int]] = [{"allocated": 0, "reserved": 0, "active": 0} for _ in range(devices)]
        #: torch.cuda.current_device()
        self.current = 0
        self.host = {"current": 0, "peak": 0}
        self.resets = [0] * devices
        self.fail: Optional[BaseException] = None  # raised by the next stats read

    # --- scripting ---------------------------------------------------------------

    def _set(self, d: int, key: str, value: int) -> None:
        self.now[d][key] = value
        self.peak[d][key] = max(self.peak[d][key], value)

    def alloc(self, nbytes: int, device: int = 0) -> None:
        a = self.now[device]["allocated"] + nbytes
        self._set(device, "allocated", a)
        self._set(device, "active", a)  # every allocated block is active here
        need = -(-a // BLOCK) * BLOCK
        if need > self.now[device]["reserved"]:
            self._set(device, "reserved", need)

    def free(self, nbytes: int, device: int = 0) -> None:
        self._set(device, "allocated", self.now[device]["allocated"] - nbytes)
        self._set(device, "active", self.now[device]["allocated"])

    def empty_cache(self, device: int = 0) -> None:
        a = self.now[device]["allocated"]
        self._set(device, "reserved", -(-a // BLOCK) * BLOCK)

    def pin(self, nbytes: int) -> None:
        self.host["current"] += nbytes
        self.host["peak"] = max(self.host["peak"], self.host["current"])

    # --- torch.cuda's functions ---------------------------------------------

    def _dev(self, device: Any) -> int:
        if device is None or getattr(device, "index", 0) is None:
            d = self.current
        else:
            d = int(getattr(device, "index", device))
        if not 0 <= d < self.devices:
            raise RuntimeError(f"Invalid device argument {d}")
        return d

    def memory_stats_as_nested_dict(self, device: Any = None) -> Dict[str, Any]:
        import torch

        # As PyTorch's: the device resolved, then the binding every read of
        # the statistics comes down to, looked up at each call.
        raw = getattr(torch._C, "_cuda_memoryStats", self.memory_stats_raw)
        return raw(self._dev(device))  # type: ignore[no-any-return]

    def memory_stats_raw(self, device: int) -> Dict[str, Any]:
        """``torch._C._cuda_memoryStats``: a new nested dict at each call."""
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        d = self._dev(device)
        out: Dict[str, Any] = {}
        for key in ("allocated", "reserved", "active"):
            out[f"{key}_bytes"] = {
                pool: {"current": self.now[d][key], "peak": self.peak[d][key], "allocated": 0, "freed": 0}
                for pool in ("all", "large_pool", "small_pool")
            }
        # The split blocks are inactive.
        out["inactive_split_bytes"] = {"all": {"current": self.split[d]}}
        return out

    def memory_stats(self, device: Any = None) -> Dict[str, int]:
        flat: Dict[str, int] = {}
        for k, v in self.memory_stats_as_nested_dict(device).items():
            for pool, stats in v.items():
                for which, n in stats.items():
                    flat[f"{k}.{pool}.{which}"] = n
        return dict(sorted(flat.items()))

    def memory_allocated(self, device: Any = None) -> int:
        return self.memory_stats(device).get("allocated_bytes.all.current", 0)

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.memory_stats(device).get("allocated_bytes.all.peak", 0)

    def memory_reserved(self, device: Any = None) -> int:
        return self.memory_stats(device).get("reserved_bytes.all.current", 0)

    def max_memory_reserved(self, device: Any = None) -> int:
        return self.memory_stats(device).get("reserved_bytes.all.peak", 0)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        import torch

        # A torch without the binding (a test removes it) resets here.
        raw = getattr(torch._C, "_cuda_resetPeakMemoryStats", self.reset_peaks_raw)
        raw(self._dev(device))

    def reset_peaks_raw(self, device: int) -> None:
        """``torch._C._cuda_resetPeakMemoryStats``: what every reset made
        through torch's Python API comes down to."""
        d = self._dev(device)
        self.resets[d] += 1
        self.peak[d] = dict(self.now[d])

    def current_device(self) -> int:
        return self.current

    def host_memory_stats(self) -> Dict[str, int]:
        return {"allocated_bytes.current": self.host["current"], "allocated_bytes.peak": self.host["peak"]}

    def reset_peak_host_memory_stats(self) -> None:
        self.host["peak"] = self.host["current"]

    def is_initialized(self) -> bool:
        return True

    # --- out-of-memory --------------------------------------------------------------

    @staticmethod
    def attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
        FakeCuda.observers.append(observer)

    def oom(self, nbytes: int, device: int = 0) -> None:
        """Gives up on an allocation of ``nbytes``, as the caching allocator
        does: observers first (device, bytes asked, the device's total, its
        free bytes), then ``torch.cuda.OutOfMemoryError``."""
        import torch

        free = max(self.total - self.now[device]["reserved"], 0)
        for obs in list(FakeCuda.observers):
            obs(device, nbytes, self.total, free)
        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {nbytes} bytes. GPU {device} has a total "
            f"capacity of {self.total} bytes of which {free} bytes is free."
        )

    def device_count(self) -> int:
        return self.devices

    FUNCTIONS = (
        "memory_stats_as_nested_dict",
        "memory_stats",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "reset_peak_memory_stats",
        "is_initialized",
        "device_count",
        "current_device",
    )
    #: Also in ``torch.cuda.memory``, where torch's own functions
    #: (``reset_max_memory_allocated``, ...) look them up.
    MEMORY_FUNCTIONS = (
        "memory_stats_as_nested_dict",
        "memory_stats",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "reset_peak_memory_stats",
    )

    def install(self, monkeypatch: Any = None, *, host: bool = False) -> None:
        """Patches the functions onto the real ``torch.cuda``: through
        ``monkeypatch`` (undone after the test), or for good when None."""
        import torch
        import torch.cuda.memory

        def patch(module: Any, name: str, value: Any) -> None:
            if monkeypatch is not None:
                monkeypatch.setattr(module, name, value, raising=False)
            else:
                setattr(module, name, value)

        # A fresh allocator: what memprobe kept of the previous one's peak
        # counters (for the caller's view of them) goes with it.
        from memprobe.integrations import _torch_user_peaks

        _torch_user_peaks._CARRIED.clear()
        names = list(self.FUNCTIONS)
        if host:
            names += ["host_memory_stats", "reset_peak_host_memory_stats"]
        for name in names:
            patch(torch.cuda, name, getattr(self, name))
        for name in self.MEMORY_FUNCTIONS:
            patch(torch.cuda.memory, name, getattr(self, name))
        patch(torch._C, "_cuda_resetPeakMemoryStats", self.reset_peaks_raw)
        patch(torch._C, "_cuda_memoryStats", self.memory_stats_raw)
        patch(torch._C, "_cuda_attach_out_of_memory_observer", FakeCuda.attach_out_of_memory_observer)
