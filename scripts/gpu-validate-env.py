#!/usr/bin/env python3
"""The machine a GPU validation ran on: date, GPU, driver, CUDA, PyTorch,
kernel, CPUs, and the tools present (nvidia-smi, nvcc, a C++ compiler).

Usage: gpu-validate-env.py [--out env.json]
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys


def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return p.stdout.strip() if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out")
    args = ap.parse_args()
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "nvidia_smi": run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,uuid",
                           "--format=csv,noheader"]),
        "nvcc": (run(["nvcc", "--version"]) or "").splitlines()[-1:] or None,
        "cxx": shutil.which(os.environ.get("CXX", "c++")),
        "cgroup_v2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if env["cuda_available"]:
            env["device"] = torch.cuda.get_device_name(0)
            env["device_count"] = torch.cuda.device_count()
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        env["torch_error"] = repr(e)
    for mod in ("lightning", "pynvml", "transformers", "accelerate"):
        try:
            m = __import__(mod)
            env[mod] = getattr(m, "__version__", "present")
        except Exception:  # noqa: BLE001
            env[mod] = None
    print(json.dumps(env, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(env, f, indent=1)
    return 0 if env.get("cuda_available") else 1


if __name__ == "__main__":
    sys.exit(main())
