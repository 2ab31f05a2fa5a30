"""Two gloo ranks on CPU, started by torchrun (``python -m
torch.distributed.run``) under ``memprobe run``, each training with a
memprobe.Tracker: the ranks travel with the phases over the run channel
(the tracker reads RANK, LOCAL_RANK and WORLD_SIZE, which torchrun sets; no
Python code is involved), and a 256 MiB host spike on rank 1 is named by
its rank, with the spread between the ranks, in the summary, the JSON and
the chart.

The ``memprobe`` command is found as in test_run_phases.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MiB, SITE, require, require_module
from schema_check import assert_valid, check
from test_run_phases import memprobe_cli

EPOCHS, STEPS, SPIKE_EPOCH, SPIKE_STEP = 2, 6, 1, 3

WORKER = f'''
import time
import torch
import torch.distributed as dist
import memprobe

dist.init_process_group("gloo")
rank = dist.get_rank()
rss = memprobe.Source.process()
t = memprobe.Tracker(rss)
x = torch.ones(1024)
for e in range({EPOCHS}):
    with t.epoch():
        t.begin("step")
        for s in range({STEPS}):
            dist.all_reduce(x)
            if rank == 1 and (e, s) == ({SPIKE_EPOCH}, {SPIKE_STEP}):
                spike = b"\\x01" * (256 << 20)
                del spike
            time.sleep(0.01)
            if s + 1 < {STEPS}:
                t.next("step")
            else:
                t.end("step")
t.close()
rss.close()
dist.barrier()
dist.destroy_process_group()
print(f"rank {{rank}} trained")
'''

#: Every launcher's variables (memprobe-core's run_channel::ranks): the
#: test's own environment must not hold any (a CI job under Slurm would).
LAUNCHER_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK", "PMI_SIZE",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
)


def test_two_gloo_ranks_under_torchrun_name_the_rank_that_spiked_and_the_spread(tmp_path):
    cli = memprobe_cli()
    require(cli is not None, "no memprobe command: cargo build -p memprobe-cli, or set MEMPROBE_CLI")
    assert cli is not None
    torch = require_module("torch", "torch")
    require(torch.distributed.is_available(), "this torch has no torch.distributed")
    worker = tmp_path / "train.py"
    worker.write_text(WORKER)
    out_json, out_svg = tmp_path / "run.json", tmp_path / "run.svg"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SITE) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("MEMPROBE_RUN_CHANNEL", None)
    for v in LAUNCHER_VARS:
        env.pop(v, None)
    # Two small CPU workers on a shared machine; gloo over loopback.
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run(
        [str(cli), "run", "--no-live", "--interval", "10ms", "--json", str(out_json),
         "--plot", str(out_svg), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(worker)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0 trained" in r.stdout and "rank 1 trained" in r.stdout, r.stdout + r.stderr

    doc = json.loads(out_json.read_text())
    assert_valid("docs/run-output.schema.json", doc)
    chan = doc["phase_channel"]
    assert chan["dropped"] == 0 and chan["garbled"] == 0, chan
    ranks = {s["rank"]: s for s in chan["ranks"]}
    assert sorted(ranks) == [0, 1], chan["ranks"]
    for rank, s in ranks.items():
        assert (s["local_rank"], s["world_size"]) == (rank, 2), s
    p0, p1 = ranks[0]["pid"], ranks[1]["pid"]
    # The workers are named by rank among the tree's processes; torchrun's
    # own agent (the command) has none.
    procs = {p["pid"]: p for p in doc["processes"]}
    assert procs[p1]["rank"] == 1 and procs[p0]["rank"] == 0
    assert "rank" not in procs[doc["pid"]]
    epochs = [p for p in doc["phases"] if p["kind"] == "epoch"]
    assert len(epochs) == 2 * EPOCHS, epochs
    assert all(p["rank"] == (1 if p["pid"] == p1 else 0) for p in epochs)

    spread = {s["label"]: s for s in chan["rank_spread"]}
    hot = spread[f"epoch {SPIKE_EPOCH}"]
    assert (hot["max_rank"], hot["max_pid"], hot["min_rank"], hot["min_pid"]) == (1, p1, 0, p0), hot
    assert hot["source"] == "rss" and hot["fidelity"] == "exact", hot
    # The spike is rank 1's alone (a little less than 256 MiB may show if
    # rank 1 held less beforehand).
    assert hot["max_bytes"] - hot["min_bytes"] >= 200 * MiB, hot
    assert hot["spread_percent"] >= 100.0 * 200 * MiB / hot["min_bytes"] - 1, hot
    steps = spread["steps"]
    assert steps["max_rank"] == 1, steps
    assert steps["max_step"] == f"epoch {SPIKE_EPOCH} / step {SPIKE_EPOCH * STEPS + SPIKE_STEP}", steps

    summary = r.stderr
    assert f"from pid {min(p0, p1)} (rank {0 if p0 < p1 else 1}), pid {max(p0, p1)}" in summary, summary
    assert f"pid {p1} (rank 1)" in summary, summary
    line = next(l for l in summary.splitlines() if f"rank spread           epoch {SPIKE_EPOCH}:" in l)
    assert f"epoch {SPIKE_EPOCH}: max rank 1 " in line and ", min rank 0 " in line, line
    assert f"spread +{hot['spread_percent']:.0f} % (rss, 2 ranks)" in line, line
    assert f"(pid {p1}, rank 1), exact" in summary, summary

    svg = out_svg.read_text()
    assert f"pid {p1} (rank 1) " in svg and f"(pid {p1}, rank 1)" in svg


def test_the_schema_checker_knows_dependent_fields():
    schema = {"type": "object", "dependentRequired": {"rank": ["world_size"]}}
    assert check(schema, {"rank": 1, "world_size": 2}) == []
    assert check(schema, {"world_size": 2}) == []
    assert check(schema, {"rank": 1}) == ["$: rank without world_size"]
