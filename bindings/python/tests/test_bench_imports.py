"""The benchmarks (bindings/python/bench/) measure the memprobe a user has:
the installed package after ``pip install ./bindings/python`` (whose library
is inside it), not the checkout's source tree, whose ``_lib/`` is empty;
without an installed package, the source tree with the library built in
``target/``; neither: a message saying what to do.

A checkout without a build is copied to a temporary directory; the
"installed" package is a copy of the package with the library in its
``_lib/``, as pip puts it, on ``PYTHONPATH``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest
from conftest import PKG, require_module

import memprobe


@pytest.fixture
def layout(tmp_path):
    """(checkout's bindings/python, site-packages with memprobe installed)."""
    tree = tmp_path / "clone" / "bindings" / "python"
    ignore = shutil.ignore_patterns("__pycache__", "*.so")
    shutil.copytree(PKG / "memprobe", tree / "memprobe", ignore=ignore)
    shutil.copytree(PKG / "bench", tree / "bench", ignore=ignore)
    (tree / "tests").mkdir()
    shutil.copy(PKG / "tests" / "fake_torch_cuda.py", tree / "tests")
    assert not list((tree / "memprobe" / "_lib").glob("libmemprobe*"))  # as in a clone
    site = tmp_path / "site"
    shutil.copytree(PKG / "memprobe", site / "memprobe", ignore=ignore)
    shutil.copy(memprobe.library_path(), site / "memprobe" / "_lib" / "libmemprobe.abi3.so")
    return tree, site


def bench(tree: Path, script: str, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("MEMPROBE_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, str(tree / "bench" / script), *args],
        cwd=str(tree.parent.parent.parent),
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def header(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return next(line for line in r.stdout.splitlines() if "memprobe 0." in line)


def test_benchmarks_measure_the_installed_package(layout):
    require_module("psutil", "psutil")
    tree, site = layout
    line = header(bench(tree, "bench_rss.py", "--rounds", "1", "--calls", "50", env={"PYTHONPATH": str(site)}))
    assert f"({site / 'memprobe'}, {site / 'memprobe' / '_lib' / 'libmemprobe.abi3.so'})" in line, line


def test_torch_benchmarks_measure_the_installed_package(layout):
    require_module("torch", "torch")
    tree, site = layout
    r = bench(tree, "bench_torch_marks.py", "--fake", "--rounds", "1", "--calls", "50", env={"PYTHONPATH": str(site)})
    assert f"({site / 'memprobe'}, " in header(r)
    require_module("lightning", "lightning")
    r = bench(tree, "bench_lightning.py", "--help", env={"PYTHONPATH": str(site)})  # imports, then argparse
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr
    r = bench(tree, "bench_lightning_hooks.py", "--help", env={"PYTHONPATH": str(site)})
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr
    r = bench(tree, "bench_lightning_parts.py", "--help", env={"PYTHONPATH": str(site)})
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr
    r = bench(tree, "bench_hf_hooks.py", "--help", env={"PYTHONPATH": str(site)})
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr
    require_module("IPython", "ipython")
    r = bench(tree, "bench_notebook.py", "--help", env={"PYTHONPATH": str(site)})
    assert r.returncode == 0 and "usage:" in r.stdout, r.stdout + r.stderr


def test_without_an_installed_package_the_checkouts_build(layout):
    require_module("psutil", "psutil")
    tree, _ = layout
    r = bench(tree, "bench_rss.py", "--rounds", "1", "--calls", "50")
    if r.returncode == 0:  # a memprobe installed for this interpreter, or system-wide
        pytest.skip(f"memprobe is installed here: {header(r)}")
    assert "memprobe is neither installed nor usable from this checkout" in r.stderr, r.stderr
    assert "pip install ./bindings/python" in r.stderr and "cargo build --release -p memprobe-ffi" in r.stderr
    built = tree.parent.parent / "target" / "release"
    built.mkdir(parents=True)
    shutil.copy(memprobe.library_path(), built / "libmemprobe.so")
    line = header(bench(tree, "bench_rss.py", "--rounds", "1", "--calls", "50"))
    assert f"({tree / 'memprobe'}, {built / 'libmemprobe.so'})" in line, line
