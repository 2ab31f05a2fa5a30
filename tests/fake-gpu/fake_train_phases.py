#!/usr/bin/env python3
"""scripts/gpu-train-phases.py for the dry run of the GPU validation, over
the fake driver (fake_cuda.c) instead of PyTorch: the same epochs and steps
reported through memprobe's tracker, a `torch_alloc:0` source pushed as
PyTorch's allocator would, one step holding 2 GiB from the driver for about
a millisecond, and the same facts file for scripts/gpu-validate-run.py.

    fake_train_phases.py FACTS.json [--epochs N] [--steps N]
"""
import argparse
import ctypes
import json
import os
import time

import memprobe
from memprobe import PhaseKind

SPIKE = 2 << 30
MODEL = 64 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("facts")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cu.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0

    def alloc(n: int) -> ctypes.c_uint64:
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), n)
        assert rc == 0, f"cuMemAlloc_v2({n}): {rc}"
        return p

    model = alloc(MODEL)
    torch_alloc = memprobe.Source.pushed("torch_alloc:0")
    torch_alloc.push(MODEL)
    tracker = memprobe.Tracker([memprobe.Source.process(), torch_alloc])
    spike_epoch, spike_step = 1, args.steps // 2
    for epoch in range(args.epochs):
        tracker.begin(PhaseKind.EPOCH)
        for step in range(args.steps):
            tracker.begin(PhaseKind.STEP)
            act = alloc(32 << 20)
            torch_alloc.push(MODEL + (32 << 20))
            if (epoch, step) == (spike_epoch, spike_step):
                big = alloc(SPIKE)
                torch_alloc.push(MODEL + (32 << 20) + SPIKE)
                end = time.perf_counter() + 0.001
                while time.perf_counter() < end:
                    pass
                assert cu.cuMemFree_v2(big) == 0
            assert cu.cuMemFree_v2(act) == 0
            torch_alloc.push(MODEL)
            time.sleep(0.002)
            tracker.end(PhaseKind.STEP)
        tracker.end(PhaseKind.EPOCH)
    facts = {
        "pid": os.getpid(), "spike_bytes": SPIKE, "spike_epoch": spike_epoch, "spike_step": spike_step,
        "steps_per_epoch": args.steps, "epochs": args.epochs,
        "reserved_now": MODEL, "allocated_now": MODEL, "torch": None, "cuda": "fake driver",
        # A pushed source stands in for torch's allocator marks here.
        "torch_alloc_fidelity": "pushed",
    }
    tracker.close()
    assert cu.cuMemFree_v2(model) == 0
    with open(args.facts, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
