"""Traces: fastai's GPUMemTrace semantics over memprobe sources."""

from __future__ import annotations

import os
import re
import tempfile

import pytest
from conftest import MiB, keep, spike

import memprobe
from memprobe import Source, Trace, mem_trace

LINE = re.compile(r"^△Used Peaked MB: +(-?[\d,]+) +([\d,]+)(?: \((.*)\))?$")


def lines(text: str):
    return [ln for ln in text.splitlines() if ln.startswith("△Used Peaked MB:")]


def test_report_prints_fastai_line_to_stdout(capsys):
    t = Trace(ctx="foobar")
    t.report()
    t.report("1st try")
    t.close()
    out = lines(capsys.readouterr().out)
    assert len(out) == 2
    assert out[0].endswith("(foobar)") and LINE.match(out[0])
    assert out[1].endswith("(foobar: 1st try)")


def test_report_without_ctx_or_note(capsys):
    with Source.pushed("p") as p:
        t = Trace(p)
        t.report()
        t.close()
    (line,) = lines(capsys.readouterr().out)
    m = LINE.match(line)
    assert m and m.group(3) is None and m.group(1) == "0" and m.group(2) == "0"


def test_data_is_bytes_and_data_mb_is_fastai(rss):
    with Source.pushed("p") as p:
        p.push(10 * MiB)
        t = Trace(p, silent=True)
        p.push(110 * MiB)
        p.push(30 * MiB + 5)
        # delta peaked = (peak - start) - delta used = 100 MiB - (20 MiB + 5)
        assert t.data() == (20 * MiB + 5, 80 * MiB - 5)
        assert t.data_mb() == (20, 79)
        d = t.measure()
        assert d.peak == 110 * MiB and d.used_start == 10 * MiB
        t.close()


def test_exact_spike_shows_in_delta_peaked():
    t = Trace(silent=True)
    spike(100 * MiB)
    used, peaked = t.data()
    assert peaked >= 98 * MiB
    t.close()


def test_reset_and_report_n_reset(capsys):
    with Source.pushed("p") as p:
        t = Trace(p, ctx="loop")
        for i in range(3):
            p.push(i * MiB)
            t.report_n_reset(f"i={i}")
        t.reset()
        assert t.data() == (0, 0)
        t.close()
    out = lines(capsys.readouterr().out)
    assert [ln.split("(")[1] for ln in out] == ["loop: i=0)", "loop: i=1)", "loop: i=2)"]
    assert LINE.match(out[1]).group(1) == "1"


def test_silent_constructor_and_property(capsys):
    t = Trace(silent=True)
    t.report()
    assert t.silent
    t.silent = False
    t.report()
    t.silent = True
    t.report()
    t.close()
    assert len(lines(capsys.readouterr().out)) == 1


def test_start_stop_order_errors():
    t = Trace(silent=True)
    assert t.running
    with pytest.raises(memprobe.WrongOrderError):
        t.start()
    t.stop()
    assert not t.running
    with pytest.raises(memprobe.WrongOrderError) as e:
        t.stop()
    assert e.value.status is memprobe.Status.WRONG_ORDER
    assert "memprobe_trace_stop" in e.value.message
    with pytest.raises(memprobe.WrongOrderError):
        t.reset()
    t.start()
    t.close()


def test_stop_freezes_data():
    with Source.pushed("p") as p:
        t = Trace(p, silent=True)
        p.push(5)
        t.stop()
        p.push(500)
        assert t.data() == (5, 0)
        t.close()


def test_deferred_start():
    t = Trace(start=False, silent=True)
    assert not t.running
    t.start()
    assert t.running
    t.close()


def test_context_manager_reports_exit(capsys):
    with Trace(ctx="some context") as t:
        held = keep(8 * MiB)
    assert not t.running
    del held
    t.close()
    (line,) = lines(capsys.readouterr().out)
    assert line.endswith("(some context: exit)")
    assert int(LINE.match(line).group(1).replace(",", "")) >= 7


def test_context_manager_restarts_a_running_trace(capsys):
    with Source.pushed("p") as p:
        t = Trace(p, on_exit_report=False)
        p.push(100 * MiB)
        with t:
            assert t.data() == (0, 0)  # (re)started on entry
            p.push(101 * MiB)
        assert t.data() == (MiB, 0)
        t.report("measured in ctx")
        t.close()
    (line,) = lines(capsys.readouterr().out)
    assert line.endswith("(measured in ctx)")


def test_decorator_reports_with_qualname(capsys):
    @mem_trace
    def some_func(x):
        return x + 1

    assert some_func(1) == 2
    assert some_func.__name__ == "some_func"
    (line,) = lines(capsys.readouterr().out)
    assert line.endswith("(test_decorator_reports_with_qualname.<locals>.some_func: exit)")


def test_decorator_with_arguments_and_exceptions(capsys):
    with Source.pushed("p") as p:

        @mem_trace(sources=[p], ctx="train")
        def fails():
            p.push(3 * MiB)
            raise KeyError("boom")

        with pytest.raises(KeyError):
            fails()
    (line,) = lines(capsys.readouterr().out)
    assert line.endswith("(train: exit)")
    assert LINE.match(line).group(1) == "3"


def test_report_to_a_file_object():
    import io

    buf = io.StringIO()
    t = Trace(ctx="f", file=buf)
    t.report("x")
    t.close()
    assert buf.getvalue().strip().endswith("(f: x)")


def test_report_to_a_file_descriptor():
    with tempfile.TemporaryFile() as f:
        t = Trace(ctx="fd", fd=f.fileno())
        t.report("n")
        t.set_output(fd=f.fileno())
        t.report("m")
        t.close()
        f.seek(0)
        text = f.read().decode()
    assert lines(text)[0].endswith("(fd: n)") and lines(text)[1].endswith("(fd: m)")


def test_format_and_repr_do_not_print(capsys):
    t = Trace(ctx="c")
    long_note = "n" * 1000
    assert t.format(long_note).endswith(f"(c: {long_note})")
    assert LINE.match(repr(t))
    assert str(t) == t.format()
    t.close()
    assert capsys.readouterr().out == ""
    assert repr(t) == "<memprobe.Trace (closed)>"


def test_several_sources_in_one_line(capsys):
    with Source.pushed("a") as a, Source.pushed("b") as b:
        t = Trace([a, b])
        b.push(2 * MiB)
        assert t.data(1) == (2 * MiB, 0)
        t.report()
        t.close()
    (line,) = lines(capsys.readouterr().out)
    assert "|" in line and "a" in line and "b" in line


def test_closed_trace_is_an_invalid_handle():
    t = Trace(silent=True)
    t.close()
    with pytest.raises(memprobe.InvalidHandleError):
        t.data()


def test_output_fd_survives_dup2(tmp_path):
    # Reports written by the library go to the descriptor, not Python's stdout.
    path = tmp_path / "out.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        t = Trace(ctx="direct", fd=fd)
        t.report()
        t.close()
    finally:
        os.close(fd)
    assert path.read_text().strip().endswith("(direct)")


def test_bad_output_descriptors_are_invalid_arguments(tmp_path):
    read_only = os.open(tmp_path / "ro.txt", os.O_RDONLY | os.O_CREAT)
    try:
        for fd in (read_only, -1):
            with pytest.raises(memprobe.InvalidArgumentError):
                Trace(ctx="bad", fd=fd)
            t = Trace(ctx="bad", silent=True)
            with pytest.raises(memprobe.InvalidArgumentError):
                t.set_output(fd=fd)
            t.close()
    finally:
        os.close(read_only)
