#!/usr/bin/env python3
"""The `origins` part of scripts/gpu-validate-all.sh: what held a PyTorch
process's GPU peak, by origin (docs/attribution.md), against references
memprobe does not control: torch's own memory_reserved() at that peak and
NVML's per-process figure.

Runs scripts/gpu-origins-train.py (a one-rank NCCL group with one
all_reduce, a matmul and a conv, then a 1 GiB tensor as the last
allocation) under `memprobe run --gpu-exact --json`, twice: with NCCL, and
without it as the negative control. Checks, from the run JSON's
gpu_exact.processes[] (origins_at_peak, context_bytes, nvml_used_bytes)
and the trainer's facts:
  * the run exits 0 and the trainer's process has a breakdown on device 0;
  * the breakdown names the PyTorch caching allocator and NCCL, and the
    context line ("CUDA context and unseen") is known, above 0 and below
    2 GiB;
  * its lines sum to its peak, and peak + context equals NVML's figure for
    the process within 2 MiB (memprobe's NVML sample, and nvidia-smi's
    reading taken by the trainer at its peak when it lists the process);
  * the caching allocator's line equals torch.cuda.memory_reserved() taken
    by the trainer at its peak, to the byte, and holds the 1 GiB tensor;
  * the interposer's excess over torch's reserved equals the sum of the
    other origins' lines, printed by name (what "the 128 MiB beyond
    torch's reserved" of the first validation was);
  * negative control: without a process group there is no NCCL line, and
    the allocator's line still equals reserved.

Usage: gpu-validate-origins.py MEMPROBE_BIN [--trainer SCRIPT] [--out report.json]
Expected time on a GPU: ~40 s (two runs, each importing torch and
initialising CUDA; NCCL's init ~5 s).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
GIB = 1 << 30
TOLERANCE = 2 * MIB
TORCH = "PyTorch caching allocator"


def run_once(memprobe, trainer, extra, tmp, name):
    facts_path, json_path = os.path.join(tmp, name + "-facts.json"), os.path.join(tmp, name + "-run.json")
    cmd = [memprobe, "run", "--gpu-exact", "--no-live", "--json", json_path, "--",
           sys.executable, trainer, facts_path] + extra
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = {"command": cmd, "rc": p.returncode, "wall_s": round(time.time() - t0, 2), "summary": p.stderr[-5000:]}
    print(p.stderr[-3000:], flush=True)
    run = facts = None
    if os.path.exists(json_path):
        with open(json_path) as f:
            run = json.load(f)
    if os.path.exists(facts_path):
        with open(facts_path) as f:
            facts = json.load(f)
    return out, run, facts


def process_of(run, pid):
    for p in ((run or {}).get("gpu_exact") or {}).get("processes") or []:
        if p.get("pid") == pid:
            return p
    return None


def first(values, index=0):
    return values[index] if isinstance(values, list) and len(values) > index else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memprobe")
    ap.add_argument("--trainer", default=os.path.join(HERE, "gpu-origins-train.py"))
    ap.add_argument("--out")
    a = ap.parse_args()
    checks = []

    def check(name, ok, detail):
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)

    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "checks": checks, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="memprobe-origins-") as tmp:
        for name, extra in (("nccl", []), ("no_nccl", ["--no-nccl"])):
            out, run, facts = run_once(a.memprobe, a.trainer, extra, tmp, name)
            report["runs"][name] = out
            out["facts"] = facts
            label = "" if name == "nccl" else "negative control (no NCCL): "
            check(f"{label}memprobe run and the trainer exit 0 with their facts",
                  out["rc"] == 0 and run is not None and facts is not None, f"rc {out['rc']}")
            if run is None or facts is None:
                continue
            proc = process_of(run, facts["pid"])
            at = first((proc or {}).get("origins_at_peak"))
            out["origins_at_peak"] = at
            out["context_bytes"] = first((proc or {}).get("context_bytes"))
            out["nvml_used_bytes"] = first((proc or {}).get("nvml_used_bytes"))
            check(f"{label}the trainer has a breakdown at its peak on device 0", at is not None,
                  f"process {facts['pid']}: {'found' if proc else 'not in gpu_exact.processes'}")
            if at is None:
                continue
            lines = at.get("by_origin") or []
            names = [o.get("name") for o in lines]
            peak = at.get("peak_bytes") or 0
            by_name = {}
            for o in lines:
                by_name[o["name"]] = by_name.get(o["name"], 0) + o["bytes"]
            shown = {k: f"{v / MIB:.1f} MiB" for k, v in by_name.items()}
            torch_line = by_name.get(TORCH)
            reserved = facts["reserved_at_peak"]
            check(f"{label}the breakdown sums to its peak", sum(o["bytes"] for o in lines) == peak,
                  f"{sum(o['bytes'] for o in lines)} vs {peak}: {shown}")
            check(f"{label}the caching allocator's line equals torch.cuda.memory_reserved() at the peak, to the byte",
                  torch_line == reserved, f"{torch_line} vs reserved {reserved}")
            check(f"{label}the caching allocator's line holds the 1 GiB tensor",
                  (torch_line or 0) >= facts["held_bytes"], f"{torch_line} vs {facts['held_bytes']}")
            others = {k: v for k, v in by_name.items() if k != TORCH}
            excess = peak - reserved
            check(f"{label}the interposer's excess over torch's reserved is the sum of the other origins",
                  excess == sum(others.values()) and excess >= 0,
                  f"excess {excess / MIB:.2f} MiB = " + (", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in
                                                                    sorted(others.items(), key=lambda kv: -kv[1]))
                                                         or "nothing"))
            out["excess_by_origin"] = others
            if name == "nccl":
                check("the breakdown names NCCL", by_name.get("NCCL", 0) > 0, names)
            else:
                check("negative control: no NCCL line without a process group", "NCCL" not in by_name, names)
            ctx, nvml = out["context_bytes"], out["nvml_used_bytes"]
            check(f"{label}the context line is known, above 0 and below 2 GiB",
                  isinstance(ctx, int) and 0 < ctx < 2 * GIB, f"context_bytes {ctx}")
            if isinstance(ctx, int) and isinstance(nvml, int):
                check(f"{label}peak + context equals NVML's figure for the process (memprobe's sample) within 2 MiB",
                      abs(peak + ctx - nvml) <= TOLERANCE, f"{peak} + {ctx} vs NVML {nvml}")
            else:
                check(f"{label}NVML gave a per-process figure", False, f"nvml_used_bytes {nvml}")
            own = facts.get("nvml_self_bytes")
            if own is not None and isinstance(ctx, int):
                check(f"{label}peak + context equals nvidia-smi's reading taken by the trainer within 2 MiB",
                      abs(peak + ctx - own) <= TOLERANCE, f"{peak} + {ctx} vs nvidia-smi {own}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    failed = [c for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    return 1 if failed or not checks else 0


if __name__ == "__main__":
    sys.exit(main())
