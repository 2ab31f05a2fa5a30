"""The GPU validation (scripts/gpu-validate-all.sh) as a dry run over the
fakes, so that it cannot rot between the times a GPU is available: the
orchestration (time-boxed parts, one failing part never stopping the others,
a skipped or timed-out part failing the run, the JSON and the markdown
summary), every part's checks over the fakes of tests/fake-gpu (the torch
allocator, the driver, NVML, nvidia-smi), the C++ part compiled and linked
against this environment's torch; and each kind of check broken on purpose
(a reset that does nothing, an interposer that over-counts by 1 MiB, NVML
that reads nothing, a part that hangs) to see the run fail."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import memprobe

from conftest import ROOT, require, require_module

SCRIPT = ROOT / "scripts" / "gpu-validate-all.sh"
SUMMARY = ROOT / "scripts" / "gpu-validate-summary.py"


def _find(name: str, *dirs: str) -> str | None:
    for d in dirs:
        if d and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def _bundle(tmp: Path) -> Path:
    """The artifacts the script takes, as `make gpu-validation-bundle` lays
    them out, from the library under test and its install prefix (or the
    cargo target directory)."""
    lib = memprobe.library_path()
    libdir = os.path.dirname(lib)
    prefix = os.path.dirname(libdir)
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    dirs = [os.path.join(prefix, "bin"), libdir, os.path.join(target, "release"), os.path.join(target, "debug")]
    exe = _find("memprobe", *dirs)
    interposer = _find("libmemprobe_interpose.so", libdir, *dirs[2:])
    require(exe is not None, "the memprobe command is not built (cargo build -p memprobe-cli)")
    require(interposer is not None, "libmemprobe_interpose.so is not built (cargo build -p memprobe-interpose-preload)")
    latency = _find("nvml_latency", *[os.path.join(d, "examples") for d in dirs[2:]])
    require(latency is not None, "the nvml_latency example is not built (cargo build -p memprobe-gpu --examples)")
    b = tmp / "bundle"
    (b / "bin").mkdir(parents=True)
    (b / "lib").mkdir()
    os.symlink(exe, b / "bin" / "memprobe")
    os.symlink(latency, b / "bin" / "nvml_latency")
    os.symlink(lib, b / "lib" / "libmemprobe.so")
    # The SONAME programs linked with -lmemprobe look for (the C++ part's).
    soname = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True).stdout.split("SONAME")[-1].split()
    if soname and soname[0] != "libmemprobe.so":
        os.symlink(lib, b / "lib" / soname[0])
    os.symlink(interposer, b / "lib" / "libmemprobe_interpose.so")
    return b


def _run(*args: str, timeout: int = 300, **env_extra: str) -> subprocess.CompletedProcess:
    require(shutil.which("cc") is not None, "a C compiler is needed for the fake GPU libraries")
    env = dict(os.environ, PYTHON=sys.executable, **env_extra)
    env.pop("MEMPROBE_GPU_EXACT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def _dry(tmp_path: Path, parts: str, bundle: Path | None = None, *more: str, **env: str):
    """A dry run of `parts`: (exit status, the summary's JSON, checks per part as {name: ok})."""
    # The fakes of the torch, interpose, oom and cpp parts run over the real
    # (CPU) torch, as the Python tests' fake torch.cuda does.
    require_module("torch", "torch")
    out = tmp_path / "out"
    b = bundle or _bundle(tmp_path)
    r = _run("--dry-run", "--parts", parts, *more, "--bundle", str(b), str(out), **env)
    doc = json.loads((out / "gpu-validation.json").read_text())
    checks = {name: {c["check"]: c["ok"] for c in ((p["report"] or {}).get("checks") or [])}
              for name, p in doc["parts"].items()}
    return r, doc, checks


ALL = "env,torch,interpose,run,oom,nvml,cpp,origins,attribution"


def test_dry_run_runs_every_part_s_checks_on_the_fakes(tmp_path):
    r, doc, checks = _dry(tmp_path, ALL)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {p: "passed" for p in ALL.split(",")}, outcomes
    assert doc["dry_run"] is True and doc["passed"] is True
    # Every part made its checks, all computed and passing.
    for part in ("torch", "interpose", "run", "oom", "nvml", "cpp", "origins", "attribution"):
        assert checks[part] and all(checks[part].values()), (part, checks[part])
    origins = doc["parts"]["origins"]["report"]["runs"]
    assert set(origins["nccl"]["excess_by_origin"]) == {"NCCL", "cuBLAS"}, origins["nccl"]
    assert set(origins["no_nccl"]["excess_by_origin"]) == {"cuBLAS"}, origins["no_nccl"]
    assert any("spike line" in c for c in checks["attribution"]), checks["attribution"]
    assert doc["parts"]["attribution"]["report"]["cost"]["snapshots"] > 0
    assert len(checks["oom"]) == 40 and len(checks["run"]) == 8, checks
    torch_checks = " ".join(checks["torch"])
    for what in ("known sizes", "negative control", "allocator history", "own reset binding", "native thread"):
        assert what in torch_checks, what
    bare = doc["parts"]["torch"]["report"]["python_run"]["boundary_cost"]["bare_pair"]
    assert bare["is_memprobe_wrapper"] is False and bare["is_what_memprobe_wraps"] is True, bare
    assert any("builds" in c for c in checks["cpp"])
    spikes = doc["parts"]["interpose"]["report"]["experiments"]["direct"]["spikes"]
    assert all(v["interposer_caught"] == 50 and v["nvml_polls"] > 0 for v in spikes.values()), spikes
    md = (out := tmp_path / "out" / "gpu-validation.md").read_text()
    assert "DRY RUN" in md and "| run |" in md and "every part passed" in md, out
    assert "===== run: rc 0" in (tmp_path / "out" / "gpu-validation.log").read_text()


def test_a_failing_part_never_stops_the_others(tmp_path):
    b = _bundle(tmp_path)
    # A memprobe command that only fails: the run part fails; the parts
    # after it still run.
    (b / "bin" / "memprobe").unlink()
    (b / "bin" / "memprobe").write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    (b / "bin" / "memprobe").chmod(0o755)
    r, doc, _ = _dry(tmp_path, "run,oom", b)
    assert r.returncode == 1, r.stdout[-3000:]
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {"run": "failed", "oom": "passed"}, outcomes
    assert doc["passed"] is False
    assert "did not pass" in (tmp_path / "out" / "gpu-validation.md").read_text()
    assert "===== oom: rc 0" in (tmp_path / "out" / "gpu-validation.log").read_text()


def _failed(checks: dict) -> list:
    return [c for c, ok in checks.items() if not ok]


def test_a_reset_that_does_nothing_fails_the_torch_part(tmp_path):
    r, doc, checks = _dry(tmp_path, "torch", None, FAKE_TORCH_DEFECT="reset-noop")
    assert r.returncode == 1 and doc["parts"]["torch"]["outcome"] == "failed"
    failed = " | ".join(_failed(checks["torch"]))
    for what in ("known sizes: every step", "negative control: every step without the spike",
                 "the step after the spike", "allocator history over it", "still base + 500 MiB"):
        assert what in failed, (what, failed)
    # The old reference, torch's own counter, agrees all the same: it
    # could not have caught this.
    consistency = [ok for c, ok in checks["torch"].items() if c.startswith("consistency")]
    assert consistency == [True]


def test_an_interposer_that_over_counts_by_1_mib_fails_the_interpose_part(tmp_path):
    cc = shutil.which("cc")
    require(cc is not None, "a C compiler is needed for the fake GPU libraries")
    b = _bundle(tmp_path)
    real = os.path.realpath(b / "lib" / "libmemprobe_interpose.so")
    (b / "lib" / "libmemprobe_interpose.so").unlink()
    subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(b / "lib" / "libmemprobe_interpose.so"),
                    str(ROOT / "tests" / "fake-gpu" / "fake_interposer_overcount.c"), "-ldl"], check=True)
    # The real interposer still counts, preloaded after the over-counting one.
    r, doc, checks = _dry(tmp_path, "interpose", b, LD_PRELOAD=real)
    assert r.returncode == 1 and doc["parts"]["interpose"]["outcome"] == "failed", r.stdout[-3000:]
    failed = " | ".join(_failed(checks["interpose"]))
    assert "holds 0 B" in failed and "counted exactly" in failed and "<= NVML's process bytes" in failed, failed


def test_nvml_that_reads_nothing_fails_every_nvml_comparison(tmp_path):
    r, doc, checks = _dry(tmp_path, "torch,oom,nvml", None,
                          MEMPROBE_DRY_RUN_NVML_EXTRA="device 0 memory_error NOT_SUPPORTED\\n"
                                                      "device 0 procs_error NOT_SUPPORTED")
    assert r.returncode == 1
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {"torch": "failed", "oom": "failed", "nvml": "failed"}, outcomes
    assert [c for c in _failed(checks["torch"])] == [c for c in checks["torch"] if "NVML polled" in c]
    oom = _failed(checks["oom"])
    assert sorted(c.split(": ", 1)[1] for c in oom) == sorted(
        ["this process in the GPU's process list", "its bytes match NVML's (within 5 %, plus the cache torch "
         "released after the report)"] * 2), oom
    assert _failed(checks["nvml"]), checks["nvml"]


def test_a_part_that_times_out_fails_the_run(tmp_path):
    r, doc, _ = _dry(tmp_path, "torch,run", None, "--part-limit", "5", FAKE_TORCH_DEFECT="hang")
    assert r.returncode == 1
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {"torch": "timed out", "run": "passed"}, outcomes
    assert doc["passed"] is False


def test_the_budget_bounds_the_run(tmp_path):
    out = tmp_path / "out"
    r = _run("--dry-run", "--budget", "5", "--bundle", str(_bundle(tmp_path)), str(out))
    assert r.returncode == 1
    doc = json.loads((out / "gpu-validation.json").read_text())
    assert {v["outcome"] for v in doc["parts"].values()} == {"skipped"}
    assert "budget" in doc["parts"]["run"]["log_tail"]


def test_bad_arguments_get_a_clear_error(tmp_path):
    r = _run()
    assert r.returncode == 2 and "usage" in r.stderr
    r = _run("--budget", "7m", str(tmp_path / "o"))
    assert r.returncode == 2 and "whole seconds" in r.stderr
    r = _run("--bundle", str(tmp_path), str(tmp_path / "o"))
    assert r.returncode == 2 and "make gpu-validation-bundle" in r.stderr
    r = _run("--frobnicate", str(tmp_path / "o"))
    assert r.returncode == 2 and "unknown option" in r.stderr
    r = _run("--part-limit", "soon", str(tmp_path / "o"))
    assert r.returncode == 2 and "whole seconds" in r.stderr


def test_the_summary_names_each_outcome(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    for name, status in {"torch": "0 12 100", "interpose": "124 130 130", "run": "1 3 60",
                         "oom": "77 0 80", "nvml": "skipped 0 0"}.items():
        (parts / f"{name}.status").write_text(status + "\n")
        (parts / f"{name}.log").write_text(f"{name} output\n")
    (parts / "run.json").write_text(json.dumps({"checks": [{"check": "c", "ok": False, "detail": "d"}]}))
    r = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path),
                        "--parts", "torch,interpose,run,oom,nvml,cpp"], capture_output=True, text=True)
    assert r.returncode == 1
    doc = json.loads((tmp_path / "gpu-validation.json").read_text())
    got = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert got == {"torch": "passed", "interpose": "timed out", "run": "failed", "oom": "skipped",
                   "nvml": "skipped", "cpp": "not run"}
    assert doc["parts"]["interpose"]["seconds"] == 130
    assert "**FAIL**" in (tmp_path / "gpu-validation.md").read_text()


def test_a_skipped_part_fails_the_run_unless_left_out(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "torch.status").write_text("0 12 100\n")
    (parts / "oom.status").write_text("77 0 80\n")

    def summary(wanted):
        return subprocess.run([sys.executable, str(SUMMARY), str(tmp_path), "--parts", wanted],
                              capture_output=True, text=True).returncode

    assert summary("torch,oom") == 1
    assert summary("torch") == 0
    assert summary("torch,nvml") == 1  # named, never run


def test_an_allocator_line_1_mib_off_fails_the_origins_part(tmp_path):
    # torch's stand-in holds 1 MiB beyond what it counts as reserved: the
    # allocator's line no longer equals torch's figure, and the excess is
    # no longer the other origins' sum.
    r, doc, checks = _dry(tmp_path, "origins", None, FAKE_ORIGINS_DEFECT="overcount")
    assert r.returncode == 1 and doc["parts"]["origins"]["outcome"] == "failed"
    failed = " | ".join(_failed(checks["origins"]))
    assert "equals torch.cuda.memory_reserved()" in failed and "the sum of the other origins" in failed, failed
    assert "names NCCL" not in failed and "no NCCL line" not in failed, failed


def test_nvml_that_reads_nothing_fails_the_origins_part(tmp_path):
    r, doc, checks = _dry(tmp_path, "origins", None,
                          MEMPROBE_DRY_RUN_NVML_EXTRA="device 0 procs_error NOT_SUPPORTED")
    assert r.returncode == 1
    failed = _failed(checks["origins"])
    assert failed and all("context line" in c or "NVML" in c for c in failed), failed


def test_a_history_that_lost_the_step_fails_the_attribution_part(tmp_path):
    # A ring buffer of 8 entries cannot hold a step: the records say the
    # history is incomplete and name nothing, and the checks fail rather
    # than accept a guess.
    r, doc, checks = _dry(tmp_path, "attribution", None, MEMPROBE_DRY_RUN_ARGS="--max-entries 8")
    assert r.returncode == 1 and doc["parts"]["attribution"]["outcome"] == "failed"
    failed = " | ".join(_failed(checks["attribution"]))
    assert "history complete" in failed and "1 GiB tensor" in failed and "to the byte" in failed, failed
