"""The Lightning callback under DDP on 2 CPU ranks (gloo): a spike on rank 1
only, and rank 0's logger shows it (the maximum across ranks at the logging
interval); each rank's own history keeps its own numbers."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

from conftest import SITE, MiB, require_module

SPIKE = 256 * MiB
SPIKE_STEP = 6

SCRIPT = r"""
import json, os, sys
import torch
import lightning.pytorch as pl
from lightning.pytorch.loggers import CSVLogger
from memprobe.integrations.lightning import MemprobeCallback

SPIKE, SPIKE_STEP, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        if self.global_rank == 1 and self.global_step == SPIKE_STEP:
            t = torch.ones(SPIKE // 4, dtype=torch.float32)
            assert float(t.sum()) == SPIKE // 4
            del t
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 8)), batch_size=2)
    cb = MemprobeCallback()
    trainer = pl.Trainer(
        max_epochs=1, callbacks=[cb], default_root_dir=OUT, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, logger=CSVLogger(OUT, name="run"),
        log_every_n_steps=5, accelerator="cpu", devices=2, strategy="ddp", num_sanity_val_steps=0,
    )
    trainer.fit(Model(), data)
    own = [(p, i, [d.delta_peaked for d in ds]) for p, i, ds in cb.history]
    maxima = [(p, i, [d.delta_peaked for d in ds]) for p, i, ds in cb.ranks.history]
    with open(os.path.join(OUT, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"own": own, "maxima": maxima, "rank": cb.ranks.rank, "world": cb.ranks.world_size}, f)
"""


def test_ddp_on_two_cpu_ranks_logs_the_maximum_across_ranks(tmp_path):
    require_module("torch", "torch")
    require_module("lightning", "lightning")
    script = tmp_path / "ddp_fit.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE)] + [p for p in [env.get("PYTHONPATH")] if p])
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    r = subprocess.run(
        [sys.executable, str(script), str(SPIKE), str(SPIKE_STEP), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [(h["rank"], h["world"]) for h in ranks] == [(0, 2), (1, 2)]

    # Own histories: 10 steps per rank; the spike on rank 1's step only.
    steps = [[ds[0] for p, _, ds in h["own"] if p == "step"] for h in ranks]
    assert len(steps[0]) == len(steps[1]) == 10
    assert steps[1][SPIKE_STEP] >= SPIKE - 8 * MiB
    assert max(steps[0]) < SPIKE // 2, steps[0]

    # The maxima logged at each interval (steps 4 and 9, and the epoch) are
    # the same on both ranks and carry rank 1's spike.
    assert ranks[0]["maxima"] == ranks[1]["maxima"]
    maxima = ranks[0]["maxima"]
    assert [p for p, _, _ in maxima] == ["step", "step", "epoch"]
    (metrics_csv,) = list(tmp_path.glob("run/*/metrics.csv"))
    rows = list(csv.DictReader(metrics_csv.open()))
    step_rows = {int(r["step"]): r for r in rows if r.get("memprobe/rss/steps_peak")}
    assert sorted(step_rows) == [4, 9]
    # Rank 0's own steps never reached the spike; its logger did.
    assert float(step_rows[9]["memprobe/rss/steps_peak"]) - float(step_rows[4]["memprobe/rss/steps_peak"]) > 128
    epoch_rows = [r for r in rows if r.get("memprobe/rss/epoch_delta_peaked")]
    assert len(epoch_rows) == 1 and float(epoch_rows[0]["memprobe/rss/epoch_delta_peaked"]) >= SPIKE / MiB - 32
