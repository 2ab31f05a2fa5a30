"""The Lightning callback makes one boundary per training step: the end of
a step (a window reset) starts the next step's interval, so what runs
between two batches is in the step that follows, while the first step of
an epoch, and the first after a validation loop, start at their batch."""

from __future__ import annotations

from conftest import MiB, lightning, spike, tiny_lightning_module

from memprobe.integrations.lightning import MemprobeHooks


class Trainer:
    sanity_checking = False
    log_every_n_steps = 50


class Counting:
    """Counts the step window's boundaries the hooks ask for."""

    def __init__(self, hooks: MemprobeHooks):
        self.starts = 0
        self.resumes = 0
        phases = hooks.phases
        start, resume = phases.start, phases.resume

        def counted_start(phase: str) -> None:
            self.starts += phase == "step"
            start(phase)

        def counted_resume(phase: str) -> None:
            self.resumes += phase == "step"
            resume(phase)

        phases.start = counted_start  # type: ignore[method-assign]
        phases.resume = counted_resume  # type: ignore[method-assign]


def steps(hooks: MemprobeHooks):
    return [d[0] for phase, _, d in hooks.history if phase == "step"]


def test_one_boundary_per_step_and_the_gap_in_the_next_step(rss):
    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    count = Counting(hooks)
    hooks.on_train_epoch_start(trainer, None)
    for i in range(6):
        hooks.on_train_batch_start(trainer, None, None, i)
        hooks.on_train_batch_end(trainer, None, None, None, i)
        if i == 2:
            spike(64 * MiB)  # between two steps: the next batch's loading
    hooks.on_train_epoch_end(trainer, None)
    hooks.teardown(trainer, None)
    assert (count.starts, count.resumes) == (1, 5)  # a start per epoch, then one reset per step
    s = steps(hooks)
    assert len(s) == 6
    assert s[3].peak >= s[3].used_start + 62 * MiB  # the gap after step 2 is step 3's
    for i in (0, 1, 2, 4, 5):
        assert s[i].delta_peaked < 32 * MiB, (i, s[i])
    for a, b in zip(s, s[1:]):
        assert b.used_start == a.used_end  # back to back: nothing unmeasured between steps


def test_validation_and_epochs_between_steps_are_not_in_a_step(rss):
    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    count = Counting(hooks)
    for epoch in range(2):
        hooks.on_train_epoch_start(trainer, None)
        for i in range(3):
            hooks.on_train_batch_start(trainer, None, None, i)
            hooks.on_train_batch_end(trainer, None, None, None, i)
            if i == 1:  # a validation loop mid-epoch (val_check_interval)
                hooks.on_validation_epoch_start(trainer, None)
                spike(64 * MiB)
                hooks.on_validation_epoch_end(trainer, None)
        hooks.on_train_epoch_end(trainer, None)
        spike(64 * MiB)  # between epochs
    hooks.teardown(trainer, None)
    # Restarted after each validation loop and at each epoch.
    assert (count.starts, count.resumes) == (4, 2)
    for i, d in enumerate(steps(hooks)):
        assert d.delta_peaked < 32 * MiB, (i, d)
    validations = [d[0] for phase, _, d in hooks.history if phase == "validation"]
    assert len(validations) == 2 and all(v.peak >= v.used_start + 62 * MiB for v in validations)


def test_a_real_fit_starts_the_step_window_once_per_epoch(tmp_path):
    pl = lightning()
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    Tiny = tiny_lightning_module()

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=2)
    cb = MemprobeCallback()

    class CountOnFirstHook(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if not hasattr(self, "count"):
                self.count = Counting(cb)

    counter = CountOnFirstHook()
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[counter, cb],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        val_check_interval=4,  # a validation loop mid-epoch
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), data, data)
    assert [p for p, _, _ in cb.history].count("step") == 16
    # Per epoch: the first step, and the first after each of its 2 validation loops.
    assert counter.count.starts == 2 * 2 and counter.count.resumes == 16 - 4
