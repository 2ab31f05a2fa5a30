"""What MemprobeCallback costs a Lightning training loop of ~3 ms steps.

Runs the same CPU training (one torch thread, a CSV logger, the model
logging its loss every step as models do) without the callback, with it at
its defaults (metrics logged at the trainer's interval, every step measured
and kept in ``history``), and with it logging every step
(``log_every_n_steps=1``). The variants alternate, round after round, in a
rotating order; each run times its steady steps (after a warm-up), in wall
time and in CPU time of the training thread, and the report gives the
median per-step time of each variant and its overhead against the runs
without the callback. Figures: docs/bindings-benchmarks.md.

    python bench/bench_lightning.py [--rounds 9] [--steps 400] [--hidden 384]

Needs torch and lightning, and memprobe: the installed package, else this
checkout's source tree with the library of target/ or MEMPROBE_LIBRARY
(bench/_memprobe_import.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Dict, List, Tuple

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from memprobe.integrations.lightning import MemprobeCallback  # noqa: E402


class Model(pl.LightningModule):
    def __init__(self, hidden: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StepTimer(pl.Callback):
    """Per-step wall time and training-thread CPU time of the steps after
    ``warmup``. The CPU time of the thread running the loop is what the
    callback adds to; unlike wall time it does not count the time other
    processes hold the CPU, so it stays comparable on a loaded machine."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.t0 = self.t1 = self.c0 = self.c1 = 0.0
        self.n = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            self.t0 = time.perf_counter()
            self.c0 = time.thread_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step > self.warmup:
            self.t1 = time.perf_counter()
            self.c1 = time.thread_time()
            self.n = trainer.global_step - self.warmup

    def per_step(self) -> Tuple[float, float]:
        return (self.t1 - self.t0) / self.n, (self.c1 - self.c0) / self.n


def run(variant: str, steps: int, hidden: int, data, root: str) -> Tuple[float, float]:
    timer = StepTimer(warmup=50)
    callbacks: list = [timer]
    cb = None
    if variant == "defaults":
        cb = MemprobeCallback()
    elif variant == "every step":
        cb = MemprobeCallback(log_every_n_steps=1)
    if cb is not None:
        callbacks.append(cb)
    trainer = pl.Trainer(
        max_steps=steps,
        max_epochs=-1,
        callbacks=callbacks,
        logger=CSVLogger(root, name=variant.replace(" ", "_")),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    torch.manual_seed(0)
    trainer.fit(Model(hidden), data)
    if cb is not None:
        assert [p for p, _, _ in cb.history].count("step") == steps  # every step measured
    return timer.per_step()


def hooks_cost_us(n: int = 20000) -> float:
    """The callback's own per-step work (two window resets, the history
    entry, the logging decision), outside Lightning: microseconds."""

    class Trainer:
        log_every_n_steps = 50

    cb = MemprobeCallback()
    t = Trainer()
    start = time.perf_counter()
    for i in range(n):
        cb.on_train_batch_start(t, None, None, i)
        cb.on_train_batch_end(t, None, None, None, i)
    took = time.perf_counter() - start
    cb.teardown(t, None)
    return took / n * 1e6


def quiet_data(batch: int, hidden: int) -> "torch.utils.data.DataLoader":
    """One torch thread, no warnings or Lightning chatter, and the benches'
    data: 64 batches of random rows (the Lightning benches share it)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    n = batch * 64
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(n, hidden), torch.randn(n)),
        batch_size=batch,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=384, help="model width (sets the step time)")
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()

    data = quiet_data(args.batch, args.hidden)
    variants = ["without", "defaults", "every step"]
    wall: Dict[str, List[float]] = {v: [] for v in variants}
    cpu: Dict[str, List[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as root:
        run("without", 60, args.hidden, data, root)  # warm caches and imports
        for r in range(args.rounds):
            order = variants[r % 3:] + variants[: r % 3]
            for v in order:
                w, c = run(v, args.steps, args.hidden, data, root)
                wall[v].append(w)
                cpu[v].append(c)
    print(f"Lightning {pl.__version__}, torch {torch.__version__}, 1 torch thread, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at the end; {args.rounds} rounds x {args.steps} steps")
    print(describe(memprobe))
    print("overhead: of the medians of per-run step times; paired: the median over rounds of "
          "(this variant / no callback) in the same round")
    labels = {"without": "no callback", "defaults": "MemprobeCallback() (defaults)",
              "every step": "MemprobeCallback(log_every_n_steps=1)"}
    for title, times in (("wall time", wall), ("training-thread CPU time", cpu)):
        base = statistics.median(times["without"])
        print(f"\n{title}:")
        print(f"{'variant':<38} {'ms/step':>8} {'overhead':>9} {'paired':>8}  runs (ms/step)")
        for v in variants:
            med = statistics.median(times[v])
            paired = statistics.median(t / b for t, b in zip(times[v], times["without"]))
            runs = " ".join(f"{t * 1e3:.2f}" for t in times[v])
            print(f"{labels[v]:<38} {med * 1e3:8.3f} {(med / base - 1) * 100:+8.2f}% "
                  f"{(paired - 1) * 100:+7.2f}%  {runs}")
    print(f"the callback's hooks alone (no Lightning, no logging): {hooks_cost_us():.1f} us per step")


if __name__ == "__main__":
    main()
