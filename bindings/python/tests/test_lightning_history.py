"""The Lightning hooks keep each step's record as the boundary read it and
make its ``Delta`` objects when ``history`` is read: the history must
still hold every ended phase, in the order the phases ended, whenever it
is read, and stay the user's list to clear or replace."""

from __future__ import annotations

from conftest import MiB, spike

from memprobe.integrations.lightning import MemprobeHooks
from memprobe.windows import Delta


class Trainer:
    sanity_checking = False
    log_every_n_steps = 50


def run_steps(hooks: MemprobeHooks, trainer: Trainer, n: int, spike_at: int = -1) -> None:
    for i in range(n):
        hooks.on_train_batch_start(trainer, None, None, i)
        if i == spike_at:
            spike(64 * MiB)
        hooks.on_train_batch_end(trainer, None, None, None, i)


def test_history_read_between_steps_holds_every_phase_in_order(rss):
    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    hooks.on_train_epoch_start(trainer, None)
    run_steps(hooks, trainer, 3, spike_at=1)
    early = hooks.history
    assert [(p, i) for p, i, _ in early] == [("step", 0), ("step", 1), ("step", 2)]
    assert all(isinstance(d, Delta) for _, _, ds in early for d in ds)
    assert early[1][2][0].peak >= early[1][2][0].used_start + 62 * MiB
    run_steps(hooks, trainer, 2)
    hooks.on_train_epoch_end(trainer, None)  # an epoch ends after steps still raw
    hooks.on_train_epoch_start(trainer, None)
    run_steps(hooks, trainer, 1)
    hooks.teardown(trainer, None)
    got = [(p, i) for p, i, _ in hooks.history]
    assert got == [("step", i) for i in range(5)] + [("epoch", 0), ("step", 5)]
    assert hooks.history is early  # one list, grown in place when read
    assert hooks.history[:3] == early[:3]


def test_a_reference_kept_from_before_sees_the_phases_ended_since(rss):
    import copy
    import pickle

    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    hooks.on_train_epoch_start(trainer, None)
    kept = hooks.history
    assert kept == [] and len(kept) == 0 and not kept
    run_steps(hooks, trainer, 3, spike_at=2)
    assert len(kept) == 3 and [(p, i) for p, i, _ in kept] == [("step", 0), ("step", 1), ("step", 2)]
    assert kept[2][2][0].peak >= kept[2][2][0].used_start + 62 * MiB
    run_steps(hooks, trainer, 1)
    assert kept[-1][:2] == ("step", 3) and ("step", 3, kept[-1][2]) in kept
    # Copied or pickled, a plain list of the same records.
    run_steps(hooks, trainer, 1)
    for other in (copy.copy(kept), pickle.loads(pickle.dumps(kept)), list(kept), kept[:]):
        assert type(other) is list and len(other) == 5
        assert [(p, i) for p, i, _ in other] == [("step", i) for i in range(5)]
    assert pickle.loads(pickle.dumps(kept)) == kept
    hooks.teardown(trainer, None)


def test_history_can_be_cleared_or_replaced_and_keep_history_false_keeps_none(rss):
    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    hooks.on_train_epoch_start(trainer, None)
    run_steps(hooks, trainer, 2)
    hooks.history.clear()
    run_steps(hooks, trainer, 1)
    assert [(p, i) for p, i, _ in hooks.history] == [("step", 2)]
    mine: list = []
    hooks.history = mine
    run_steps(hooks, trainer, 1)
    assert hooks.history is mine and [(p, i) for p, i, _ in mine] == [("step", 3)]
    hooks.teardown(trainer, None)

    quiet = MemprobeHooks(rss, keep_history=False)
    quiet.on_train_epoch_start(trainer, None)
    run_steps(quiet, trainer, 3)
    quiet.on_train_epoch_end(trainer, None)
    quiet.teardown(trainer, None)
    assert quiet.history == []


def test_history_read_from_another_thread_during_steps_loses_and_repeats_none(rss):
    import sys
    import threading

    hooks = MemprobeHooks(rss)
    trainer = Trainer()
    hooks.on_train_epoch_start(trainer, None)
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            hooks.history  # noqa: B018 - reading builds the pending records

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    t = threading.Thread(target=reader)
    t.start()
    try:
        run_steps(hooks, trainer, 3000)
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(old)
    hooks.teardown(trainer, None)
    assert [i for p, i, _ in hooks.history if p == "step"] == list(range(3000))
