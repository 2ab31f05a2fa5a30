#!/usr/bin/env python3
"""Gathers the parts of scripts/gpu-validate-all.sh into one JSON and one
markdown summary.

    gpu-validate-summary.py OUTDIR [--parts LIST] [--budget S] [--elapsed S] [--dry-run]

Reads OUTDIR/parts/NAME.status ("rc seconds limit", or "skipped 0 0"),
NAME.json (the part's own report, when it wrote one) and NAME.log; writes
OUTDIR/gpu-validation.json and OUTDIR/gpu-validation.md. Exits 0 only when
every part of LIST passed: a part skipped (its budget spent, or the part
said it cannot run here), timed out or not run fails the whole run; leave
it out of --parts to run without it.
"""
import argparse
import json
import os
import sys

ORDER = ["env", "torch", "interpose", "run", "oom", "nvml", "cpp", "origins", "attribution"]
TITLES = {
    "env": "the machine",
    "torch": "PyTorch allocator marks against known sizes and torch's own history, 2 GiB ~1 ms spike, boundary cost",
    "interpose": "driver interposer: bytes, spikes, allocator modes, throughput",
    "run": "`memprobe run --gpu-exact` over a PyTorch training run with phases",
    "oom": "a real PyTorch out-of-memory: observer and driver reports",
    "nvml": "NVML readings against nvidia-smi and torch",
    "cpp": "libtorch C++ (`memprobe_torch.hpp`): exact windows and attribution",
    "origins": "GPU memory by origin at a PyTorch + NCCL peak, against torch's reserved and NVML",
    "attribution": "PyTorch tensors at each epoch's peak step and at an OOM, and their cost",
}


def outcome(status):
    if status is None:
        return "not run"
    if status[0] == "skipped":
        return "skipped"
    rc = int(status[0])
    if rc == 77:  # the part said it cannot run here (the dry run's GPU-only parts)
        return "skipped"
    if rc == 0:
        return "passed"
    if rc in (124, 137):
        return "timed out"
    return "failed"


def checks_of(name, rep):
    """(check, ok, detail) rows of a part's report."""
    if not isinstance(rep, dict):
        return []
    if isinstance(rep.get("skipped"), str):
        return [("skipped", None, rep["skipped"])]
    if isinstance(rep.get("checks"), list):
        return [(c.get("check"), c.get("ok"), c.get("detail")) for c in rep["checks"]]
    rows = []
    py = rep.get("python_run")
    if isinstance(py, dict):
        rows.append(("exact step and epoch peaks equal torch's reference to the byte",
                     py.get("exact_equal_to_reference"), f"{py.get('mismatches')} mismatches"))
        rows.append(("the ~1 ms 2 GiB spike caught by the exact window in every try",
                     py.get("exact_caught") == py.get("tries"), f"{py.get('exact_caught')} of {py.get('tries')}"))
        rows.append(("NVML polling caught it (reported, not checked)", None,
                     f"{py.get('nvml_caught')} of {py.get('tries')}; polls {py.get('nvml_polls')}"))
        ur = py.get("user_reset")
        if isinstance(ur, dict):
            rows.append(("the script's own reset_peak_memory_stats inside the windows: peaks still exact",
                         ur.get("exact"), {k: ur.get(k) for k in ("expected", "step_peak", "epoch_peak")}))
        bc = py.get("boundary_cost")
        if isinstance(bc, dict):
            rows.append(("boundary cost vs a bare max_memory_allocated + reset_peak_memory_stats (target <= 1.0x)",
                         None, f"{bc.get('median_ns')} ns: {bc.get('ratio')}x"))
    cpp = rep.get("cpp_run")
    if isinstance(cpp, dict):
        if "skipped" in cpp:
            rows.append(("libtorch C++ path", None, f"skipped: {cpp['skipped']}"))
        elif "build_failed" in cpp:
            rows.append(("libtorch C++ path builds", False, cpp["build_failed"][-600:]))
        else:
            rows.append(("libtorch C++: spike caught in every try, exact to the byte", cpp.get("returncode") == 0,
                         {k: cpp.get(k) for k in ("tries", "caught", "mismatches", "build_s", "peak_since_start")}))
    return rows


def short(v, n=220):
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    s = s.replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= n else s[: n - 1] + "…"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--parts", default=",".join(ORDER))
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--elapsed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    pdir = os.path.join(a.outdir, "parts")
    wanted = [p for p in a.parts.split(",") if p]
    doc = {"dry_run": a.dry_run, "budget_s": a.budget, "elapsed_s": a.elapsed, "parts": {}}
    for name in [p for p in ORDER if p in wanted] + [p for p in wanted if p not in ORDER]:
        status = rep = None
        try:
            with open(os.path.join(pdir, name + ".status")) as f:
                status = f.read().split()
        except OSError:
            pass
        try:
            with open(os.path.join(pdir, name + ".json")) as f:
                rep = json.load(f)
        except (OSError, ValueError):
            pass
        log = ""
        try:
            with open(os.path.join(pdir, name + ".log"), errors="replace") as f:
                log = f.read()
        except OSError:
            pass
        entry = {"outcome": outcome(status), "title": TITLES.get(name, name)}
        if status and status[0] != "skipped":
            entry.update(rc=int(status[0]), seconds=int(status[1]), limit_s=int(status[2]))
        entry["report"] = rep
        entry["log_tail"] = log[-4000:]
        doc["parts"][name] = entry
    env = (doc["parts"].get("env") or {}).get("report") or {}
    doc["env"] = env
    ran = [p for p in doc["parts"].values() if p["outcome"] not in ("skipped", "not run")]
    doc["passed"] = bool(doc["parts"]) and all(p["outcome"] == "passed" for p in doc["parts"].values())
    with open(os.path.join(a.outdir, "gpu-validation.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)

    md = []
    title = "GPU validation" + (" — DRY RUN on the fakes (no GPU)" if a.dry_run else "")
    md.append(f"# {title}\n")
    if env:
        md.append(f"{env.get('date', '?')} · {env.get('device') or 'no GPU'} · "
                  f"nvidia-smi: `{env.get('nvidia_smi') or 'none'}` · torch {env.get('torch') or 'none'} "
                  f"(CUDA {env.get('torch_cuda') or 'none'}) · "
                  f"kernel {env.get('kernel', '?')} · {env.get('cpus', '?')} CPUs · Python {env.get('python', '?')}\n")
    skipped = [n for n, p in doc["parts"].items() if p["outcome"] in ("skipped", "not run")]
    verdict = "every part passed" if doc["passed"] else "some parts did not pass"
    if not ran:
        verdict = "no part ran"
    md.append(f"Whole run: {a.elapsed} s of a {a.budget} s budget. Result: **{verdict}**"
              + (f" ({len(skipped)} not run: {', '.join(skipped)})" if skipped else "") + ".\n")
    md.append("| part | what | outcome | time |")
    md.append("|---|---|---|---|")
    for name, p in doc["parts"].items():
        t = f"{p.get('seconds', '–')} s of {p.get('limit_s', '–')} s" if "seconds" in p else "–"
        md.append(f"| {name} | {p['title']} | {p['outcome']} | {t} |")
    for name, p in doc["parts"].items():
        if name == "env":
            continue
        rows = checks_of(name, p["report"])
        md.append(f"\n## {name}: {p['title']} — {p['outcome']}\n")
        if rows:
            md.append("| check | result | detail |")
            md.append("|---|---|---|")
            for c, ok, d in rows:
                res = "—" if ok is None else ("ok" if ok else "**FAIL**")
                md.append(f"| {short(c, 120)} | {res} | {short(d)} |")
        elif p["outcome"] != "not run":
            tail = "\n".join(p["log_tail"].strip().splitlines()[-12:])
            md.append("No report; the end of its output:\n\n```\n" + tail + "\n```")
    with open(os.path.join(a.outdir, "gpu-validation.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md[:12 + len(doc["parts"])]))
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
