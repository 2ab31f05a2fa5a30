"""The notebook extension (``%load_ext memprobe``) in a real IPython shell
in this process: the line after each cell, exact peaks, ``%%memprobe``,
off / on / unload, the GPU columns (over the scripted torch.cuda), and
what the hook costs a cell. The same in a real Jupyter kernel is in
test_notebook_kernel.py."""

from __future__ import annotations

import gc
import re
import sys

import pytest
from conftest import MiB, require_module

import memprobe

SPIKE = 256 * MiB
LINE = re.compile(
    r"^･ RAM: △Consumed △Peaked Used Total \| CPU: +(-?[\d,]+) +([\d,]+) +([\d,]+) MB"
    r"((?: \| GPU\d*: +-?[\d,]+ +[\d,]+ +[\d,]+ MB)+) \| Exec time (\d+\.\d{3})s$"
)
GPU = re.compile(r"GPU(\d*): +(-?[\d,]+) +([\d,]+) +([\d,]+) MB")


def num(s: str) -> int:
    return int(s.replace(",", ""))


def lines(text: str):
    """The per-cell lines printed, parsed: (cpu (consumed, peaked, used),
    {gpu label: (consumed, peaked, used)}, seconds)."""
    out = []
    for line in text.splitlines():
        if line.startswith("･ RAM:"):
            m = LINE.match(line)
            assert m, line
            gpus = {g[0] or "": tuple(num(x) for x in g[1:]) for g in GPU.findall(m.group(4))}
            out.append((tuple(num(m.group(i)) for i in (1, 2, 3)), gpus, float(m.group(5))))
    return out


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """A fresh IPython shell (history in memory, its folder in tmp_path);
    the hooks IPython installs in ``sys`` are put back afterwards."""
    require_module("IPython", "ipython")
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    for name in ("displayhook", "excepthook", "stdout", "stderr"):
        monkeypatch.setattr(sys, name, getattr(sys, name))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    InteractiveShell.clear_instance()
    sh = InteractiveShell.instance(config=config)
    yield sh
    sh.run_cell("%unload_ext memprobe")
    InteractiveShell.clear_instance()
    gc.collect()


def run(shell, capsys, code: str):
    result = shell.run_cell(code)
    return result, capsys.readouterr().out


def test_each_cell_prints_its_exact_peak_and_consumed(shell, capsys):
    from memprobe.notebook import current

    _, out = run(shell, capsys, "%load_ext memprobe")
    assert lines(out) == []  # the loading cell itself is not measured
    ext = current(shell)
    assert ext is not None and ext.enabled

    # The cell measures its own window around the allocation: the hook's
    # window, opened before the cell, must see at least that peak.
    cell = (
        "import memprobe\n"
        "_w = memprobe.Window()\n"
        "x = b'\\x01' * (256 << 20)\n"
        "del x\n"
        "_inner = _w.reset()[0]\n"
        "_w.close(); _w.sources[0].close()\n"
    )
    result, out = run(shell, capsys, cell)
    assert result.success, result.error_in_exec
    (cpu, gpus, seconds), = lines(out)
    record = ext.history[-1]
    d = record.cpu
    inner = shell.user_ns["_inner"]
    # RSS counts mapped file pages too, which a loaded machine may reclaim
    # meanwhile: a few MiB of slack, as in the other spike tests.
    assert inner.peak - inner.used_start >= SPIKE - 8 * MiB
    assert d.peak >= inner.peak  # exact: the spike is in the cell's peak
    assert d.peak - d.used_start >= SPIKE - 8 * MiB
    assert d.delta_peaked >= SPIKE - 8 * MiB
    assert abs(d.delta_used) < 16 * MiB  # freed: a small consumed delta
    # The line carries the record in MiB (fastai's b2mb).
    assert cpu == (memprobe.b2mb(d.delta_used), memprobe.b2mb(d.delta_peaked), memprobe.b2mb(d.used_end))
    assert cpu[1] >= 248 and abs(cpu[0]) < 16
    assert gpus == {"": (0, 0, 0)}  # no CUDA: fastai's GPUMemory(0, 0, 0)
    assert seconds == round(record.seconds, 3) and record.number == result.execution_count

    # A quiet cell right after: nothing peaked, nothing consumed.
    _, out = run(shell, capsys, "y = sum(range(1000))")
    (cpu, _, _), = lines(out)
    assert cpu[1] < 64 and abs(cpu[0]) < 16
    assert len(ext.history) == 2


def test_a_cell_that_keeps_memory_shows_it_consumed(shell, capsys):
    run(shell, capsys, "%load_ext memprobe")
    _, out = run(shell, capsys, "kept = b'\\x02' * (128 << 20)")
    (cpu, _, _), = lines(out)
    assert cpu[0] >= 127 and cpu[1] < 16
    _, out = run(shell, capsys, "del kept")
    (cpu, _, _), = lines(out)
    assert cpu[0] <= -127  # released: a negative consumed


def test_a_failing_cell_still_gets_its_line(shell, capsys):
    run(shell, capsys, "%load_ext memprobe")
    result, out = run(shell, capsys, "x = b'\\x01' * (64 << 20)\nraise ValueError('boom')")
    assert not result.success
    (cpu, _, _), = lines(out)
    assert cpu[0] >= 63  # x stays (the cell failed after it)


def test_cell_magic_measures_one_cell_with_a_table(shell, capsys):
    run(shell, capsys, "%load_ext memprobe")
    run(shell, capsys, "%memprobe off")
    result, out = run(shell, capsys, "%%memprobe\nz = b'\\x01' * (64 << 20)\ndel z\n6 * 7")
    assert result.success and result.result == 42  # the last expression is the cell's result
    assert lines(out) == []  # the per-cell line is off
    head, cols, rss, gpu, unit = out.strip().splitlines()[:5]
    assert re.match(r"^･ memprobe: this cell \| Exec time \d+\.\d{3}s$", head), head
    assert cols.split() == ["source", "△Consumed", "△Peaked", "Used", "Total", "Peak", "fidelity"]
    name, consumed, peaked, used, peak, fidelity = rss.split()
    assert name == "rss" and fidelity == "exact"
    assert num(peaked) >= 62 and abs(num(consumed)) < 16 and num(peak) >= num(used) + 62
    assert gpu.split()[:3] == ["GPU", "(no", "CUDA)"] and gpu.split()[3:7] == ["0"] * 4
    assert "b2mb" in unit

    # With the line on, the cell has both; a bad argument is a usage error.
    run(shell, capsys, "%memprobe on")
    _, out = run(shell, capsys, "%%memprobe\nq = 1")
    assert "･ memprobe: this cell" in out and len(lines(out)) == 1
    result, _ = run(shell, capsys, "%%memprobe now\nq = 1")
    assert "%%memprobe takes no arguments" in str(result.error_in_exec)


def test_off_on_and_unload(shell, capsys):
    from memprobe.notebook import current

    base = memprobe.live_handles()
    run(shell, capsys, "%load_ext memprobe")
    assert memprobe.live_handles() != base  # the RSS source and the cell window
    _, out = run(shell, capsys, "%memprobe")
    assert "per-cell line: on (sources: rss)" in out
    _, out = run(shell, capsys, "%memprobe off")
    assert lines(out) == []
    _, out = run(shell, capsys, "a = 1")
    assert lines(out) == []
    gc.collect()
    assert memprobe.live_handles() == base  # off releases the window and source
    _, out = run(shell, capsys, "%memprobe")
    assert "per-cell line: off" in out
    _, out = run(shell, capsys, "%memprobe on")
    assert lines(out) == []  # measured from the next cell on
    _, out = run(shell, capsys, "a = 2")
    assert len(lines(out)) == 1
    result, _ = run(shell, capsys, "%memprobe sideways")
    assert "usage: %memprobe [on|off]" in str(result.error_in_exec)

    run(shell, capsys, "%unload_ext memprobe")
    assert current(shell) is None
    _, out = run(shell, capsys, "a = 3")
    assert lines(out) == []
    result, _ = run(shell, capsys, "%memprobe on")
    assert "memprobe` not found" in str(result.error_in_exec)  # the magic went too
    gc.collect()
    assert memprobe.live_handles() == base
    _, out = run(shell, capsys, "%load_ext memprobe")  # and loads again
    _, out = run(shell, capsys, "a = 4")
    assert len(lines(out)) == 1


def test_the_hook_records_its_own_cost_per_cell(shell, capsys):
    # Speed is measured by bench/bench_notebook.py (docs/bindings-benchmarks.md),
    # never as a timed pass/fail test; here only that each cell's own cost is
    # recorded, fresh for each cell.
    from memprobe.notebook import current

    run(shell, capsys, "%load_ext memprobe")
    ext = current(shell)
    costs = []
    for i in range(20):
        run(shell, capsys, f"v = {i}")
        costs.append(ext.last_cost_ns)
    assert all(isinstance(c, int) and c > 0 for c in costs), costs
    assert len(set(costs)) > 1, costs


@pytest.fixture
def cuda(monkeypatch):
    """The scripted torch.cuda, not initialised until ``cuda.up = True``."""
    require_module("torch", "torch")
    from fake_torch_cuda import FakeCuda

    fake = FakeCuda(devices=1)
    fake.install(monkeypatch)
    fake.up = False
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: fake.up)
    import builtins

    monkeypatch.setattr(builtins, "fake_cuda", fake, raising=False)
    yield fake
    gc.collect()  # the sources over the fake go before it is unpatched


def test_gpu_columns_from_the_cell_that_initialises_cuda(shell, capsys, cuda):
    run(shell, capsys, "%load_ext memprobe")
    _, out = run(shell, capsys, "a = 1")
    (_, gpus, _), = lines(out)
    assert gpus == {"": (0, 0, 0)}

    # The cell that initialises CUDA: torch's own counters since then.
    _, out = run(shell, capsys, "fake_cuda.up = True\nfake_cuda.alloc(512 << 20)\nfake_cuda.free(256 << 20)")
    (_, gpus, _), = lines(out)
    assert gpus == {"": (256, 256, 256)}
    # Then the allocator sources, exact over each cell: a 100 MiB temporary.
    _, out = run(shell, capsys, "fake_cuda.alloc(100 << 20)\nfake_cuda.free(100 << 20)")
    (_, gpus, _), = lines(out)
    assert gpus == {"": (0, 100, 256)}
    _, out = run(shell, capsys, "%memprobe")
    assert "sources: rss, torch_alloc:0, torch_reserved:0" in out

    _, out = run(shell, capsys, "%%memprobe\nfake_cuda.alloc(10 << 20)")
    rows = {r.split()[0]: r.split()[1:] for r in out.splitlines() if r.startswith("  ") and r.split()}
    assert rows["torch_alloc:0"][:4] == ["10", "0", "266", "266"]
    assert rows["torch_reserved:0"][2] == "512"  # 512 MiB reserved at the peak, kept
    assert "GPU" not in rows


def test_a_cuda_that_cannot_be_read_leaves_the_gpu_columns_at_zero(shell, capsys, cuda, monkeypatch):
    import torch

    def broken(*_a):
        raise RuntimeError("CUDA driver gone")

    run(shell, capsys, "%load_ext memprobe")
    monkeypatch.setattr(torch.cuda, "device_count", broken)
    monkeypatch.setattr(torch.cuda, "memory_allocated", broken)
    result, out = run(shell, capsys, "fake_cuda.up = True")
    assert result.success and "Error in callback" not in out
    (_, gpus, _), = lines(out)
    assert gpus == {"": (0, 0, 0)}
    _, out = run(shell, capsys, "b = 1")
    assert len(lines(out)) == 1
    _, out = run(shell, capsys, "%memprobe")
    assert "sources: rss; no GPU sources: RuntimeError: CUDA driver gone" in out
