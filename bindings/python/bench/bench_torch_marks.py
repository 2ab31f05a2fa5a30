#!/usr/bin/env python3
"""The cost of a step boundary over PyTorch's allocator sources, against
the bare ``max_memory_allocated() + reset_peak_memory_stats()`` pair a
training loop would call itself, in one run.

    python3 bindings/python/bench/bench_torch_marks.py [--fake] [--rounds 15] [--calls 20000]

memprobe is the installed package (``pip install ./bindings/python``), else
this checkout's source tree with the library built in target/ or named by
MEMPROBE_LIBRARY (bench/_memprobe_import.py); the header names which.

On a machine with CUDA the real ``torch.cuda`` of device 0 is used (CUDA
is initialised by the script, a small tensor allocated). Without CUDA, or
with ``--fake``, a scripted stand-in for ``torch.cuda``'s statistics
(bindings/python/tests/fake_torch_cuda.py) is patched in: those figures
measure memprobe's overhead around a fake whose reads are much cheaper
than the CUDA allocator's, so the ratio is an upper bound; re-measure on a
GPU. Variants, median time per boundary:

- ``pair``: ``max_memory_allocated(0)`` then torch's reset
  (``torch._C._cuda_resetPeakMemoryStats(0)``, what
  ``reset_peak_memory_stats(0)`` calls after resolving the device: while
  allocator sources exist memprobe makes a reset through the Python API a
  boundary of its own, so the bare binding is what a loop without memprobe
  pays);
- ``restart alloc``: ``Window.restart()`` over ``torch_alloc:0``;
- ``reset alloc``: ``Window.reset()`` (the ended interval as a Delta);
- ``restart alloc+reserved``: ``Window.restart()`` over both sources.

A benchmark, not a test: nothing is asserted (the target is <= 1.3x of the
pair for a step boundary over one device's sources, ``restart
alloc+reserved`` being what ``allocator_sources(0)`` gives; ``--check``
exits 1 when a ``restart`` variant is above).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _memprobe_import import describe, import_memprobe

HERE = Path(__file__).resolve().parent
memprobe = import_memprobe()
from memprobe.integrations.torch import allocator_sources  # noqa: E402


def per_call_ns(variants: dict, calls: int, rounds: int) -> dict:
    """Median-ready times per call of each variant; the rounds of all the
    variants are interleaved so that a change of load on the machine hits
    each of them alike."""
    for fn in variants.values():  # warm-up
        for _ in range(calls // 10):
            fn()
    out: dict = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            out[name].append((time.perf_counter_ns() - t0) / calls)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fake", action="store_true", help="use the scripted torch.cuda even with a GPU")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--check", action="store_true", help="exit 1 if a 'restart' variant is above 1.3x the pair")
    args = ap.parse_args()

    import torch

    fake = args.fake or not torch.cuda.is_available()
    if fake:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from fake_torch_cuda import FakeCuda

        FakeCuda(devices=1).install()
        where = "fake torch.cuda (no GPU: re-measure on one)"
        keep = None
    else:
        torch.cuda.init()
        keep = torch.ones(1 << 20, device="cuda:0")  # something allocated
        where = torch.cuda.get_device_name(0)
    cuda = torch.cuda
    # torch's own reset, taken before memprobe carries the caller's resets
    # (a reset made through torch's Python API while sources exist is a
    # memprobe boundary): what the pair costs without memprobe.
    raw_reset = torch._C._cuda_resetPeakMemoryStats

    def pair() -> None:
        cuda.max_memory_allocated(0)
        raw_reset(0)

    alloc = allocator_sources(0, reserved=False)
    both = allocator_sources(0)
    w_alloc = memprobe.Window(alloc)
    w_both = memprobe.Window(both)
    results = per_call_ns(
        {
            "pair": pair,
            "restart alloc": w_alloc.restart,
            "reset alloc": w_alloc.reset,
            "restart alloc+reserved": w_both.restart,
        },
        args.calls,
        args.rounds,
    )
    w_alloc.close()
    w_both.close()
    del keep

    print(f"# {where}; torch {torch.__version__}; {describe(memprobe)}; "
          f"Python {platform.python_version()}; {args.rounds} rounds x {args.calls} calls")
    base = statistics.median(results["pair"])
    for name, xs in results.items():
        med = statistics.median(xs)
        print(f"{name:24s} {med / 1000:8.2f} us  ({med / base:.2f}x the pair)")
    worst = max(statistics.median(xs) for name, xs in results.items() if name.startswith("restart")) / base
    return 1 if args.check and worst > 1.3 else 0


if __name__ == "__main__":
    sys.exit(main())
