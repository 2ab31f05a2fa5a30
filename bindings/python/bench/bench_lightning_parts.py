"""What MemprobeCallback's per-step hook time is made of, inside a real fit.

The fit of bench_lightning_hooks.py (CPU, one torch thread, ~4 ms steps, a
CSV logger), run once per variant in a rotating order, round after round;
each variant times its two per-step hooks (``on_train_batch_start`` +
``on_train_batch_end``) in the training thread's CPU time, where they run
cold between the model's work:

- ``empty``: a ``Callback`` that does nothing (the timer's floor);
- ``getpid``: one trivial system call from Python (``os.getpid``): what
  any system call costs there, cold;
- ``syscalls``: the three system calls an RSS boundary makes, from Python,
  no memprobe call: ``getrusage``, ``5`` written to
  ``/proc/self/clear_refs``, a read of ``/proc/self/statm``;
- ``reads``: the same but the ``clear_refs`` write (what a boundary
  that finds nothing to reset would make);
- ``call``: the library's step boundary alone (the callback's phases, the
  step ended on its tail by ``PhasePeaks.tail_call``'s function, called
  from the hook with its arguments made once);
- ``defaults``: ``MemprobeCallback()`` as a user has it.

``defaults`` minus ``call`` is the callback's own Python; ``call`` minus
``empty`` the boundary (library, kernel, ctypes). Figures:
docs/bindings-benchmarks.md.

    python bench/bench_lightning_parts.py [--rounds 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
from typing import Any, Dict, List

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

import torch  # noqa: E402

import bench_lightning_hooks as hooks_bench  # noqa: E402
from bench_lightning import quiet_data  # noqa: E402
from memprobe.integrations.lightning import MemprobeCallback  # noqa: E402


class _OnTail(MemprobeCallback):  # type: ignore[misc, valid-type]
    """The callback's phases, but the hooks keep the step on its tail (its
    batch start marks it when it is not chained) and end it by the bare
    call: what the library and the kernel cost a cold step."""

    def on_train_batch_start(self, *a: Any) -> None:
        if not self._step_chained:
            self.phases.mark("step")
            self._step_chained = True

    def on_train_batch_end(self, *a: Any) -> None:
        fn, args = self._call
        if fn(*args):
            raise RuntimeError(f"the step's boundary failed: {memprobe._ffi.last_error()}")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        fn, args, _out, _tracker, _pin = self._tail
        self._call = (fn, args)


class _Getpid(hooks_bench.Empty):
    """One trivial system call."""

    def on_train_batch_end(self, *a: Any) -> None:
        os.getpid()


class _Syscalls(hooks_bench.Empty):
    """The boundary's three system calls, no library call."""

    def __init__(self) -> None:
        self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)

    def on_train_batch_end(self, *a: Any) -> None:
        resource.getrusage(resource.RUSAGE_SELF)
        os.pwrite(self._clear, b"5", 0)
        os.pread(self._statm, 4096, 0)

    def teardown(self, *a: Any, **kw: Any) -> None:
        for fd in (self._clear, self._statm):
            try:
                os.close(fd)
            except OSError:
                pass
        self._clear = self._statm = -1


class _Reads(_Syscalls):
    """The boundary's two reads, no reset."""

    def on_train_batch_end(self, *a: Any) -> None:
        resource.getrusage(resource.RUSAGE_SELF)
        os.pread(self._statm, 4096, 0)


VARIANTS = {
    "empty": hooks_bench.timed(hooks_bench.Empty),
    "getpid": hooks_bench.timed(_Getpid),
    "syscalls": hooks_bench.timed(_Syscalls),
    "reads": hooks_bench.timed(_Reads),
    "call": hooks_bench.timed(_OnTail),
    "defaults": hooks_bench.timed(MemprobeCallback),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()

    data = quiet_data(args.batch, args.hidden)
    medians: Dict[str, List[float]] = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as root:
        hooks_bench.fit(None, 60, args.hidden, data, root, "warm")
        names = list(VARIANTS)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                cb = VARIANTS[name]()
                hooks_bench.fit(cb, args.steps, args.hidden, data, root, name)
                medians[name].append(statistics.median(hooks_bench.per_step(cb, cpu=True)))
    print(f"torch {torch.__version__}, 1 torch thread, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f} at the end; {args.rounds} rounds x {args.steps} steps "
          f"(hooks of the steps after {hooks_bench.WARMUP}), training-thread CPU time")
    print(describe(memprobe))
    print(f"\n{'hooks per step':<12} {'median of runs':>14}   runs")
    for name, ms in medians.items():
        print(f"{name:<12} {statistics.median(ms) / 1e3:12.1f}us   " + ", ".join(f"{m / 1e3:.1f}" for m in ms))


if __name__ == "__main__":
    main()
