"""The package as a user installs it, from a clean clone of the repository:

``pip install ./bindings/python`` into a fresh virtual environment builds
libmemprobe and the ``memprobe`` command into it (no MEMPROBE_LIBRARY, no
installed prefix, no other step). test_wheels.py does the same with the
wheels of ``make wheel`` (and reuses the helpers here).

Only committed files are in a clone. The release build of the Rust crates
is shared through CARGO_TARGET_DIR (default: this repository's target/), so
the installs and ``make test`` build it once, when the checkout is its last
commit (as in CI). A checkout with changes builds the clone under
``<target>/clone`` instead: the clone's artifacts are the commit's, and
cargo, which compares times rather than contents, would take them for the
checkout's own (a later build or bench of the checkout would run them). Without git, cargo or network
access to PyPI (the build backend) these tests skip, except in CI (CI=true),
where they fail.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest
from conftest import MiB, ROOT, require

BUILD_TIMEOUT = 1800  # a release build from scratch on two cores


@functools.lru_cache(maxsize=None)
def checkout_differs_from_head() -> bool:
    """Whether the checkout has changes a clone lacks (tracked or not;
    ignored files aside). Unknown (no git answer) counts as changed."""
    r = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return r.returncode != 0 or bool(r.stdout.strip())


def clone_target_dir() -> str:
    """Where a clone's cargo builds go (see the module's docstring)."""
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return str(target / "clone" if checkout_differs_from_head() else target)


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a new user: no MEMPROBE_LIBRARY, no library path,
    no virtual environment of ours, the release build shared."""
    env = {k: v for k, v in os.environ.items() if k not in ("MEMPROBE_LIBRARY", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONPATH")}
    env["CARGO_TARGET_DIR"] = clone_target_dir()
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra or {})
    return env


def run(cmd, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    require(shutil.which("git") is not None, "git is not installed")
    require(shutil.which("cargo") is not None, "cargo is not installed")
    require((ROOT / ".git").exists(), f"{ROOT} is not a git checkout")
    dest = tmp_path_factory.mktemp("clone") / "memprobe"
    run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest)], cwd=None, env=clean_env())
    return dest


def fresh_venv(where: Path) -> Path:
    run([sys.executable, "-m", "venv", str(where)], cwd=None, env=clean_env())
    return where / "bin"


def check_installed(bin_dir: Path, cwd: Path) -> None:
    """What a user does next: import, read a source, run under `memprobe run`."""
    env = clean_env({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    code = (
        "import json, memprobe\n"
        "s = memprobe.Source.process()\n"
        "print(json.dumps({'how': memprobe.library_found_by(), 'path': memprobe.library_path(),\n"
        "  'used': s.read().used, 'version': memprobe.__version__}))\n"
    )
    # Run from an unrelated directory: the installed package, not the clone's.
    r = run(["python", "-c", code], cwd=str(cwd), env=env)
    info = json.loads(r.stdout)
    assert info["how"] == "bundled", info
    site = Path(info["path"]).resolve()
    assert site.name == "libmemprobe.abi3.so" and site.parent.name == "_lib", info
    assert str(site).startswith(str(bin_dir.parent.resolve())), info
    assert info["used"] > 1 * MiB

    memprobe_cmd = shutil.which("memprobe", path=env["PATH"])
    assert memprobe_cmd is not None and Path(memprobe_cmd).parent == bin_dir
    out = cwd / "run.json"
    child = "b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); print('trained')"
    r = run(["memprobe", "run", "--json", str(out), "--", "python", "-c", child], cwd=str(cwd), env=env)
    assert r.stdout.strip() == "trained"
    summary = json.loads(out.read_text())
    assert summary["exit"]["code"] == 0
    assert summary["peak_process"]["peak_rss_bytes"] >= 96 * MiB

    # The GPU interposer comes with the package: the venv's `memprobe`
    # finds it with nothing set, and the package names it for LD_PRELOAD.
    r = run(["python", "-c", "import memprobe; print(memprobe.interposer_library())"], cwd=str(cwd), env=env)
    interposer = Path(r.stdout.strip())
    assert interposer.name == "libmemprobe_interpose.abi3.so" and interposer.is_file(), r.stdout
    assert str(interposer.resolve()).startswith(str(bin_dir.parent.resolve())), r.stdout
    out = cwd / "run-gpu-exact.json"
    r = run(["memprobe", "run", "--gpu-exact", "--json", str(out), "--", "python", "-c", "print('counted')"],
            cwd=str(cwd), env=env)
    assert r.stdout.strip() == "counted", r.stdout + r.stderr
    summary = json.loads(out.read_text())
    assert summary["exit"]["code"] == 0
    assert summary["gpu_exact"]["library"] == str(interposer.resolve()), summary["gpu_exact"]


def test_pip_install_from_a_clean_clone(clone, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv")
    r = run(
        [str(bin_dir / "python"), "-m", "pip", "install", "./bindings/python"],
        cwd=str(clone),
        env=clean_env(),
        timeout=BUILD_TIMEOUT,
    )
    assert "Successfully installed memprobe" in r.stdout
    check_installed(bin_dir, tmp_path)
