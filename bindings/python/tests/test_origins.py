"""memprobe.origins: who holds this process's GPU memory, read through the
C ABI. Without the interposer the calls say so; under it (with the fake
driver of tests/fake-gpu) the bytes a ctypes caller allocated are named by
their origin, now and at the peak, to the byte."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import require, run_python

import memprobe
from memprobe import origins

# The child imports the same package the tests do.
SITE = str(Path(memprobe.__file__).resolve().parent.parent)
from memprobe.errors import InvalidIdError, UnavailableError

ROOT = Path(__file__).resolve().parents[3]


def test_bad_devices_and_a_missing_interposer_are_errors():
    for bad in (64, -2, 1 << 30):
        with pytest.raises(InvalidIdError):
            origins.live(bad)
        with pytest.raises(InvalidIdError):
            origins.at_peak(bad)
    # pytest itself runs without the interposer.
    with pytest.raises(UnavailableError, match="interposer"):
        origins.live(0)
    with pytest.raises(UnavailableError):
        origins.at_peak(origins.HOST_PINNED)
    with pytest.raises(UnavailableError, match="interposer"):
        origins.at_oom()


def _interposer() -> str | None:
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    libdir = os.path.dirname(memprobe.library_path())
    for d in (libdir, os.path.join(target, "debug"), os.path.join(target, "release")):
        p = os.path.join(d, "libmemprobe_interpose.so")
        if os.path.exists(p):
            return p
    return None


CHILD = r"""
import ctypes, json
from ctypes import byref, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
a, b = c_uint64(), c_uint64()
assert cu.cuMemAlloc_v2(byref(a), 3 << 20) == 0
assert cu.cuMemAlloc_v2(byref(b), 5 << 20) == 0
assert cu.cuMemFree_v2(b) == 0
from memprobe import origins
before_oom = origins.at_oom()
c = c_uint64()
# Past the fake device's memory (FAKE_CUDA_MEMORY): out of memory (2).
assert cu.cuMemAlloc_v2(byref(c), ctypes.c_size_t(1 << 40)) == 2
oom = origins.at_oom()
live = origins.live(0)
peak = origins.at_peak(0)
print(json.dumps({
    "live": [(o.library, o.bytes) for o in live],
    "program": [o.program for o in live],
    "peak": peak.peak,
    "at_peak": [(o.library, o.bytes) for o in peak.by_origin],
    "pinned": len(origins.live(origins.HOST_PINNED)),
    "before_oom": before_oom,
    "oom": [oom.device, oom.held, oom.at_ns > 0, [(o.library, o.bytes) for o in oom.by_origin]],
}))
"""


def test_under_the_interposer_the_caller_holds_its_bytes(tmp_path):
    interposer = _interposer()
    require(interposer is not None, "libmemprobe_interpose.so is not built (cargo build -p memprobe-interpose-preload)")
    fake = tmp_path / "libcuda.so.1"
    cc = subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic",
         str(ROOT / "tests/fake-gpu/fake_cuda.c"), "-o", str(fake), "-lpthread"],
        capture_output=True, text=True,
    )
    require(cc.returncode == 0, f"cannot build the fake driver: {cc.stderr}")
    r = run_python(CHILD, env={
        "LD_PRELOAD": interposer,
        "LD_LIBRARY_PATH": str(tmp_path),
        "MEMPROBE_GPU_EXACT_DIR": str(tmp_path / "regions"),
        "MEMPROBE_GPU_EXACT": None,
        "PYTHONPATH": SITE,
        "MEMPROBE_GPU_ORIGINS": None,
    })
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # One caller (ctypes' foreign-call library), 3 MiB now, 8 MiB at the peak.
    assert len(out["live"]) == 1, out
    library, held = out["live"][0]
    assert held == 3 << 20
    assert library and "libcuda" not in library and "memprobe_interpose" not in library
    assert out["peak"] == 8 << 20
    assert out["at_peak"] == [[library, 8 << 20]]
    assert out["pinned"] == 0
    # ctypes' library is not the program (the interpreter).
    assert out["program"] == [False]
    # Nothing failed, then one allocation failed on device 0 holding 3 MiB.
    assert out["before_oom"] is None
    assert out["oom"] == [0, 3 << 20, True, [[library, 3 << 20]]]
