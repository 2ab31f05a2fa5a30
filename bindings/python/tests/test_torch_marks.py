"""memprobe.integrations.torch over a scripted torch.cuda (no GPU in CI):
exact allocator peaks per window, shared resets, peak since start, the
tracker, the Lightning callback and Avalanche's GPU metrics."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys

import pytest
from conftest import PKG, MiB, require, require_module, run_python, SITE
from fake_torch_cuda import FakeCuda

import memprobe
from memprobe import Fidelity, Tracker, Window


@pytest.fixture
def cuda(monkeypatch):
    require_module("torch", "torch")
    fake = FakeCuda(devices=2)
    fake.install(monkeypatch)
    yield fake
    gc.collect()  # the sources over the fake go before it is unpatched


def names(srcs):
    return [s.name for s in srcs]


def test_import_never_imports_torch_nor_initialises_cuda():
    # Imports torch at its end (in a child): skipped like its siblings where
    # torch is not installed, failed in CI.
    require(importlib.util.find_spec("torch") is not None, "torch is not installed; pip install torch")
    code = (
        "import sys, memprobe, memprobe.integrations.torch as mt\n"
        "assert 'torch' not in sys.modules\n"
        "assert mt.cuda_initialized() is False and 'torch' not in sys.modules\n"
        "t = memprobe.Tracker()\n"  # default sources: no torch either
        "assert 'torch' not in sys.modules and len(t.sources) == 1\n"
        "t.close()\n"
        "try:\n"
        "    mt.allocator_sources()\n"
        "except RuntimeError as e:\n"
        "    print('refused', 'not initialised CUDA' in str(e))\n"
        "import torch\n"
        "print('initialised', torch.cuda.is_initialized())\n"
    )
    r = run_python(code, env={"PYTHONPATH": str(SITE)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "True", "initialised", "False"]


def test_sources_per_device(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources()
    assert names(srcs) == ["torch_alloc:0", "torch_reserved:0", "torch_alloc:1", "torch_reserved:1"]
    assert all(s.fidelity is Fidelity.EXACT for s in srcs)
    cuda.alloc(3 * MiB, device=1)
    assert srcs[2].read().used == 3 * MiB and srcs[3].read().used == 4 * MiB
    assert srcs[0].read().used == 0
    one = allocator_sources(1, reserved=False)
    assert names(one) == ["torch_alloc:1"]
    assert one[0] is srcs[2]  # one group per device, shared
    with pytest.raises(ValueError):
        allocator_sources(2)
    one.close()
    srcs.close()


def test_devices_are_named_as_torch_names_them(cuda):
    import torch

    from memprobe.integrations.torch import allocator_sources

    for spec in (1, "cuda:1", torch.device("cuda:1"), torch.device("cuda", 1), [torch.device("cuda:1")],
                 ("cuda:1",), torch.cuda.device(1)):
        assert names(allocator_sources(spec, reserved=False)) == ["torch_alloc:1"], spec
    assert names(allocator_sources(["cuda:1", 0], reserved=False)) == ["torch_alloc:1", "torch_alloc:0"]
    cuda.current = 1  # "cuda" and torch.device("cuda"): torch's current device
    assert names(allocator_sources("cuda", reserved=False)) == ["torch_alloc:1"]
    assert names(allocator_sources(torch.device("cuda"), reserved=False)) == ["torch_alloc:1"]
    for bad in ("cpu", torch.device("cpu"), "gpu:0", "cuda:x"):
        with pytest.raises(ValueError, match="not a CUDA device"):
            allocator_sources(bad)
    with pytest.raises(ValueError, match="no CUDA device 2: 2 visible"):
        allocator_sources("cuda:2")
    for bad in (1.5, True, object()):
        with pytest.raises(TypeError, match="a CUDA device is"):
            allocator_sources(bad)


def test_active_bytes_and_since_start_reset(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0, active=True)
    assert names(srcs) == ["torch_alloc:0", "torch_reserved:0", "torch_active:0"]
    assert names(allocator_sources(0, reserved=False, active=True)) == ["torch_alloc:0", "torch_active:0"]
    with Window(srcs[2]) as step:
        cuda.alloc(48 * MiB)
        cuda.free(48 * MiB)
        assert step.reset()[0].peak == 48 * MiB
    assert srcs.peak_since_start("torch_active:0") == 48 * MiB
    ended = srcs.since_start().reset()  # starts it over; other windows keep theirs
    assert [d.peak for d in ended] == [48 * MiB, 48 * MiB, 48 * MiB]
    cuda.alloc(6 * MiB)
    assert srcs.peak_since_start() == {"torch_alloc:0": 6 * MiB, "torch_reserved:0": 48 * MiB, "torch_active:0": 6 * MiB}
    srcs.close()
    with pytest.raises(ValueError, match="closed"):
        srcs.since_start()


def test_closing_the_sources_under_a_window_keeps_one_group(cuda):
    # Closing the sources while a window holds them, then asking again, used
    # to make a second group over the same torch counter: each group's
    # boundaries then reset the peaks the other had not read yet.
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0)
    epoch = Window(srcs)
    cuda.alloc(10 * MiB)
    for s in srcs:
        s.close()
    srcs.close()
    again = allocator_sources(0)
    cuda.alloc(100 * MiB)
    cuda.free(100 * MiB)
    with Window(again) as step:  # a boundary: folds the 110 MiB into the epoch first
        cuda.alloc(1 * MiB)
        cuda.free(1 * MiB)
        assert step.reset()[0].peak == 11 * MiB
    assert epoch.peaks() == [110 * MiB, 110 * MiB]
    assert again[0] is srcs[0] and again[1] is srcs[1]  # one group per device
    # The sources stay usable for every holder, and go when none holds them.
    assert srcs[0].read().used == 10 * MiB
    epoch.close()
    again.close()
    before = memprobe.live_handles()[0]
    del srcs, again, s, epoch, step
    gc.collect()
    assert memprobe.live_handles()[0] == before - 2


def test_sources_made_before_a_fork_raise_in_the_child(cuda):
    import torch

    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0, reserved=False)
    cuda.alloc(5 * MiB)
    w = Window(srcs)
    r, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report in one line, never return into pytest
        out = []
        try:
            for what, call in (("read", srcs[0].read), ("reset", w.reset)):
                try:
                    call()
                    out.append(f"{what}: no error")
                except memprobe.UnavailableError as e:
                    out.append(f"{what}: {type(e.__cause__).__name__}: {e.__cause__}")
            # What torch's own at-fork handler leaves in a child of a CUDA parent.
            torch.cuda.is_initialized = lambda: False
            torch.cuda._is_in_bad_fork = lambda: True
            try:
                allocator_sources(0)
                out.append("new: no error")
            except RuntimeError as e:
                out.append(f"new: {e}")
        except BaseException as e:  # noqa: BLE001
            out.append(f"child failed: {e!r}")
        os.write(wr, "\n".join(out).encode())
        os._exit(0)
    os.close(wr)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    os.waitpid(pid, 0)
    assert len(lines) == 3, lines
    for line in lines[:2]:
        assert "RuntimeError" in line and "forked child" in line and f"process {os.getpid()}" in line, line
    assert lines[2].startswith("new: this is a process forked") and "spawn" in lines[2], lines[2]
    # The parent's window is untouched.
    assert w.reset()[0].peak == 5 * MiB
    w.close()
    srcs.close()


def test_temporary_allocation_between_two_boundaries_is_the_peak(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0)
    cuda.alloc(10 * MiB)
    with Window(srcs) as step:
        for temp in (512 * MiB, 0, 3 * MiB + 1):
            cuda.alloc(temp)
            cuda.free(temp)
            alloc, reserved = step.reset()
            assert alloc.peak == 10 * MiB + temp
            assert alloc.used_start == alloc.used_end == 10 * MiB
            # the cache keeps what it reserved: its peak is what it holds
            assert reserved.peak == cuda.now[0]["reserved"] >= alloc.peak
    srcs.close()


def test_nested_and_sibling_windows_stay_independent(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0, reserved=False)
    epoch = Window(srcs)
    evaluation = Window(srcs)
    step = Window(srcs)
    peaks = []
    for size in (100, 300, 200):
        cuda.alloc(size * MiB)
        cuda.free(size * MiB)
        peaks.append(step.reset()[0].peak)
    assert peaks == [100 * MiB, 300 * MiB, 200 * MiB]
    assert epoch.peak() == 300 * MiB
    evaluation.restart()
    cuda.alloc(50 * MiB)
    cuda.free(50 * MiB)
    assert evaluation.reset()[0].peak == 50 * MiB
    assert epoch.peak() == 300 * MiB and step.peak() == 50 * MiB
    assert cuda.resets[0] >= 5  # memprobe owns torch's peak counter
    for w in (step, evaluation, epoch):
        w.close()
    srcs.close()


def test_shared_reset_through_one_source_keeps_the_others(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0)
    alloc, reserved = srcs
    on_reserved = Window(reserved)
    on_alloc = Window(alloc)
    cuda.alloc(64 * MiB)
    cuda.free(64 * MiB)
    cuda.empty_cache()
    for _ in range(3):
        on_alloc.restart()  # each resets torch's peaks of the whole device
    assert on_reserved.peak() == 64 * MiB
    assert on_alloc.peak() == 0
    assert on_reserved.reset()[0].peak == 64 * MiB
    assert on_reserved.peak() == 0
    on_alloc.close()
    on_reserved.close()
    srcs.close()


def test_peak_since_start_survives_memprobe_boundaries(cuda):
    import torch

    from memprobe.integrations.torch import allocator_sources, peak_since_start

    srcs = allocator_sources(0)
    with Window(srcs) as step:
        cuda.alloc(700 * MiB)
        cuda.free(700 * MiB)
        step.restart()
        cuda.alloc(5 * MiB)
        step.restart()
        # torch's counter holds the peak since memprobe's last boundary, but
        # the caller sees the peak since the start, as without memprobe
        assert torch.cuda.max_memory_allocated(0) == 700 * MiB
        assert peak_since_start(srcs, "torch_alloc:0") == 700 * MiB
        assert srcs.peak_since_start() == {"torch_alloc:0": 700 * MiB, "torch_reserved:0": 700 * MiB}
    with pytest.raises(KeyError):
        srcs.peak_since_start("torch_alloc:9")
    srcs.close()
    with pytest.raises(ValueError):
        srcs.peak_since_start()


def test_torch_errors_are_raised_from_the_boundary(cuda):
    from memprobe.integrations.torch import allocator_sources

    srcs = allocator_sources(0, reserved=False)
    with Window(srcs) as w:
        cuda.alloc(9 * MiB)
        cuda.fail = RuntimeError("CUDA error: an illegal memory access was encountered")
        with pytest.raises(memprobe.UnavailableError) as err:
            w.reset()
        assert "illegal memory access" in str(err.value.__cause__)
        assert "torch_alloc:0" in err.value.message
        assert w.reset()[0].peak == 9 * MiB
    srcs.close()


def test_pinned_host_memory(cuda, monkeypatch):
    import torch

    from memprobe.integrations.torch import pinned_sources

    if not hasattr(torch.cuda, "host_memory_stats"):
        with pytest.raises(RuntimeError, match="host_memory_stats"):
            pinned_sources()
    cuda.install(monkeypatch, host=True)
    srcs = pinned_sources()
    assert names(srcs) == ["torch_pinned"]
    with Window(srcs) as w:
        cuda.pin(32 * MiB)
        assert w.reset()[0].peak == 32 * MiB
    srcs.close()


def test_tracker_adds_allocator_sources_when_cuda_is_initialised(cuda):
    with Tracker() as t:
        assert names(t.sources) == ["rss", "torch_alloc:0", "torch_reserved:0", "torch_alloc:1", "torch_reserved:1"]
        steps = []
        with t.epoch() as epoch:
            for size in (40, 120, 80):
                with t.step() as s:
                    cuda.alloc(size * MiB)
                    cuda.free(size * MiB)
                steps.append(s.record.deltas[1].peak)
        assert steps == [40 * MiB, 120 * MiB, 80 * MiB]
        assert epoch.record.deltas[1].peak == 120 * MiB
        assert epoch.record.deltas[3].peak == 0
    with Tracker(torch_sources=False) as t:
        assert names(t.sources) == ["rss"]


def test_lightning_callback_reports_exact_gpu_peaks_per_step_and_epoch(cuda, tmp_path):
    require_module("lightning", "lightning")
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from memprobe.integrations.lightning import MemprobeCallback

    temps = {3: 300 * MiB, 7: 700 * MiB, 12: 120 * MiB}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            temp = temps.get(self.global_step, 0)
            cuda.alloc(temp)  # a temporary "GPU" tensor inside the step
            cuda.free(temp)
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 8)), batch_size=4)
    cb = MemprobeCallback(log_every_n_steps=1)
    off = MemprobeCallback(torch_sources=False, keep_history=True)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[cb, off],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=CSVLogger(tmp_path, name="run"),
        log_every_n_steps=1,
        accelerator="cpu",
    )
    trainer.fit(Model(), data)
    steps = [d for phase, _, d in cb.history if phase == "step"]
    epochs = [d for phase, _, d in cb.history if phase == "epoch"]
    assert len(steps) == 20 and len(epochs) == 2
    assert [d[1].peak for d in steps] == [temps.get(i, 0) for i in range(20)]
    assert [d[1].peak for d in epochs] == [700 * MiB, 120 * MiB]
    # reserved: the cache keeps the 700 MiB it reserved in the first epoch
    assert [d[2].peak for d in epochs] == [700 * MiB, 700 * MiB]
    assert trainer.callback_metrics["memprobe/torch_alloc_0/epoch_peak"] == 120
    (metrics_csv,) = list(tmp_path.glob("run/*/metrics.csv"))
    header = metrics_csv.read_text().splitlines()[0]
    assert "memprobe/torch_alloc_0/step_peak" in header and "memprobe/torch_reserved_1/epoch_peak" in header
    assert len([d for phase, _, d in off.history if phase == "step"][0]) == 1  # rss only


def test_avalanche_gpu_metrics_match_avalanches_names(cuda):
    require_module("avalanche", "avalanche-lib")
    import warnings

    from avalanche.evaluation import GenericPluginMetric
    from avalanche.evaluation.metrics import gpu_usage as theirs

    from memprobe.integrations import avalanche as ours

    flags = dict(minibatch=True, epoch=True, experience=True, stream=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Your system has no GPU!"
        a = theirs.gpu_usage_metrics(1, 0.5, **flags)
    m = ours.gpu_usage_metrics(1, 0.5, **flags)
    assert [type(x).__name__ for x in m] == [type(x).__name__ for x in a]
    assert [str(x) for x in m] == [str(x) for x in a] == [
        "MaxGPU1Usage_MB",
        "MaxGPU1Usage_Epoch",
        "MaxGPU1Usage_Experience",
        "MaxGPU1Usage_Stream",
    ]
    for x, y in zip(m, a):
        assert (x._reset_at, x._emit_at, x._mode) == (y._reset_at, y._emit_at, y._mode)
        assert isinstance(x, GenericPluginMetric)
    # Exact, in MiB, on torch's device 1.
    metric = m[0]._metric
    metric.reset()
    cuda.alloc(96 * MiB, device=1)
    cuda.free(96 * MiB, device=1)
    assert metric.result() == 96.0
    metric.reset()
    assert metric.result() == 0.0
    for x in m:
        x._metric.close()


def test_avalanche_max_gpu_before_cuda_is_initialised():
    from memprobe.integrations.avalanche import MaxGPU

    metric = MaxGPU(0)
    metric.reset()
    assert metric.result() == 0.0  # nothing can be on the GPU yet
    metric.close()
    with pytest.raises(ValueError):
        MaxGPU(0, stat="used")
    assert "torch" not in sys.modules or not sys.modules["torch"].cuda.is_initialized()


class FakeJaxDevice:
    def __init__(self, id: int, platform: str = "gpu"):
        self.id, self.platform = id, platform
        self.in_use = 0

    def memory_stats(self):
        if self.platform == "cpu":
            return None
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.in_use, "bytes_limit": 1 << 34}


def test_jax_sources_are_sampled_over_bytes_in_use(monkeypatch):
    import types

    from memprobe.integrations.jax import jax_sources

    devs = [FakeJaxDevice(0), FakeJaxDevice(1)]
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(local_devices=lambda: devs))
    srcs = jax_sources()
    assert names(srcs) == ["jax:gpu0", "jax:gpu1"]
    devs[1].in_use = 5 * MiB
    assert srcs[1].read().used == 5 * MiB
    with Window(srcs[1]) as w:
        assert w.measure().fidelity is Fidelity.SAMPLED
    with pytest.raises(ValueError, match="no memory statistics"):
        jax_sources([FakeJaxDevice(0, "cpu")])
    for s in srcs:
        s.close()


def test_jax_missing_is_a_clear_import_error(monkeypatch):
    from memprobe.integrations.jax import jax_sources

    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ImportError, match="pip install jax"):
        jax_sources()
