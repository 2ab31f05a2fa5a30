"""The notebook extension's out-of-memory report: each measured cell is a
phase of the extension's tracker, so a CUDA allocation that fails in a
cell (over the scripted torch.cuda) is reported with that cell open, its
peak so far, and the cells before it."""

from __future__ import annotations

from test_notebook import cuda, lines, run, shell  # noqa: F401  (fixtures)
from test_oom import read

GiB = 1 << 30


def test_an_oom_in_a_cell_names_the_cell_and_the_cells_before_it(shell, capsys, cuda, tmp_path):  # noqa: F811
    from memprobe.notebook import current

    cuda.up = True  # CUDA initialised before the extension: GPU sources from the start
    run(shell, capsys, "%load_ext memprobe")
    path = tmp_path / "oom.json"
    current(shell).set_oom_report(path)
    for _ in range(2):
        run(shell, capsys, "fake_cuda.alloc(1 << 30)\nfake_cuda.free(1 << 30)")
    result, out = run(shell, capsys, "fake_cuda.alloc(3 << 30)\nfake_cuda.oom(20 << 30)")
    assert not result.success and type(result.error_in_exec).__name__ == "OutOfMemoryError"
    assert len(lines(out)) == 1  # the failing cell still gets its line

    doc = read(path)
    assert doc["failed_allocation"]["reported_by"] == "torch"
    opened = [(p["kind"], p["name"], p["index"]) for p in doc["open_phases"]["phases"]]
    assert opened == [("custom", "cell", 2)]
    peak = {s["name"]: s["peak"] for s in doc["open_phases"]["phases"][0]["sources"]}
    assert peak["torch_alloc:0"] == 3 * GiB
    ended = [(r["phase"]["name"], r["phase"]["index"]) for r in doc["ended_phases"]["phases"]]
    assert ended == [("cell", 0), ("cell", 1)]
    assert current(shell).tracker.oom_status().reports_written == 1
