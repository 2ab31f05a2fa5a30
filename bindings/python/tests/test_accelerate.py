"""The Accelerate loop helper in a real Accelerate loop (CPU): a tiny GPT-2
built from a config, trained on random token ids through
``accelerator.prepare``, one step holding a known temporary host allocation,
logged to a tracker of ``accelerator.init_trackers``; transformers' own
``TrainerMemoryTracker`` measuring the same stage side by side."""

from __future__ import annotations

from conftest import MiB, require, require_module

from test_transformers import SPIKE, TokenIds, spike_in_training_forward, tiny_gpt2

SPIKE_STEP = 7
END_SLACK = 1 * MiB


def accelerate():
    require_module("torch", "torch")
    acc = require_module("accelerate", "accelerate")
    tf = require_module("transformers", "transformers")
    from transformers.utils import is_torch_available

    require(is_torch_available(), f"transformers {tf.__version__} cannot use this torch (pin transformers in .ci/run)")
    return acc


def recording_tracker():
    from accelerate.tracking import GeneralTracker

    class Recording(GeneralTracker):
        name = "recording"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.rows = []

        @property
        def tracker(self):
            return self.rows

        def store_init_configuration(self, values):
            pass

        def log(self, values, step=None, **kwargs):
            self.rows.append((step, dict(values)))

    return Recording()


def test_accelerate_loop_step_epoch_and_stage_show_a_spike_and_release_on_schedule():
    accelerate()
    import torch
    from accelerate import Accelerator
    from transformers.trainer_utils import TrainerMemoryTracker

    from memprobe.integrations.accelerate import MemprobeAccelerate

    rec = recording_tracker()
    accelerator = Accelerator(cpu=True, log_with=[rec])
    accelerator.init_trackers("memprobe")
    model = tiny_gpt2()
    calls = spike_in_training_forward(model, SPIKE_STEP)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(TokenIds(24), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # The default release: Accelerate's clear_device_cache, every 5th step and every epoch.
    probe = MemprobeAccelerate(accelerator, log_every_n_steps=4, release_every_n_steps=5, release_every_n_epochs=1)
    theirs = TrainerMemoryTracker(skip_memory_metrics=False)
    theirs.init_reported = True  # no Trainer.__init__ here: train is its only stage
    trainer_metrics = {}

    def train():  # the name TrainerMemoryTracker derives its stage from
        theirs.start()
        with probe.train():
            for _epoch in range(2):
                with probe.epoch():
                    model.train()
                    for batch in loader:
                        loss = model(**batch).loss
                        accelerator.backward(loss)
                        optimizer.step()
                        optimizer.zero_grad()
                        probe.step()
                with probe.evaluation():
                    model.eval()
                    with torch.no_grad():
                        model(**next(iter(loader)))
        theirs.stop_and_update_metrics(trainer_metrics)

    train()
    assert calls["train"] == 12
    assert probe.loop.releases == 2 + 2

    steps = [d for phase, _, d in probe.history if phase == "step"]
    assert len(steps) == 12
    spiky = steps[SPIKE_STEP][0]
    assert spiky.delta_peaked >= SPIKE - 8 * MiB, spiky
    for i, (d, *_) in enumerate(steps):
        if i != SPIKE_STEP:
            assert d.delta_peaked < SPIKE // 2, (i, d)
    epochs = [d[0] for phase, _, d in probe.history if phase == "epoch"]
    assert epochs[1].peak >= spiky.peak and epochs[0].peak < spiky.peak - SPIKE // 2
    (stage,) = [d[0] for phase, _, d in probe.history if phase == "train"]
    assert stage.peak >= spiky.peak

    # The tracker got the step logs (every 4th step), the epochs, the
    # evaluations and the train stage under the Trainer's names.
    rows = dict((step, v) for step, v in rec.rows if "memprobe/rss/step_peak" in v)
    assert sorted(rows) == [4, 8, 12]
    assert rows[8]["memprobe/rss/step_peak"] >= spiky.peak / MiB - 0.01
    assert rows[8]["memprobe/rss/interval_peak"] >= spiky.peak / MiB - 0.01
    assert rows[4]["memprobe/rss/interval_peak"] < spiky.peak / MiB - 128
    epoch_rows = [v for _, v in rec.rows if "memprobe/rss/epoch_peak" in v]
    assert len(epoch_rows) == 2 and epoch_rows[1]["memprobe/rss/epoch_peak"] >= spiky.peak / MiB - 0.01
    assert len([v for _, v in rec.rows if "memprobe/rss/eval_peak" in v]) == 2
    (final,) = [v for _, v in rec.rows if "train_mem_cpu_peaked_delta" in v]
    assert final["memprobe/rss/train_peak"] >= spiky.peak / MiB - 0.01
    assert final["train_mem_cpu_peaked_delta"] >= SPIKE // 2
    assert "init_mem_cpu_alloc_delta" in final and "before_init_mem_cpu" in final
    assert probe.logged[-1][1] == final

    # transformers' own tracker, over the same stage: never above memprobe.
    assert trainer_metrics["train_mem_cpu_peaked_delta"] <= final["train_mem_cpu_peaked_delta"] + END_SLACK, (
        trainer_metrics,
        final,
    )
    accelerator.end_training()
    probe.close()
