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

Usage: gpu-validate.py MEMPROBE_BIN NVML_LATENCY_BIN [--out report.json] [--fake]
Prints a report and exits non-zero if a check fails.

--fake (the dry run, no GPU): the fake NVML (tests/fake-gpu/fake_nvml.c,
its script in $FAKE_NVML_SCRIPT) and the fake nvidia-smi over it
(tests/fake-gpu/nvidia-smi) on PATH; the held tensor is this process's line
added to the fake NVML's script, CUDA's mem_get_info is NVML's free and
total minus reserved, as the runtime reports them.
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


class FakeDevice:
    """What the script asks of torch, over the fake NVML (the dry run)."""

    def __init__(self):
        import ctypes

        self.lib = ctypes.CDLL(os.environ.get("MEMPROBE_NVML_LIBRARY") or "libnvidia-ml.so.1")
        self.ctypes = ctypes

    def hold(self, nbytes):
        # The fake NVML reads its script at every nvmlInit: every later
        # reader (memprobe, nvidia-smi) sees this process hold the bytes.
        with open(os.environ["FAKE_NVML_SCRIPT"], "a") as f:
            f.write(f"device 0 procs {os.getpid()}:{nbytes + (300 << 20)}\n")
        return nbytes

    def mem_get_info(self, device=0):
        ct = self.ctypes

        class M(ct.Structure):
            _fields_ = [("version", ct.c_uint), ("total", ct.c_ulonglong), ("reserved", ct.c_ulonglong),
                        ("free", ct.c_ulonglong), ("used", ct.c_ulonglong)]

        h = ct.c_void_p()
        m = M(version=(2 << 24) | ct.sizeof(M))
        if self.lib.nvmlInit_v2() or self.lib.nvmlDeviceGetHandleByIndex_v2(0, ct.byref(h)) or \
                self.lib.nvmlDeviceGetMemoryInfo_v2(h, ct.byref(m)):
            raise RuntimeError("the fake NVML cannot be read")
        return m.free, m.total - m.reserved


def main():
    binary, latency_bin = sys.argv[1], sys.argv[2]
    out_path = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    if "--fake" in sys.argv:
        dev = FakeDevice()
        report = {"torch": None, "device": "fake NVML (dry run)", "fake": True}
        held = dev.hold(4 << 30)
        mem_get_info = dev.mem_get_info
    else:
        import torch

        torch.cuda.init()
        report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
        # A known allocation held by this process.
        held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        mem_get_info = torch.cuda.mem_get_info
    print(f"device: {report['device']}, torch {report['torch']}", flush=True)
    time.sleep(0.5)
    rc, out, err = memprobe_gpus(binary)
    mp = gpu_list(out) if rc == 0 else []
    check("memprobe gpus runs and lists a device", rc == 0 and len(mp) > 0, err.strip() or f"{len(mp)} devices")
    if not mp:
        return finish(report, out_path)
    report["memprobe_gpus"] = mp
    gpu0 = mp[0]
    try:
        (s_total, s_used, s_free, s_reserved, s_uuid) = smi("memory.total,memory.used,memory.free,memory.reserved,uuid")[0]
    except (subprocess.CalledProcessError, IndexError, ValueError) as e:
        check("nvidia-smi answers", False, repr(e))
        return finish(report, out_path)
    t_free, t_total = mem_get_info(0)
    report["nvidia_smi"] = {"total_mib": s_total, "used_mib": s_used, "free_mib": s_free, "reserved_mib": s_reserved, "uuid": s_uuid}
    report["torch_mem_get_info"] = {"free": t_free, "total": t_total}
    mt, mu, mf = gpu0["total_bytes"], gpu0["used_bytes"], gpu0["free_bytes"]
    mr = gpu0.get("reserved_bytes")
    check("uuid matches nvidia-smi", gpu0["uuid"] == s_uuid, f"{gpu0['uuid']} vs {s_uuid}")
    check("total matches nvidia-smi (MiB)", mt // MIB == int(s_total), f"{mt // MIB} vs {s_total}")
    check("used matches nvidia-smi within 64 MiB", abs(mu / MIB - int(s_used)) <= 64, f"{mu / MIB:.0f} vs {s_used}")
    check("free matches nvidia-smi within 64 MiB", abs(mf / MIB - int(s_free)) <= 64, f"{mf / MIB:.0f} vs {s_free}")
    has_reserved = mr is not None and s_reserved.isdigit()
    check("reserved matches nvidia-smi (MiB; both must report it)",
          has_reserved and abs(mr / MIB - int(s_reserved)) <= 1, f"{None if mr is None else mr // MIB} vs {s_reserved}")
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
    check("an NVML read through memprobe is faster than an nvidia-smi subprocess",
          0 < lat["memory_median_ns"] < smi_med,
          f"memprobe {lat['memory_median_ns']:.0f} ns (used_fast {lat['used_fast_median_ns']:.0f} ns) vs nvidia-smi "
          f"{smi_med / 1e6:.1f} ms: {lat['ratio_smi_over_memprobe']}x")
    del held
    return finish(report, out_path)


def finish(report, out_path):
    report["checks"] = checks
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=2)
    failed = [c for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
