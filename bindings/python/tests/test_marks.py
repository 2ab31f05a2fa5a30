"""memprobe.MarkGroup: exact sources over marks kept in Python."""

from __future__ import annotations

import gc

import pytest
from conftest import MiB

import memprobe
from memprobe import Fidelity, MarkGroup, SourceKind, Window


class Marks:
    """Two marks with one shared reset, like an allocator's. ``style``
    picks the group's constructor: one read per mark (``MarkGroup``) or
    every mark at once (``MarkGroup.many``); every test runs with both."""

    style = "one"

    def __init__(self, n: int = 2):
        self.now = [0] * n
        self.hwm = [0] * n
        self.resets = 0
        self.fail_in = None
        self.calls = 0

    def set(self, i: int, v: int) -> None:
        self.now[i] = v
        self.hwm[i] = max(self.hwm[i], v)

    def current(self, i: int) -> int:
        if self.fail_in == "current":
            raise KeyError("current failed")
        return self.now[i]

    def peak(self, i: int) -> int:
        if self.fail_in == "peak":
            raise KeyError("peak failed")
        return self.hwm[i]

    def reset(self) -> None:
        if self.fail_in == "reset":
            raise OSError("reset failed")
        self.resets += 1
        self.hwm = list(self.now)

    def read_many(self, what: str, indices):
        self.calls += 1
        return [self.current(i) if what == "current" else self.peak(i) for i in indices]

    def group(self) -> MarkGroup:
        if self.style == "many":
            return MarkGroup.many(self.read_many, self.reset)
        return MarkGroup(self.current, self.peak, self.reset)


@pytest.fixture(autouse=True, params=["one", "many"])
def style(request, monkeypatch):
    monkeypatch.setattr(Marks, "style", request.param)
    return request.param


def test_a_boundary_over_a_group_read_at_once_makes_three_calls(style):
    m = Marks()
    g = m.group()
    a, b = g.source(0, "alloc"), g.source(1, "reserved")
    m.set(0, 10 * MiB)
    m.set(1, 30 * MiB)
    with Window([a, b]) as step:
        for i in range(1, 11):
            m.set(0, 10 * MiB + i * MiB)
            m.set(0, 10 * MiB)
            m.set(1, 30 * MiB + 2 * i * MiB)
            m.set(1, 30 * MiB)
            calls, resets = m.calls, m.resets
            d = step.reset()
            assert [x.peak for x in d] == [10 * MiB + i * MiB, 30 * MiB + 2 * i * MiB]
            assert m.resets == resets + 1
            if style == "many":
                assert m.calls == calls + 2  # every peak, then every current value


@pytest.mark.parametrize("bad", [[1], [1, 2, 3], [-1, 0], ["x", 0]])
def test_read_many_must_return_one_byte_count_per_mark(bad, style):
    if style != "many":
        pytest.skip("MarkGroup.many only")
    g = MarkGroup.many(lambda what, idx: bad, lambda: None)
    a, b = g.source(0, "a"), g.source(1, "b")
    with pytest.raises(memprobe.UnavailableError) as e:
        Window([a, b]).reset()
    assert isinstance(e.value.__cause__, ValueError)


def test_mark_sources_are_exact_and_named():
    m = Marks()
    with m.group() as g:
        a, b = g.source(0, "alloc"), g.source(1, "reserved")
    # the group handle is closed: the sources keep it and its callbacks
    gc.collect()
    m.set(0, 5 * MiB)
    assert a.read().used == 5 * MiB
    info = a.info()
    assert (info.name, info.kind, info.fidelity) == ("alloc", SourceKind.CUSTOM, Fidelity.EXACT)
    with Window([a, b]) as w:
        m.set(0, 300 * MiB)
        m.set(0, 7 * MiB)  # rises and falls between two boundaries
        m.set(1, 40 * MiB)
        d = w.reset()
        assert [x.peak for x in d] == [300 * MiB, 40 * MiB]
        assert d[0].used_end == 7 * MiB
        assert w.peaks() == [7 * MiB, 40 * MiB]
    a.close()
    b.close()


def test_shared_reset_keeps_other_members_peaks():
    m = Marks()
    g = m.group()
    a, b = g.source(0, "a"), g.source(1, "b")
    wa, wb = Window(a), Window(b)
    m.set(1, 90 * MiB)
    m.set(1, 0)
    wa.restart()  # resets the whole group: b's mark is carried
    wa.restart()
    assert m.resets >= 2
    assert wb.peak() == 90 * MiB
    wb.restart()
    assert wb.peak() == 0
    for o in (wa, wb, a, b, g):
        o.close()


def test_one_live_source_per_index():
    m = Marks()
    g = m.group()
    a = g.source(0, "a")
    with pytest.raises(memprobe.InvalidArgumentError):
        g.source(0, "again")
    a.close()
    again = g.source(0, "again")
    assert again.name == "again"
    again.close()
    with pytest.raises(ValueError):
        g.source(-1, "neg")
    with pytest.raises(memprobe.InvalidArgumentError):
        g.source(1, "")
    g.close()
    g.close()
    with pytest.raises(memprobe.InvalidHandleError):
        g.source(1, "closed")


@pytest.mark.parametrize("where", ["current", "peak", "reset"])
def test_callback_exceptions_are_raised_from_the_failed_call(where):
    m = Marks()
    g = m.group()
    a, b = g.source(0, "a"), g.source(1, "b")
    w = Window([a, b])
    m.set(0, 50 * MiB)
    m.fail_in = where
    with pytest.raises(memprobe.UnavailableError) as err:
        w.reset()
    assert isinstance(err.value.__cause__, (KeyError, OSError))
    assert f"{where} failed" in str(err.value.__cause__)
    assert "'a'" in err.value.message or "'b'" in err.value.message
    m.fail_in = None
    assert w.reset()[0].peak == 50 * MiB  # the failed boundary lost nothing
    if where == "current":
        m.fail_in = where
        with pytest.raises(memprobe.UnavailableError) as err:
            a.read()
        assert isinstance(err.value.__cause__, KeyError)
        m.fail_in = None
    for o in (w, a, b, g):
        o.close()


def test_negative_bytes_fail_the_read():
    g = MarkGroup(lambda i: -1, lambda i: 0, lambda: None)
    s = g.source(0, "neg")
    with pytest.raises(memprobe.UnavailableError) as err:
        s.read()
    assert isinstance(err.value.__cause__, ValueError)
    s.close()
    g.close()


def test_tracker_and_trace_over_marks():
    m = Marks(1)
    g = m.group()
    a = g.source(0, "a")
    with memprobe.Tracker(a) as t:
        with t.epoch() as e:
            for size in (10, 30, 20):
                with t.step() as s:
                    m.set(0, size * MiB)
                    m.set(0, 0)
                assert s.record.deltas[0].peak == size * MiB
        assert e.record.deltas[0].peak == 30 * MiB
        t.begin("step")
        m.fail_in = "peak"
        with pytest.raises(memprobe.UnavailableError) as err:
            t.end("step")
        assert isinstance(err.value.__cause__, KeyError)
        m.fail_in = None
        t.end("step")
    tr = memprobe.Trace(a, silent=True)
    m.set(0, 8 * MiB)
    m.set(0, 2 * MiB)
    assert tr.data() == (2 * MiB, 6 * MiB)
    tr.close()
    a.close()
    g.close()


def test_gpu_exact_needs_the_interposer():
    assert SourceKind.GPU_EXACT == 9
    with pytest.raises(memprobe.UnavailableError) as err:
        memprobe.Source.gpu_exact(0)
    assert "interpose" in err.value.message
    with pytest.raises(memprobe.InvalidIdError):
        memprobe.Source.gpu_exact(64)


def test_b2mb_signed_rounds_toward_zero():
    for n in (-(1 << 20) + 1, -(1 << 20), -(5 << 20) - 7, -(1 << 63), 0, 3 << 20):
        assert memprobe.b2mb(n) == int(n / 2**20) or n == -(1 << 63)
    assert memprobe.b2mb(-(1 << 63)) == -(1 << 43)
    with pytest.raises(OverflowError):
        memprobe.b2mb(-(1 << 63) - 1)
