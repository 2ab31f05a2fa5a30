"""The notebook extension in a real Jupyter kernel: a notebook executed by
nbclient on an ipykernel (this interpreter, with the memprobe package
under test importable) whose output cells must carry the per-cell lines,
the ``%%memprobe`` table, and none after ``%memprobe off``. The kernel is
local (ZeroMQ over the loopback interface); nothing is downloaded."""

from __future__ import annotations

import json
import os
import sys

from conftest import SITE, require_module

import memprobe
from test_notebook import lines, num

CELLS = [
    "import memprobe, sys\nprint(memprobe.__file__)",
    "%load_ext memprobe",
    "x = b'\\x01' * (256 << 20)\ndel x",
    "kept = b'\\x02' * (64 << 20)",
    "%%memprobe\nz = b'\\x01' * (96 << 20)\ndel z",
    "%memprobe off",
    "after_off = 1",
]


def kernel_spec(tmp_path) -> str:
    """A kernelspec in tmp_path running this interpreter's ipykernel with
    the package under test first on its path (as ``make test`` installs
    it) and the same library."""
    spec = tmp_path / "kernels" / "memprobe-test"
    spec.mkdir(parents=True)
    env = {
        "PYTHONPATH": os.pathsep.join([str(SITE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "MEMPROBE_LIBRARY": memprobe.library_path(),
        "IPYTHONDIR": str(tmp_path / "ipython"),
    }
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "memprobe test",
                "language": "python",
                "env": env,
            }
        )
    )
    return str(tmp_path / "kernels")


def text_of(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            out.append(f"{o.get('ename')}: {o.get('evalue')}")
    return "".join(out)


def test_a_notebook_run_by_a_real_kernel_carries_the_lines(tmp_path, monkeypatch):
    require_module("ipykernel", "ipykernel")
    nbformat = require_module("nbformat", "nbformat")
    nbclient = require_module("nbclient", "nbclient")
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))  # connection files
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    km = KernelManager(
        kernel_name="memprobe-test",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[kernel_spec(tmp_path)]),
    )
    nbclient.NotebookClient(nb, km=km, timeout=180, allow_errors=False).execute()
    texts = [text_of(c) for c in nb.cells]

    assert texts[0].strip() == str(SITE / "memprobe" / "__init__.py")  # the package under test
    assert lines(texts[1]) == []  # the loading cell is not measured
    (cpu, gpus, _), = lines(texts[2])
    assert cpu[1] >= 248 and abs(cpu[0]) < 16  # the 256 MiB spike, freed
    assert gpus == {"": (0, 0, 0)}  # no CUDA in the kernel
    (cpu, _, _), = lines(texts[3])
    assert cpu[0] >= 63  # kept
    table = texts[4]
    assert "･ memprobe: this cell" in table and len(lines(table)) == 1
    rss = next(r.split() for r in table.splitlines() if r.strip().startswith("rss "))
    assert num(rss[2]) >= 94 and rss[-1] == "exact"
    assert lines(texts[5]) == [] and lines(texts[6]) == []  # off
    # The kernel's stdout went to the cells, not elsewhere.
    assert all(o.get("name", "stdout") == "stdout" for c in nb.cells for o in c.get("outputs", []))
