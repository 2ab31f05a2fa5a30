"""A Python training loop (memprobe.Tracker) under ``memprobe run``: its
epochs, evaluation streams and the step of its one spike reach the run's
summary, JSON and chart, through the run channel (MEMPROBE_RUN_CHANNEL).

The ``memprobe`` command used: $MEMPROBE_CLI, else the one installed beside
the library under test (``<prefix>/bin/memprobe``, as ``make test`` lays it
out), else the newest build in the repository's target/ directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from conftest import MiB, PKG, ROOT, require, SITE

CHILD = r'''
import memprobe, time

EPOCHS, STEPS, SPIKE_EPOCH, SPIKE_STEP = 3, 8, 1, 5
rss = memprobe.Source.process()
t = memprobe.Tracker(rss)
for e in range(EPOCHS):
    with t.epoch():
        t.begin("step")
        for s in range(STEPS):
            time.sleep(0.02)
            if (e, s) == (SPIKE_EPOCH, SPIKE_STEP):
                spike = b"\x01" * (256 << 20)
                del spike
            rec = t.next("step") if s + 1 < STEPS else t.end("step")
            assert rec.index == e * STEPS + s, rec
            if (e, s) == (SPIKE_EPOCH, SPIKE_STEP):
                d = rec.deltas[0]
                assert d.peak + (2 << 20) >= d.used_start + (256 << 20), d
    with t.stream():
        time.sleep(0.04)
with t.phase("custom", "checkpoint"):
    time.sleep(0.02)
t.close()
rss.close()
print("trained")
'''


def memprobe_cli() -> Optional[Path]:
    given = os.environ.get("MEMPROBE_CLI")
    if given:
        return Path(given)
    lib = os.environ.get("MEMPROBE_LIBRARY")
    if lib:
        beside = Path(lib).resolve().parent.parent / "bin" / "memprobe"
        if beside.is_file():
            return beside
    built = [ROOT / "target" / p / "memprobe" for p in ("release", "debug")]
    built = [b for b in built if b.is_file()]
    return max(built, key=lambda b: b.stat().st_mtime) if built else None


def test_a_python_training_loop_shows_its_epochs_and_the_step_of_its_spike(tmp_path):
    cli = memprobe_cli()
    require(cli is not None, "no memprobe command: cargo build -p memprobe-cli, or set MEMPROBE_CLI")
    assert cli is not None
    child = tmp_path / "train.py"
    child.write_text(CHILD)
    out_json, out_svg = tmp_path / "run.json", tmp_path / "run.svg"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SITE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MEMPROBE_RUN_CHANNEL", None)
    r = subprocess.run(
        [str(cli), "run", "--no-live", "--interval", "5ms", "--json", str(out_json),
         "--plot", str(out_svg), "--", sys.executable, str(child)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout, r.stdout + r.stderr

    doc = json.loads(out_json.read_text())
    chan = doc["phase_channel"]
    assert chan["processes"] == [doc["pid"]], chan
    assert chan["dropped"] == 0 and chan["garbled"] == 0, chan
    assert chan["steps"] == 24, chan
    labels = [p["label"] for p in doc["phases"]]
    assert labels == ["epoch 0", "stream 0", "epoch 1", "stream 1", "epoch 2", "stream 2", "checkpoint 0"]
    epoch1 = doc["phases"][2]
    assert epoch1["steps"]["count"] == 8
    assert epoch1["steps"]["peaks"][0]["index"] == 13, epoch1
    assert epoch1["sources"][0]["fidelity"] == "exact"
    assert epoch1["sources"][0]["peak_bytes"] >= 256 * MiB
    assert doc["phases"][0]["sources"][0]["peak_bytes"] < 200 * MiB
    assert epoch1["run"]["samples"] > 0
    peak = chan["peaks"][0]
    assert (peak["source"], peak["label"], peak["step_in_phase"]) == ("rss", "epoch 1 / step 13", 5), peak
    assert peak["peak_bytes"] >= 256 * MiB

    summary = r.stderr
    assert "3 streams, 3 epochs, 1 custom phase, 24 steps" in summary, summary
    assert "in epoch 1, step 13 (#5 of its epoch), exact" in summary, summary

    svg = out_svg.read_text()
    for needle in ("epochs (shaded)", "evaluations (shaded): stream", "rss peak ", "in epoch 1, step 13"):
        assert needle in svg, needle
