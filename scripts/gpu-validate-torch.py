#!/usr/bin/env python3
"""Validates memprobe's exact PyTorch allocator peaks on a real GPU, against
references memprobe does not control.

memprobe's windows over `torch_alloc:N` / `torch_reserved:N` read and reset
torch's one global peak counter, so that counter cannot be their reference
(had memprobe's reset done nothing, both would still agree). The references:

1. known sizes: nested run / epoch / step windows over a schedule of uint8
   tensors whose sizes the script chose (small ones rounded up to 512
   bytes, as c10's caching allocator does; large ones whole multiples of
   2 MiB, which c10 never rounds): every window's peak is computed by the
   script from the sizes it holds;
2. the same schedule before memprobe is imported, with torch's own reset
   binding called by the script at each step (no memprobe wrapper exists
   yet): `max_memory_allocated` / `max_memory_reserved` per step, against
   memprobe's `torch_alloc` / `torch_reserved` windows of the same steps;
3. torch's allocator history (`torch.cuda.memory._record_memory_history`;
   `_snapshot()` at each step's end: its device trace of alloc /
   free_requested / segment events, and its segments' live blocks)
   replayed per step of a training run in which one step per epoch holds a
   2 GiB tensor for about a millisecond: torch_reserved equal to the
   replay, torch_alloc between the bytes asked for and those plus c10's
   rounding per live block (the trace records the size asked for, the
   counter the block's); each step's replay must end at the next
   snapshot's state (nothing missing); an epoch's peak is its steps'.

Negative controls: every step without the spike reads below its base plus
the spike, and so does the step after it (a window after a reset never
shows an earlier spike); in the known schedule, every window after the one
that held the largest tensor reads below it.

Also: the caller's own `torch.cuda.reset_peak_memory_stats()` inside open
windows; NVML polled every 10 ms and 1 ms by native threads (a C helper
compiled here) while the spike is held by a C busy-wait with the GIL
released (catch counts reported, not checked; a poller that reads nothing
fails); one window boundary timed against the bare pair a script would
call, `max_memory_allocated` + torch's own `_cuda_resetPeakMemoryStats`
binding captured before memprobe was imported (the JSON says which).

Then builds and runs scripts/gpu-validate-cpp.cpp (libtorch C++ over
include/memprobe_torch.hpp) on the same machine (skip with --no-cpp).

    python3 scripts/gpu-validate-torch.py --out build/torch.json
    python3 scripts/gpu-validate-torch.py --fake --out torch.json   # the dry run

`--fake` runs every check on tests/fake-gpu/fake_torch_device.py (the
Python tests' scripted torch.cuda) and the fake NVML. Needs: torch with
CUDA, memprobe's Python binding, a C compiler (the NVML poller), a C++20
compiler and the CUDA headers for the C++ part.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from gpu_validate_nvml_poll import NativeNvml

SPIKE = 2 << 30
MIB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "scripts")


def rounded(n):
    """The bytes c10's caching allocator counts for an n-byte tensor."""
    return max(-(-n // 512) * 512, 512)


class Checks(list):
    """(check, ok, detail) rows; ok is always computed."""

    def add(self, name, ok, detail):
        self.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}", flush=True)


# ---- the device: real (torch.cuda) or fake (tests/fake-gpu) -----------------

class RealDevice:
    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        if not torch.cuda.is_available():
            sys.exit("gpu-validate-torch: CUDA is not available")
        torch.cuda.init()
        torch.manual_seed(0)
        self.name = torch.cuda.get_device_name(device)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.data = torch.randn(16, 64, 1024, device=device)

    def alloc(self, nbytes):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def free(self, handle):
        del handle  # the caller's reference is the last one

    def train_step(self, step):
        self.opt.zero_grad(set_to_none=True)
        self.model(self.data[step % len(self.data)]).square().mean().backward()
        self.opt.step()

    def synchronize(self):
        self.torch.cuda.synchronize(self.device)

    def empty_cache(self):
        self.torch.cuda.empty_cache()

    def history_start(self):
        self.torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                      max_entries=1 << 16, device=self.device)

    def history_take(self):
        """The allocator's events since the last take, and its state now
        from the snapshot's segments (bytes asked for by live blocks, their
        count, bytes reserved); the history starts over (disabling it clears
        it)."""
        mem = self.torch.cuda.memory
        snap = mem._snapshot(self.device)
        traces = snap.get("device_traces") or []
        events = list(traces[self.device]) if len(traces) > self.device else []
        segs = [g for g in snap.get("segments", []) if g.get("device", self.device) == self.device]
        live = [b for g in segs for b in g.get("blocks", []) if b.get("state") == "active_allocated"]
        state = {"requested": sum(int(b.get("requested_size", b["size"])) for b in live), "live": len(live),
                 "reserved": sum(int(g["total_size"]) for g in segs)}
        mem._record_memory_history(enabled=None, device=self.device)
        self.history_start()
        return events, state

    def history_stop(self):
        self.torch.cuda.memory._record_memory_history(enabled=None, device=self.device)


def make_device(args):
    if args.fake:
        sys.path.insert(0, os.path.join(ROOT, "tests", "fake-gpu"))
        import fake_torch_device

        return fake_torch_device.FakeDevice(args.device)
    return RealDevice(args.device)


# ---- NVML from native threads --------------------------------------------------

def nvml_index(dev, device):
    """NVML's index of the device (CUDA_VISIBLE_DEVICES renumbers)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if device < len(entries) and entries[device].isdigit():
        return int(entries[device])
    return device


# ---- memprobe ----------------------------------------------------------------

class MemprobePeaks:
    """The only code that touches memprobe's Python API: run, epoch and
    step windows over one device's allocator sources; each returns
    {"alloc": peak, "reserved": peak} of the interval it ends."""

    def __init__(self, device):
        import memprobe
        from memprobe.integrations.torch import allocator_sources

        self.sources = allocator_sources(device=device)
        self.names = [s.name for s in self.sources]
        self.alloc = self.names.index(f"torch_alloc:{device}")
        self.reserved = self.names.index(f"torch_reserved:{device}")
        self.windows = {k: memprobe.Window(self.sources) for k in ("run", "epoch", "step")}

    def end(self, which):
        d = self.windows[which].reset()
        return {"alloc": int(d[self.alloc].peak), "reserved": int(d[self.reserved].peak)}

    def step(self):
        return self.end("step")

    def close(self):
        for w in self.windows.values():
            w.close()
        self.sources.close()


# ---- reference 1 and 2: known sizes, with memprobe and without ------------

def known_schedule(epochs, steps):
    """Per epoch, per step: a list of ("a", name, bytes) / ("f", name)
    operations. Epoch 0's step 1 holds the largest tensor; every window
    after it holds less (the negative control). The large tensors are whole
    multiples of 2 MiB of at least 12 MiB: c10 keeps a cached block whole
    when at most 1 MiB would remain, and gives 1-10 MiB requests 20 MiB
    segments, so other sizes could be counted as a larger block than asked
    for; the small ones (under 1 MiB, the small pool, whose blocks always
    split) show the rounding up to 512 bytes."""
    sched = []
    for e in range(epochs):
        ep = []
        for s in range(steps):
            a = (s + 6) * 2 * MIB
            b = (e + s + 7) * 2 * MIB
            c = 777 * (e + 1) + 100 * s + 1
            ops = [("a", "x", a), ("a", "c", c), ("a", "y", b), ("f", "x")]
            if (e, s) == (0, 1):
                ops += [("a", "big", 512 * MIB), ("f", "big")]
            ops += [("a", "z", ((s + 6) // 2 + 6) * 2 * MIB), ("f", "y"), ("f", "c"), ("f", "z")]
            ep.append(ops)
        sched.append(ep)
    return sched


def expected_peak(ops):
    """The step's peak above its base, from the sizes alone."""
    held, now, peak = {}, 0, 0
    for op in ops:
        if op[0] == "a":
            held[op[1]] = rounded(op[2])
            now += held[op[1]]
            peak = max(peak, now)
        else:
            now -= held.pop(op[1])
    return peak


def run_ops(dev, ops):
    held = {}
    for op in ops:
        if op[0] == "a":
            held[op[1]] = dev.alloc(op[2])
        else:
            dev.free(held.pop(op[1]))
    dev.synchronize()


def known_without_memprobe(dev, sched, raw_reset):
    """The schedule before memprobe exists: torch's own binding resets the
    peak at every step; max_memory_* read at each step's end."""
    torch, d = dev.torch, dev.device
    dev.empty_cache()
    dev.synchronize()
    rows = []
    for ep in sched:
        for ops in ep:
            raw_reset(d)
            base = torch.cuda.memory_allocated(d)
            run_ops(dev, ops)
            rows.append({"base": base, "alloc": torch.cuda.max_memory_allocated(d),
                         "reserved": torch.cuda.max_memory_reserved(d)})
    return rows


def known_with_memprobe(dev, mp, sched):
    torch, d = dev.torch, dev.device
    dev.empty_cache()
    dev.synchronize()
    mp.end("run")
    mp.end("epoch")
    mp.step()
    run_base = torch.cuda.memory_allocated(d)
    steps, epochs = [], []
    for ep in sched:
        ep_base = torch.cuda.memory_allocated(d)
        ep_expected = 0
        for ops in ep:
            base = torch.cuda.memory_allocated(d)
            run_ops(dev, ops)
            got = mp.step()
            want = base + expected_peak(ops)
            ep_expected = max(ep_expected, want)
            steps.append({"base": base, "expected": want, "alloc": got["alloc"], "reserved": got["reserved"]})
        got = mp.end("epoch")
        epochs.append({"base": ep_base, "expected": ep_expected, "alloc": got["alloc"]})
    got = mp.end("run")
    run = {"base": run_base, "expected": max(e["expected"] for e in epochs), "alloc": got["alloc"]}
    return {"steps": steps, "epochs": epochs, "run": run}


def check_known(checks, known, without):
    steps, epochs, run = known["steps"], known["epochs"], known["run"]
    bad = [i for i, s in enumerate(steps) if s["alloc"] != s["expected"]]
    bad_e = [i for i, e in enumerate(epochs) if e["alloc"] != e["expected"]]
    checks.add("known sizes: every step, epoch and run window's torch_alloc peak equals the bytes the script "
               "allocated in it (rounded to 512 B), to the byte",
               not bad and not bad_e and run["alloc"] == run["expected"],
               f"{len(steps)} steps, {len(epochs)} epochs; wrong steps {bad[:5]}, epochs {bad_e}; "
               f"run {run['alloc']} vs {run['expected']}")
    big = max(range(len(steps)), key=lambda i: steps[i]["expected"] - steps[i]["base"])
    top = steps[big]["expected"]
    later = [s["alloc"] for s in steps[big + 1:]] + [e["alloc"] for e in epochs[1:]]
    checks.add("negative control: every window after the one that held the largest tensor reads below it",
               later and all(v < top for v in later), f"largest {top} B; later windows up to {max(later or [0])} B")
    same = len(without) == len(steps) and all(
        w["alloc"] == s["alloc"] and w["reserved"] == s["reserved"] for w, s in zip(without, steps))
    diff = [(i, w["alloc"], s["alloc"], w["reserved"], s["reserved"]) for i, (w, s) in enumerate(zip(without, steps))
            if w["alloc"] != s["alloc"] or w["reserved"] != s["reserved"]]
    checks.add("known sizes without memprobe (torch's own reset binding per step, max_memory_allocated / "
               "max_memory_reserved): equal to memprobe's torch_alloc and torch_reserved windows, step by step",
               same, f"{len(without)} vs {len(steps)} steps; differing (step, alloc, memprobe, reserved, memprobe): "
               f"{diff[:4]}")


# ---- reference 3: torch's allocator history, replayed ------------------------

ALLOC_DELTA = {"alloc": 1, "free_requested": -1}
RESERVED_DELTA = {"segment_alloc": 1, "segment_free": -1, "segment_map": 1, "segment_unmap": -1}
#: c10 records the size asked for; its allocated bytes count the block
#: given: rounded up to 512 B, and a large block is not split when at most
#: 1 MiB (kSmallSize) would remain. So, per live allocation, the block
#: exceeds the request by less than this.
BLOCK_SLACK = (1 << 20) + 512


def replay(events, start):
    """One window, from torch's own record: its state at the start (from
    the snapshot that closed the previous window) and its events in order.
    Returns the peak of bytes asked for, the most blocks live at once, the
    peak of reserved bytes, and the state at the end."""
    a, n, r = start["requested"], start["live"], start["reserved"]
    peak = [a, n, r]
    for ev in events:
        size = int(ev.get("size", 0))
        sign = ALLOC_DELTA.get(ev.get("action"), 0)
        a += sign * size
        n += sign
        r += RESERVED_DELTA.get(ev.get("action"), 0) * size
        peak = [max(peak[0], a), max(peak[1], n), max(peak[2], r)]
    return peak, {"requested": a, "live": n, "reserved": r}


def hold_spike(dev, nvml, hold_s):
    """A 2 GiB temporary tensor, held about `hold_s` (a C busy-wait: the GIL
    is free for anything else), from and back to the driver."""
    dev.empty_cache()
    x = dev.alloc(SPIKE)
    dev.synchronize()
    if nvml is not None:
        nvml.hold(hold_s)
    else:
        time.sleep(hold_s)
    dev.free(x)
    del x
    dev.empty_cache()
    dev.synchronize()


def training(dev, mp, args, nvml, pollers, raw_stats):
    torch, d = dev.torch, dev.device
    lib = nvml.lib if nvml else None
    for p in pollers.values():
        lib.poller_take(p)
    dev.synchronize()
    mp.step()
    mp.end("epoch")
    dev.history_start()
    _, state = dev.history_take()
    steps, epochs = [], []
    events_total, incomplete = 0, []
    for t in range(args.tries):
        spike_step = (t * 7) % args.steps
        ref_epoch = 0
        nv_epoch = {k: 0 for k in pollers}
        hist_epoch = [0, 0, 0]
        for s in range(args.steps):
            base = torch.cuda.memory_allocated(d)
            for p in pollers.values():
                lib.poller_take(p)
            dev.train_step(s)
            if s == spike_step:
                hold_spike(dev, nvml, args.hold_ms / 1000.0)
            dev.synchronize()
            # c10's own counter through the binding taken before memprobe
            # (torch.cuda.max_memory_allocated answers the caller's view):
            # the counter memprobe resets, so consistency, not a reference.
            ref = int(raw_stats(d).get("allocated_bytes", {}).get("all", {}).get("peak", 0))
            # torch's own record of the step, taken where the step ends (no
            # allocation between it and memprobe's boundary).
            events, now = dev.history_take()
            got = mp.step()
            nv = {k: lib.poller_take(p) for k, p in pollers.items()}
            peak, end = replay(events, state)
            events_total += len(events)
            if end != now:
                incomplete.append((t, s, end, now))
            state = now
            ref_epoch = max(ref_epoch, ref)
            hist_epoch = [max(x, y) for x, y in zip(hist_epoch, peak)]
            for k in nv:
                nv_epoch[k] = max(nv_epoch[k], nv[k])
            steps.append({"try": t, "step": s, "spike": s == spike_step, "base_alloc": base,
                          "exact_alloc": got["alloc"], "exact_reserved": got["reserved"], "counter_alloc": ref,
                          "history_requested": peak[0], "history_live": peak[1], "history_reserved": peak[2],
                          "history_events": len(events), **nv})
        got = mp.end("epoch")  # ends where its last step ended: the peak of its steps
        epochs.append({"try": t, "exact_alloc": got["alloc"], "exact_reserved": got["reserved"],
                       "counter_alloc": ref_epoch, "history_requested": hist_epoch[0],
                       "history_live": hist_epoch[1], "history_reserved": hist_epoch[2], **nv_epoch})
    dev.history_stop()
    return {"steps": steps, "epochs": epochs, "history_events": events_total, "history_incomplete": incomplete}


def check_training(checks, tr, tries, nvml_info):
    steps, epochs = tr["steps"], tr["epochs"]
    inc = tr["history_incomplete"]
    end_ok = tr["history_events"] > 0 and not inc
    checks.add("torch's allocator history is complete: each step's replay, from the snapshot before it, ends at "
               "the snapshot after it (bytes asked for, live blocks, reserved bytes)", end_ok,
               f"{tr['history_events']} events; steps that do not: {inc[:3]}")

    def within(r):
        lo, hi = r["history_requested"], r["history_requested"] + r["history_live"] * BLOCK_SLACK
        return lo <= r["exact_alloc"] <= hi and r["exact_reserved"] == r["history_reserved"]

    bad = [(r["try"], r["step"]) for r in steps if not within(r)]
    bad_e = [r["try"] for r in epochs if not within(r)]
    checks.add("every step and epoch window against the replay of torch's allocator history over it: "
               "torch_reserved equal to the byte; torch_alloc from the bytes asked for up to that plus "
               f"{BLOCK_SLACK} B per allocation live (c10's rounding and unsplit blocks)",
               end_ok and not bad and not bad_e,
               f"{len(steps)} steps, {len(epochs)} epochs; outside: steps {bad[:5]}, epochs {bad_e[:5]}")
    spikes = [r for r in steps if r["spike"]]
    caught = sum(r["exact_alloc"] - r["base_alloc"] >= SPIKE for r in spikes)
    checks.add("the ~1 ms 2 GiB spike caught by the step window in every try (peak >= base + 2 GiB)",
               len(spikes) == tries and caught == tries, f"{caught} of {tries}")
    quiet = [r for r in steps if not r["spike"]]
    loud = [(r["try"], r["step"]) for r in quiet if r["exact_alloc"] >= r["base_alloc"] + SPIKE]
    checks.add("negative control: every step without the spike reads below its base + 2 GiB",
               quiet and not loud, f"{len(quiet)} steps; above: {loud[:5]}")
    after = [r for i, r in enumerate(steps) if i > 0 and steps[i - 1]["spike"] and not r["spike"]]
    seen = [(r["try"], r["step"]) for r in after if r["exact_alloc"] >= r["base_alloc"] + SPIKE]
    checks.add("negative control: the step after the spike (a window after a reset) never shows it",
               after and not seen, f"{len(after)} steps after a spike; showing it: {seen[:5]}")
    same = sum(r["exact_alloc"] == r["counter_alloc"] for r in steps + epochs)
    checks.add("consistency (not independent: the counter memprobe reads and resets): equal to c10's "
               "allocated peak read before each boundary", same == len(steps) + len(epochs),
               f"{same} of {len(steps) + len(epochs)} windows")
    for k, info in nvml_info.items():
        checks.add(f"NVML polled from a native thread ({k}) read the device",
                   info.get("polls", 0) > 0 and info.get("errors", 1) == 0, info)


# ---- the caller's own reset, the boundary's cost -------------------------------

def user_reset(dev, mp):
    """A training script's own `torch.cuda.reset_peak_memory_stats()` inside
    memprobe's windows: 500 MiB held and freed, the user's reset, then
    100 MiB: the step and epoch windows must still read base + 500 MiB."""
    torch, d = dev.torch, dev.device
    dev.synchronize()
    mp.step()
    mp.end("epoch")
    base = torch.cuda.memory_allocated(d)
    x = dev.alloc(500 * MIB)
    dev.free(x)
    del x
    torch.cuda.reset_peak_memory_stats(d)  # the user's own
    y = dev.alloc(100 * MIB)
    dev.free(y)
    del y
    dev.synchronize()
    step, epoch = mp.step()["alloc"], mp.end("epoch")["alloc"]
    want = base + 500 * MIB
    return {"base": base, "expected": want, "step_peak": step, "epoch_peak": epoch,
            "torch_after_user_reset": torch.cuda.max_memory_allocated(d), "exact": step == want and epoch == want}


def boundary_cost(dev, mp, raw_reset, blocks, per_block):
    """One exact boundary (a step window reset over torch_alloc + torch_reserved:
    both marks read, torch's peak reset) against the bare pair a script calls
    without memprobe: max_memory_allocated, then torch's own reset binding,
    captured before memprobe was imported. Interleaved blocks, medians per call."""
    torch, d = dev.torch, dev.device

    def bare():
        torch.cuda.max_memory_allocated(d)
        raw_reset(d)

    cases = {"memprobe_window_reset": mp.step, "bare_max_allocated_and_reset": bare}
    times = {k: [] for k in cases}
    for fn in cases.values():
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


def python_run(args, dev, raw_reset, raw_stats, checks):
    torch, d = dev.torch, dev.device
    sched = known_schedule(3, 4)
    without = known_without_memprobe(dev, sched, raw_reset)

    from memprobe.integrations import _torch_resets

    mp = MemprobePeaks(d)
    installed = torch._C._cuda_resetPeakMemoryStats
    bare_pair = {
        "reset": "torch._C._cuda_resetPeakMemoryStats",
        "taken": "by this script before memprobe was imported (same process)",
        "is_memprobe_wrapper": hasattr(raw_reset, "_memprobe_original"),
        "memprobe_wrapped_it_since": installed is not raw_reset,
        "is_what_memprobe_wraps": _torch_resets.unwrapped(installed) is raw_reset,
    }
    checks.add("the bare pair times torch's own reset binding, not memprobe's wrapper",
               not bare_pair["is_memprobe_wrapper"] and bare_pair["is_what_memprobe_wraps"], bare_pair)
    known = known_with_memprobe(dev, mp, sched)
    check_known(checks, known, without)

    nvml, pollers, nvml_info = None, {}, {}
    work = tempfile.mkdtemp(prefix="memprobe-torch-nvml-")
    try:
        nvml = NativeNvml(work)
        idx = nvml_index(dev, d)
        pollers = {"nvml_10ms": nvml.start(idx, 0.010), "nvml_1ms": nvml.start(idx, 0.001)}
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        nvml_info["nvml"] = {"error": str(e), "polls": 0, "errors": 1}
    tr = training(dev, mp, args, nvml, pollers, raw_stats)
    for k, p in pollers.items():
        nvml_info[k] = {"polls": nvml.lib.poller_polls(p), "errors": nvml.lib.poller_errors(p)}
        nvml.lib.poller_stop(p)
    check_training(checks, tr, args.tries, nvml_info)
    nvml_caught = {}
    for k in pollers:
        spikes = [r for r in tr["steps"] if r["spike"]]
        quiet = [r[k] for r in tr["steps"] if not r["spike"] and r[k]]
        floor = min(quiet) if quiet else 0
        nvml_caught[k] = sum(r[k] - floor >= SPIKE * 0.95 for r in spikes if r[k] and floor)
    ur = user_reset(dev, mp)
    checks.add("the script's own reset_peak_memory_stats inside the windows: step and epoch peaks still base + "
               "500 MiB", ur["exact"], {k: ur[k] for k in ("expected", "step_peak", "epoch_peak")})
    cost = boundary_cost(dev, mp, raw_reset, args.cost_blocks, args.cost_calls)
    cost["bare_pair"] = bare_pair
    mp.close()
    return {
        "sources": mp.names, "tries": args.tries, "steps_per_try": args.steps, "hold_ms": args.hold_ms,
        "known_sizes": known, "known_without_memprobe": without, "training": tr,
        "nvml": nvml_info, "nvml_caught": nvml_caught, "user_reset": ur, "boundary_cost": cost,
    }


# ---- the C++ part -----------------------------------------------------------------

def cpp_build_command(torch, prefix, src, exe):
    """The compiler command for scripts/gpu-validate-cpp.cpp against the
    installed torch and memprobe under `prefix` (None: compile only)."""
    import glob

    import torch.utils.cpp_extension as ext

    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if not cxx:
        raise RuntimeError("no C++ compiler")
    incs = list(ext.include_paths())
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.isdir(os.path.join(home, "include")):
            incs.append(os.path.join(home, "include"))
    try:
        import nvidia

        for p in nvidia.__path__:
            incs += sorted(glob.glob(os.path.join(p, "*", "include")))
    except ImportError:
        pass
    tlib = ext.library_paths()[0]
    cmd = [cxx, "-std=c++20", "-O2", "-Wall", "-Wextra", "-Werror",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           "-I" + os.path.join(ROOT, "include")]
    for i in incs:
        cmd += ["-isystem", i]
    if prefix is None:
        return cmd + ["-c", src, "-o", exe]
    libdir = os.path.join(prefix, "lib")
    return cmd + [src, "-o", exe, "-L" + libdir, "-L" + tlib, "-Wl,--no-as-needed", "-lmemprobe", "-ltorch",
                  "-ltorch_cuda", "-ltorch_cpu", "-lc10_cuda", "-lc10", "-Wl,--as-needed",
                  "-Wl,-rpath," + libdir, "-Wl,-rpath," + tlib, "-Wl,--allow-shlib-undefined"]


def cpp_run(args, torch, checks):
    """Builds scripts/gpu-validate-cpp.cpp and runs it. With --fake (no
    device): built and linked the same way, then run with no device visible,
    where it must refuse with its error line."""
    libdir = os.path.join(args.memprobe_prefix, "lib")
    have = os.path.exists(os.path.join(libdir, "libmemprobe.so"))
    checks.add("libtorch C++ part: libmemprobe.so found", have, libdir)
    if not have:
        return {}
    work = tempfile.mkdtemp(prefix="memprobe-torch-")
    exe = os.path.join(work, "validate")
    src = os.path.join(HERE, "gpu-validate-cpp.cpp")
    try:
        cmd = cpp_build_command(torch, args.memprobe_prefix, src, exe)
    except RuntimeError as e:
        checks.add("libtorch C++ part builds", False, str(e))
        return {}
    t0 = time.time()
    b = subprocess.run(cmd, capture_output=True, text=True)
    out = {"build_s": round(time.time() - t0, 1), "command": cmd}
    checks.add("libtorch C++ part builds", b.returncode == 0, b.stderr[-3000:] or f"{out['build_s']} s")
    if b.returncode != 0:
        return out
    records = os.path.join(work, "attribution")
    env = dict(os.environ, MEMPROBE_ATTRIBUTION_DIR=records)
    if args.fake:
        env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run([exe, str(args.cpp_tries)], capture_output=True, text=True, env=env)
    out.update(returncode=r.returncode, stderr=r.stderr[-2000:], attribution_dir=records)
    try:
        res = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {}
        out["stdout"] = r.stdout[-2000:]
    out.update(res)
    if args.fake:
        checks.add("libtorch C++ part, no device visible: refuses with its error line (exit 2)",
                   r.returncode == 2 and "no CUDA device" in str(res.get("error")), {"rc": r.returncode, **res})
    else:
        check_cpp(checks, out)
    return out


def check_cpp(checks, c):
    """The C++ program's figures (see gpu-validate-cpp.cpp) as checks."""
    tries = c.get("tries", 0)
    checks.add("libtorch C++: the 2 GiB spike caught by the step window in every try",
               tries > 0 and c.get("caught") == tries, f"{c.get('caught')} of {tries}")
    checks.add("libtorch C++: known sizes in nested step / epoch windows, to the byte",
               c.get("known_windows", 0) > 0 and c.get("known_wrong") == 0,
               f"{c.get('known_wrong')} wrong of {c.get('known_windows')}")
    checks.add("libtorch C++ negative control: steps without the spike, and after it, below base + 2 GiB",
               c.get("quiet_steps", 0) > 0 and c.get("quiet_loud") == 0,
               f"{c.get('quiet_loud')} of {c.get('quiet_steps')} above")
    checks.add("libtorch C++ consistency (the counter memprobe resets): equal to c10's DeviceStats peak",
               c.get("mismatches") == 0 and tries > 0, f"{c.get('mismatches')} mismatches")
    check_cpp_attribution(checks, c)


def read_record(directory, name):
    try:
        with open(os.path.join(directory, name)) as f:
            text = f.read()
        return json.loads(text), len(text.encode())
    except (OSError, ValueError) as e:
        return {"error": str(e)}, 0


def check_cpp_attribution(checks, c):
    """memprobe_torch.hpp's Attribution: the records the C++ program wrote
    against its steps' exact peaks (see gpu-validate-cpp.cpp)."""
    a = c.get("attribution") or {}
    d = c.get("attribution_dir") or ""
    checks.add("libtorch C++ attribution: runs (history on, records written)", not a.get("error") and a,
               a.get("error") or a)
    checks.add("libtorch C++ attribution: snapshots only on new epoch peaks",
               a.get("snapshots") == a.get("new_epoch_peaks") and (a.get("snapshots") or 0) > 0,
               f"{a.get('snapshots')} snapshots, {a.get('new_epoch_peaks')} new epoch peaks")
    rec, size = read_record(d, "epoch-1-rank-0.json")
    blocks = rec.get("blocks") or []
    rest = (rec.get("rest") or {}).get("bytes")
    complete = (rec.get("history") or {}).get("complete") is True
    checks.add("libtorch C++ attribution: epoch 1's record is its spike step, complete, within 256 KiB",
               complete and rec.get("step") == a.get("spike_step") and 0 < size <= 256 * 1024
               and rec.get("schema") == "memprobe.torch_attribution/1",
               {k: rec.get(k) for k in ("step", "history", "error")} | {"size": size})
    checks.add("libtorch C++ attribution: the 1 GiB tensor is the top block",
               bool(blocks) and blocks[0].get("bytes") == 1 << 30, blocks[:2])
    checks.add("libtorch C++ attribution: blocks + rest == the step's exact peak, to the byte",
               complete and rest is not None and sum(b["bytes"] for b in blocks) + rest == a.get("spike_peak")
               == rec.get("peak_bytes"),
               f"{sum(b.get('bytes', 0) for b in blocks)} + {rest} vs {a.get('spike_peak')} "
               f"(record {rec.get('peak_bytes')}); unplaced {(rec.get('rest') or {}).get('unplaced_bytes')}")
    e0, _ = read_record(d, "epoch-0-rank-0.json")
    checks.add("libtorch C++ attribution negative control: epoch 0 holds no 1 GiB block",
               "error" not in e0 and all(b.get("bytes", 0) < 1 << 30 for b in e0.get("blocks") or []),
               [b.get("bytes") for b in (e0.get("blocks") or [])[:3]])
    oom, _ = read_record(d, "oom-0-rank-0.json")
    req = oom.get("requested_bytes")
    checks.add("libtorch C++ attribution: torch's out-of-memory error writes its table (request, segments)",
               a.get("oom_seen") is True and oom.get("kind") == "oom" and isinstance(req, int)
               and a.get("oom_request", 0) <= req <= a.get("oom_request", 0) + (2 << 20)
               and bool(oom.get("segments")),
               {"request": a.get("oom_request"), "requested_bytes": req, "segments": len(oom.get("segments") or []),
                "error": oom.get("error")})


# ---- main ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the JSON report")
    ap.add_argument("--tries", type=int, default=50)
    ap.add_argument("--steps", type=int, default=10, help="steps per try (epoch)")
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cost-blocks", type=int, default=30)
    ap.add_argument("--cost-calls", type=int, default=200)
    ap.add_argument("--cpp-tries", type=int, default=20)
    ap.add_argument("--memprobe-prefix", default=os.path.join(ROOT, "build", "test-prefix"))
    ap.add_argument("--no-cpp", action="store_true", help="skip the libtorch C++ part")
    ap.add_argument("--cpp-only", action="store_true", help="run only the libtorch C++ part")
    ap.add_argument("--fake", action="store_true",
                    help="the dry run: tests/fake-gpu's scripted device and NVML (no GPU)")
    args = ap.parse_args()
    if "memprobe" in sys.modules:
        sys.exit("gpu-validate-torch: memprobe must not be imported before torch's bindings are captured")

    checks = Checks()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "host": platform.node(),
              "python": platform.python_version(), "fake": args.fake, "checks": checks}
    if args.cpp_only:
        import torch

        report.update(torch=torch.__version__, cuda=torch.version.cuda)
        report["cpp_run"] = cpp_run(args, torch, checks)
        return finish(args, report, checks)
    dev = make_device(args)
    torch = dev.torch
    # torch's own binding, before memprobe exists: the bare pair's reset and
    # the reset of the pass without memprobe.
    raw_reset = torch._C._cuda_resetPeakMemoryStats
    raw_stats = torch._C._cuda_memoryStats
    report.update(device=dev.name, torch=torch.__version__, cuda=torch.version.cuda)
    report["python_run"] = python_run(args, dev, raw_reset, raw_stats, checks)
    py = report["python_run"]
    bc = py["boundary_cost"]
    print(f"boundary cost: memprobe {bc['median_ns']['memprobe_window_reset']} ns vs bare pair "
          f"{bc['median_ns']['bare_max_allocated_and_reset']} ns (torch's own binding): {bc['ratio']}x "
          f"(reported, not checked); NVML caught {py['nvml_caught']} of {args.tries} (reported, not checked)")
    if not args.no_cpp and not args.fake:
        report["cpp_run"] = cpp_run(args, torch, checks)
    return finish(args, report, checks)


def finish(args, report, checks):
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    failed = [c for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
    return 0 if checks and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
