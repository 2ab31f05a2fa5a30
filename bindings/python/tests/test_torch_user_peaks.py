"""memprobe is invisible to the caller's own ``torch.cuda.max_memory_*`` and
``memory_stats()`` peaks (over a scripted torch.cuda, see fake_torch_cuda.py):
while memprobe resets torch's peak counters at its boundaries, the caller
still reads the peak since its own last ``reset_peak_memory_stats()`` (or
the start), exactly as without memprobe — and memprobe's windows keep
their own exact peaks."""

from __future__ import annotations

import gc
from typing import Any, Callable, Dict, List, Tuple

import pytest
from conftest import MiB, require_module
from fake_torch_cuda import FakeCuda

from memprobe import Tracker

Seen = Tuple[str, int, int, Dict[str, int], int, int]


def user_script(cuda: FakeCuda, boundary: Callable[[str], None]) -> List[Seen]:
    """A training script's own memory bookkeeping, with ``boundary(where)``
    wherever memprobe could make one (a no-op without memprobe)."""
    import torch

    seen: List[Seen] = []

    def look(tag: str) -> None:
        stats = torch.cuda.memory_stats(0)
        seen.append(
            (
                tag,
                torch.cuda.max_memory_allocated(0),
                torch.cuda.max_memory_reserved(),
                {k: v for k, v in stats.items() if k.endswith(".peak")},
                torch.cuda.memory.max_memory_allocated(1),
                torch.cuda.memory_stats_as_nested_dict(0)["active_bytes"]["all"]["peak"],
            )
        )

    cuda.alloc(300 * MiB)  # before memprobe's first boundary
    cuda.free(300 * MiB)
    boundary("epoch")
    look("since the start")
    cuda.alloc(50 * MiB)
    boundary("step")
    cuda.alloc(200 * MiB, device=1)
    cuda.free(200 * MiB, device=1)
    boundary("step")
    look("device 1 spiked")
    torch.cuda.reset_peak_memory_stats()  # device 0, the current one
    look("after the caller's reset")
    for size in (120, 40, 80):
        cuda.alloc(size * MiB)
        boundary("step")
        cuda.free(size * MiB)
        boundary("step")
        look(f"after a {size} MiB step")
    torch.cuda.reset_peak_memory_stats(1)
    look("device 1 reset")
    cuda.alloc(10 * MiB, device=1)
    boundary("epoch")
    torch.cuda.reset_max_memory_allocated(0)  # torch's deprecated spelling
    boundary("step")
    look("after the deprecated reset")
    return seen


@pytest.fixture
def torch_mod():
    return require_module("torch", "torch")


def test_the_callers_peaks_are_the_same_with_memprobe_as_without(torch_mod, monkeypatch):
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # reset_max_memory_allocated
    alone = FakeCuda(devices=2)
    alone.install(monkeypatch)
    without = user_script(alone, lambda where: None)

    probed = FakeCuda(devices=2)
    probed.install(monkeypatch)
    tracker = Tracker(torch_sources=True)  # rss and the allocator sources of both devices
    assert [s.name for s in tracker.sources][1:3] == ["torch_alloc:0", "torch_reserved:0"]
    tracker.begin("epoch")
    tracker.begin("step")
    steps: List[int] = []
    resets_before = list(probed.resets)

    def boundary(where: str) -> None:
        if where == "step":
            steps.append(tracker.next("step").deltas[1].peak)
        else:
            tracker.end("step")
            tracker.next("epoch")
            tracker.begin("step")

    with_memprobe = user_script(probed, boundary)
    tracker.end("step")
    tracker.end("epoch")
    tracker.close()
    gc.collect()

    # memprobe did reset torch's counters, many times...
    assert sum(probed.resets) > sum(resets_before) + 10
    # ...and the caller saw every peak as without it.
    assert with_memprobe == without
    # What it saw is torch's own answer, not a constant.
    by_tag: Dict[str, Any] = {s[0]: s for s in without}
    assert by_tag["since the start"][1] == 300 * MiB
    assert by_tag["device 1 spiked"][4] == 200 * MiB
    assert by_tag["after the caller's reset"][1] == 50 * MiB
    assert by_tag["after a 120 MiB step"][1] == 170 * MiB
    assert by_tag["after a 80 MiB step"][1] == 170 * MiB
    assert by_tag["device 1 reset"][4] == 0
    assert by_tag["after the deprecated reset"][1] == 50 * MiB
    assert by_tag["after a 40 MiB step"][3]["reserved_bytes.all.peak"] == 300 * MiB
    # memprobe's own windows stayed exact: each step its own peak.
    assert [p // MiB for p in steps][2:8] == [170, 170, 90, 90, 130, 130]


def test_a_reset_with_no_source_left_still_starts_the_callers_peaks_over(torch_mod, monkeypatch):
    import torch

    from memprobe.integrations.torch import allocator_sources

    cuda = FakeCuda(devices=1)
    cuda.install(monkeypatch)
    srcs = allocator_sources(0)
    cuda.alloc(400 * MiB)
    cuda.free(400 * MiB)
    srcs.since_start().restart()  # memprobe resets torch's counter
    assert torch.cuda.max_memory_allocated(0) == 400 * MiB
    srcs.close()
    del srcs
    gc.collect()
    # No memprobe source any more: the caller's view still holds...
    assert torch.cuda.max_memory_allocated(0) == 400 * MiB
    # ...until the caller resets, as torch would.
    cuda.alloc(5 * MiB)
    torch.cuda.reset_peak_memory_stats(0)
    assert torch.cuda.max_memory_allocated(0) == 5 * MiB
