"""Integrations: framework-free engines through the real library; the
framework-bound parts are skipped (with the reason) when the framework is
not installed, and fail instead in CI (CI=true), which installs them."""

from __future__ import annotations

import pytest
from conftest import PKG, MiB, lightning, require_module, run_python, spike, SITE, tiny_lightning_module

import memprobe
from memprobe import Source
from memprobe.integrations.avalanche import MaxRAM
from memprobe.integrations.lightning import MemprobeHooks
from memprobe.integrations.phases import PhasePeaks

FRAMEWORKS = ("torch", "lightning", "pytorch_lightning", "avalanche", "jax", "transformers", "accelerate")


def test_importing_memprobe_and_integrations_imports_no_framework():
    code = (
        "import sys, memprobe, memprobe.integrations.lightning, "
        "memprobe.integrations.avalanche, memprobe.integrations.torch, "
        "memprobe.integrations.phases, memprobe.integrations.jax, "
        "memprobe.integrations.transformers, memprobe.integrations.accelerate, "
        "memprobe.integrations.loop, memprobe.integrations.trainer_stages, memprobe.integrations._ranks\n"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    r = run_python(code, env={"PYTHONPATH": str(SITE)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_phase_peaks_nest_independently(rss):
    with PhasePeaks(rss) as phases:
        phases.start("epoch")
        phases.start("step")
        spike(96 * MiB)
        (step,) = phases.end("step")
        phases.start("step")
        (quiet,) = phases.end("step")
        (epoch,) = phases.end("epoch")
        assert step.peak >= step.used_start + 94 * MiB
        assert quiet.peak < step.peak - 64 * MiB
        assert epoch.peak >= step.peak - 2 * MiB
        m = phases.metrics("step", [step])
        assert m["memprobe/rss/step_peak"] == step.peak / MiB
        assert m["memprobe/rss/step_delta_peaked"] == step.delta_peaked / MiB
        mb = phases.metrics("step", [step], prefix="", unit="bytes")
        assert mb["rss/step_peak"] == step.peak


class FakeModule:
    def __init__(self):
        self.logged = []

    def log_dict(self, metrics, **kw):
        self.logged.append((dict(metrics), kw))


class FakeTrainer:
    sanity_checking = False


def test_lightning_hooks_log_steps_epochs_and_validation(rss):
    hooks = MemprobeHooks(rss, log_every_n_steps=2)
    trainer, module = FakeTrainer(), FakeModule()
    for _epoch in range(2):
        hooks.on_train_epoch_start(trainer, module)
        for i in range(3):
            hooks.on_train_batch_start(trainer, module, None, i)
            if i == 1:
                spike(64 * MiB)
            hooks.on_train_batch_end(trainer, module, None, None, i)
        hooks.on_train_epoch_end(trainer, module)
        hooks.on_validation_epoch_start(trainer, module)
        hooks.on_validation_epoch_end(trainer, module)
    hooks.teardown(trainer, module, "fit")
    phases = [p for p, _, _ in hooks.history]
    assert phases.count("step") == 6 and phases.count("epoch") == 2 and phases.count("validation") == 2
    steps = [d for p, _, d in hooks.history if p == "step"]
    assert steps[1][0].peak >= steps[1][0].used_start + 62 * MiB
    step_logs = [m for m, kw in module.logged if kw["on_step"]]
    assert len(step_logs) == 3  # steps 1, 3, 5 (Lightning's: every 2nd ended step)
    # steps_peak: the highest step peak since the previous log (step 1's spike).
    assert step_logs[0]["memprobe/rss/steps_peak"] == steps[1][0].peak / MiB
    assert step_logs[0]["memprobe/rss/step_peak"] == steps[1][0].peak / MiB
    assert step_logs[1]["memprobe/rss/steps_peak"] == max(s[0].peak for s in steps[2:4]) / MiB
    epoch_logs = [m for m, kw in module.logged if kw["on_epoch"] and "memprobe/rss/epoch_peak" in m]
    assert len(epoch_logs) == 2
    assert epoch_logs[0]["memprobe/rss/epoch_peak"] >= steps[1][0].peak / MiB - 2
    assert any("memprobe/rss/validation_peak" in m for m, _ in module.logged)


class ConnectorTrainer(FakeTrainer):
    """Lightning's own decision, as its logger connector exposes it."""

    def __init__(self, log_on):
        self.log_on = log_on
        self.step = 0
        self._logger_connector = self

    @property
    def should_update_logs(self):
        return self.step in self.log_on


def test_lightning_hooks_default_to_the_trainers_logging_steps(rss):
    hooks = MemprobeHooks(rss)
    trainer, module = ConnectorTrainer(log_on={3, 7}), FakeModule()
    for i in range(10):
        trainer.step = i
        hooks.on_train_batch_start(trainer, module, None, i)
        hooks.on_train_batch_end(trainer, module, None, None, i)
    hooks.teardown(trainer, module)
    assert len(module.logged) == 2 and all(kw["on_step"] for _, kw in module.logged)
    assert [p for p, _, _ in hooks.history].count("step") == 10  # every step kept

    # Without the connector: the trainer's log_every_n_steps, by our count.
    hooks = MemprobeHooks(rss)
    trainer, module = FakeTrainer(), FakeModule()
    trainer.log_every_n_steps = 4
    for i in range(9):
        hooks.on_train_batch_start(trainer, module, None, i)
        hooks.on_train_batch_end(trainer, module, None, None, i)
    hooks.teardown(trainer, module)
    assert len(module.logged) == 2  # steps 3 and 7


def test_lightning_hooks_skip_sanity_check_logging(rss):
    hooks = MemprobeHooks(rss)
    trainer, module = FakeTrainer(), FakeModule()
    trainer.sanity_checking = True
    hooks.on_validation_epoch_start(trainer, module)
    hooks.on_validation_epoch_end(trainer, module)
    hooks.teardown(trainer, module)
    assert module.logged == [] and hooks.history == []


def test_lightning_hooks_validate_arguments():
    with pytest.raises(ValueError):
        MemprobeHooks(log_every_n_steps=0)
    with pytest.raises(ValueError):
        MemprobeHooks(unit="GB")


def test_avalanche_maxram_is_exact(rss):
    m = MaxRAM(every=1, sources=rss)
    m.start_thread()
    m.reset()
    base = rss.read().used
    spike(80 * MiB)
    assert m.result() >= (base + 78 * MiB) / MiB
    m.update()
    m.reset()
    assert m.result() < (base + 40 * MiB) / MiB
    m.stop_thread()
    m.close()


def test_missing_frameworks_give_clear_import_errors():
    code = (
        "import importlib.util, sys\n"
        "missing = {m: importlib.util.find_spec(m) is None for m in ('lightning', 'pytorch_lightning', 'avalanche', 'torch')}\n"
        "import memprobe.integrations.lightning as L, memprobe.integrations.avalanche as A, memprobe.integrations.torch as T\n"
        "out = []\n"
        "if missing['lightning'] and missing['pytorch_lightning']:\n"
        "    try: L.MemprobeCallback\n"
        "    except ImportError as e: out.append('lightning' if 'pip install lightning' in str(e) else 'bad')\n"
        "if missing['avalanche']:\n"
        "    try: A.ram_usage_metrics(minibatch=True)\n"
        "    except ImportError as e: out.append('avalanche' if 'avalanche-lib' in str(e) else 'bad')\n"
        "if missing['torch']:\n"
        "    try: T.empty_cache_release()\n"
        "    except ImportError as e: out.append('torch' if 'pip install torch' in str(e) else 'bad')\n"
        "print(' '.join(out) or 'none-missing')\n"
    )
    r = run_python(code, env={"PYTHONPATH": str(SITE)})
    assert r.returncode == 0, r.stderr
    assert "bad" not in r.stdout


def test_no_metrics_asked_needs_no_framework():
    from memprobe.integrations.avalanche import ram_usage_metrics

    assert ram_usage_metrics() == []


def test_torch_empty_cache_release():
    require_module("torch", "torch")
    from memprobe.integrations.torch import empty_cache_release

    release = empty_cache_release(gc_collect=True)
    release()  # a no-op without CUDA, torch.cuda.empty_cache() with it
    assert release.__name__ == "empty_cache_release"


def test_lightning_callback_in_a_real_trainer(tmp_path, rss):
    pl = lightning()
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    Tiny = tiny_lightning_module(validation=False)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    cb = MemprobeCallback(rss)
    assert isinstance(cb, pl.Callback)
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[cb],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), data)
    assert [p for p, _, _ in cb.history].count("step") == 8
    assert "memprobe/rss/epoch_peak" in trainer.callback_metrics


def test_loop_peaks_report_the_step_interval_epoch_and_trainer_named_stage(rss):
    """The engine under the Transformers and Accelerate integrations, on one
    rank: a spike in one step shows in that step, the interval, the epoch
    and the stage; the Trainer-named metrics follow transformers'
    definitions (alloc = end - start, peaked = max(0, peak - end))."""
    from memprobe.integrations.loop import LoopPeaks

    loop = LoopPeaks(rss, stage_gc=False)
    loop.stage_begin("train")
    loop.epoch_begin()
    loop.step_end()
    spike(96 * MiB)
    (spiky,) = loop.step_end()
    loop.epoch_end()
    (stage,) = loop.stage_end("train")
    metrics, named = loop.report()
    assert spiky.delta_peaked >= 94 * MiB
    assert metrics["memprobe/rss/step_peak"] == spiky.peak / MiB
    assert metrics["memprobe/rss/interval_peak"] >= spiky.peak / MiB
    assert metrics["memprobe/rss/epoch_peak"] >= spiky.peak / MiB
    assert metrics["memprobe/rss/train_peak"] == stage.peak / MiB >= spiky.peak / MiB
    assert named["train_mem_cpu_alloc_delta"] == stage.used_end - stage.used_start
    assert named["train_mem_cpu_peaked_delta"] == max(0, stage.peak - stage.used_end) >= 90 * MiB
    # init's metrics come with the first stage, as the Trainer reports them.
    assert "init_mem_cpu_alloc_delta" in named and named["before_init_mem_cpu"] > 0
    assert [p for p, _, _ in loop.history if p != "interval"] == ["init", "step", "step", "epoch", "train"]
    assert loop.ranks.history == [] and loop.ranks.world_size == 1
    loop.close()


def test_rank_values_pack_and_unpack_every_delta_field(rss):
    from memprobe.integrations._ranks import max_deltas, pack, unpack

    with memprobe.Window(rss) as w:
        spike(8 * MiB)
        deltas = w.reset()
    assert unpack(pack(deltas), deltas) == deltas
    # One rank: unchanged, torch not needed.
    assert max_deltas(deltas, [7, -3]) == (deltas, [7, -3])
