"""The GPU validation (scripts/gpu-validate-all.sh) as a dry run over the
fakes, so that it cannot rot between the times a GPU is available: the
orchestration (time-boxed parts, one failing part never stopping the others,
the JSON and the markdown summary) and the parts that can run on the fake
driver (the interposer's direct experiment, ``memprobe run --gpu-exact``
over a training run with phases)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import memprobe

from conftest import ROOT, require

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
    b = tmp / "bundle"
    (b / "bin").mkdir(parents=True)
    (b / "lib").mkdir()
    os.symlink(exe, b / "bin" / "memprobe")
    os.symlink(lib, b / "lib" / "libmemprobe.so")
    os.symlink(interposer, b / "lib" / "libmemprobe_interpose.so")
    return b


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    require(shutil.which("cc") is not None, "a C compiler is needed for the fake GPU libraries")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("MEMPROBE_GPU_EXACT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_dry_run_passes_every_part_that_can_run_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    r = _run("--dry-run", "--bundle", str(_bundle(tmp_path)), str(out))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    doc = json.loads((out / "gpu-validation.json").read_text())
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {"env": "passed", "torch": "skipped", "interpose": "passed", "run": "passed",
                        "oom": "skipped", "nvml": "skipped", "cpp": "skipped"}, outcomes
    assert doc["dry_run"] is True and doc["passed"] is True
    # The parts that ran made their checks, all passing, on the fakes.
    run_checks = doc["parts"]["run"]["report"]["checks"]
    assert len(run_checks) == 7 and all(c["ok"] for c in run_checks)
    spikes = doc["parts"]["interpose"]["report"]["experiments"]["direct"]["spikes"]
    assert all(v["interposer_caught"] == 50 for v in spikes.values()), spikes
    md = (out / "gpu-validation.md").read_text()
    assert "DRY RUN" in md and "| run |" in md and "skipped" in md
    assert "===== run: rc 0" in (out / "gpu-validation.log").read_text()


def test_a_failing_part_never_stops_the_others(tmp_path):
    b = _bundle(tmp_path)
    # A memprobe command that only fails: the run part fails; the parts
    # after it still run (and say they are skipped without a GPU).
    (b / "bin" / "memprobe").unlink()
    (b / "bin" / "memprobe").write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    (b / "bin" / "memprobe").chmod(0o755)
    out = tmp_path / "out"
    r = _run("--dry-run", "--bundle", str(b), str(out))
    assert r.returncode == 1, r.stdout[-3000:]
    doc = json.loads((out / "gpu-validation.json").read_text())
    outcomes = {k: v["outcome"] for k, v in doc["parts"].items()}
    assert outcomes == {"env": "passed", "torch": "skipped", "interpose": "passed", "run": "failed",
                        "oom": "skipped", "nvml": "skipped", "cpp": "skipped"}, outcomes
    assert doc["passed"] is False
    assert "did not pass" in (out / "gpu-validation.md").read_text()
    assert "===== cpp: rc 77" in (out / "gpu-validation.log").read_text()


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
