#!/usr/bin/env python3
"""A small PyTorch training run on GPU 0 that reports its phases to
``memprobe run`` (epochs and steps, through memprobe's tracker) and holds a
2 GiB tensor for about a millisecond in one step. Used by
scripts/gpu-validate-run.py under ``memprobe run --gpu-exact``.

    gpu-train-phases.py FACTS.json [--epochs N] [--steps N]

Writes FACTS.json: torch's own view of the run (peak reserved and allocated
bytes, the spike's epoch and step, this process's pid), for the checker to
compare with what ``memprobe run`` reported.
"""
import argparse
import json
import os
import time

import torch

import memprobe
from memprobe import PhaseKind
from memprobe.integrations.torch import allocator_sources

SPIKE = 2 << 30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("facts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)  # initialises CUDA before the allocator sources
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sources = [memprobe.Source.process()] + list(allocator_sources(0))
    tracker = memprobe.Tracker(sources)
    spike_epoch, spike_step = 1, args.steps // 2
    for epoch in range(args.epochs):
        tracker.begin(PhaseKind.EPOCH)
        for step in range(args.steps):
            tracker.begin(PhaseKind.STEP)
            x = torch.randn(256, 1024, device=dev)
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
            if (epoch, step) == (spike_epoch, spike_step):
                torch.cuda.empty_cache()  # the spike comes from, and goes back to, the driver
                t = torch.empty(SPIKE, dtype=torch.uint8, device=dev)
                t.fill_(1)
                torch.cuda.synchronize()
                end = time.perf_counter() + 0.001
                while time.perf_counter() < end:
                    pass
                del t
                torch.cuda.empty_cache()
            torch.cuda.synchronize()
            tracker.end(PhaseKind.STEP)
        tracker.end(PhaseKind.EPOCH)
    stats = torch.cuda.memory_stats(0)
    facts = {
        "pid": os.getpid(),
        "spike_bytes": SPIKE,
        "spike_epoch": spike_epoch,
        "spike_step": spike_step,
        "steps_per_epoch": args.steps,
        "epochs": args.epochs,
        # memprobe's boundaries reset torch's peak counters, so the run's
        # peak reserved is what torch reserved at most in any step: the
        # interposer, counting every driver allocation, must be at least that.
        "reserved_now": torch.cuda.memory_reserved(0),
        "allocated_now": torch.cuda.memory_allocated(0),
        "num_alloc_retries": stats.get("num_alloc_retries", 0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    with open(args.facts, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
