"""The caller's own ``torch.cuda.reset_peak_memory_stats()`` while memprobe
owns torch's peak counters (over a scripted torch.cuda, see
fake_torch_cuda.py): memprobe carries the peaks before the reset, so every
open window stays exact; a reset it cannot carry (from C++) is counted and
warned about."""

from __future__ import annotations

import gc
import warnings

import pytest
from conftest import MiB, require_module
from fake_torch_cuda import FakeCuda

from memprobe import Tracker, Window


@pytest.fixture
def cuda(monkeypatch):
    require_module("torch", "torch")
    fake = FakeCuda(devices=2)
    fake.install(monkeypatch)
    yield fake
    gc.collect()  # the sources over the fake go before it is unpatched


def test_a_reset_of_the_callers_own_between_two_boundaries_is_carried(cuda):
    import torch

    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0)
    cuda.alloc(10 * MiB)
    epoch = Window(srcs)
    with Window(srcs) as step:
        cuda.alloc(500 * MiB)  # 510 MiB: the true peak
        cuda.free(400 * MiB)
        resets = cuda.resets[0]
        assert torch.cuda.reset_peak_memory_stats() is None  # the current device
        # The caller's reset happened, once, as asked...
        assert cuda.resets[0] == resets + 1
        assert torch.cuda.max_memory_allocated(0) == 110 * MiB
        # ...and no window lost what came before it.
        alloc, reserved = step.reset()
        assert alloc.peak == 510 * MiB and alloc.used_start == 10 * MiB and alloc.used_end == 110 * MiB
        assert reserved.peak == 510 * MiB
    assert epoch.peaks() == [510 * MiB, 510 * MiB]
    assert srcs.peak_since_start("torch_alloc:0") == 510 * MiB
    epoch.close()
    srcs.close()


@pytest.mark.parametrize(
    "how",
    [
        "torch.cuda.reset_peak_memory_stats(0)",
        "torch.cuda.reset_peak_memory_stats('cuda:0')",
        "torch.cuda.memory.reset_peak_memory_stats(torch.device('cuda', 0))",
        "torch.cuda.reset_max_memory_allocated(0)",
        "torch.cuda.reset_max_memory_cached(device='cuda:0')",
        "torch._C._cuda_resetPeakMemoryStats(0)",
        "early(0)",  # `from torch.cuda import reset_peak_memory_stats` before memprobe
    ],
)
def test_every_way_to_reset_through_torchs_python_api_is_carried(cuda, how):
    import torch

    from memprobe.integrations.torch import allocator_sources, foreign_resets

    early = torch.cuda.reset_peak_memory_stats  # taken before memprobe wrapped it
    srcs = allocator_sources(0)
    other = allocator_sources(1, reserved=False)
    with Window(srcs + other) as w:
        cuda.alloc(300 * MiB)
        cuda.free(300 * MiB)
        cuda.alloc(70 * MiB, device=1)
        cuda.free(70 * MiB, device=1)
        resets = list(cuda.resets)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # reset_max_memory_*: deprecated
            eval(how, {"torch": torch, "early": early})
        assert cuda.resets == [resets[0] + 1, resets[1]]  # device 0 only, once
        assert [d.peak for d in w.reset()] == [300 * MiB, 300 * MiB, 70 * MiB]
    assert foreign_resets() == 0
    other.close()
    srcs.close()


def test_a_torch_without_the_binding_is_carried_through_its_python_function(cuda, monkeypatch):
    import torch

    from memprobe.integrations.torch import allocator_sources

    monkeypatch.delattr(torch._C, "_cuda_resetPeakMemoryStats")
    srcs = allocator_sources(0)  # memprobe's own resets go through torch.cuda's function
    with Window(srcs) as w:
        cuda.alloc(500 * MiB)
        cuda.free(400 * MiB)
        resets = cuda.resets[0]
        torch.cuda.reset_peak_memory_stats(0)
        assert cuda.resets[0] == resets + 1
        assert w.reset()[0].peak == 500 * MiB
        assert cuda.resets[0] == resets + 2  # and the boundary's own
    srcs.close()


def test_nested_windows_and_a_tracker_keep_their_peaks_across_user_resets(cuda):
    import torch

    with Tracker() as t:  # rss and the allocator sources of both devices
        steps = []
        with t.epoch() as epoch:
            for size in (40, 120, 80):
                with t.step() as s:
                    cuda.alloc(size * MiB)
                    cuda.free(size * MiB)
                    torch.cuda.reset_peak_memory_stats()
                    cuda.alloc(1 * MiB)
                    cuda.free(1 * MiB)
                steps.append(s.record.deltas[1].peak)
        assert steps == [40 * MiB, 120 * MiB, 80 * MiB]
        assert epoch.record.deltas[1].peak == 120 * MiB


def test_without_sources_a_reset_is_torchs_own(cuda):
    import torch

    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0)
    del srcs
    gc.collect()  # no source left: nothing to carry
    resets = cuda.resets[0]
    cuda.alloc(8 * MiB)
    cuda.free(8 * MiB)
    torch.cuda.reset_peak_memory_stats(0)
    assert cuda.resets[0] == resets + 1
    assert torch.cuda.max_memory_allocated(0) == 0
    # torch's own error for a device it does not have, windows untouched
    srcs = allocator_sources(0)
    with Window(srcs) as w:
        cuda.alloc(3 * MiB)
        with pytest.raises(RuntimeError, match="Invalid device argument 5"):
            torch.cuda.reset_peak_memory_stats(5)
        assert w.peaks() == [3 * MiB, 8 * MiB]  # the cache kept the 8 MiB it reserved
    srcs.close()


def test_a_reset_memprobe_cannot_see_is_counted_and_warned_once(cuda):
    import torch

    from memprobe.integrations.torch import ForeignResetWarning, allocator_sources, foreign_resets

    srcs = allocator_sources(0, reserved=False)
    with Window(srcs) as w:
        cuda.alloc(200 * MiB)
        assert w.peak() == 200 * MiB
        cuda.free(200 * MiB)
        cuda.reset_peaks_raw(0)  # what a C++ resetPeakStats does: no Python in between
        with pytest.warns(ForeignResetWarning, match="cuda:0 were reset outside memprobe"):
            assert w.reset()[0].peak == 200 * MiB  # read before the reset: kept
        assert foreign_resets() == foreign_resets(0) == foreign_resets("cuda:0") == 1
        assert foreign_resets(1) == 0
        # Not seen before the reset: the part before it is lost, and counted.
        cuda.alloc(90 * MiB)
        cuda.free(90 * MiB)
        w.reset()
        cuda.alloc(30 * MiB)
        cuda.free(30 * MiB)
        cuda.reset_peaks_raw(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ForeignResetWarning)  # once per device: not again
            assert w.reset()[0].peak == 0
        assert foreign_resets(0) == 1  # nothing read since the last boundary was above 0
        cuda.alloc(64 * MiB)
        assert w.peak() == 64 * MiB
        cuda.free(64 * MiB)
        cuda.reset_peaks_raw(0)
        w.reset()
        assert foreign_resets(0) == 2
    # A carried reset is never counted.
    torch.cuda.reset_peak_memory_stats(0)
    with Window(srcs) as w:
        cuda.alloc(5 * MiB)
        torch.cuda.reset_peak_memory_stats(0)
        assert w.reset()[0].peak == 5 * MiB
    assert foreign_resets(0) == 2
    srcs.close()


def test_pinned_host_memory_resets_are_carried(cuda, monkeypatch):
    import torch

    from memprobe.integrations.torch import pinned_sources

    cuda.install(monkeypatch, host=True)
    srcs = pinned_sources()
    with Window(srcs) as w:
        cuda.pin(32 * MiB)
        cuda.host["current"] -= 32 * MiB
        torch.cuda.reset_peak_host_memory_stats()
        assert cuda.host["peak"] == 0  # the caller's reset happened
        assert w.reset()[0].peak == 32 * MiB
    srcs.close()


def test_lightning_callback_keeps_exact_step_peaks_when_the_model_resets(cuda, tmp_path):
    require_module("lightning", "lightning")
    import lightning.pytorch as pl
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    temps = {1: 2000 * MiB, 4: 700 * MiB}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            temp = temps.get(self.global_step, 0)
            cuda.alloc(temp)  # a temporary "GPU" tensor
            cuda.free(temp)
            # What training scripts do to read their own per-step peak.
            torch.cuda.reset_peak_memory_stats()
            cuda.alloc(33 * MiB)
            cuda.free(33 * MiB)
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 8)), batch_size=4)
    cb = MemprobeCallback(log_every_n_steps=1)
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[cb],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        accelerator="cpu",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about GPUs and loggers
        trainer.fit(Model(), data)
    steps = [d for phase, _, d in cb.history if phase == "step"]
    epochs = [d for phase, _, d in cb.history if phase == "epoch"]
    assert [d[1].peak for d in steps] == [max(temps.get(i, 0), 33 * MiB) for i in range(6)]
    assert [d[1].peak for d in epochs] == [2000 * MiB]
