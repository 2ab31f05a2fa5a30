"""The monitor's settings and counters; unit helpers."""

from __future__ import annotations

import pytest

import memprobe
from memprobe import monitor


def test_interval_round_trip():
    try:
        monitor.set_interval(0.002)
        assert monitor.stats().interval_ns == 2_000_000
        assert monitor.stats().interval == pytest.approx(0.002)
        monitor.set_interval_ns(monitor.MIN_INTERVAL_NS)
        assert monitor.stats().interval_ns == monitor.MIN_INTERVAL_NS
    finally:
        monitor.set_interval(0.010)


@pytest.mark.parametrize("ns", [0, 99_999, monitor.MAX_INTERVAL_NS + 1])
def test_interval_out_of_range(ns):
    with pytest.raises(memprobe.InvalidArgumentError) as e:
        monitor.set_interval_ns(ns)
    assert e.value.status is memprobe.Status.INVALID_ARGUMENT


def test_stop_and_restart():
    monitor.stop()
    assert not monitor.stats().running
    with memprobe.Source.system_ram() as ram, memprobe.Window(ram):
        assert monitor.stats().running
    monitor.stop()
    assert not monitor.stats().running


@pytest.mark.parametrize(
    "num", [0, 1, (1 << 20) - 1, 1 << 20, 5 * (1 << 20) + 7, -1, -(1 << 20), -(3 << 20) - 1, 10**15]
)
def test_b2mb_matches_fastai(num):
    assert memprobe.b2mb(num) == int(num / 2**20)


def test_mib():
    assert memprobe.MiB == 2**20


def test_b2mb_is_the_c_abis_rule_value_for_value():
    """b2mb computes in Python what memprobe_b2mb (byte counts) and
    memprobe_b2mb_signed (deltas) return, over both C types' ranges."""
    import random

    from memprobe._ffi import C

    rng = random.Random(7)
    edges = [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (1 << 53) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    for n in edges + [rng.randrange(1 << 64) for _ in range(2000)]:
        assert memprobe.b2mb(n) == C.memprobe_b2mb(n), n
    negatives = [-1, -(1 << 20) + 1, -(1 << 20), -(1 << 20) - 1, -(1 << 63)]
    for n in negatives + [-rng.randrange(1, 1 << 63) for _ in range(2000)]:
        assert memprobe.b2mb(n) == C.memprobe_b2mb_signed(n), n
    with pytest.raises(OverflowError):
        memprobe.b2mb(1 << 64)
