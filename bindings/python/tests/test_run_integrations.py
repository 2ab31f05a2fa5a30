"""Every Python integration under ``memprobe run``: the Lightning callback
at its defaults, the Transformers callback, Accelerate under torchrun (two
gloo ranks on CPU) and ``%load_ext memprobe`` in a script run through
IPython. Each keeps its phases in the core tracker, so every epoch,
evaluation and step it ended reaches the run channel: the child writes
what the integration itself recorded, and the run's summary (its phases
line) and JSON (``phases``, ``phase_channel``) must hold the same, ranks
named.

The ``memprobe`` command is found as in test_run_phases.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Tuple

from conftest import SITE, require, require_module
from test_run_phases import memprobe_cli
from test_run_ranks import LAUNCHER_VARS

HERE = Path(__file__).resolve().parent


def run(tmp_path: Path, argv: List[str], *, stdin: Any = None, timeout: int = 600) -> Tuple[Any, Dict[str, Any]]:
    """``memprobe run --json ... -- argv``: the finished process and the JSON."""
    cli = memprobe_cli()
    require(cli is not None, "no memprobe command: cargo build -p memprobe-cli, or set MEMPROBE_CLI")
    assert cli is not None
    out_json = tmp_path / "run.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(HERE), env.get("PYTHONPATH", "")])
    env.pop("MEMPROBE_RUN_CHANNEL", None)
    for v in LAUNCHER_VARS:
        env.pop(v, None)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", TOKENIZERS_PARALLELISM="false")
    r = subprocess.run(
        [str(cli), "run", "--no-live", "--interval", "20ms", "--json", str(out_json), "--", *argv],
        env=env, capture_output=True, text=True, timeout=timeout, stdin=stdin, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r, json.loads(out_json.read_text())


def phases_line(summary: str) -> str:
    lines = [l for l in summary.splitlines() if l.strip().startswith("phases ")]
    assert len(lines) == 1, summary
    return lines[0]


def kinds(doc: Dict[str, Any], pid: Any = None) -> Counter:
    return Counter(
        (p["kind"], p["name"]) for p in doc["phases"] if pid is None or p["pid"] == pid
    )


def check_arrived(doc: Dict[str, Any], summary: str, epochs: int, custom: Dict[str, int], steps: int) -> None:
    """The run received what the integration ended: ``epochs`` epochs,
    ``custom`` custom phases by name, ``steps`` steps, nothing lost."""
    chan = doc["phase_channel"]
    assert chan["received"] > 0 and chan["dropped"] == 0 and chan["garbled"] == 0, chan
    assert chan["steps"] == steps, chan
    got = kinds(doc)
    assert got[("epoch", "epoch")] == epochs, got
    for name, n in custom.items():
        assert got[("custom", name)] == n, (name, got)
    assert all(p["ended"] for p in doc["phases"]), doc["phases"]
    n_custom = sum(custom.values())
    want = f"{epochs} epochs, {n_custom} custom phase{'s' if n_custom != 1 else ''}, {steps} steps from "
    assert want in phases_line(summary), phases_line(summary)


LIGHTNING = r'''
import json, sys, torch
from conftest import tiny_lightning_module, lightning
pl = lightning()
from memprobe.integrations.lightning import MemprobeCallback

Tiny = tiny_lightning_module()
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 4)), batch_size=4)
cb = MemprobeCallback()
trainer = pl.Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                     accelerator="cpu", default_root_dir=".")
trainer.fit(Tiny(), data, data)
json.dump([p for p, _, _ in cb.history], open("history.json", "w"))
print("trained")
'''


def test_lightning_callback_at_its_defaults_sends_every_epoch_validation_and_step(tmp_path):
    require_module("torch", "torch")
    (tmp_path / "train.py").write_text(LIGHTNING)
    r, doc = run(tmp_path, [sys.executable, "train.py"])
    assert "trained" in r.stdout, r.stdout + r.stderr
    history = Counter(json.loads((tmp_path / "history.json").read_text()))
    assert history["step"] == 12 and history["epoch"] == 2 and history["validation"] == 2, history
    check_arrived(doc, r.stderr, 2, {"validation": history["validation"]}, history["step"])
    # Steps are inside their epoch: 6 each.
    epochs = [p for p in doc["phases"] if p["kind"] == "epoch"]
    assert [p["steps"]["count"] for p in epochs] == [6, 6], epochs


TRANSFORMERS = r'''
import json, torch
from test_transformers import TokenIds, tiny_gpt2
from transformers import Trainer, TrainingArguments
from memprobe.integrations.transformers import MemprobeCallback

cb = MemprobeCallback()
args = TrainingArguments(output_dir="out", num_train_epochs=2, per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, logging_steps=4, eval_strategy="epoch",
                         save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                         dataloader_num_workers=0)
trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenIds(24),
                  eval_dataset=TokenIds(8, seed=1), callbacks=[cb])
trainer.train()
json.dump([p for p, _, _ in cb.history], open("history.json", "w"))
print("trained")
'''


def test_transformers_callback_sends_every_epoch_evaluation_stage_and_step(tmp_path):
    require_module("torch", "torch")
    require_module("transformers", "transformers")
    require_module("accelerate", "accelerate")
    (tmp_path / "train.py").write_text(TRANSFORMERS)
    r, doc = run(tmp_path, [sys.executable, "train.py"])
    assert "trained" in r.stdout, r.stdout + r.stderr
    history = Counter(json.loads((tmp_path / "history.json").read_text()))
    assert history["step"] == 12 and history["epoch"] == 2 and history["eval"] == 2, history
    check_arrived(doc, r.stderr, 2, {"eval": 2, "train": 1}, 12)
    # The epochs and evaluations are inside the train stage.
    (train,) = [i for i, p in enumerate(doc["phases"]) if p["name"] == "train"]
    inner = [p for p in doc["phases"] if p["kind"] == "epoch" or p["name"] == "eval"]
    assert all(p["parent"] == train for p in inner), inner


ACCELERATE = r'''
import json, os, torch
from accelerate import Accelerator
from memprobe.integrations.accelerate import MemprobeAccelerate

acc = Accelerator(cpu=True)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 8)), batch_size=4)
model, opt, data = acc.prepare(model, opt, data)
probe = MemprobeAccelerate(acc, log_every_n_steps=2)
with probe.train():
    for epoch in range(2):
        with probe.epoch():
            for (x,) in data:
                loss = model(x).pow(2).mean()
                acc.backward(loss)
                opt.step(); opt.zero_grad()
                probe.step()
        with probe.evaluation():
            with torch.no_grad():
                for (x,) in data:
                    model(x)
rank = acc.process_index
json.dump([p for p, _, _ in probe.history], open(f"history{rank}.json", "w"))
probe.close()
acc.wait_for_everyone()
print(f"rank {rank} of {acc.num_processes} trained")
'''


def test_accelerate_under_torchrun_sends_every_rank_s_phases_named_by_rank(tmp_path):
    torch = require_module("torch", "torch")
    require_module("accelerate", "accelerate")
    require(torch.distributed.is_available(), "this torch has no torch.distributed")
    (tmp_path / "train.py").write_text(ACCELERATE)
    r, doc = run(
        tmp_path,
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py"],
    )
    assert "rank 0 of 2 trained" in r.stdout and "rank 1 of 2 trained" in r.stdout, r.stdout + r.stderr
    histories = [Counter(json.loads((tmp_path / f"history{i}.json").read_text())) for i in (0, 1)]
    # 32 samples over 2 ranks in batches of 4: 4 steps per epoch each.
    for h in histories:
        assert h["step"] == 8 and h["epoch"] == 2 and h["eval"] == 2 and h["train"] == 1, h
    check_arrived(doc, r.stderr, 4, {"eval": 4, "train": 2}, 16)
    chan = doc["phase_channel"]
    ranks = {s["rank"]: s for s in chan["ranks"]}
    assert sorted(ranks) == [0, 1], chan["ranks"]
    for rank, s in ranks.items():
        assert (s["local_rank"], s["world_size"]) == (rank, 2), s
        mine = kinds(doc, s["pid"])
        assert mine[("epoch", "epoch")] == 2 and mine[("custom", "eval")] == 2, (rank, mine)
        assert all(p["rank"] == rank for p in doc["phases"] if p["pid"] == s["pid"])
    assert "(rank 0)" in phases_line(r.stderr) and "(rank 1)" in phases_line(r.stderr)


NOTEBOOK = """%load_ext memprobe
import memprobe.notebook as nb
x = bytearray(64 << 20)
del x
y = 1
import json; json.dump(len(nb.current().history), open("cells.json", "w"))
"""


def test_load_ext_in_a_script_run_through_ipython_sends_every_cell(tmp_path):
    ipython = Path(sys.executable).with_name("ipython")
    require(ipython.is_file(), f"no IPython beside {sys.executable}")
    script = tmp_path / "cells.ipy"
    script.write_text(NOTEBOOK)
    with open(script) as stdin:
        r, doc = run(
            tmp_path,
            [str(ipython), "--simple-prompt", "--no-banner", "--no-confirm-exit",
             "--HistoryManager.enabled=False", "--colors=NoColor"],
            stdin=stdin,
        )
    assert "RAM: △Consumed △Peaked Used Total" in r.stdout, r.stdout + r.stderr
    # The cells measured before the one that wrote the count, and that one.
    measured = json.loads((tmp_path / "cells.json").read_text()) + 1
    assert measured == 5, measured
    chan = doc["phase_channel"]
    assert chan["received"] > 0 and chan["dropped"] == 0, chan
    got = kinds(doc)
    assert got[("custom", "cell")] == measured, got
    assert [p["label"] for p in doc["phases"]] == [f"cell {i}" for i in range(measured)]
    assert f"{measured} custom phases from " in phases_line(r.stderr), phases_line(r.stderr)
    # The cell that held 64 MiB shows it.
    big = doc["phases"][1]
    assert big["sources"][0]["peak_bytes"] - big["sources"][0]["used_start_bytes"] >= 60 << 20, big
