#!/usr/bin/env python3
"""Validates memprobe's exact PyTorch allocator peaks on a real GPU.

Trains a small model; in every try (one epoch) one step holds a 2 GiB
temporary tensor for about a millisecond. Records side by side, per step and
per epoch:

- memprobe's exact allocator peaks (torch_alloc / torch_reserved sources,
  nested step and epoch windows over one device's mark group);
- NVML's device memory sampled by two pollers, every 10 ms and every 1 ms;
- the reference: torch.cuda.max_memory_allocated() read just before each
  step boundary. memprobe's boundaries reset torch's one global peak
  counter, so that reading is the peak since the step began: exactly what a
  single global reset_peak_memory_stats() at each step start gives. The
  epoch reference is the largest step reference of the epoch (one global
  counter cannot serve nested windows: the reason memprobe exists).

Pass criteria: every exact step and epoch peak equals the reference to the
byte, and the spike is caught in every try. NVML's catch rate is reported.
The spike step empties torch's cache before and after the tensor, so the
2 GiB really comes from and returns to the driver and NVML has something to
see for about a millisecond.

Then builds and runs a libtorch C++ program using include/memprobe_torch.hpp
on the same machine (skip with --no-cpp).

    python3 scripts/gpu-validate-torch.py --out build/gpu-validation.json

Needs: torch with CUDA, memprobe's Python binding (bindings/python on
PYTHONPATH or installed), nvidia-ml-py (pynvml) for the NVML columns, a C++20
compiler and the CUDA headers for the C++ part.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

SPIKE = 2 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MemprobePeaks:
    """The only code that touches memprobe's Python API: adapt it here.

    A step window and an epoch window over the allocator sources of one
    device; `step()` and `epoch()` end their interval and return
    {"alloc": peak, "reserved": peak} in bytes.
    """

    def __init__(self, device):
        import memprobe
        from memprobe.integrations.torch import allocator_sources

        self.sources = allocator_sources(device=device)
        names = [getattr(s, "name", None) or str(s) for s in self.sources]
        self.alloc = next(i for i, n in enumerate(names) if "alloc" in n)
        self.reserved = next(i for i, n in enumerate(names) if "reserved" in n)
        self.names = names
        self.epoch_window = memprobe.Window(self.sources)
        self.step_window = memprobe.Window(self.sources)

    def _peaks(self, deltas):
        return {"alloc": int(deltas[self.alloc].peak), "reserved": int(deltas[self.reserved].peak)}

    def step(self):
        return self._peaks(self.step_window.reset())

    def epoch(self):
        return self._peaks(self.epoch_window.reset())


class NvmlPoller:
    """Polls NVML's used bytes of one device every `interval_s` on its own
    thread; take() returns the highest reading since the last take()."""

    def __init__(self, index, interval_s):
        import pynvml

        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.interval = interval_s
        self.lock = threading.Lock()
        self.high = 0
        self.polls = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        next_at = time.perf_counter()
        while not self.stop_event.is_set():
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
            with self.lock:
                self.high = max(self.high, used)
                self.polls += 1
            next_at += self.interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.perf_counter()

    def take(self):
        with self.lock:
            high, self.high = self.high, 0
        return high

    def stop(self):
        self.stop_event.set()
        self.thread.join()


def nvml_index(torch, device):
    """NVML's index of torch's device (CUDA_VISIBLE_DEVICES renumbers)."""
    import pynvml

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
    for i in range(pynvml.nvmlDeviceGetCount()):
        u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        u = u.decode() if isinstance(u, bytes) else u
        if uuid and u.replace("GPU-", "") == uuid.replace("GPU-", ""):
            return i
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return int(visible.split(",")[device])
    return device


def hold_spike(torch, device, hold_s):
    """A 2 GiB temporary tensor, held about `hold_s`, from and back to the driver."""
    torch.cuda.empty_cache()
    x = torch.empty(SPIKE, dtype=torch.uint8, device=device)
    x.fill_(1)
    torch.cuda.synchronize(device)
    end = time.perf_counter() + hold_s
    while time.perf_counter() < end:
        pass
    del x
    torch.cuda.empty_cache()
    torch.cuda.synchronize(device)


def python_run(args, torch):
    device = args.device
    torch.cuda.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(args.steps, 64, 1024, device=device)

    pollers = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        idx = nvml_index(torch, device)
        pollers = {"nvml_10ms": NvmlPoller(idx, 0.010), "nvml_1ms": NvmlPoller(idx, 0.001)}
    except Exception as e:  # NVML is optional: report why it is missing
        print(f"NVML columns skipped: {e}", file=sys.stderr)

    mp = MemprobePeaks(device)
    steps, epochs = [], []
    mismatches = 0
    exact_caught = 0
    nvml_caught = {k: 0 for k in pollers}
    for p in pollers.values():
        p.take()
    mp.step()
    mp.epoch()
    for t in range(args.tries):
        spike_step = (t * 7) % args.steps
        ref_epoch = 0
        nvml_epoch = {k: 0 for k in pollers}
        base_nvml = None
        for s in range(args.steps):
            base_alloc = torch.cuda.memory_allocated(device)
            for p in pollers.values():
                p.take()
            if s == spike_step and pollers:
                base_nvml = min(
                    pynvml.nvmlDeviceGetMemoryInfo(p.handle).used for p in pollers.values()
                )
            opt.zero_grad(set_to_none=True)
            loss = model(data[s]).square().mean()
            loss.backward()
            opt.step()
            if s == spike_step:
                hold_spike(torch, device, args.hold_ms / 1000.0)
            torch.cuda.synchronize(device)
            ref = torch.cuda.max_memory_allocated(device)  # since memprobe's last boundary
            exact = mp.step()
            nv = {k: p.take() for k, p in pollers.items()}
            ref_epoch = max(ref_epoch, ref)
            for k in nv:
                nvml_epoch[k] = max(nvml_epoch[k], nv[k])
            equal = exact["alloc"] == ref
            mismatches += not equal
            row = {"try": t, "step": s, "spike": s == spike_step, "reference_alloc": ref,
                   "exact_alloc": exact["alloc"], "exact_reserved": exact["reserved"],
                   "equal": equal, "base_alloc": base_alloc}
            row.update(nv)
            if s == spike_step:
                caught = exact["alloc"] - base_alloc >= SPIKE
                exact_caught += caught
                row["exact_caught"] = caught
                for k in nv:
                    c = base_nvml is not None and nv[k] - base_nvml >= SPIKE * 0.95
                    nvml_caught[k] += c
                    row[k + "_caught"] = c
            steps.append(row)
        exact = mp.epoch()
        equal = exact["alloc"] == ref_epoch
        mismatches += not equal
        row = {"try": t, "reference_alloc": ref_epoch, "exact_alloc": exact["alloc"],
               "exact_reserved": exact["reserved"], "equal": equal}
        row.update(nvml_epoch)
        epochs.append(row)
    for p in pollers.values():
        p.stop()
    cost = boundary_cost(torch, device, mp)
    ureset = user_reset(torch, device, mp)
    return {
        "boundary_cost": cost,
        "user_reset": ureset,
        "sources": mp.names,
        "tries": args.tries,
        "steps_per_try": args.steps,
        "hold_ms": args.hold_ms,
        "exact_equal_to_reference": mismatches == 0,
        "mismatches": mismatches,
        "exact_caught": exact_caught,
        "nvml_caught": nvml_caught,
        "nvml_polls": {k: p.polls for k, p in pollers.items()},
        "steps": steps,
        "epochs": epochs,
    }


def boundary_cost(torch, device, mp, blocks=30, per_block=200):
    """The cost of one exact boundary over the device's allocator sources (a
    window reset: both marks read, torch's peak reset) against the bare pair
    a script would call itself, `max_memory_allocated` then
    `reset_peak_memory_stats`. Interleaved blocks, medians per call."""
    import statistics

    # Once memprobe's allocator sources exist, torch.cuda.reset_peak_memory_stats
    # is memprobe's (it carries the open windows' marks first): the bare pair
    # calls torch's own binding underneath, as a script would without memprobe.
    reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None) or torch.cuda.reset_peak_memory_stats

    def bare():
        torch.cuda.max_memory_allocated(device)
        reset(device)

    cases = {"memprobe_window_reset": mp.step, "bare_max_allocated_and_reset": bare}
    times = {k: [] for k in cases}
    for fn in cases.values():  # warm both
        for _ in range(per_block):
            fn()
    for _ in range(blocks):
        for k, fn in cases.items():
            t = time.perf_counter_ns()
            for _ in range(per_block):
                fn()
            times[k].append((time.perf_counter_ns() - t) / per_block)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_ns": {k: round(v) for k, v in med.items()},
            "ratio": round(med["memprobe_window_reset"] / med["bare_max_allocated_and_reset"], 3),
            "blocks": blocks, "calls_per_block": per_block}


def user_reset(torch, device, mp):
    """A training script's own `torch.cuda.reset_peak_memory_stats()` inside
    memprobe's windows: 500 MiB held and freed, the user's reset, then
    100 MiB. memprobe carries its marks before a reset made through torch's
    Python API, so the open windows still see the 500 MiB: the step
    window's `torch_alloc` peak must be the base plus 500 MiB, to the byte,
    and so must an epoch window opened before it."""
    mib = 1 << 20
    torch.cuda.synchronize(device)
    mp.step()
    mp.epoch()
    base = torch.cuda.memory_allocated(device)
    x = torch.empty(500 * mib, dtype=torch.uint8, device=device)
    del x
    torch.cuda.reset_peak_memory_stats(device)  # the user's own
    y = torch.empty(100 * mib, dtype=torch.uint8, device=device)
    del y
    torch.cuda.synchronize(device)
    step, epoch = mp.step()["alloc"], mp.epoch()["alloc"]
    want = base + 500 * mib
    return {"base": base, "expected": want, "step_peak": step, "epoch_peak": epoch,
            "torch_after_user_reset": torch.cuda.max_memory_allocated(device),
            "exact": step == want and epoch == want}


CPP = r"""
#include <torch/torch.h>
#include <c10/cuda/CUDACachingAllocator.h>  // the reference: c10's DeviceStats (memprobe_torch.hpp needs no CUDA header on libtorch >= 2.11)
#include <chrono>
#include <cstdio>
#include "memprobe_torch.hpp"

int main(int argc, char **argv) {
    int tries = argc > 1 ? std::atoi(argv[1]) : 50, steps = 10;
    const std::int64_t spike = 2ll << 30;
    auto dev = torch::Device(torch::kCUDA, 0);
    auto warm = torch::ones({1024}, dev);  // initialises CUDA and the allocator
    memprobe::torch::AllocatorSources gpu(0);
    memprobe::Tracker tracker(gpu.list());
    auto model = torch::nn::Linear(1024, 1024);
    model->to(dev);
    int caught = 0, mismatches = 0;
    for (int t = 0; t < tries; t++) {
        tracker.begin(memprobe::PhaseKind::Epoch);
        std::uint64_t ref_epoch = 0;
        for (int s = 0; s < steps; s++) {
            tracker.begin(memprobe::PhaseKind::Step);
            auto base = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].current;
            auto y = model(torch::randn({64, 1024}, dev)).sum();
            y.backward();
            if (s == t % steps) {
                auto x = torch::empty({spike}, torch::TensorOptions().dtype(torch::kUInt8).device(dev));
                x.fill_(1);
                torch::cuda::synchronize();
                auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
                while (std::chrono::steady_clock::now() < end) {
                }
            }
            torch::cuda::synchronize();
            auto ref = static_cast<std::uint64_t>(
                c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak);
            auto r = tracker.end(memprobe::PhaseKind::Step);
            ref_epoch = std::max(ref_epoch, ref);
            mismatches += r.deltas[0].peak != ref;
            if (s == t % steps) caught += static_cast<std::int64_t>(r.deltas[0].peak) - base >= spike;
        }
        auto e = tracker.end(memprobe::PhaseKind::Epoch);
        mismatches += e.deltas[0].peak != ref_epoch;
    }
    std::printf("{\"tries\": %d, \"caught\": %d, \"mismatches\": %d, \"peak_since_start\": %llu}\n", tries,
                caught, mismatches, static_cast<unsigned long long>(gpu.peak_allocated_since_start()));
    return caught == tries && mismatches == 0 ? 0 : 1;
}
"""


def cpp_run(args, torch):
    import torch.utils.cpp_extension as ext

    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if not cxx:
        return {"skipped": "no C++ compiler"}
    prefix = args.memprobe_prefix
    libdir = os.path.join(prefix, "lib")
    if not os.path.exists(os.path.join(libdir, "libmemprobe.so")):
        return {"skipped": f"no libmemprobe.so under {libdir} (make install PREFIX=...)"}
    incs = list(ext.include_paths())
    cuda_home = ext.CUDA_HOME or os.environ.get("CUDA_HOME")
    if cuda_home:
        incs.append(os.path.join(cuda_home, "include"))
    try:
        import nvidia

        for p in nvidia.__path__:
            for d in sorted(os.listdir(p)):
                if os.path.isdir(os.path.join(p, d, "include")):
                    incs.append(os.path.join(p, d, "include"))
    except ImportError:
        pass
    tlib = ext.library_paths()[0]
    work = tempfile.mkdtemp(prefix="memprobe-torch-")
    src, exe = os.path.join(work, "validate.cpp"), os.path.join(work, "validate")
    with open(src, "w") as f:
        f.write(CPP)
    cmd = [cxx, "-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           "-I" + os.path.join(ROOT, "include")]
    for i in incs:
        cmd += ["-isystem", i]
    cmd += [src, "-o", exe, "-L" + libdir, "-L" + tlib, "-lmemprobe", "-ltorch", "-ltorch_cuda",
            "-ltorch_cpu", "-lc10_cuda", "-lc10", "-Wl,--no-as-needed", "-Wl,-rpath," + libdir,
            "-Wl,-rpath," + tlib]
    t0 = time.time()
    b = subprocess.run(cmd, capture_output=True, text=True)
    if b.returncode != 0:
        return {"build_failed": b.stderr[-4000:], "command": cmd}
    r = subprocess.run([exe, str(args.tries)], capture_output=True, text=True)
    out = {"build_s": round(time.time() - t0, 1), "returncode": r.returncode,
           "stderr": r.stderr[-2000:]}
    try:
        out.update(json.loads(r.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        out["stdout"] = r.stdout[-2000:]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--tries", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10, help="steps per try (epoch)")
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--memprobe-prefix", default=os.path.join(ROOT, "build", "test-prefix"))
    ap.add_argument("--no-cpp", action="store_true", help="skip the libtorch C++ part")
    ap.add_argument("--cpp-only", action="store_true", help="run only the libtorch C++ part")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu-validate-torch: CUDA is not available")
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "host": platform.node(),
        "device": torch.cuda.get_device_name(args.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        d = pynvml.nvmlSystemGetDriverVersion()
        report["driver"] = d.decode() if isinstance(d, bytes) else d
    except Exception:
        pass
    if args.cpp_only:
        report["cpp_run"] = cpp_run(args, torch)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        c = report["cpp_run"]
        print(f"libtorch: {json.dumps({k: v for k, v in c.items() if k not in ('command',)})[:3000]}")
        sys.exit(0 if c.get("returncode") == 0 else 1)
    report["python_run"] = python_run(args, torch)
    if not args.no_cpp:
        report["cpp_run"] = cpp_run(args, torch)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    py = report["python_run"]
    print(f"exact == reference: {py['exact_equal_to_reference']} ({py['mismatches']} mismatches); "
          f"exact caught {py['exact_caught']}/{args.tries}; NVML caught {py['nvml_caught']}")
    bc = py["boundary_cost"]
    print(f"boundary cost: memprobe {bc['median_ns']['memprobe_window_reset']} ns vs bare pair "
          f"{bc['median_ns']['bare_max_allocated_and_reset']} ns: {bc['ratio']}x (target <= 1.0x, not a pass/fail check)")
    if "cpp_run" in report:
        c = report["cpp_run"]
        print(f"libtorch: {json.dumps({k: v for k, v in c.items() if k not in ('stderr', 'command')})[:400]}")
    ur = py["user_reset"]
    print(f"the user's own reset_peak_memory_stats inside the windows: step {ur['step_peak']}, epoch "
          f"{ur['epoch_peak']}, expected {ur['expected']}: {'exact' if ur['exact'] else 'NOT exact'}")
    ok = py["exact_equal_to_reference"] and py["exact_caught"] == args.tries and ur["exact"]
    if "cpp_run" in report and "skipped" not in report["cpp_run"]:
        ok = ok and report["cpp_run"].get("returncode") == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
