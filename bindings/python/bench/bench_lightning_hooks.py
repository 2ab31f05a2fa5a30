"""What MemprobeCallback's per-step hooks cost inside a real Lightning fit.

Whole-fit timings cannot resolve a 1 % overhead on a shared machine (run
to run noise is several per cent), so this times the hooks themselves:
``perf_counter_ns`` around ``on_train_batch_start`` and
``on_train_batch_end`` of the callback at its defaults, inside the same
fit as bench_lightning.py (CPU, one torch thread, ~4 ms steps, a CSV
logger, the trainer's ``log_every_n_steps=50``), where the hooks run cold
between the model's work. It also times an empty callback the same way
(the timer's own floor) and reports, beside them, the paired whole-fit
wall time of the runs with and without the callback.

    python bench/bench_lightning_hooks.py [--rounds 5] [--steps 400] [--hidden 384]
                                          [--together] [--against DIR]

Per step: the sum of the two hooks of that step, in wall time and in CPU
time of the training thread (which, unlike wall time, leaves out the time
other processes take the CPU in the middle of a hook: on a loaded machine
the figure to read); the tables give the median and the 90th percentile
over the steady steps (after a warm-up) of every run, the mean, and the
median's share of a 4 ms step (the target's yardstick). Figures:
docs/bindings-benchmarks.md.

``--against DIR``: DIR holds another memprobe package (``DIR/memprobe``,
e.g. an older commit's ``bindings/python``), loaded beside this one under
another name over the same library; one more fit per round runs the two
callbacks side by side, the order of their hooks alternating by round. Runs
of one package in separate processes differ by as much as two packages do
on a shared machine; side by side, in the same steps, they do not.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import os
import sys
import statistics
import tempfile
import time
from typing import Any, Dict, List, Tuple

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

import torch  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from bench_lightning import Model, StepTimer, quiet_data  # noqa: E402
from memprobe.integrations.lightning import MemprobeCallback  # noqa: E402

WARMUP = 50

#: Wall and CPU nanoseconds spent in Python's cyclic garbage collector so
#: far. A collection runs at the allocation that crosses gen0's threshold:
#: after a training step that is often the first allocation a hook makes,
#: which then pays for collecting the step's garbage (work the next
#: allocation anywhere would have done). Hooks are reported with and
#: without the collections that ran inside them.
GC_NS = [0, 0]
_gc_start = [0, 0]


def _gc_clock(phase: str, info: Dict[str, Any]) -> None:
    if phase == "start":
        _gc_start[:] = [time.perf_counter_ns(), time.thread_time_ns()]
    else:
        GC_NS[0] += time.perf_counter_ns() - _gc_start[0]
        GC_NS[1] += time.thread_time_ns() - _gc_start[1]


gc.callbacks.append(_gc_clock)


def timed(base: type) -> type:
    """``base`` with its two per-step hooks timed (nanoseconds per step)."""

    class Timed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.start_ns: List[int] = []
            self.end_ns: List[int] = []
            self.start_cpu: List[int] = []
            self.end_cpu: List[int] = []
            #: Per step: wall and CPU ns of the collections inside the hooks.
            self.gc_ns: List[int] = []
            self.gc_cpu: List[int] = []

        def on_train_batch_start(self, *a: Any) -> None:
            g, gc_cpu = GC_NS[0], GC_NS[1]
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            super().on_train_batch_start(*a)
            self.start_cpu.append(time.thread_time_ns() - c)
            self.start_ns.append(time.perf_counter_ns() - t)
            self.gc_ns.append(GC_NS[0] - g)
            self.gc_cpu.append(GC_NS[1] - gc_cpu)

        def on_train_batch_end(self, *a: Any) -> None:
            g, gc_cpu = GC_NS[0], GC_NS[1]
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            super().on_train_batch_end(*a)
            self.end_cpu.append(time.thread_time_ns() - c)
            self.end_ns.append(time.perf_counter_ns() - t)
            self.gc_ns[-1] += GC_NS[0] - g
            self.gc_cpu[-1] += GC_NS[1] - gc_cpu

    Timed.__name__ = f"Timed{base.__name__}"
    return Timed


class Empty(pl.Callback):
    """Does nothing: the floor of the timing (two timer reads, a call)."""


class TwoBoundaries(MemprobeCallback):  # type: ignore[misc, valid-type]
    """The callback as it was: the step window restarted at every batch
    start too (two boundaries per step instead of one)."""

    def on_train_batch_start(self, *a: Any) -> None:
        self._step_chained = False
        super().on_train_batch_start(*a)


class _Several(list):  # type: ignore[type-arg]
    """Several callbacks for one fit (in this order)."""


def other_callback(folder: str) -> type:
    """``MemprobeCallback`` of the memprobe package in ``folder``, imported
    as ``memprobe_against`` (its imports inside are relative)."""
    pkg = os.path.join(os.path.abspath(folder), "memprobe")
    spec = importlib.util.spec_from_file_location(
        "memprobe_against", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {folder}: no memprobe package in it")
    module = importlib.util.module_from_spec(spec)
    sys.modules["memprobe_against"] = module
    spec.loader.exec_module(module)
    cls: type = importlib.import_module("memprobe_against.integrations.lightning").MemprobeCallback
    return cls


def fit(cb: Any, steps: int, hidden: int, data: Any, root: str, name: str) -> float:
    timer = StepTimer(warmup=WARMUP)
    extra = list(cb) if isinstance(cb, _Several) else ([cb] if cb is not None else [])
    callbacks: List[Any] = [timer] + extra
    trainer = pl.Trainer(
        max_steps=steps,
        max_epochs=-1,
        callbacks=callbacks,
        logger=CSVLogger(root, name=name),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    torch.manual_seed(0)
    trainer.fit(Model(hidden), data)
    return timer.per_step()[0]


def per_step(cb: Any, cpu: bool = False, without_gc: bool = False) -> List[int]:
    starts, ends = (cb.start_cpu, cb.end_cpu) if cpu else (cb.start_ns, cb.end_ns)
    gcs = (cb.gc_cpu if cpu else cb.gc_ns) if without_gc else [0] * len(starts)
    return [a + b - g for a, b, g in zip(starts, ends, gcs)][WARMUP:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=384, help="model width (sets the step time)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--together", action="store_true",
                    help="also run one fit per round with the one- and two-boundary callbacks side by side "
                         "(same steps, same machine state; the order of their hooks alternates by round)")
    ap.add_argument("--against", metavar="DIR",
                    help="also run one fit per round with this package's callback and DIR/memprobe's side by side "
                         "(an even --rounds: each called first as often)")
    args = ap.parse_args()
    against = timed(other_callback(args.against)) if args.against else None

    data = quiet_data(args.batch, args.hidden)
    keys = ("empty", "defaults", "one", "two", "this", "against", "this 1st", "against 2nd", "against 1st", "this 2nd")
    hooks: Dict[str, List[int]] = {k: [] for k in keys}
    hooks_cpu: Dict[str, List[int]] = {k: [] for k in keys}
    hooks_cpu_nogc: Dict[str, List[int]] = {k: [] for k in keys}
    in_gc: Dict[str, List[int]] = {k: [] for k in keys}
    wall: Dict[str, List[float]] = {"without": [], "defaults": []}
    TimedEmpty, TimedMemprobe = timed(Empty), timed(MemprobeCallback)
    with tempfile.TemporaryDirectory() as root:
        fit(None, 60, args.hidden, data, root, "warm")  # warm caches and imports
        for r in range(args.rounds):
            order: List[Tuple[str, Any]] = [
                ("without", None),
                ("empty", TimedEmpty()),
                ("defaults", TimedMemprobe()),
            ]
            order = order[r % 3:] + order[: r % 3]
            for name, cb in order:
                w = fit(cb, args.steps, args.hidden, data, root, name)
                if name in wall:
                    wall[name].append(w)
                if cb is not None:
                    hooks[name].extend(per_step(cb))
                    hooks_cpu[name].extend(per_step(cb, cpu=True))
                    hooks_cpu_nogc[name].extend(per_step(cb, cpu=True, without_gc=True))
                    in_gc[name].extend(x > 0 for x in cb.gc_ns[WARMUP:])
                if name == "defaults":
                    assert [p for p, _, _ in cb.history].count("step") == args.steps
            if args.together:
                pair = {"one": TimedMemprobe(), "two": timed(TwoBoundaries)()}
                names = ["one", "two"] if r % 2 == 0 else ["two", "one"]
                fit(_Several([pair[k] for k in names]), args.steps, args.hidden, data, root, "together")
                for k, cb in pair.items():
                    hooks[k].extend(per_step(cb))
                    hooks_cpu[k].extend(per_step(cb, cpu=True))
                    hooks_cpu_nogc[k].extend(per_step(cb, cpu=True, without_gc=True))
                    in_gc[k].extend(x > 0 for x in cb.gc_ns[WARMUP:])
            if against is not None:
                pair = {"this": TimedMemprobe(), "against": against()}
                names = ["this", "against"] if r % 2 == 0 else ["against", "this"]
                fit(_Several([pair[k] for k in names]), args.steps, args.hidden, data, root, "against")
                for k, cb in pair.items():
                    # The hooks called first run colder: each order apart too.
                    for key in (k, f"{k} {'1st' if names[0] == k else '2nd'}"):
                        hooks[key].extend(per_step(cb))
                        hooks_cpu[key].extend(per_step(cb, cpu=True))
                        hooks_cpu_nogc[key].extend(per_step(cb, cpu=True, without_gc=True))
                    in_gc[k].extend(x > 0 for x in cb.gc_ns[WARMUP:])
    step = statistics.median(wall["without"])
    print(f"Lightning {pl.__version__}, torch {torch.__version__}, 1 torch thread, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} at the end; {args.rounds} rounds x {args.steps} steps "
          f"(hooks of the steps after {WARMUP})")
    print(describe(memprobe))
    if args.against:
        print(f"side by side with: {os.path.join(os.path.abspath(args.against), 'memprobe')}")
    print(f"median step without the callback: {step * 1e3:.3f} ms")
    # Wall time counts the time the scheduler gives other processes in the
    # middle of a hook (a loaded machine); the thread's CPU time does not.
    if any(any(v) for v in in_gc.values()):
        tables = [("wall time", hooks), ("training-thread CPU time", hooks_cpu),
                  ("CPU time, collections inside left out", hooks_cpu_nogc)]
    else:
        tables = [("wall time", hooks), ("training-thread CPU time", hooks_cpu)]
    for title, table in tables:
        print(f"\n{'hooks per step, ' + title:<40} {'median':>9} {'p90':>9} {'mean':>9} {'of 4 ms':>8}")
        rows = [("empty", "empty Callback (timer floor)"), ("defaults", "MemprobeCallback() (defaults)")]
        if args.together:
            rows += [("one", "side by side: one boundary (defaults)"), ("two", "side by side: two boundaries (before)")]
        if against is not None:
            rows += [("this", "side by side: this package"), ("against", "side by side: --against's")]
            rows += [(k, f"  {k.split()[0]}, hooks called {k.split()[1]}") for k in keys[6:] if table[k]]
        for name, label in rows:
            ns = sorted(table[name])
            med, p90, mean = statistics.median(ns), ns[int(len(ns) * 0.9)], statistics.fmean(ns)
            print(f"{label:<40} {med / 1e3:7.1f}us {p90 / 1e3:7.1f}us {mean / 1e3:7.1f}us "
                  f"{med / 4e6 * 100:7.2f}%")
    print("\nsteps whose hooks ran a garbage collection: " + ", ".join(
        f"{k} {sum(v) / len(v):.0%}" for k, v in in_gc.items() if v))
    paired = statistics.median(d / w for d, w in zip(wall["defaults"], wall["without"]))
    print(f"\nwhole fit, paired median of (defaults / without) wall time per step: {(paired - 1) * 100:+.2f}% "
          f"(runs: {' '.join(f'{d / w - 1:+.1%}' for d, w in zip(wall['defaults'], wall['without']))})")


if __name__ == "__main__":
    main()
