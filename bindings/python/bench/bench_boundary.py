#!/usr/bin/env python3
"""A step boundary from Python against a bare ctypes call, in one run.

    python3 bindings/python/bench/bench_boundary.py [--rounds 15] [--calls 20000]

Times, interleaved round by round so machine noise hits them alike:

- a bare ctypes call of a no-op C function (libc's ``getpid``, argtypes and
  restype set once): the floor of any foreign call from Python;
- ``memprobe_window_reset`` called bare through ctypes (the C boundary with
  no Python around it): what the binding's methods add is measured above it;
- ``Window.restart()`` (a boundary that builds no result);
- ``Window.reset()`` (a boundary that returns each source's delta);
- ``Tracker.next("step")`` (the tracker's step boundary, which returns a
  record).

The process source is made first, then the process grows by a ballast
(``--ballast-mib``, 512 by default), as a trainer loads its model after
setting memprobe up: the boundaries run on the path a trainer's take (see
"the exec floor" in docs/benchmarks.md). Each figure is the median over rounds of the mean time per call; the
ratios are to the bare ctypes call and to the bare C boundary. memprobe is
found as by the other benches (bench/_memprobe_import.py). A benchmark,
not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import time
from typing import Dict, List

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()
from memprobe import _ffi  # noqa: E402  (the package found above)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--ballast-mib", type=int, default=512)
    args = ap.parse_args()

    libc = ctypes.CDLL(None)
    getpid = libc.getpid
    getpid.argtypes = []
    getpid.restype = ctypes.c_int

    rss = memprobe.Source.process()
    ballast = bytearray(args.ballast_mib << 20)
    ballast[::4096] = b"\x01" * len(range(0, len(ballast), 4096))  # every page touched
    window = memprobe.Window([rss])
    bare = memprobe.Window([rss])
    reset = _ffi.C.memprobe_window_reset
    handle = bare._handle
    tracker = memprobe.Tracker([rss])
    tracker.begin("epoch")
    tracker.begin("step")

    variants = [
        ("ctypes: libc getpid() (no-op floor)", getpid),
        ("ctypes: memprobe_window_reset(h, NULL, 0)", lambda: reset(handle, None, 0)),
        ("Window.restart()", window.restart),
        ("Window.reset()", window.reset),
        ('Tracker.next("step")', lambda: tracker.next("step")),
    ]
    for _, fn in variants:  # warm-up
        for _ in range(args.calls // 10):
            fn()
    rounds: Dict[str, List[float]] = {name: [] for name, _ in variants}
    for _ in range(args.rounds):
        for name, fn in variants:
            t0 = time.perf_counter_ns()
            for _ in range(args.calls):
                fn()
            rounds[name].append((time.perf_counter_ns() - t0) / args.calls)
    tracker.end("step")
    tracker.end("epoch")
    tracker.close()
    window.close()
    bare.close()
    del ballast

    print(
        f"{describe(memprobe)}, Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, kernel {platform.release()}"
    )
    print(f"{args.rounds} rounds x {args.calls} calls, cases interleaved, median per call:")
    floor = statistics.median(rounds[variants[0][0]])
    c_boundary = statistics.median(rounds[variants[1][0]])
    print(f"  {'case':<44} {'ns':>8} {'x ctypes':>9} {'- C boundary':>13}")
    for name, _ in variants:
        m = statistics.median(rounds[name])
        print(f"  {name:<44} {m:8.0f} {m / floor:8.2f}x {m - c_boundary:+12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
