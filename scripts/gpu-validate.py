#!/usr/bin/env python3
"""Validates memprobe's GPU readings on a machine with an NVIDIA GPU.

Compares, while PyTorch holds a known allocation:
  * device total / used / free / reserved: `memprobe gpus --json` against
    `nvidia-smi --query-gpu` and `torch.cuda.mem_get_info`;
  * this process's GPU memory: memprobe's process list against
    nvidia-smi's compute-apps table;
  * CUDA_VISIBLE_DEVICES given as an index, a UUID, a UUID prefix, an invalid
    entry and an empty string;
  * the latency of an NVML read through memprobe against an nvidia-smi
    subprocess (what Avalanche's GPU metric does per reading).

Usage: gpu-validate.py MEMPROBE_BIN NVML_LATENCY_BIN [--out report.json]
Prints a report and exits non-zero if a check fails.
"""
import json
import os
import statistics
import subprocess
import sys
import time

MIB = 1 << 20
checks = []


def check(name, ok, detail):
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def smi(query, kind="gpu"):
    flag = "--query-gpu" if kind == "gpu" else "--query-compute-apps"
    out = subprocess.run(["nvidia-smi", f"{flag}={query}", "--format=csv,noheader,nounits"],
                         check=True, capture_output=True, text=True).stdout
    return [[f.strip() for f in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def gpu_list(out):
    v = json.loads(out)
    return v["gpus"] if isinstance(v, dict) else v


def memprobe_gpus(binary, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([binary, "gpus", "--json"], capture_output=True, text=True, env=e)
    return p.returncode, p.stdout, p.stderr


def main():
    binary, latency_bin = sys.argv[1], sys.argv[2]
    out_path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    import torch

    torch.cuda.init()
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    print(f"device: {report['device']}, torch {report['torch']}", flush=True)

    # A known allocation held by this process.
    held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    time.sleep(0.5)
    rc, out, err = memprobe_gpus(binary)
    check("memprobe gpus runs", rc == 0, err.strip() or "ok")
    mp = gpu_list(out)
    report["memprobe_gpus"] = mp
    gpu0 = mp[0]
    (s_total, s_used, s_free, s_reserved, s_uuid) = smi("memory.total,memory.used,memory.free,memory.reserved,uuid")[0]
    t_free, t_total = torch.cuda.mem_get_info(0)
    report["nvidia_smi"] = {"total_mib": s_total, "used_mib": s_used, "free_mib": s_free, "reserved_mib": s_reserved, "uuid": s_uuid}
    report["torch_mem_get_info"] = {"free": t_free, "total": t_total}
    mt, mu, mf = gpu0["total_bytes"], gpu0["used_bytes"], gpu0["free_bytes"]
    mr = gpu0.get("reserved_bytes")
    check("uuid matches nvidia-smi", gpu0["uuid"] == s_uuid, f"{gpu0['uuid']} vs {s_uuid}")
    check("total matches nvidia-smi (MiB)", mt // MIB == int(s_total), f"{mt // MIB} vs {s_total}")
    check("used matches nvidia-smi within 64 MiB", abs(mu / MIB - int(s_used)) <= 64, f"{mu / MIB:.0f} vs {s_used}")
    check("free matches nvidia-smi within 64 MiB", abs(mf / MIB - int(s_free)) <= 64, f"{mf / MIB:.0f} vs {s_free}")
    if mr is not None and s_reserved not in ("[N/A]", "N/A"):
        check("reserved matches nvidia-smi (MiB)", abs(mr / MIB - int(s_reserved)) <= 1, f"{mr / MIB:.0f} vs {s_reserved}")
    check("free matches torch.cuda.mem_get_info within 64 MiB", abs(mf - t_free) <= 64 * MIB,
          f"{mf / MIB:.0f} vs {t_free / MIB:.0f} MiB")
    # CUDA's total leaves out the driver's reservation, which NVML v2 (and
    # nvidia-smi) count in total and report apart.
    check("total - reserved matches torch.cuda.mem_get_info's total", mt - (mr or 0) == t_total,
          f"{mt} - {mr or 0} vs {t_total}")

    # This process in the per-process table.
    me = os.getpid()
    apps = {int(p): int(u) for p, u in (row[:2] for row in smi("pid,used_memory", kind="apps"))}
    mine = [p for p in gpu0.get("processes", []) if p["pid"] == me]
    report["smi_compute_apps"] = apps
    check("nvidia-smi lists this process", me in apps, f"pid {me} in {sorted(apps)}")
    check("memprobe lists this process", bool(mine), f"pid {me} in {[p['pid'] for p in gpu0.get('processes', [])]}")
    if mine and me in apps:
        used = mine[0]["used_bytes"] or 0
        check("this process's bytes match nvidia-smi (MiB)", abs(used / MIB - apps[me]) <= 2, f"{used / MIB:.0f} vs {apps[me]}")
        check("this process holds at least the 4 GiB tensor", used >= 4 << 30, f"{used / MIB:.0f} MiB")

    # CUDA_VISIBLE_DEVICES forms.
    for name, value, want in [("index 0", "0", 1), ("full UUID", s_uuid, 1), ("UUID prefix", s_uuid[:12], 1),
                              ("invalid index 7", "7", 0), ("invalid first hides the rest", "7,0", 0), ("empty", "", 0)]:
        rc, out, err = memprobe_gpus(binary, {"CUDA_VISIBLE_DEVICES": value})
        n = len(gpu_list(out)) if rc == 0 else 0
        uuid_ok = n == 0 or gpu_list(out)[0]["uuid"] == s_uuid
        check(f"CUDA_VISIBLE_DEVICES={value!r} ({name})", n == want and uuid_ok, f"{n} device(s), rc {rc}")

    # Latency: memprobe's NVML read in-process vs an nvidia-smi subprocess.
    lat = json.loads(subprocess.run([latency_bin, "20000"], check=True, capture_output=True, text=True).stdout)
    smi_times = []
    for _ in range(20):
        t = time.perf_counter()
        smi("memory.used")
        smi_times.append((time.perf_counter() - t) * 1e9)
    smi_med = statistics.median(smi_times)
    lat["nvidia_smi_subprocess_median_ns"] = round(smi_med)
    lat["ratio_smi_over_memprobe"] = round(smi_med / lat["memory_median_ns"])
    report["latency"] = lat
    check("latency measured", True, f"memprobe {lat['memory_median_ns']:.0f} ns (used_fast {lat['used_fast_median_ns']:.0f} ns) vs nvidia-smi {smi_med / 1e6:.1f} ms: {lat['ratio_smi_over_memprobe']}x")

    del held
    report["checks"] = checks
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=2)
    failed = [c for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
