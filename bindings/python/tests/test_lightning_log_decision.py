"""The Lightning callback decides whether a step logs from the trainer's
attributes instead of asking Lightning's logger connector (a cold step paid
~9 µs for the property): its answer must be Lightning's own at every
training step, with gradient accumulation, validation loops between
steps, a stop requested mid-epoch and logging turned off."""

from __future__ import annotations

import pytest

from conftest import lightning, tiny_lightning_module


@pytest.mark.parametrize(
    "log_every_n_steps, accumulate, stop_at",
    [(3, 1, None), (2, 2, None), (4, 1, 9), (1, 3, 5), (0, 1, None)],
)
def test_the_step_log_decision_is_lightnings_own(tmp_path, log_every_n_steps, accumulate, stop_at):
    pl = lightning()
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    Tiny = tiny_lightning_module()

    class Stopper(pl.Callback):
        """Requests a stop at one step, before the memprobe callback's hook."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if stop_at is not None and trainer.fit_loop.total_batch_idx == stop_at:
                trainer.should_stop = True

    cb = MemprobeCallback()
    decisions = []

    class Compare(pl.Callback):
        """After the memprobe callback: its decision and Lightning's, at the same point."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            decisions.append((cb._should_log_step(trainer), trainer._logger_connector.should_update_logs))

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=2)
    trainer = pl.Trainer(
        max_epochs=2,
        min_steps=1,
        callbacks=[Stopper(), cb, Compare()],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=pl.loggers.CSVLogger(tmp_path, name="run"),
        log_every_n_steps=log_every_n_steps,
        accumulate_grad_batches=accumulate,
        val_check_interval=5,  # validation loops mid-epoch
        num_sanity_val_steps=1,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), data, data)
    assert len(decisions) >= 6
    ours = [a for a, _ in decisions]
    assert ours == [b for _, b in decisions], decisions
    if log_every_n_steps == 0:
        assert not any(ours)
    else:
        assert any(ours) and not all(ours) or log_every_n_steps == 1
