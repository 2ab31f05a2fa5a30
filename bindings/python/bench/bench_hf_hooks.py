"""What memprobe's Transformers callback and Accelerate helper cost a
training step, measured inside real runs: each of their hooks is timed with
``perf_counter_ns`` while a ``Trainer`` (and an Accelerate loop) trains a
small model on CPU (one torch thread), and the report gives the hooks' own
time per typical step (the median step-end call, plus the logs and epochs
spread over the steps; the mean over every step is given beside it: on a
shared machine preemptions land in some calls), the median step of the run, and
the hooks' share of that step and of a 4 ms step; apart, what the stage
boundaries cost once per run (the garbage collection the Trainer's tracker
also makes there, ``stage_gc``). The timer's own two ``perf_counter_ns``
calls per hook are included (about 0.1 µs).

A whole-run wall-time comparison cannot resolve 1 % on a shared machine;
the hooks' own time can. Figures: docs/bindings-benchmarks.md.

    python bench/bench_hf_hooks.py [--rounds 3] [--steps 300] [--hidden 256] [--logging-steps 50]
                                   [--per-hook] [--clock wall|cpu]

Needs torch, transformers (< 5 with torch 2.5) and accelerate, and memprobe:
the installed package, else this checkout's source tree with the library of
target/ or MEMPROBE_LIBRARY (bench/_memprobe_import.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

import torch  # noqa: E402

#: --per-hook: each hook's calls, total and median time, on stderr.
PER_HOOK = False
#: --clock: wall time (perf_counter_ns), or the main thread's CPU time
#: (thread_time_ns: what a hook costs without the preemptions of a loaded
#: machine; torch runs one thread here, so a step's CPU time is the thread's).
CLOCKS: Dict[str, Callable[[], int]] = {"wall": time.perf_counter_ns, "cpu": time.thread_time_ns}
CLOCK = [time.perf_counter_ns]
HOOKS = ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_end", "on_epoch_end", "on_log", "on_train_end")


class Timed:
    """Nanoseconds spent in each wrapped call, per name."""

    def __init__(self) -> None:
        self.ns: Dict[str, List[int]] = {}

    def wrap(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        clock = CLOCK[0]
        out = self.ns.setdefault(name, [])

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                out.append(clock() - t0)

        return timed

    def split(self, once: List[str], steps: int, every_step: str) -> Dict[str, float]:
        """µs per step of the calls made at every step or log, and ms of
        those made once per run (a stage's begin and end: Trainer's garbage
        collection); a name in ``once`` ending in ``:last`` is that name's
        last call (the final training log ends the train stage)."""
        per_step = 0
        per_run = 0
        typical = 0.0
        for name, calls in self.ns.items():
            if name == every_step and calls:
                # The typical step: the median call (a shared machine's
                # preemptions land in some calls: the mean shows them).
                typical += statistics.median(calls) / 1e3
                per_step += sum(calls)
            elif name in once:
                per_run += sum(calls)
            elif f"{name}:last" in once and calls:
                per_run += calls[-1]
                per_step += sum(calls[:-1])
                typical += sum(calls[:-1]) / steps / 1e3
            else:
                per_step += sum(calls)
                typical += sum(calls) / steps / 1e3
        if PER_HOOK:
            for k, v in self.ns.items():
                med = statistics.median(v) / 1e3
                print(f"  {k}: {len(v)} calls, {sum(v) / 1e3:.0f} µs in all, median {med:.1f} µs", file=sys.stderr)
        return {"hooks_us_per_step": per_step / steps / 1e3, "typical_us": typical, "once_ms": per_run / 1e6}


class Net(torch.nn.Module):
    """A model the Trainer takes: returns its loss in a dict."""

    def __init__(self, hidden: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


class Rows(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, hidden: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, hidden, generator=g)
        self.y = torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


def trainer_run(args: argparse.Namespace, with_memprobe: bool) -> Dict[str, float]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from memprobe.integrations.transformers import MemprobeCallback

    stamps: List[int] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **kw: Any) -> None:
            stamps.append(CLOCK[0]())

    timer = Timed()
    callbacks: List[Any] = [StepClock()]
    if with_memprobe:
        cb = MemprobeCallback()
        for name in HOOKS:
            setattr(cb, name, timer.wrap(getattr(cb, name), name))
        callbacks.append(cb)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            logging_steps=args.logging_steps,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            log_level="error",
        )
        data = Rows(args.steps * args.batch, args.hidden)
        trainer = Trainer(model=Net(args.hidden), args=targs, train_dataset=data, callbacks=callbacks)
        trainer.train()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][args.steps // 10 :]
    once = ["on_init_end", "on_train_begin", "on_train_end", "on_log:last"]
    return {"step_us": statistics.median(gaps) / 1e3, **timer.split(once, args.steps, "on_step_end")}


def accelerate_run(args: argparse.Namespace, with_memprobe: bool) -> Dict[str, float]:
    from accelerate import Accelerator

    from memprobe.integrations.accelerate import MemprobeAccelerate

    accelerator = Accelerator(cpu=True)
    model = Net(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Rows(args.steps * args.batch, args.hidden), batch_size=args.batch)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    timer = Timed()
    probe = MemprobeAccelerate(accelerator, log_every_n_steps=args.logging_steps)
    step = timer.wrap(probe.step, "step") if with_memprobe else (lambda: None)
    stamps: List[int] = []
    if with_memprobe:
        timer.wrap(probe.loop.stage_begin, "stage_begin")("train")
    for batch in loader:
        loss = model(**batch)["loss"]
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        step()
        stamps.append(CLOCK[0]())
    if with_memprobe:
        timer.wrap(probe.loop.stage_end, "stage_end")("train")
    probe.close()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])][args.steps // 10 :]
    return {"step_us": statistics.median(gaps) / 1e3, **timer.split(["stage_begin", "stage_end"], args.steps, "step")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--logging-steps", type=int, default=50)
    p.add_argument("--per-hook", action="store_true", help="each hook's calls and times, on stderr")
    p.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="wall (perf_counter_ns) or the thread's CPU time"
    )
    args = p.parse_args()
    CLOCK[0] = CLOCKS[args.clock]
    global PER_HOOK
    PER_HOOK = args.per_hook
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    print(describe(memprobe), f"torch {torch.__version__}, {os.cpu_count()} CPUs", file=sys.stderr)
    runs = (
        ("transformers Trainer + MemprobeCallback", trainer_run),
        ("accelerate loop + MemprobeAccelerate", accelerate_run),
    )
    for name, run in runs:
        rows = [run(args, True) for _ in range(args.rounds)]
        hooks = statistics.median(r["typical_us"] for r in rows)
        mean = statistics.median(r["hooks_us_per_step"] for r in rows)
        step = statistics.median(r["step_us"] for r in rows)
        once = statistics.median(r["once_ms"] for r in rows)
        each = ", ".join("%.1f" % r["typical_us"] for r in rows)
        print(
            f"{name}: hooks {hooks:.1f} µs per typical step ({each}; mean over every step {mean:.1f}), "
            f"median step {step:.0f} µs: {100 * hooks / step:.2f} % of this step, "
            f"{100 * hooks / 4000:.2f} % of a 4 ms step; "
            f"once per run (stage begin and end, with their garbage collection) {once:.0f} ms "
            f"({args.steps} steps, log every {args.logging_steps}, {args.rounds} rounds, {args.clock} clock)"
        )


if __name__ == "__main__":
    main()
