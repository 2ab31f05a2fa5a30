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

History: ``torch.cuda.memory._record_memory_history`` and ``_snapshot``
(patched in by :meth:`install`) as PyTorch's: while recording, every
:meth:`alloc` / :meth:`free` adds an entry (``alloc``, ``free_requested``,
``free_completed``; ``time_us`` in Unix microseconds; the size the caller
asked for; the caller's Python frames, innermost first) to a per-device
ring buffer of ``max_entries``; ``_snapshot()`` gives the live blocks in
``"segments"`` (one segment per block, as if each came from the driver
alone) and the buffers in ``"device_traces"``.
"""

from __future__ import annotations

import collections
import os
import time
import traceback
from typing import Any, Callable, Deque, Dict, List, Optional

BLOCK = 2 << 20  # the allocator reserves whole 2 MiB segments
_HERE = os.path.abspath(__file__)


def _frames() -> List[Dict[str, Any]]:
    """The caller's Python stack as torch records it: innermost first,
    this file's frames left out."""
    out = []
    for f in reversed(traceback.extract_stack()):
        if os.path.abspath(f.filename) == _HERE:
            continue
        out.append({"filename": f.filename, "line": f.lineno or 0, "name": f.name})
    return out


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
        # Blocks by device: address -> {"size", "requested", "stream", "frames", "state"}.
        self.blocks: List[Dict[int, Dict[str, Any]]] = [{} for _ in range(devices)]
        self._next_addr = [0x7F0000000000 + (d << 36) for d in range(devices)]
        self.history: List[Deque[Dict[str, Any]]] = [collections.deque() for _ in range(devices)]
        self.history_on = False
        self.max_entries = 0
        #: Arguments of every _record_memory_history call, and snapshots taken.
        self.history_calls: List[Dict[str, Any]] = []
        self.snapshots = 0

    # --- scripting ---------------------------------------------------------------

    def _set(self, d: int, key: str, value: int) -> None:
        self.now[d][key] = value
        self.peak[d][key] = max(self.peak[d][key], value)

    def _record(self, device: int, action: str, addr: int, size: int, stream: int, frames: List[Any]) -> None:
        if not self.history_on:
            return
        entry = {
            "action": action,
            "addr": addr,
            "size": size,
            "stream": stream,
            "time_us": time.time_ns() // 1000,
            "frames": frames,
        }
        buf = self.history[device]
        buf.append(entry)
        while len(buf) > self.max_entries:
            buf.popleft()

    def alloc(
        self,
        nbytes: int,
        device: int = 0,
        *,
        stream: int = 0,
        requested: Optional[int] = None,
        frames: Optional[List[Dict[str, Any]]] = None,
    ) -> int:
        """Allocates a block of ``nbytes`` (what torch's allocated bytes
        count); the history records ``requested`` (default ``nbytes``), the
        size the caller asked for. Returns the block's address."""
        addr = self._next_addr[device]
        self._next_addr[device] += -(-max(nbytes, 1) // 512) * 512 + 512
        fr = _frames() if frames is None else frames
        self.blocks[device][addr] = {
            "size": nbytes,
            "requested": nbytes if requested is None else requested,
            "stream": stream,
            "frames": fr,
            "state": "active_allocated",
        }
        self._record(device, "alloc", addr, nbytes if requested is None else requested, stream, fr)
        self._count_alloc(nbytes, device)
        return addr

    def _count_alloc(self, nbytes: int, device: int) -> None:
        a = self.now[device]["allocated"] + nbytes
        self._set(device, "allocated", a)
        self._set(device, "active", a)  # every allocated block is active here
        need = -(-a // BLOCK) * BLOCK
        if need > self.now[device]["reserved"]:
            self._set(device, "reserved", need)

    def free(
        self, nbytes: Optional[int] = None, device: int = 0, *, addr: Optional[int] = None, pending: bool = False
    ) -> None:
        """Frees the block at ``addr`` (else the newest block of ``nbytes``;
        else only the counters move). ``pending``: a stream still uses it
        (``free_requested`` now, ``free_completed`` at :meth:`complete`)."""
        blocks = self.blocks[device]
        if addr is None and nbytes is not None:
            for a in reversed(list(blocks)):
                if blocks[a]["size"] == nbytes and blocks[a]["state"] == "active_allocated":
                    addr = a
                    break
        if addr is not None:
            b = blocks[addr]
            nbytes = b["size"]
            fr = _frames()
            self._record(device, "free_requested", addr, b["requested"], b["stream"], fr)
            if pending:
                b["state"] = "active_pending_free"
            else:
                self._record(device, "free_completed", addr, b["requested"], b["stream"], fr)
                del blocks[addr]
        assert nbytes is not None
        self._set(device, "allocated", self.now[device]["allocated"] - nbytes)
        self._set(device, "active", self.now[device]["allocated"])

    def complete(self, addr: int, device: int = 0) -> None:
        """A pending free completes (its stream is done with the block)."""
        b = self.blocks[device].pop(addr)
        self._record(device, "free_completed", addr, b["requested"], b["stream"], [])

    # --- torch.cuda.memory's history ------------------------------------------------

    def _record_memory_history(
        self,
        enabled: Optional[str] = "all",
        context: Optional[str] = "all",
        stacks: str = "all",
        max_entries: int = 2**62,
        device: Any = None,
    ) -> None:
        self.history_calls.append(
            {"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries}
        )
        self.history_on = enabled is not None
        self.max_entries = int(max_entries)
        for buf in self.history:
            while len(buf) > self.max_entries:
                buf.popleft()

    def _snapshot(self, device: Any = None) -> Dict[str, Any]:
        self.snapshots += 1
        segments = []
        for d, blocks in enumerate(self.blocks):
            for addr, b in blocks.items():
                total = -(-b["size"] // BLOCK) * BLOCK
                inner = [
                    {
                        "address": addr,
                        "size": b["size"],
                        "requested_size": b["requested"],
                        "state": b["state"],
                        "frames": b["frames"],
                    }
                ]
                if total > b["size"]:
                    inner.append(
                        {"address": addr + b["size"], "size": total - b["size"], "requested_size": 0, "state": "inactive", "frames": []}
                    )
                segments.append(
                    {
                        "device": d,
                        "address": addr,
                        "total_size": total,
                        "allocated_size": b["size"] if b["state"] == "active_allocated" else 0,
                        "active_size": b["size"],
                        "requested_size": b["requested"],
                        "stream": b["stream"],
                        "segment_type": "large" if total > BLOCK else "small",
                        "segment_pool_id": (0, 0),
                        "is_expandable": False,
                        "frames": [],
                        "blocks": inner,
                    }
                )
        return {"segments": segments, "device_traces": [[dict(e) for e in buf] for buf in self.history]}

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
        self._record(device, "oom", free, nbytes, 0, _frames())
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
        patch(torch.cuda.memory, "_record_memory_history", self._record_memory_history)
        patch(torch.cuda.memory, "_snapshot", self._snapshot)
