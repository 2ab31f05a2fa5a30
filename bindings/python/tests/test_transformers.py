"""The Transformers callback in a real Trainer (CPU): a tiny GPT-2 built
from a config (random weights, nothing downloaded) trained on random token
ids, one step holding a known temporary host allocation, with the Trainer's
own memory tracker (``skip_memory_metrics=False``) on side by side."""

from __future__ import annotations

from conftest import MiB, require, require_module

SPIKE = 256 * MiB
SPIKE_STEP = 7  # 0-based optimizer step whose forward allocates it (epoch 1)
STEPS = 12  # 2 epochs of 6
#: The two trackers read the end of a stage a few calls apart (the Trainer
#: before its final log, memprobe in it): a page or two may differ there.
END_SLACK = 1 * MiB


def transformers():
    require_module("torch", "torch")
    tf = require_module("transformers", "transformers")
    require_module("accelerate", "accelerate")
    from transformers.utils import is_torch_available

    require(is_torch_available(), f"transformers {tf.__version__} cannot use this torch (pin transformers in .ci/run)")
    return tf


class TokenIds:
    """A dataset of random token ids (labels = inputs, a language model's task)."""

    def __init__(self, n, length=16, vocab=128, seed=0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=16)
    return GPT2LMHeadModel(cfg)


def spike_in_training_forward(model, at_step):
    """A forward pre-hook allocating, touching and freeing SPIKE on the
    ``at_step``-th training forward (one forward per optimizer step here)."""
    import torch

    calls = {"train": 0}

    def hook(module, args):
        if not module.training:
            return
        if calls["train"] == at_step:
            t = torch.ones(SPIKE // 4, dtype=torch.float32)
            assert float(t.sum()) == SPIKE // 4
            del t
        calls["train"] += 1

    model.register_forward_pre_hook(hook)
    return calls


def test_trainer_step_epoch_and_stage_show_a_spike_beside_the_trainers_own_metrics(tmp_path):
    transformers()
    from transformers import Trainer, TrainingArguments

    from memprobe.integrations.transformers import MemprobeCallback

    cb = MemprobeCallback()
    model = tiny_gpt2()
    calls = spike_in_training_forward(model, SPIKE_STEP)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        logging_steps=4,
        eval_strategy="epoch",
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        skip_memory_metrics=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenIds(24),
        eval_dataset=TokenIds(8, seed=1),
        callbacks=[cb],
    )
    out = trainer.train()
    assert calls["train"] == STEPS
    assert trainer.callback_handler.callbacks[0] is cb

    # Per step: the spike is in its step only.
    steps = [d for phase, _, d in cb.history if phase == "step"]
    assert len(steps) == STEPS
    spiky = steps[SPIKE_STEP][0]
    assert spiky.delta_peaked >= SPIKE - 8 * MiB, spiky
    for i, (d, *_) in enumerate(steps):
        if i != SPIKE_STEP:
            assert d.delta_peaked < SPIKE // 2, (i, d)
    # Its epoch (the second) and the train stage hold it; the first epoch not.
    epochs = [d[0] for phase, _, d in cb.history if phase == "epoch"]
    assert len(epochs) == 2
    assert epochs[1].peak >= spiky.peak and epochs[0].peak < spiky.peak - SPIKE // 2
    (train,) = [d[0] for phase, _, d in cb.history if phase == "train"]
    assert train.peak >= spiky.peak
    assert len([p for p, _, _ in cb.history if p == "eval"]) == 2  # one per epoch

    # The Trainer's logs carry it: the log at step 8 (steps 5-8) has the
    # spiky step as its last step and in its interval, the others not.
    logs = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logs) == [4, 8, 12]
    assert logs[8]["memprobe/rss/step_peak"] >= spiky.peak / MiB - 0.01
    assert logs[8]["memprobe/rss/interval_peak"] >= spiky.peak / MiB - 0.01
    assert logs[4]["memprobe/rss/interval_peak"] < spiky.peak / MiB - 128
    assert logs[12]["memprobe/rss/interval_peak"] < spiky.peak / MiB - 128
    # Each epoch is in the next log: the evaluation at its end.
    eval_logs = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert len(eval_logs) == 2 and all("memprobe/rss/eval_peak" in h for h in eval_logs)
    assert eval_logs[0]["memprobe/rss/epoch_peak"] < spiky.peak / MiB - 128
    assert eval_logs[1]["memprobe/rss/epoch_peak"] >= spiky.peak / MiB - 0.01

    # The final log: memprobe's train stage beside the Trainer's own tracker.
    final = out.metrics
    assert final["memprobe/rss/train_peak"] >= spiky.peak / MiB - 0.01
    ours = final["memprobe/train_mem_cpu_peaked_delta"]
    theirs = final["train_mem_cpu_peaked_delta"]
    assert ours >= SPIKE // 2, final
    assert theirs <= ours + END_SLACK, (theirs, ours)
    assert "memprobe/train_mem_cpu_alloc_delta" in final
    assert "memprobe/init_mem_cpu_alloc_delta" in final and "memprobe/before_init_mem_cpu" in final
    assert cb.stage_metrics["train"]["train_mem_cpu_peaked_delta"] == ours
    assert trainer.state.log_history[-1]["memprobe/train_mem_cpu_peaked_delta"] == ours

    # A standalone evaluation and a prediction: Trainer's eval_ / test_ names.
    metrics = trainer.evaluate()
    assert "memprobe/eval_mem_cpu_peaked_delta" in metrics and "eval_mem_cpu_peaked_delta" in metrics
    assert metrics["eval_mem_cpu_peaked_delta"] <= metrics["memprobe/eval_mem_cpu_peaked_delta"] + END_SLACK
    pred = trainer.predict(TokenIds(4, seed=2))
    assert "memprobe/test_mem_cpu_alloc_delta" in pred.metrics and "memprobe/rss/test_peak" in pred.metrics


def test_trainer_names_alone_and_a_release_schedule(tmp_path):
    """Without the Trainer's tracker, memprobe's values take the Trainer's
    own names; the cache release runs on its schedule."""
    transformers()
    from transformers import Trainer, TrainingArguments

    from memprobe.integrations.transformers import MemprobeCallback

    released = []
    cb = MemprobeCallback(release=lambda: released.append(1), release_every_n_steps=2, release_every_n_epochs=1)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=TokenIds(16), callbacks=[cb])
    out = trainer.train()
    for key in ("train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta", "init_mem_cpu_alloc_delta",
                "init_mem_cpu_peaked_delta", "before_init_mem_cpu"):
        assert key in out.metrics, key
        assert f"memprobe/{key}" not in out.metrics
    assert out.metrics["before_init_mem_cpu"] > 0
    assert len(released) == 2 + 1 == cb.loop.releases
