"""The Lightning hooks keep each step's record as the library's bytes
(appended to the history's steps, or kept apart until the next log when
the history is off) and end a step that runs on its tail by one library
call made ready once: the history, the logged values and the highest peak
between logs must be what they are when every step goes the general way,
whatever the history's switch, the sources or the readers do."""

from __future__ import annotations

import sys
import threading

from conftest import MiB, spike

from memprobe.integrations._history import History
from memprobe.integrations.lightning import MemprobeHooks
from memprobe.windows import deltas_of


class Trainer:
    sanity_checking = False


class Module:
    """Logs through log_dict (no trainer loggers): the step metrics land here."""

    def __init__(self) -> None:
        self.logged: list = []

    def log_dict(self, metrics, **kw) -> None:
        if kw["on_step"]:
            self.logged.append(dict(metrics))


def steps(hooks: MemprobeHooks):
    return [(i, d[0]) for p, i, d in hooks.history if p == "step"]


def run(hooks: MemprobeHooks, module, first: int, n: int, spike_at=()) -> None:
    trainer = Trainer()
    for i in range(first, first + n):
        hooks.on_train_batch_start(trainer, module, None, i)
        if i in spike_at:
            spike(48 * MiB)
        hooks.on_train_batch_end(trainer, module, None, None, i)


def test_steps_left_out_of_the_history_still_count_in_the_highest_peak_between_logs(rss):
    hooks = MemprobeHooks(rss, log_every_n_steps=4)
    module = Module()
    hooks.on_train_epoch_start(Trainer(), module)
    run(hooks, module, 0, 2)
    hooks.keep_history = False
    run(hooks, module, 2, 3, spike_at={3})  # step 3's spike, not kept, logged at step 3
    hooks.keep_history = True
    run(hooks, module, 5, 3, spike_at={5})  # step 5's spike, kept, logged at step 7
    hooks.keep_history = False
    hooks.keep_history = True  # off and on with no step between: nothing lost or repeated
    run(hooks, module, 8, 4)
    hooks.on_train_epoch_end(Trainer(), module)
    hooks.teardown(Trainer(), module)
    kept = steps(hooks)
    assert [i for i, _ in kept] == [0, 1, 5, 6, 7, 8, 9, 10, 11]
    by_index = dict(kept)
    assert by_index[5].peak >= by_index[5].used_start + 46 * MiB
    # The phases after the steps, in order.
    assert [(p, i) for p, i, _ in hooks.history][-1] == ("epoch", 0)
    assert len(module.logged) == 3  # steps 3, 7 and 11
    assert [m["memprobe/rss/step_peak"] for m in module.logged[1:]] == [by_index[7].peak / MiB, by_index[11].peak / MiB]
    first, second, third = (m["memprobe/rss/steps_peak"] for m in module.logged)
    # Step 3 (not kept, logged) made the first interval's highest peak, 48
    # MiB above the kept steps 0 and 1.
    assert first == module.logged[0]["memprobe/rss/step_peak"]
    assert first >= max(by_index[0].peak, by_index[1].peak) / MiB + 40
    assert second == max(by_index[i].peak for i in (5, 6, 7)) / MiB
    assert third == max(by_index[i].peak for i in (8, 9, 10, 11)) / MiB


def test_a_step_the_library_refuses_on_its_tail_ends_the_general_way(rss):
    hooks = MemprobeHooks(rss)
    module = None
    hooks.on_train_epoch_start(Trainer(), module)
    run(hooks, module, 0, 2)
    fn, args, out, tracker, pin = hooks._tail  # type: ignore[misc]
    calls = []

    def refusing(*a):
        calls.append(a)
        return 7  # any failure: nothing changed in the library

    hooks._tail = (refusing, args, out, tracker, pin)
    run(hooks, module, 2, 2, spike_at={3})
    hooks.on_train_epoch_end(Trainer(), module)
    hooks.teardown(Trainer(), module)
    assert len(calls) == 2
    got = steps(hooks)
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert got[3][1].peak >= got[3][1].used_start + 46 * MiB
    for (_, a), (_, b) in zip(got, got[1:]):
        assert b.used_start == a.used_end  # still back to back


def test_a_sink_writing_to_the_standard_streams_sees_them_flushed_before_each_step(rss):
    hooks = MemprobeHooks(rss)
    hooks.on_train_epoch_start(Trainer(), None)
    hooks.tracker.add_table_sink()
    flushed = []

    class Counting:
        def __init__(self, stream):
            self.stream = stream

        def write(self, s):
            return self.stream.write(s)

        def flush(self):
            flushed.append(1)
            self.stream.flush()

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Counting(out), Counting(err)
    try:
        run(hooks, None, 0, 3)
        assert len(flushed) == 6  # stdout and stderr at each of the 3 steps
    finally:
        sys.stdout, sys.stderr = out, err
    hooks.teardown(Trainer(), None)


def test_other_sources_in_a_later_fit_keep_both_fits_steps_readable(rss):
    import memprobe

    tree = memprobe.Source.process_tree()
    try:
        hooks = MemprobeHooks(rss, log_every_n_steps=3)
        module = Module()
        hooks.on_train_epoch_start(Trainer(), module)
        run(hooks, module, 0, 2)
        hooks.teardown(Trainer(), module)
        hooks._sources = [rss, tree]  # the next fit measures two sources
        hooks.on_train_epoch_start(Trainer(), module)
        run(hooks, module, 2, 2, spike_at={3})
        hooks.teardown(Trainer(), module)
        got = steps(hooks)
        assert [i for i, _ in got] == [0, 1, 2, 3]
        assert [len(d) for p, _, d in hooks.history if p == "step"] == [1, 1, 2, 2]
        # The log at step 2 (index 2: the third ended) covers the new fit's steps alone.
        (log,) = module.logged
        assert set(k for k in log if k.endswith("steps_peak")) == {"memprobe/rss/steps_peak", "memprobe/tree/steps_peak"}
        assert log["memprobe/rss/steps_peak"] == got[2][1].peak / MiB
    finally:
        tree.close()


def test_logs_drop_what_a_reader_took_and_a_reader_thread_loses_and_repeats_none(rss):
    hooks = MemprobeHooks(rss, log_every_n_steps=7)
    module = Module()
    hooks.on_train_epoch_start(Trainer(), module)
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            hooks.history  # noqa: B018 - reading takes the step records in

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=reader)
    t.start()
    try:
        for epoch in range(3):
            run(hooks, module, epoch * 700, 700)
            hooks.on_train_epoch_end(Trainer(), module)
            hooks.on_train_epoch_start(Trainer(), module)
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(old)
    hooks.history  # noqa: B018
    # Read up to here: the next log drops them, so the bytes kept stay small.
    run(hooks, module, 2100, 7)
    assert len(hooks._history.steps) < 7 * 56 + 1
    hooks.on_train_epoch_end(Trainer(), module)
    hooks.teardown(Trainer(), module)
    got = [(p, i) for p, i, _ in hooks.history]
    want = []
    for epoch in range(3):
        want += [("step", i) for i in range(epoch * 700, epoch * 700 + 700)] + [("epoch", epoch)]
    want += [("step", i) for i in range(2100, 2107)] + [("epoch", 3)]
    assert got == want
    assert len(module.logged) == 2107 // 7


def test_history_reads_step_records_in_order_with_the_phases_between_them():
    import struct

    record = struct.Struct("=QQQqQII")

    def rec(peak: int) -> bytes:
        return record.pack(10, 20, peak, 10, peak - 20, 0, 0)

    h = History()
    h.steps_begin("step", 5, record.size, record.unpack_from)
    h.steps += rec(100)
    h.steps += rec(200)
    h.add_raw("epoch", 0, record.unpack(rec(300)))
    h.steps += rec(400)
    assert [(p, i, d[0].peak) for p, i, d in h.records()] == [("step", 5, 100), ("step", 6, 200), ("epoch", 0, 300), ("step", 7, 400)]
    h.trim()  # everything was read: the bytes go, the history stays
    assert len(h.steps) == 0
    h.steps += rec(500)
    h.add("validation", 0, deltas_of(record.unpack(rec(600))))
    h.steps_begin("step", 20, record.size, record.unpack_from)  # steps left out
    h.steps += rec(700)
    h.trim()  # nothing read since: nothing dropped
    assert len(h.steps) == 2 * record.size
    assert [(p, i, d[0].peak) for p, i, d in h.records()][4:] == [("step", 8, 500), ("validation", 0, 600), ("step", 20, 700)]
    h.steps += rec(800)
    h.replace([])  # what was not read yet goes with the old list
    h.steps += rec(900)
    assert [(p, i, d[0].peak) for p, i, d in h.records()] == [("step", 22, 900)]
