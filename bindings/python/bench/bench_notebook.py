"""What the notebook extension's per-cell hook costs a cell.

Runs cells in a real IPython shell with ``%load_ext memprobe`` and reads,
after each, the hook's own time (``pre_run_cell`` + ``post_run_cell``,
the line printed included: ``NotebookMemory.last_cost_ns``), for a cell
that does nothing and for one that allocates and frees 64 MiB; with
``--fake`` (or without a GPU: always) the allocator sources of one device
over the scripted ``torch.cuda`` of tests/fake_torch_cuda.py are measured
too, as after ``model.cuda()``. Also the whole ``run_cell`` of an empty
cell with and without the extension (paired, alternating). Figures:
docs/bindings-benchmarks.md.

    python bench/bench_notebook.py [--cells 2000] [--fake]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, List

from _memprobe_import import describe, import_memprobe

memprobe = import_memprobe()

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from traitlets.config import Config  # noqa: E402

from memprobe.notebook import current  # noqa: E402


def pct(ns: List[int], q: float) -> float:
    s = sorted(ns)
    return s[min(len(s) - 1, int(len(s) * q))] / 1e3


def hook_costs(shell: Any, code: str, cells: int) -> List[int]:
    ext = current(shell)
    assert ext is not None
    out: List[int] = []
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(cells):
            shell.run_cell(code)
            out.append(ext.last_cost_ns)
    return out


def run_cell_ns(shell: Any, on: bool, n: int) -> List[int]:
    shell.run_cell("%memprobe on" if on else "%memprobe off")
    out: List[int] = []
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(n):
            t = time.perf_counter_ns()
            shell.run_cell("pass")
            out.append(time.perf_counter_ns() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=2000)
    ap.add_argument("--fake", action="store_true", help="measure the scripted torch.cuda's sources even with a GPU")
    args = ap.parse_args()

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    gpu = "no torch sources"
    try:
        import torch

        if args.fake or not torch.cuda.is_available():
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from fake_torch_cuda import FakeCuda

            FakeCuda(devices=1).install()
            gpu = "torch_alloc:0 + torch_reserved:0 over the scripted torch.cuda (re-measure on a GPU)"
        else:
            torch.zeros(1, device="cuda")
            gpu = f"torch_alloc:N + torch_reserved:N of {torch.cuda.device_count()} GPU(s)"
    except ImportError:
        pass
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_cell("%load_ext memprobe")
    ext = current(shell)
    assert ext is not None
    print(f"IPython shell, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {args.cells} cells each")
    print(describe(memprobe))
    print(f"sources: {', '.join(ext._measured.names()) if ext._measured else '-'} ({gpu})")
    print(f"\n{'hook per cell (pre + post, line printed)':<44} {'median':>9} {'p90':>9} {'p99':>9}")
    for label, code in (("empty cell", "pass"), ("cell allocating and freeing 64 MiB", "x = b'\\x01' * (64 << 20); del x")):
        ns = hook_costs(shell, code, args.cells if code == "pass" else max(1, args.cells // 10))
        print(f"{label:<44} {pct(ns, 0.5):7.1f}us {pct(ns, 0.9):7.1f}us {pct(ns, 0.99):7.1f}us")
    off: List[int] = []
    on: List[int] = []
    for _ in range(5):
        off += run_cell_ns(shell, False, args.cells // 5)
        on += run_cell_ns(shell, True, args.cells // 5)
    print(f"\nrun_cell('pass'), median: without the hook {statistics.median(off) / 1e3:.1f}us, "
          f"with it {statistics.median(on) / 1e3:.1f}us")


if __name__ == "__main__":
    main()
