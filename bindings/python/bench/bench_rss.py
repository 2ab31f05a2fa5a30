#!/usr/bin/env python3
"""RSS read cost: memprobe (through the Python binding) vs psutil, in one run.

    python3 bindings/python/bench/bench_rss.py [--rounds 15] [--calls 20000]

memprobe is the installed package (``pip install ./bindings/python``), else
this checkout's source tree with the library built in target/ or named by
MEMPROBE_LIBRARY (bench/_memprobe_import.py); the header names which.

Each variant is timed for ``--rounds`` rounds of ``--calls`` calls (after a
warm-up); the script prints the median time per call of every variant and
the ratio of psutil's to memprobe's. A benchmark, not a test: nothing is
asserted (``--check`` exits 1 when the ratio is under 5). psutil is needed
(``pip install psutil``; .ci/run installs it).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

try:
    import psutil
except ImportError:
    sys.exit("bench_rss.py needs psutil: python3 -m pip install psutil")


def per_call_ns(fn, calls: int, rounds: int) -> list:
    for _ in range(calls // 10):  # warm-up
        fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t0) / calls)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--check", action="store_true", help="exit 1 if memprobe is not >= 5x faster")
    args = ap.parse_args()

    rss = memprobe.Source.process()
    proc = psutil.Process()
    # Same quantity from both (RSS, bytes), within the kernel's batching.
    a, b = rss.read().used, proc.memory_info().rss
    assert abs(a - b) < 8 << 20, (a, b)

    variants = [
        ("memprobe  Source.read().used", lambda: rss.read().used),
        ("memprobe  Source.used()", rss.used),
        ("psutil    Process().memory_info().rss", lambda: psutil.Process().memory_info().rss),
        ("psutil    proc.memory_info().rss (reused)", lambda: proc.memory_info().rss),
    ]
    medians = {}
    print(
        f"{describe(memprobe)}, psutil {psutil.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(f"{args.rounds} rounds x {args.calls} calls, median per call:")
    for name, fn in variants:
        samples = per_call_ns(fn, args.calls, args.rounds)
        medians[name] = statistics.median(samples)
        print(f"  {name:<44} {medians[name] / 1000:8.2f} us  (min {min(samples) / 1000:.2f})")
    mp = medians["memprobe  Source.read().used"]
    ratio_fresh = medians["psutil    Process().memory_info().rss"] / mp
    ratio_reused = medians["psutil    proc.memory_info().rss (reused)"] / mp
    fast = medians["psutil    proc.memory_info().rss (reused)"] / medians["memprobe  Source.used()"]
    print(f"ratio psutil Process().memory_info() / memprobe read(): {ratio_fresh:.1f}x")
    print(f"ratio psutil reused memory_info()   / memprobe read(): {ratio_reused:.1f}x")
    print(f"ratio psutil reused memory_info()   / memprobe used(): {fast:.1f}x")
    rss.close()
    if args.check and ratio_fresh < 5:
        print("below the 5x target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
