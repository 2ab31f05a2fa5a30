"""The Lightning callback in real training (CPU): DataLoader workers, a
logger, the trainer's logging interval, and one step holding a known
temporary allocation that the per-step history must show."""

from __future__ import annotations

import csv

from conftest import MiB, lightning

SPIKE = 256 * MiB
SPIKE_STEP = 6  # the global training step (0-based) whose training_step allocates it


def test_step_with_a_temporary_allocation_shows_it_with_dataloader_workers(tmp_path):
    pl = lightning()
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from memprobe.integrations.lightning import MemprobeCallback

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            (x,) = batch
            self.seen.append(self.global_step)
            if self.global_step == SPIKE_STEP:
                # A temporary host tensor, touched and freed inside the step.
                t = torch.ones(SPIKE // 4, dtype=torch.float32)
                assert float(t.sum()) == SPIKE // 4
                del t
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(40, 16)),
        batch_size=4,
        num_workers=2,
        persistent_workers=False,
    )
    cb = MemprobeCallback()
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[cb],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=CSVLogger(tmp_path, name="run"),
        log_every_n_steps=5,
        accelerator="cpu",
    )
    model = Model()
    trainer.fit(model, data)

    steps = [d for phase, _, d in cb.history if phase == "step"]
    assert len(steps) == 20 == len(model.seen)
    assert model.seen == list(range(20))
    spiky = steps[SPIKE_STEP][0]
    assert spiky.delta_peaked >= SPIKE - 8 * MiB, spiky
    assert spiky.peak >= spiky.used_start + SPIKE - 8 * MiB
    for i, (d,) in enumerate(steps):
        if i != SPIKE_STEP:
            assert d.delta_peaked < SPIKE // 2, (i, d)
    epochs = [d for phase, _, d in cb.history if phase == "epoch"]
    assert len(epochs) == 2 and epochs[0][0].peak >= spiky.peak

    # The logger got the steps Lightning logs (every 5th), each carrying the
    # highest step peak since the previous log: step 6's spike is in step 9's row.
    (metrics_csv,) = list(tmp_path.glob("run/*/metrics.csv"))
    rows = list(csv.DictReader(metrics_csv.open()))
    step_rows = [r for r in rows if r.get("memprobe/rss/steps_peak")]
    assert [int(r["step"]) for r in step_rows] == [4, 9, 14, 19]
    assert float(step_rows[1]["memprobe/rss/steps_peak"]) >= spiky.peak / MiB - 0.01
    assert float(step_rows[0]["memprobe/rss/steps_peak"]) < spiky.peak / MiB - 128
    assert any(r.get("memprobe/rss/epoch_peak") for r in rows)
