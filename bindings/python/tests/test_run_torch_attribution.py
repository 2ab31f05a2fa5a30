"""The PyTorch attribution records the Python integrations write, read by
``memprobe run``: a child builds records with the package's own replay and
writer (on a snapshot in torch's documented format, so no torch is needed)
into the directory ``memprobe run`` names in MEMPROBE_ATTRIBUTION_DIR, and
the run's JSON (``torch_attribution``) and summary show them as written.
This is the contract between the two sides: a change of the record on
either side fails here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import SITE, require
from test_run_phases import memprobe_cli

CHILD = r'''
import json, os
from memprobe.integrations.torch_attribution import record as rec
from memprobe.integrations.torch_attribution.replay import replay_peak

MiB = 1 << 20
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"

def frames(line):
    return [{"filename": TORCH, "line": 1736, "name": "_call_impl"},
            {"filename": "/work/train.py", "line": line, "name": "forward"}]

def ev(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": frames(40 + addr // 0x1000000)}

a, b, c = 0x1000000, 0x2000000, 0x3000000
trace = [ev("alloc", a, MiB, 100), ev("alloc", b, 1024 * MiB, 210), ev("alloc", c, 2 * MiB, 220),
         ev("free_requested", b, 1024 * MiB, 230), ev("free_completed", b, 1024 * MiB, 231)]
segments = [{"device": 0, "address": x, "total_size": 2 * s, "allocated_size": s, "stream": 0,
             "blocks": [{"address": x, "size": s, "state": "active_allocated", "frames": frames(40 + x // 0x1000000)}]}
            for x, s in ((a, MiB), (c, 2 * MiB))]
snap = {"segments": segments, "device_traces": [trace]}
d = rec.directory(None)
written = []
# Epoch 0: complete, the 1 GiB block on top. Epoch 1: the step's start is
# older than the history (a ring buffer that lost it): no blocks named.
for epoch, start in ((0, 200), (1, None)):
    r = replay_peak(snap, 0, start_us=start, end_us=300, peak_bytes=1027 * MiB, recording_since_us=50)
    out = rec.build(r, kind="epoch_peak", top=2, peak_bytes=1027 * MiB, epoch=epoch, step=10 + epoch,
                    stage="train", rank_=0, cost_ms=1.25)
    rec.write(out, os.path.join(d, rec.file_name("epoch_peak", epoch, 0)))
    written.append(out)
print("RECORDS " + json.dumps(written))
'''


def test_records_the_package_writes_reach_the_runs_json_and_summary(tmp_path):
    cli = memprobe_cli()
    require(cli is not None, "no memprobe command: cargo build -p memprobe-cli, or set MEMPROBE_CLI")
    assert cli is not None
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out_json = tmp_path / "run.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SITE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MEMPROBE_ATTRIBUTION_DIR", None)
    r = subprocess.run(
        [str(cli), "run", "--no-live", "--json", str(out_json), "--", sys.executable, str(child)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    written = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RECORDS "))[8:])
    doc = json.loads(out_json.read_text())
    got = doc["torch_attribution"]
    assert [g["file"] for g in got] == ["epoch-0-rank-0.json", "epoch-1-rank-0.json"], got
    for g, w in zip(got, written):
        for key in ("kind", "rank", "epoch", "step", "stage", "device", "peak_bytes", "blocks"):
            assert g[key] == w[key], (key, g, w)
        assert g["history"] == {"reason": None, **w["history"]}, (g, w)
        assert g["rest"]["bytes"] == w["rest"]["bytes"] and g["rest"]["blocks"] == w["rest"]["blocks"]
    top = got[0]["blocks"][0]
    assert top["bytes"] == 1024 << 20 and top["frames"][0] == {"file": "/work/train.py", "line": 42, "function": "forward"}
    assert not got[1]["history"]["complete"] and got[1]["blocks"] == [] and got[1]["rest"]["bytes"] is None
    lines = [x for x in r.stderr.splitlines() if x.startswith("  torch epoch")]
    assert lines[0].endswith(
        "step 10, train, GPU 0 1.00 GiB: 1.00 GiB train.py:42 forward, 2.00 MiB train.py:43 forward, rest 1.00 MiB in 1 block"
    ), r.stderr
    assert lines[1].endswith("blocks unknown: the step's start is unknown"), r.stderr
    assert "warning" not in r.stderr, r.stderr
