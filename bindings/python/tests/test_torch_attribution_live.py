"""Attribution on the live path: the torch_fake_cuda caching allocator
(fake_torch_cuda.py) records its history as torch does, and each
integration — the plain tracker, Lightning, Transformers, Accelerate, the
notebook — writes each epoch's peak-step table. In every case the blocks
and the rest sum to the step's exact peak of ``torch_alloc:0`` as the
integration's own history reads it, the top block is the line that
allocated the spike, and snapshots are taken on new epoch peaks only."""

from __future__ import annotations

import inspect
import json
import os
import warnings

import pytest

from conftest import MiB, require_module, tiny_lightning_module
from fake_torch_cuda import FakeCuda

HERE = os.path.abspath(__file__)
SPIKE = 64 * MiB


def line_here() -> int:
    return inspect.currentframe().f_back.f_lineno


def new_peak_steps(step_peaks_by_epoch):
    """Steps that set a new peak of their epoch (the snapshots expected)."""
    n = 0
    for peaks in step_peaks_by_epoch:
        best = -1
        for p in peaks:
            if p > best:
                best, n = p, n + 1
    return n


def read(tmp_path, name):
    path = tmp_path / "attribution" / name
    assert path.stat().st_size <= 256 * 1024
    return json.loads(path.read_text())


def check_sums(record, peak):
    assert record["schema"] == "memprobe.torch_attribution/1" and record["kind"] == "epoch_peak"
    assert record["history"]["complete"] is True
    assert record["peak_bytes"] == peak
    assert sum(b["bytes"] for b in record["blocks"]) + record["rest"]["bytes"] == peak


def train_steps(torch_fake_cuda, epoch, s):
    """One step's work: a transient growing with the step; the spike in
    epoch 1, step 2. Returns the spike's line."""
    tmp = torch_fake_cuda.alloc((s + 1) * MiB)
    line = 0
    if epoch == 1 and s == 2:
        line = line_here() + 1
        big = torch_fake_cuda.alloc(SPIKE)
        torch_fake_cuda.free(addr=big)
    torch_fake_cuda.free(addr=tmp)
    return line


def test_plain_tracker_over_allocator_sources(torch_fake_cuda, tmp_path):
    import memprobe
    from memprobe.integrations.torch import allocator_sources

    weights = torch_fake_cuda.alloc(8 * MiB)
    src = allocator_sources(0, reserved=False, attribution={"top": 2, "max_entries": 5000})
    t = memprobe.Tracker(src)
    assert torch_fake_cuda.history_calls[-1] == {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}
    peaks, spike_line = [], 0
    for e in range(3):
        with t.epoch():
            peaks.append([])
            for s in range(4):
                with t.step() as st:
                    spike_line = train_steps(torch_fake_cuda, e, s) or spike_line
                peaks[-1].append(st.record.deltas[0].peak)
    att = t.attribution
    assert att.snapshots == torch_fake_cuda.snapshots == new_peak_steps(peaks) == 4 + 3 + 4
    t.close()
    src.close()
    assert torch_fake_cuda.history_calls[-1]["enabled"] is None  # turned off again
    assert sorted(os.listdir(tmp_path / "attribution")) == [f"epoch-{e}-rank-0.json" for e in range(3)]

    r = read(tmp_path, "epoch-1-rank-0.json")
    check_sums(r, max(peaks[1]))
    assert r["step"] == 4 + 2 and r["epoch"] == 1 and r["rank"] == 0 and r["device"] == 0
    top = r["blocks"][0]
    assert top["bytes"] == SPIKE and top["frames"][0] == {"file": HERE, "line": spike_line, "function": "train_steps"}
    assert r["blocks"][1]["bytes"] == 8 * MiB and r["rest"] == {"bytes": 3 * MiB, "blocks": 1, "unplaced_bytes": 0}
    assert att.epochs[1] == r and weights
    # Epochs without the spike: the last step's transient on top of the weights.
    r0 = read(tmp_path, "epoch-0-rank-0.json")
    check_sums(r0, 12 * MiB)
    assert [b["bytes"] for b in r0["blocks"]] == [8 * MiB, 4 * MiB] and r0["step"] == 3
    assert len(att.lines) == 3 and "epoch 1 peak 75.0 MiB" in att.lines[1] and f":{spike_line} train_steps" in att.lines[1]


def test_directory_option_and_explicit_tracker_argument(torch_fake_cuda, tmp_path, monkeypatch):
    import memprobe
    from memprobe.integrations.torch import allocator_sources
    from memprobe.integrations.torch_attribution import AttributionOptions

    monkeypatch.delenv("MEMPROBE_ATTRIBUTION_DIR")
    src = allocator_sources(0)
    t = memprobe.Tracker(src, attribution=AttributionOptions(directory=str(tmp_path / "mine"), top=1))
    with t.epoch():
        with t.step():
            torch_fake_cuda.alloc(3 * MiB)
    t.close()
    src.close()
    r = json.loads((tmp_path / "mine" / "epoch-0-rank-0.json").read_text())
    check_sums(r, 3 * MiB)
    assert len(r["blocks"]) == 1 and r["rest"]["blocks"] == 0


def test_a_step_longer_than_the_ring_buffer_is_reported_not_guessed(torch_fake_cuda, tmp_path):
    import memprobe
    from memprobe.integrations.torch import allocator_sources

    src = allocator_sources(0, attribution={"max_entries": 16})
    t = memprobe.Tracker(src)
    with t.epoch():
        with t.step() as st:
            big = torch_fake_cuda.alloc(32 * MiB)
            torch_fake_cuda.free(addr=big)
            for _ in range(20):  # 40 entries: the spike's alloc and free are gone
                torch_fake_cuda.free(addr=torch_fake_cuda.alloc(MiB))
    t.close()
    src.close()
    r = read(tmp_path, "epoch-0-rank-0.json")
    assert st.record.deltas[0].peak == 32 * MiB == r["peak_bytes"]
    assert r["history"]["complete"] is False and r["history"]["lost_entries"] is True
    assert r["blocks"] == [] and r["rest"]["bytes"] is None


def test_a_huge_step_stays_within_256_kib(torch_fake_cuda, tmp_path):
    import memprobe
    from memprobe.integrations.torch import allocator_sources

    deep = [{"filename": f"/srv/project/{'pkg/' * 40}layer{i}.py", "line": i, "name": "forward" * 10} for i in range(30)]
    src = allocator_sources(0, attribution={"top": 100000, "max_entries": 100000})
    t = memprobe.Tracker(src)
    with t.epoch():
        with t.step() as st:
            for i in range(6000):
                torch_fake_cuda.alloc(512 * (1 + i % 7), frames=deep)
    t.close()
    src.close()
    r = read(tmp_path, "epoch-0-rank-0.json")
    assert r["truncated"] is True
    check_sums(r, st.record.deltas[0].peak)
    assert r["rest"]["blocks"] + len(r["blocks"]) == 6000


def test_without_allocator_sources_it_says_so(torch_fake_cuda):
    import memprobe
    from memprobe.integrations.torch_attribution import AttributionWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = memprobe.Tracker(torch_sources=False, attribution=True)
    assert t.attribution is None and any(issubclass(w.category, AttributionWarning) for w in caught)
    assert torch_fake_cuda.history_calls == []
    t.close()


def test_a_failure_at_every_step_keeps_few_exceptions_and_counts_them(torch_fake_cuda, tmp_path, monkeypatch):
    import torch

    import memprobe
    from memprobe.integrations.torch import allocator_sources
    from memprobe.integrations.torch_attribution import AttributionWarning
    from memprobe.integrations.torch_attribution.engine import MAX_ERRORS

    def broken():
        raise RuntimeError("snapshot failed")

    src = allocator_sources(0, reserved=False, attribution=True)
    t = memprobe.Tracker(src)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", broken)
    steps = MAX_ERRORS * 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in range(steps):
            with t.step():
                torch_fake_cuda.free(addr=torch_fake_cuda.alloc((s + 1) * MiB))
    att = t.attribution
    # Every step set a new peak and failed: each counted, few kept, one warning.
    assert att.failures == steps
    assert len(att.errors) == MAX_ERRORS and all(str(e) == "snapshot failed" for e in att.errors)
    assert sum(issubclass(w.category, AttributionWarning) for w in caught) == 1
    t.close()
    src.close()


def test_oom_table_and_the_report_that_names_it(torch_fake_cuda, tmp_path):
    import torch

    import memprobe
    from memprobe.integrations.torch import allocator_sources, report_oom

    src = allocator_sources(0, attribution=True)
    t = memprobe.Tracker(src)
    report = tmp_path / "oom.json"
    report_oom(t, path=str(report))
    held = torch_fake_cuda.alloc(3 << 30)
    pending = torch_fake_cuda.alloc(MiB)
    torch_fake_cuda.free(addr=pending, pending=True)  # freed, a stream still on it: not allocated
    with t.epoch():
        with t.step():
            with pytest.raises(torch.cuda.OutOfMemoryError):
                torch_fake_cuda.oom(20 << 30)
    r = read(tmp_path, "oom-0-rank-0.json")
    assert r["kind"] == "oom" and r["requested_bytes"] == 20 << 30
    assert r["peak_bytes"] == 3 << 30 == sum(b["bytes"] for b in r["blocks"]) + r["rest"]["bytes"]
    assert [b["address"] for b in r["blocks"]] == [held]
    segs = {s["address"]: s for s in r["segments"]}
    assert segs[held]["bytes"] == 3 << 30 and segs[held]["allocated"] == 3 << 30
    assert segs[pending]["allocated"] == 0 and segs[pending]["bytes"] == 2 * MiB
    text = report.read_text()
    assert str(tmp_path / "attribution" / "oom-0-rank-0.json") in text
    t.close()
    src.close()


def test_an_oom_record_that_cannot_be_written_names_no_earlier_file(torch_fake_cuda, tmp_path, monkeypatch):
    import memprobe
    from memprobe.integrations.torch import allocator_sources
    from memprobe.integrations.torch_attribution import record as rec_mod

    src = allocator_sources(0, reserved=False, attribution=True)
    t = memprobe.Tracker(src)
    with t.epoch():
        with t.step():
            torch_fake_cuda.free(addr=torch_fake_cuda.alloc(MiB))
    att = t.attribution
    assert [os.path.basename(f) for f in att.files] == ["epoch-0-rank-0.json"]

    def full(record, path):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(rec_mod, "write", full)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert att.on_oom(0, 1 << 30) is None
    assert len(att.files) == 1 and att.failures == 1 and isinstance(att.errors[0], OSError)
    t.close()
    src.close()


def test_lightning_callback(torch_fake_cuda, tmp_path):
    pl = require_module("lightning.pytorch", "lightning")
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    Tiny = tiny_lightning_module(validation=False)
    where = {}

    class Spiky(Tiny):
        def training_step(self, batch, batch_idx):
            tmp = torch_fake_cuda.alloc((batch_idx + 1) * MiB)
            if self.current_epoch == 1 and batch_idx == 2:
                where["line"] = line_here() + 1
                big = torch_fake_cuda.alloc(SPIKE)
                torch_fake_cuda.free(addr=big)
            torch_fake_cuda.free(addr=tmp)
            return super().training_step(batch, batch_idx)

    cb = MemprobeCallback(attribution={"top": 3})
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
    trainer = pl.Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(Spiky(), data)
    step_peaks = [d for phase, _, d in cb.history if phase == "step"]
    att = cb.attribution
    assert att is not None and sorted(att.epochs) == [0, 1]
    alloc = att.devices[0]
    peaks = [[d[alloc].peak for d in step_peaks[e * 4:(e + 1) * 4]] for e in range(2)]
    assert att.snapshots == new_peak_steps(peaks)
    r = read(tmp_path, "epoch-1-rank-0.json")
    check_sums(r, max(peaks[1]))
    assert r["step"] == 6 and r["blocks"][0]["bytes"] == SPIKE
    assert r["blocks"][0]["frames"][0] == {"file": HERE, "line": where["line"], "function": "training_step"}


def test_accelerate_probe(torch_fake_cuda, tmp_path, monkeypatch):
    require_module("accelerate", "accelerate")
    from memprobe.integrations.accelerate import MemprobeAccelerate

    class Accelerator:  # what the probe reads of one: where its project logs, and log()
        logging_dir = None
        project_dir = str(tmp_path / "project")

        def log(self, values, step=None):
            pass

    monkeypatch.delenv("MEMPROBE_ATTRIBUTION_DIR")  # beside the project's logs then
    probe = MemprobeAccelerate(Accelerator(), attribution=True)
    spike_line = 0
    with probe.train():
        for e in range(2):
            with probe.epoch():
                for s in range(4):
                    spike_line = train_steps(torch_fake_cuda, e, s) or spike_line
                    probe.step()
    att = probe.attribution
    probe.close()
    steps = [d for phase, _, d in probe.history if phase == "step"]
    alloc = att.devices[0]
    peaks = [[d[alloc].peak for d in steps[e * 4:(e + 1) * 4]] for e in range(2)]
    assert att.snapshots == new_peak_steps(peaks)
    r = json.loads((tmp_path / "project" / "memprobe-attribution" / "epoch-1-rank-0.json").read_text())
    check_sums(r, max(peaks[1]))
    assert r["blocks"][0]["frames"][0]["line"] == spike_line


def test_transformers_callback(torch_fake_cuda, tmp_path, monkeypatch):
    tf = require_module("transformers", "transformers")
    require_module("accelerate", "accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import torch

    from memprobe.integrations.transformers import MemprobeCallback

    assert tf
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=16))
    calls = {"n": 0}
    where = {}

    def hook(module, args):
        if not module.training:
            return
        tmp = torch_fake_cuda.alloc((calls["n"] % 3 + 1) * MiB)
        if calls["n"] == 4:  # epoch 1's second step
            where["line"] = line_here() + 1
            big = torch_fake_cuda.alloc(SPIKE)
            torch_fake_cuda.free(addr=big)
        torch_fake_cuda.free(addr=tmp)
        calls["n"] += 1

    model.register_forward_pre_hook(hook)
    ids = torch.randint(0, 128, (12, 16), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    cb = MemprobeCallback(attribution=True)
    monkeypatch.delenv("MEMPROBE_ATTRIBUTION_DIR")  # beside the Trainer's output then
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=4,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=100,
                             # AdamW asks CUDA about graph capture, which the torch_fake_cuda's "initialised" misleads.
                             optim="sgd")
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    assert calls["n"] == 6
    att = cb.attribution
    steps = [d for phase, _, d in cb.history if phase == "step"]
    alloc = att.devices[0]
    peaks = [[d[alloc].peak for d in steps[e * 3:(e + 1) * 3]] for e in range(2)]
    assert att.snapshots == new_peak_steps(peaks)
    assert att.files == [str(tmp_path / "out" / "memprobe-attribution" / f"epoch-{e}-rank-0.json") for e in (0, 1)]
    r = json.loads((tmp_path / "out" / "memprobe-attribution" / "epoch-1-rank-0.json").read_text())
    check_sums(r, max(peaks[1]))
    assert r["step"] == 4 and r["blocks"][0]["bytes"] == SPIKE
    assert r["blocks"][0]["frames"][0] == {"file": HERE, "line": where["line"], "function": "hook"}


def test_module_timeline_names_backward_on_a_cpu_model():
    torch = require_module("torch", "torch")
    from memprobe.integrations.torch_attribution.modules import ModuleTimeline

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    timeline = ModuleTimeline()
    timeline.install(torch)
    try:
        model(torch.randn(2, 4)).sum().backward()
    finally:
        timeline.close()
    names = [n for _, n in timeline.events]
    # Backward runs from the output: the last layer's node first.
    assert names[0] == "Sequential.2" and "Sequential.0" in names and names.index("Sequential.0") > 0
    before = len(timeline.events)
    model(torch.randn(2, 4)).sum().backward()  # hooks removed: nothing more
    assert len(timeline.events) == before


def test_notebook_a_table_per_cell(tmp_path, monkeypatch, capsys):
    require_module("IPython", "ipython")
    from test_notebook import run

    monkeypatch.setenv("MEMPROBE_ATTRIBUTION_DIR", str(tmp_path / "attribution"))
    from memprobe.notebook import current

    torch_fake_cuda = FakeCuda(devices=1)
    torch_fake_cuda.install(monkeypatch)
    import builtins

    monkeypatch.setattr(builtins, "fake_cuda", torch_fake_cuda, raising=False)
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    sh = InteractiveShell.instance(config=config)
    try:
        run(sh, capsys, "%load_ext memprobe")
        current(sh).set_attribution({"top": 1})
        run(sh, capsys, "w = fake_cuda.alloc(2 << 20)")
        run(sh, capsys, "t = fake_cuda.alloc(16 << 20)\nfake_cuda.free(addr=t)")
        att = current(sh).attribution
        assert att.cell_phase == "cell" and att.snapshots == 2
    finally:
        sh.run_cell("%unload_ext memprobe")
        InteractiveShell.clear_instance()
    r = read(tmp_path, "epoch-1-rank-0.json")
    check_sums(r, 18 << 20)
    assert r["stage"] == "cell" and r["blocks"][0]["bytes"] == 16 << 20
    assert r["blocks"][0]["frames"][0]["line"] == 1 and r["rest"] == {"bytes": 2 << 20, "blocks": 1, "unplaced_bytes": 0}


def test_a_frameless_backward_block_is_named_by_its_module(torch_fake_cuda, tmp_path):
    import torch

    import memprobe
    from memprobe.integrations.torch import allocator_sources

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    src = allocator_sources(0, attribution=True)
    t = memprobe.Tracker(src)
    with t.epoch():
        with t.step():
            def during_backward(grad_inputs, grad_outputs):
                # As autograd's C++ thread allocates inside a node: no
                # Python frame at all.
                torch_fake_cuda.free(addr=torch_fake_cuda.alloc(32 * MiB, frames=[]))

            def first_layer_output(module, inputs, output):
                # Hooked after memprobe's own hook on the node: runs once
                # the backward of the first layer has begun.
                output.grad_fn.register_hook(during_backward)

            model[0].register_forward_hook(first_layer_output)
            out = model(torch.randn(2, 4, requires_grad=True))
            out.sum().backward()
    t.close()
    src.close()
    r = read(tmp_path, "epoch-0-rank-0.json")
    check_sums(r, 32 * MiB)
    (block,) = r["blocks"]
    assert block["frames"] == [] and block["module"] == "Sequential.0"


def test_two_devices_the_highest_peak_takes_the_plain_name(monkeypatch, tmp_path):
    require_module("torch", "torch")
    import memprobe
    from memprobe.integrations.torch import allocator_sources

    torch_fake_cuda = FakeCuda(devices=2)
    torch_fake_cuda.install(monkeypatch)
    monkeypatch.setenv("MEMPROBE_ATTRIBUTION_DIR", str(tmp_path / "attribution"))
    src = allocator_sources(None, reserved=False, attribution=True)
    t = memprobe.Tracker(src)
    with t.epoch():
        with t.step():
            torch_fake_cuda.alloc(4 * MiB, device=0)
            torch_fake_cuda.alloc(16 * MiB, device=1)
    att = t.attribution
    t.close()
    src.close()
    assert att.snapshots == 1  # one snapshot covers both devices
    assert sorted(os.listdir(tmp_path / "attribution")) == ["epoch-0-rank-0-device-0.json", "epoch-0-rank-0.json"]
    main, other = read(tmp_path, "epoch-0-rank-0.json"), read(tmp_path, "epoch-0-rank-0-device-0.json")
    assert (main["device"], other["device"]) == (1, 0) and att.epochs[0] == main
    check_sums(main, 16 * MiB)
    check_sums(other, 4 * MiB)
