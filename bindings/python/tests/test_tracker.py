"""The training-loop tracker: phases, records, sinks, releases, leaks, OOM retry."""

from __future__ import annotations

import json
import os

import pytest
from conftest import MiB, spike

import memprobe
from memprobe import PhaseKind, Source, Tracker


@pytest.fixture
def alloc():
    s = Source.pushed("alloc")
    s.push(100 * MiB)
    yield s
    s.close()


def test_phases_nest_and_records_carry_deltas(alloc):
    with Tracker(alloc) as t:
        t.begin("epoch")
        records = []
        for i in range(3):
            t.begin("step")
            alloc.push((200 + 100 * i) * MiB)
            alloc.push(100 * MiB)
            records.append(t.end("step"))
        epoch = t.end("epoch")
    assert [r.index for r in records] == [0, 1, 2]
    assert all(r.kind is PhaseKind.STEP and r.name == "step" and r.depth == 1 for r in records)
    assert [r.deltas[0].peak for r in records] == [200 * MiB, 300 * MiB, 400 * MiB]
    assert epoch.kind is PhaseKind.EPOCH and epoch.depth == 0
    assert epoch.deltas[0].peak == 400 * MiB and epoch.deltas[0].delta_used == 0
    assert epoch.duration_ns == epoch.ended_at_ns - epoch.started_at_ns >= 0
    assert epoch.leaking == []


def test_context_managers_and_next(alloc):
    with Tracker(alloc) as t:
        with t.epoch() as e:
            t.begin(PhaseKind.STEP)
            alloc.push(150 * MiB)
            first = t.next("step")
            alloc.push(120 * MiB)
            second = t.end("step")
            with t.phase("eval") as ev:
                alloc.push(130 * MiB)
        assert first.deltas[0].peak == 150 * MiB
        assert second.deltas[0].used_start == 150 * MiB and second.index == 1
        assert ev.record.kind is PhaseKind.CUSTOM and ev.record.name == "eval"
        assert e.record.deltas[0].peak == 150 * MiB


def test_exact_step_peaks_over_rss(rss):
    with Tracker(rss) as t:
        with t.epoch():
            with t.step() as s:
                spike(96 * MiB)
        d = s.record.deltas[0]
        assert d.peak >= d.used_start + 94 * MiB
        assert d.fidelity is memprobe.Fidelity.EXACT


def test_wrong_order_is_refused(alloc):
    with Tracker(alloc) as t:
        with pytest.raises(memprobe.WrongOrderError):
            t.end("epoch")
        t.begin("step")
        with pytest.raises(memprobe.WrongOrderError):
            t.begin("epoch")  # an epoch inside a step
        with pytest.raises(memprobe.WrongOrderError):
            t.end("epoch")
        t.end("step")
        with pytest.raises(ValueError):
            t.begin("custom")
        with pytest.raises(memprobe.InvalidArgumentError):
            t.begin(PhaseKind.STEP, "named")
        with pytest.raises(memprobe.InvalidArgumentError):
            t.begin(99)


def test_sinks(alloc, tmp_path):
    jsonl, csv = tmp_path / "phases.jsonl", tmp_path / "phases.csv"
    seen = []
    table = tmp_path / "table.txt"
    fd = os.open(table, os.O_WRONLY | os.O_CREAT)
    try:
        with Tracker(alloc) as t:
            t.add_jsonl_sink(jsonl)
            t.add_csv_sink(csv)
            t.add_callback_sink(seen.append)
            t.add_table_sink("epoch", fd=fd)
            for _ in range(2):
                with t.epoch():
                    with t.step():
                        alloc.push(300 * MiB)
                        alloc.push(100 * MiB)
            assert not jsonl.exists()  # written beside, renamed when finished
        assert t.closed
    finally:
        os.close(fd)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(rows) == 4
    assert csv.read_text().count("\n") >= 5  # header + 4 records x 1 source
    assert [r.kind for r in seen] == [PhaseKind.STEP, PhaseKind.EPOCH] * 2
    assert seen[0].deltas[0].peak == 300 * MiB
    lines = table.read_text().splitlines()
    assert len(lines) >= 3  # header + 2 epochs


def test_callback_sink_errors_are_kept(alloc):
    def broken(_record):
        raise RuntimeError("sink broke")

    with Tracker(alloc) as t:
        t.add_callback_sink(broken)
        t.begin("epoch")
        t.end("epoch")
        assert isinstance(t.callback_errors[0], RuntimeError)


def test_release_policies(alloc):
    calls = []

    def release():
        calls.append("cache")
        alloc.push(50 * MiB)

    with Tracker(alloc) as t:
        t.add_release(release, "allocator cache")
        t.add_release(lambda: calls.append("gc"), "collector", gc=True)
        t.release_every("step", 2)
        with t.epoch():
            for _ in range(4):
                with t.step() as s:
                    alloc.push(100 * MiB)
        assert calls == ["cache", "cache"]
        assert t.releases_fired == 2
        assert s.record.n_releases == 1 and s.record.released_bytes == 50 * MiB
        freed = t.release_now(gc=True)
        assert calls[-2:] == ["cache", "gc"] or calls[-2:] == ["gc", "cache"]
        assert freed == [0]
        assert t.releases_fired == 3


def test_release_below_free():
    ram = Source.system_ram()
    calls = []
    with Tracker(ram) as t:
        t.add_release(lambda: calls.append(1), "always")
        t.release_below_free(0, 1 << 62)  # always below
        with t.epoch():
            pass
        assert calls == [1]
        with pytest.raises(memprobe.InvalidIdError):
            t.release_below_free(3, 1)
    ram.close()


def test_failing_release_is_reported(alloc):
    def broken():
        raise OSError("cannot release")

    with Tracker(alloc) as t:
        t.add_release(broken, "broken")
        with pytest.raises(memprobe.UnavailableError) as e:
            t.release_now()
        assert "broken" in e.value.message
        assert isinstance(t.callback_errors[0], OSError)


def test_leak_policy(alloc):
    with Tracker(alloc) as t:
        t.set_leak_policy(10 * MiB, 2)
        used = 100
        flags = []
        for _ in range(4):
            with t.epoch() as e:
                used += 50
                alloc.push(used * MiB)
            flags.append(e.record.leaking)
        status = t.leak_status(0)
        assert status.flagged and status.streak >= 2 and status.last_growth == 50 * MiB
        assert flags[-1] == [0]
        with pytest.raises(memprobe.InvalidIdError):
            t.leak_status(1)


def test_oom_retry(alloc):
    attempts = []
    released = []
    with Tracker(alloc) as t:
        t.add_release(lambda: (released.append(1), alloc.push(10 * MiB)), "cache")

        def step():
            attempts.append(1)
            if len(attempts) < 3:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return "done"

        report = t.run_oom_retry(step, max_retries=5)
        assert isinstance(report, memprobe.OomRetryResult)
        assert report.succeeded and report.retries == 2 and report.result == "done"
        assert len(released) == 2
        assert report.freed == (90 * MiB,) and report.freed_bytes == 90 * MiB

        attempts.clear()
        # Still out of memory after every retry: the library returns
        # MEMPROBE_STATUS_OUT_OF_MEMORY with the result written; the binding
        # returns that result instead of raising.
        released.clear()
        report = t.run_oom_retry(lambda: (_ for _ in ()).throw(MemoryError()), max_retries=1)
        assert not report.succeeded and report.retries == 1 and report.result is None
        assert len(released) == 1
        assert memprobe.Status.OUT_OF_MEMORY == 15
        assert isinstance(memprobe.errors.error_for(15, "x"), memprobe.OutOfMemoryError)

        with pytest.raises(KeyError):
            t.run_oom_retry(lambda: {}["missing"])


def test_oom_retry_result_old_name_warns_and_is_the_same_class(alloc):
    # OomReport, the old name, until 0.3.0: the same class, from the package
    # and from memprobe.tracker, each use with a DeprecationWarning.
    import memprobe.tracker

    for module in (memprobe, memprobe.tracker):
        with pytest.warns(DeprecationWarning, match="OomRetryResult.*0.3.0"):
            old = module.OomReport
        assert old is memprobe.OomRetryResult
    with pytest.warns(DeprecationWarning):
        from memprobe import OomReport  # noqa: F401
    with Tracker(alloc) as t:
        assert isinstance(t.run_oom_retry(lambda: None, max_retries=0), old)
    # Not a catch-all: other missing names still fail, without a warning.
    with pytest.raises(AttributeError):
        memprobe.NoSuchName  # noqa: B018
    assert "OomReport" not in memprobe.__all__


def test_step_must_not_reenter_its_tracker(alloc):
    with Tracker(alloc) as t:

        def step():
            t.begin("epoch")

        with pytest.raises(memprobe.WrongOrderError):
            t.run_oom_retry(step)


def test_closed_tracker_is_an_invalid_handle(alloc):
    t = Tracker(alloc)
    t.close()
    t.close()
    with pytest.raises(memprobe.InvalidHandleError):
        t.begin("epoch")
    assert "closed" in repr(t)


def test_sink_path_in_a_missing_directory(alloc, tmp_path):
    with Tracker(alloc) as t:
        with pytest.raises(memprobe.MemprobeError):
            t.add_jsonl_sink(tmp_path / "no" / "such" / "dir" / "x.jsonl")


def test_table_sink_descriptors_are_checked_when_added(alloc, tmp_path):
    read_only = os.open(tmp_path / "ro.txt", os.O_RDONLY | os.O_CREAT)
    closed = os.open(tmp_path / "closed.txt", os.O_WRONLY | os.O_CREAT)
    os.close(closed)
    try:
        with Tracker(alloc) as t:
            for fd in (read_only, closed, -1):
                with pytest.raises(memprobe.InvalidArgumentError):
                    t.add_table_sink("epoch", fd=fd)
    finally:
        os.close(read_only)


def test_table_sink_write_errors_surface_as_io_at_finish(alloc):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full to fail writes")
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        t = Tracker(alloc)
        t.add_table_sink("epoch", fd=full)
        with t.epoch():
            alloc.push(300 * MiB)
        with pytest.raises(memprobe.IoError):
            t.finish_sinks()
        t.close()
        t2 = Tracker(alloc)
        t2.add_table_sink("epoch", fd=full)
        with t2.epoch():
            alloc.push(200 * MiB)
        with pytest.raises(memprobe.IoError):
            t2.close()  # the tracker is released all the same
        assert t2.closed
    finally:
        os.close(full)


def test_an_empty_source_list_is_an_invalid_argument_in_c():
    from memprobe import _ffi

    h = _ffi.out_handle()
    empty = (_ffi.handle_t * 1)()
    for fn in (_ffi.C.memprobe_tracker_new, _ffi.C.memprobe_window_open):
        assert fn(empty, 0, _ffi.byref(h)) == memprobe.Status.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        Tracker([])
