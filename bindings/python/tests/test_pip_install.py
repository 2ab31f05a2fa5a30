"""`pip install ./bindings/python` builds and installs a working package,
with a bundled copy of the library when one is placed in memprobe/_lib/."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import PKG, run_python


def build_backend_ok() -> bool:
    """setuptools >= 61 (pyproject metadata), and wheel before setuptools 70.1."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(x) for x in setuptools.__version__.split(".")[:2] if x.isdigit())
    if version < (61, 0):
        return False
    if version < (70, 1):
        try:
            import wheel  # noqa: F401
        except ImportError:
            return False
    return True


@pytest.mark.skipif(
    not build_backend_ok(),
    reason="pip install --no-build-isolation needs setuptools >= 61 (and wheel before "
    "setuptools 70.1) in this Python; .ci/run installs them",
)
@pytest.mark.parametrize("bundle", [False, True], ids=["plain", "bundled"])
def test_pip_install_into_a_target(tmp_path, library_path, bundle):
    src = tmp_path / "src"
    shutil.copytree(
        PKG,
        src,
        ignore=shutil.ignore_patterns(
            "__pycache__", "libmemprobe.so*", "build", "*.egg-info", ".pytest_cache", "tests", "bench"
        ),
    )
    if bundle:
        shutil.copy(library_path, src / "memprobe" / "_lib" / "libmemprobe.so")
    target = tmp_path / "site"
    r = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
            "--no-build-isolation", "--no-index", "--disable-pip-version-check",
            "--target", str(target), str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    installed = target / "memprobe"
    assert (installed / "integrations" / "lightning.py").exists()
    assert (installed / "py.typed").exists()
    assert (installed / "_lib" / "libmemprobe.so").exists() == bundle
    env = {"PYTHONPATH": str(target), "LD_LIBRARY_PATH": None}
    if bundle:
        env["MEMPROBE_LIBRARY"] = None
    code = (
        "import memprobe\n"
        "s = memprobe.Source.process()\n"
        "print(memprobe.__version__, memprobe.library_found_by(), s.read().used > 0)\n"
    )
    r = run_python(code, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    version, how, ok = r.stdout.split()
    assert version == __import__("memprobe").__version__ and ok == "True"
    assert how == ("bundled" if bundle else "MEMPROBE_LIBRARY")
