"""A fake CUDA device for scripts/gpu-validate-torch.py's dry run.

The caching allocator's statistics come from the Python tests' scripted
``torch.cuda`` (bindings/python/tests/fake_torch_cuda.py, patched onto the
real, CPU-only torch); on top of it this module gives what the validation
script does with a real device: tensors of known sizes (rounded up to 512
bytes, as c10's caching allocator rounds them), a training step, the
allocator's history (``_record_memory_history`` / ``_snapshot``'s
``device_traces``: ``alloc`` / ``free_requested`` with the size asked for,
as c10 records them, ``segment_alloc`` / ``segment_free`` with the
segment's; and the state a snapshot's segments give) and ``empty_cache``.

Defects, to see the validation fail (``FAKE_TORCH_DEFECT``, comma-separated):
  reset-noop    ``torch._C._cuda_resetPeakMemoryStats`` does nothing;
  no-history    the history records nothing;
  hang          the device never answers (a part that runs out of time).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python", "tests"))
from fake_torch_cuda import FakeCuda  # noqa: E402

sys.path.pop(0)

ROUND = 512  # c10's kMinBlockSize: every allocation is a multiple of it


def rounded(n: int) -> int:
    return max(-(-n // ROUND) * ROUND, ROUND)


class HistoryCuda(FakeCuda):
    """FakeCuda with the allocator's event history and the defects above."""

    def __init__(self, defects: List[str]):
        super().__init__(devices=1)
        self.defects = set(defects)
        self.recording = False
        self.trace: List[Dict[str, Any]] = []

    def _event(self, action: str, size: int) -> None:
        if self.recording and "no-history" not in self.defects:
            self.trace.append({"action": action, "size": size})

    def _reserve(self, before: int) -> None:
        after = self.now[0]["reserved"]
        if after > before:
            self._event("segment_alloc", after - before)
        elif after < before:
            self._event("segment_free", before - after)

    def alloc(self, nbytes: int, device: int = 0) -> None:
        before = self.now[device]["reserved"]
        super().alloc(rounded(nbytes), device)
        self._reserve(before)
        self._event("alloc", nbytes)  # as c10 records it: the size asked for

    def free(self, nbytes: int, device: int = 0) -> None:
        super().free(rounded(nbytes), device)
        self._event("free_requested", nbytes)

    def empty_cache(self, device: int = 0) -> None:
        before = self.now[device]["reserved"]
        super().empty_cache(device)
        self._reserve(before)

    def reset_peaks_raw(self, device: int) -> None:
        if "reset-noop" in self.defects:
            self.resets[self._dev(device)] += 1
            return
        super().reset_peaks_raw(device)


class FakeDevice:
    """What gpu-validate-torch.py asks of a device (RealDevice is its twin)."""

    name = "fake CUDA device (dry run: bindings/python/tests/fake_torch_cuda.py)"

    def __init__(self, device: int = 0):
        import torch

        defects = [d for d in os.environ.get("FAKE_TORCH_DEFECT", "").split(",") if d]
        if "hang" in defects:
            time.sleep(3600)
        self.cuda = HistoryCuda(defects)
        self.cuda.install()
        self.torch = torch
        self.device = device
        self.defects = defects
        self.live: Dict[int, int] = {}  # tensor id -> bytes asked for
        self.ids = 0
        self.model = self.alloc(24 << 20)  # parameters and optimizer state, held for good

    def alloc(self, nbytes: int) -> Any:
        self.cuda.alloc(nbytes)
        self.ids += 1
        self.live[self.ids] = nbytes
        return self.ids

    def free(self, handle: Any) -> None:
        self.cuda.free(self.live.pop(handle))

    def train_step(self, step: int) -> None:
        """Activations and gradients of a small model: varying, freed by the end."""
        held = [self.alloc((8 << 20) + 4096 * (step % 5)), self.alloc(3 << 20)]
        grad = self.alloc(6 << 20)
        for h in held + [grad]:
            self.free(h)

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> None:
        self.cuda.empty_cache()

    def history_start(self) -> None:
        self.cuda.trace = []
        self.cuda.recording = True

    def history_take(self) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
        """The events since the last take and the state a snapshot gives."""
        events, self.cuda.trace = self.cuda.trace, []
        state = {"requested": sum(self.live.values()), "live": len(self.live),
                 "reserved": self.cuda.now[0]["reserved"]}
        return events, state

    def history_stop(self) -> None:
        self.cuda.recording = False
        self.cuda.trace = []
