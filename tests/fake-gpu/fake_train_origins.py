#!/usr/bin/env python3
"""scripts/gpu-origins-train.py for the dry run of the GPU validation, over
the fake driver (fake_cuda.c): stand-ins for PyTorch's caching allocator,
NCCL and cuBLAS built from tests/interpose/origin_lib.c as libc10_cuda.so,
libnccl.so.2 and libcublas.so.12 (in $FAKE_ORIGIN_LIBS), each allocating
through the driver as the real ones do; the same order (NCCL, cuBLAS, then
the caching allocator's last segment as the peak), hold and facts file.
"reserved" is what the stand-in for torch's allocator obtained, summed
here, as torch counts its own segments.

FAKE_ORIGINS_DEFECT=overcount: the stand-in for torch's allocator obtains
1 MiB it does not count in reserved (what an interposer over-counting
torch's line by 1 MiB looks like to the validation, which must fail).

    fake_train_origins.py FACTS.json [--no-nccl]
    fake_train_origins.py --print-total [--no-nccl]   (what it holds at its peak)
"""
import argparse
import ctypes
import json
import os
import sys
import time

MIB = 1 << 20
NCCL = [32 * MIB, 6 * MIB]
CUBLAS = [8 * MIB + 4096]
TORCH = [20 * MIB, 2 * MIB, 1 << 30]
PLAIN = 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("facts", nargs="?")
    ap.add_argument("--no-nccl", action="store_true")
    ap.add_argument("--print-total", action="store_true")
    a = ap.parse_args()
    nccl = [] if a.no_nccl else NCCL
    if a.print_total:
        print(sum(nccl) + sum(CUBLAS) + sum(TORCH))
        return
    libs = os.environ["FAKE_ORIGIN_LIBS"]
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0

    def lib(file, prefix):
        h = ctypes.CDLL(os.path.join(libs, file))
        f = getattr(h, prefix + "_alloc")
        f.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]

        def alloc(n):
            out = ctypes.c_uint64()
            rc = f(PLAIN, n, ctypes.byref(out))
            if rc != 0:
                sys.exit(f"{file}: allocating {n} B failed: {rc}")
            return out.value
        return alloc

    held = []
    for n in nccl:
        held.append(lib("libnccl.so.2", "nccl")(n))
    for n in CUBLAS:
        held.append(lib("libcublas.so.12", "cublas")(n))
    torch_alloc = lib("libc10_cuda.so", "torch")
    reserved = 0
    for n in TORCH:
        held.append(torch_alloc(n))
        reserved += n
    if os.environ.get("FAKE_ORIGINS_DEFECT") == "overcount":
        held.append(torch_alloc(1 * MIB))
    time.sleep(1.5)
    facts = {"pid": os.getpid(), "nccl": not a.no_nccl, "reserved_at_peak": reserved,
             "allocated_at_peak": TORCH[-1], "held_bytes": TORCH[-1], "nvml_self_bytes": None,
             "torch": "fake", "nccl_version": None if a.no_nccl else "fake"}
    with open(a.facts, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
