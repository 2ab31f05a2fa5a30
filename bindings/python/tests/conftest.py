"""Test setup: every test goes through the real libmemprobe.so.

The library is the one named by MEMPROBE_LIBRARY (``make test`` sets it);
when unset, a build in the repository's target/ directory is used.
"""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PKG = HERE.parent
ROOT = PKG.parent.parent
MiB = 1 << 20

if not os.environ.get("MEMPROBE_LIBRARY"):
    for profile in ("release", "debug"):
        cand = ROOT / "target" / profile / "libmemprobe.so"
        if cand.exists():
            os.environ["MEMPROBE_LIBRARY"] = str(cand)
            break

#: Where the package under test is imported from: `make test` installs it
#: (``pip install --target``, the Rust parts built and bundled as for a user)
#: and names that folder in MEMPROBE_PYTHON_SITE, so the tests exercise what
#: an install gives; without it (a developer's quick run), the source tree.
SITE = Path(os.environ["MEMPROBE_PYTHON_SITE"]) if os.environ.get("MEMPROBE_PYTHON_SITE") else PKG
if not (SITE / "memprobe" / "__init__.py").exists():
    raise RuntimeError(f"MEMPROBE_PYTHON_SITE={SITE} holds no memprobe package")
sys.path.insert(0, str(SITE))

import memprobe  # noqa: E402  (after the library is chosen)

if Path(memprobe.__file__).resolve().parent.parent != SITE.resolve():
    raise RuntimeError(f"memprobe was imported from {memprobe.__file__}, not from {SITE}")


#: CI sets CI=true: there a missing framework or tool fails the test that
#: needs it instead of skipping it (only a missing GPU may skip).
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


def require(ok: bool, reason: str) -> None:
    """Skips the test when ``ok`` is false, or fails it in CI."""
    if not ok:
        if IN_CI:
            pytest.fail(f"{reason}: required in CI (CI=true); .ci/run installs it")
        pytest.skip(reason)


def require_module(name: str, install: str):
    """Imports ``name`` (a framework): skipped when missing, failed in CI."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as e:
        require(False, f"{name} is not installed ({e}); pip install {install}")


def lightning():
    """``lightning.pytorch`` (or the older ``pytorch_lightning``), with torch:
    skipped when missing, failed in CI."""
    require_module("torch", "torch")
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = require_module("pytorch_lightning", "lightning")
    return pl


def tiny_lightning_module(validation: bool = True):
    """A LightningModule class with one linear layer over 4 features, whose
    loss is its output's sum (and a validation step, unless asked not to)."""
    pl = lightning()
    import torch

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.layer(x).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    if validation:

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            return self.layer(x).sum()

        Tiny.validation_step = validation_step
    return Tiny


def _touched(nbytes: int, fill: int) -> mmap.mmap:
    """A fresh anonymous mapping, every page written. Not Python's heap:
    after earlier tests freed large buffers, malloc may hand out pages that
    are already resident, and the RSS would not move."""
    m = mmap.mmap(-1, nbytes)
    page = bytes([fill]) * mmap.PAGESIZE
    for off in range(0, nbytes, mmap.PAGESIZE):
        m[off : off + min(mmap.PAGESIZE, nbytes - off)] = page[: min(mmap.PAGESIZE, nbytes - off)]
    return m


def spike(nbytes: int) -> None:
    """Touches ``nbytes`` of fresh memory, then frees it: a short RSS spike."""
    _touched(nbytes, 1).close()


def keep(nbytes: int) -> mmap.mmap:
    """Touched memory that stays while the result is referenced."""
    return _touched(nbytes, 2)


def run_python(code: str, env: dict = None, cwd: str = None) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (for import-time behaviour)."""
    full_env = dict(os.environ)
    if env is not None:
        full_env.update(env)
        for k, v in env.items():
            if v is None:
                full_env.pop(k, None)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def rss():
    s = memprobe.Source.process()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def no_leaked_handles():
    """Every test leaves the library's handle counts as it found them."""
    gc.collect()
    before = memprobe.live_handles()
    yield
    gc.collect()
    after = memprobe.live_handles()
    assert after == before, f"live handles (sources, windows, traces) {before} -> {after}"


@pytest.fixture
def torch_fake_cuda(monkeypatch, tmp_path):
    """torch's CUDA allocator faked (fake_torch_cuda.FakeCuda, installed),
    attribution records under tmp_path/attribution, no RANK."""
    require_module("torch", "torch")
    from fake_torch_cuda import FakeCuda

    cuda = FakeCuda()
    cuda.install(monkeypatch)
    monkeypatch.setenv("MEMPROBE_ATTRIBUTION_DIR", str(tmp_path / "attribution"))
    monkeypatch.delenv("RANK", raising=False)
    return cuda


@pytest.fixture
def library_path() -> str:
    return memprobe.library_path()
