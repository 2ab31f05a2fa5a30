"""Peak windows: exact spikes, independence, resets, errors."""

from __future__ import annotations

import time

import pytest
from conftest import MiB, keep, spike

import memprobe
from memprobe import Fidelity, Source, Window

SLACK = 2 * MiB  # the kernel counts RSS in per-CPU batches


def test_exact_peak_sees_a_short_spike(rss):
    with Window(rss) as w:
        start = w.measure().used_start
        spike(128 * MiB)
        d = w.measure()
        assert d.peak >= start + 128 * MiB - SLACK
        assert d.fidelity is Fidelity.EXACT
        assert w.peak() >= d.peak - SLACK
        assert d.delta_peaked >= 128 * MiB - SLACK - max(d.delta_used, 0)


def test_windows_are_independent(rss):
    outer = Window(rss)
    inner = Window(rss)
    spike(96 * MiB)
    inner.reset()
    assert inner.peak() < outer.peak() - 64 * MiB
    assert outer.peak() >= outer.measure().used_start + 96 * MiB - SLACK
    inner.close()
    assert outer.peak() >= outer.measure().used_start + 96 * MiB - SLACK
    outer.close()


def test_restart_starts_a_new_interval_without_a_result(rss):
    with Window(rss) as w, Window(rss) as outer:
        spike(96 * MiB)
        assert w.peak() >= rss.read().used + 90 * MiB
        assert w.restart() is None
        assert w.peak() < rss.read().used + 32 * MiB  # the spike is gone from this one
        assert outer.peak() >= rss.read().used + 90 * MiB  # not from another
    with pytest.raises(memprobe.InvalidHandleError):
        w.restart()


def test_reset_returns_the_ended_interval(rss):
    with Window([rss]) as w:
        spike(64 * MiB)
        held = keep(16 * MiB)
        (ended,) = w.reset()
        assert isinstance(ended, memprobe.Delta)
        assert ended.peak >= ended.used_start + 64 * MiB - SLACK
        assert ended.delta_used >= 16 * MiB - SLACK
        assert ended.delta_used == ended.used_end - ended.used_start
        # The next interval starts where the ended one stopped.
        nxt = w.measure()
        assert abs(nxt.used_start - ended.used_end) < SLACK
        assert nxt.peak < ended.peak
        del held


def test_delta_follows_fastai_rule():
    with Source.pushed("p") as p:
        p.push(100)
        with Window(p) as w:
            p.push(1000)
            p.push(300)
            d = w.measure()
            assert (d.used_start, d.used_end, d.peak) == (100, 300, 1000)
            assert d.delta_used == 200
            assert d.delta_peaked == 1000 - 100 - 200
            assert d.fidelity is Fidelity.PUSHED
            p.push(50)
            d = w.measure()
            assert d.delta_used == -50 and d.delta_peaked == 900
            assert d.delta_used_mb == 0 and d.peak_mb == 0


def test_several_sources_in_order(rss):
    with Source.pushed("a") as a, Source.pushed("b") as b:
        a.push(10)
        b.push(20)
        with Window([a, b, rss]) as w:
            assert len(w) == 3
            a.push(11)
            b.push(99)
            b.push(1)
            peaks = w.peaks()
            assert peaks[:2] == [11, 99]
            assert [d.peak for d in w.measures()][:2] == [11, 99]
            ended = w.reset()
            assert [d.peak for d in ended[:2]] == [11, 99]
            assert w.peaks()[:2] == [11, 1]
            assert w.sources == (a, b, rss)


def test_index_out_of_range_is_invalid_id(rss):
    with Window(rss) as w:
        with pytest.raises(memprobe.InvalidIdError):
            w.peak(1)
        with pytest.raises(LookupError):
            w.measure(5)


def test_closed_window_is_an_invalid_handle(rss):
    w = Window(rss)
    w.close()
    w.close()
    with pytest.raises(memprobe.InvalidHandleError):
        w.peak()
    with pytest.raises(memprobe.InvalidHandleError):
        w.reset()


def test_window_over_a_closed_source_is_refused():
    s = Source.pushed("gone")
    s.close()
    with pytest.raises(memprobe.InvalidHandleError):
        Window(s)


def test_window_keeps_its_source_alive():
    s = Source.pushed("kept")
    s.push(42)
    w = Window(s)
    s.close()
    assert w.peak() == 42
    w.close()


def test_bad_source_lists():
    with pytest.raises(ValueError):
        Window([])
    with pytest.raises(TypeError):
        Window(["rss"])


def test_default_source_is_this_process():
    with Window() as w:
        assert w.sources[0].kind is memprobe.SourceKind.PROCESS
        assert w.peak() > 0


def test_sampled_callback_source_is_polled_by_the_monitor():
    value = [1 * MiB]
    memprobe.monitor.set_interval(0.001)
    try:
        with Source.callback("poll", lambda: value[0]) as c, Window(c) as w:
            value[0] = 50 * MiB
            reads = memprobe.monitor.stats().reads
            deadline = time.time() + 5
            while memprobe.monitor.stats().reads < reads + 2 and time.time() < deadline:
                time.sleep(0.002)
            value[0] = 2 * MiB
            assert w.peak() == 50 * MiB  # seen by the monitor's polls only
            assert w.measure().fidelity is Fidelity.SAMPLED
            stats = memprobe.monitor.stats()
            assert stats.running and stats.watched >= 1 and stats.reads > 0
    finally:
        memprobe.monitor.set_interval(0.010)
