"""A fake PyTorch caching allocator over the fake CUDA driver, for the GPU
validation's dry run (scripts/gpu-validate-oom.py --fake).

The Python tests' scripted ``torch.cuda`` (bindings/python/tests/
fake_torch_cuda.py, patched onto the real, CPU-only torch) keeps the
statistics; here every segment comes from ``cuMemAlloc_v2`` of the
``libcuda.so.1`` on the library path (tests/fake-gpu/fake_cuda.c), so that
the interposer, when preloaded, counts what this allocator holds, and a
device that is full makes the driver fail, as on a GPU. What c10 does, in
short: a tensor takes a free cached segment that fits, else a new one
(rounded up to 2 MiB); when the driver fails, the cache is released and
the allocation tried once more; when that fails too, torch's out-of-memory
observers run and ``torch.cuda.OutOfMemoryError`` is raised.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python", "tests"))
from fake_torch_cuda import FakeCuda  # noqa: E402

sys.path.pop(0)

SEGMENT = 2 << 20


def rounded(n: int) -> int:
    return max(-(-n // 512) * 512, 512)


class DriverCache(FakeCuda):
    def __init__(self) -> None:
        super().__init__(devices=1)
        cu = ctypes.CDLL("libcuda.so.1")
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        for rc in (cu.cuInit(0), cu.cuDeviceGet(ctypes.byref(dev), 0),
                   cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), cu.cuCtxSetCurrent(ctx)):
            if rc != 0:
                raise RuntimeError(f"the fake driver refused to start: CUresult {rc}")
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        cu.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        self.cu = cu
        free, total = self.mem_get_info()
        self.total = total
        #: [pointer, segment bytes, bytes in use (0: cached)]
        self.segments: List[List[int]] = []

    def mem_get_info(self, device: int = 0) -> Tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def _stats(self) -> None:
        a = sum(s[2] for s in self.segments)
        self._set(0, "allocated", a)
        self._set(0, "active", a)
        self._set(0, "reserved", sum(s[1] for s in self.segments))

    def _driver_alloc(self, size: int) -> int:
        p = ctypes.c_uint64()
        return p.value if self.cu.cuMemAlloc_v2(ctypes.byref(p), size) == 0 else 0

    def tensor(self, nbytes: int, device: int = 0) -> List[int]:
        """A tensor of ``nbytes``: the segment that holds it."""
        need = rounded(nbytes)
        for seg in self.segments:
            if seg[2] == 0 and seg[1] >= need:
                seg[2] = need
                self._stats()
                return seg
        size = -(-need // SEGMENT) * SEGMENT
        ptr = self._driver_alloc(size)
        if not ptr:
            self.empty_cache()  # what c10 does before it gives up
            ptr = self._driver_alloc(size)
        if not ptr:
            self.oom(nbytes, device)  # observers, then OutOfMemoryError
        seg = [ptr, size, need]
        self.segments.append(seg)
        self._stats()
        return seg

    def release(self, seg: List[int]) -> None:
        seg[2] = 0
        self._stats()

    def empty_cache(self, device: int = 0) -> None:
        for seg in [s for s in self.segments if s[2] == 0]:
            self.cu.cuMemFree_v2(seg[0])
            self.segments.remove(seg)
        self._stats()

    def oom(self, nbytes: int, device: int = 0) -> None:
        free, _ = self.mem_get_info()
        for obs in list(FakeCuda.observers):
            obs(device, nbytes, self.total, free)
        import torch

        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes} bytes (fake driver)")


class FakeOomDevice:
    """What gpu-validate-oom.py asks of torch (its RealDevice's twin)."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.cuda = DriverCache()
        self.cuda.install()
        torch.cuda.mem_get_info = self.cuda.mem_get_info  # type: ignore[assignment]

    def alloc(self, nbytes: int) -> Any:
        return self.cuda.tensor(nbytes)

    def free(self, handle: Any) -> None:
        self.cuda.release(handle)

    def mem_get_info(self) -> Tuple[int, int]:
        return self.cuda.mem_get_info()
