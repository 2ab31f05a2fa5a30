"""A window's boundary read as plain integers (``Window.reset_raw``, what
the training integrations keep per step) is ``reset`` field for field:
signed deltas, kinds and fidelities, several sources in order, a closed
window refused the same way."""

from __future__ import annotations

import pytest

import memprobe
from memprobe import Fidelity, Source, SourceKind, Window
from memprobe.windows import deltas_of, peaks_of, raw_of


def test_reset_raw_is_reset_as_integers(rss):
    with Source.pushed("a") as a, Source.pushed("b") as b:
        a.push(100)
        b.push(20)
        with Window([a, b, rss]) as w, Window([a, b]) as twin:
            a.push(40)  # released: delta_used is negative
            b.push(99)
            b.push(30)
            raw = w.reset_raw()
            ended = twin.reset()
            assert len(raw) == 3 * 7 and all(type(v) is int for v in raw)
            got = deltas_of(raw)
            assert got[:2] == ended
            assert (got[0].used_start, got[0].used_end, got[0].peak, got[0].delta_used) == (100, 40, 100, -60)
            assert (got[1].peak, got[1].delta_used, got[1].delta_peaked) == (99, 10, 69)
            assert isinstance(got[0].kind, SourceKind) and isinstance(got[2].fidelity, Fidelity)
            assert list(peaks_of(raw)) == [d.peak for d in got]
            assert raw_of(got) == raw
            # The next interval started at the boundary.
            a.push(41)
            assert [d.peak for d in w.reset()][:2] == [41, 30]


def test_reset_raw_of_a_closed_window_is_an_invalid_handle(rss):
    w = Window(rss)
    w.close()
    with pytest.raises(memprobe.InvalidHandleError):
        w.reset_raw()
