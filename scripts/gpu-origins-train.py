#!/usr/bin/env python3
"""The program of the `origins` part of scripts/gpu-validate-all.sh (run
under `memprobe run --gpu-exact` by scripts/gpu-validate-origins.py): on
GPU 0, a one-rank NCCL group (world size 1 still allocates NCCL's buffers)
with one all_reduce, cuBLAS work (a matmul) and cuDNN work (a conv), then
one 1 GiB tensor from PyTorch's caching allocator as the last allocation:
the process's GPU peak. At that peak it records torch's memory_reserved()
and what NVML (nvidia-smi) says this process holds, holds the peak ~1.5 s
so that memprobe's NVML samples see it, and writes the facts.

    gpu-origins-train.py FACTS.json [--no-nccl]

--no-nccl is the negative control: no process group, so no NCCL line.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import torch

GIB = 1 << 30


def nvml_self_bytes():
    """This process's bytes on the GPU as nvidia-smi lists them (MiB
    resolution), or None when it does not list this process (a PID
    namespace, no nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()) and parts[1].isdigit():
            return int(parts[1]) << 20
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("facts")
    ap.add_argument("--no-nccl", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    group = False
    if not a.no_nccl:
        import torch.distributed as dist
        store = tempfile.NamedTemporaryFile(prefix="memprobe-nccl-", delete=False).name
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
        t = torch.ones(1 << 20, device=dev)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        group = True
    # cuBLAS and cuDNN work (their workspaces and handles).
    m = torch.randn(2048, 2048, device=dev)
    (m @ m).sum().item()
    conv = torch.nn.Conv2d(16, 32, 3).to(dev)
    conv(torch.randn(8, 16, 64, 64, device=dev)).sum().item()
    torch.cuda.synchronize()
    # The peak: the last allocation of the run, from torch's cache.
    held = torch.empty(GIB, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved(dev)
    allocated = torch.cuda.memory_allocated(dev)
    time.sleep(0.6)
    nvml = nvml_self_bytes()
    time.sleep(0.9)
    facts = {"pid": os.getpid(), "nccl": group, "reserved_at_peak": reserved, "allocated_at_peak": allocated,
             "held_bytes": held.numel(), "nvml_self_bytes": nvml, "torch": torch.__version__,
             "nccl_version": nccl_version() if group else None}
    with open(a.facts, "w") as f:
        json.dump(facts, f)
    # Out without tearing anything down: destroying the group or torch's
    # cache would free memory through the driver before memprobe's last
    # NVML sample of this process, which the context line is read from.
    os._exit(0)


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


if __name__ == "__main__":
    main()
