"""The Accelerate helper on 2 CPU ranks (torchrun, gloo): a spike on rank 1
only; every rank logs the maximum across ranks (rank 0's logs show rank 1's
spike, in the step, the interval, the epoch and the Trainer-named train
stage), and each keeps its own history."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from conftest import SITE, MiB, require_module

SPIKE = 256 * MiB
SPIKE_STEP = 3

SCRIPT = r"""
import json, os, sys
import torch
from accelerate import Accelerator
from memprobe.integrations.accelerate import MemprobeAccelerate

SPIKE, SPIKE_STEP, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = accelerator.prepare(model, opt)
probe = MemprobeAccelerate(accelerator, log_every_n_steps=4, stage_gc=False)
with probe.train():
    with probe.epoch():
        for step in range(8):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            if accelerator.process_index == 1 and step == SPIKE_STEP:
                t = torch.ones(SPIKE // 4, dtype=torch.float32)
                assert float(t.sum()) == SPIKE // 4
                del t
            probe.step()
own = [(p, i, [d.delta_peaked for d in ds]) for p, i, ds in probe.history]
with open(os.path.join(OUT, f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump({"own": own, "logged": probe.logged, "rank": probe.ranks.rank, "world": probe.ranks.world_size,
               "maxima": len(probe.ranks.history)}, f)
probe.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_accelerate_on_two_cpu_ranks_logs_the_maximum_across_ranks(tmp_path):
    require_module("torch", "torch")
    require_module("accelerate", "accelerate")
    script = tmp_path / "acc_ranks.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE)] + [p for p in [env.get("PYTHONPATH")] if p])
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(script), str(SPIKE), str(SPIKE_STEP), str(tmp_path)]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [(h["rank"], h["world"]) for h in ranks] == [(0, 2), (1, 2)]

    steps = [[ds[0] for p, _, ds in h["own"] if p == "step"] for h in ranks]
    assert steps[1][SPIKE_STEP] >= SPIKE - 8 * MiB
    assert max(steps[0]) < SPIKE // 2, steps[0]

    # Both ranks logged the same maxima: step 4's (the spiky step is its
    # last), step 8's, the epoch, the train stage.
    assert ranks[0]["logged"] == ranks[1]["logged"]
    logged = ranks[0]["logged"]
    assert [step for step, _ in logged] == [4, 8, 8, 8]
    assert ranks[0]["maxima"] == ranks[1]["maxima"] == 4
    at4 = logged[0][1]
    assert at4["memprobe/rss/step_delta_peaked"] >= SPIKE / MiB - 8
    assert at4["memprobe/rss/interval_delta_peaked"] >= SPIKE / MiB - 32
    assert logged[1][1]["memprobe/rss/step_delta_peaked"] < 128
    assert logged[2][1]["memprobe/rss/epoch_delta_peaked"] >= SPIKE / MiB - 32
    assert logged[3][1]["train_mem_cpu_peaked_delta"] >= SPIKE // 2
