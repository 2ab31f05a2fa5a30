"""GPUs through the real library against the fake NVML of tests/fake-gpu
(compiled here), one fresh interpreter per scenario: the GPU backend is
chosen once per process."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import pytest
from conftest import PKG, ROOT, run_python, SITE

import memprobe

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="session")
def fake_nvml_build(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the fake NVML (tests/fake-gpu/fake_nvml.c)")
    out = tmp_path_factory.mktemp("fake-nvml") / "libnvidia-ml.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(out),
         str(ROOT / "tests" / "fake-gpu" / "fake_nvml.c"), "-lpthread"],
        check=True,
    )
    return out


@pytest.fixture
def fake_nvml(tmp_path, fake_nvml_build):
    """Stages a fake NVML with a script; returns the library's path."""

    def stage(script: str):
        lib = tmp_path / "libnvidia-ml.so.1"
        shutil.copy(fake_nvml_build, lib)
        (tmp_path / "fake_nvml.script").write_text(textwrap.dedent(script))
        return lib

    return stage


def run_gpu(code: str, lib=None, backend: str = "nvml", **env) -> dict:
    """Runs ``code`` (which sets ``out``) in a fresh interpreter; returns ``out``."""
    full = {"PYTHONPATH": str(SITE), "MEMPROBE_GPU_BACKEND": backend, "CUDA_VISIBLE_DEVICES": None}
    if lib is not None:
        full["MEMPROBE_NVML_LIBRARY"] = str(lib)
    full.update(env)
    prog = "import json, memprobe\nfrom memprobe import gpu\nout = {}\n" + textwrap.dedent(code)
    prog += "\nprint(json.dumps(out))\n"
    r = run_python(prog, env=full)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_no_gpu_answers_like_fastai():
    out = run_gpu(
        """
        out["get"] = list(gpu.gpu_mem_get())
        out["all"] = gpu.gpu_mem_get_all()
        out["max"] = list(gpu.gpu_with_max_free_mem())
        out["free"] = gpu.gpu_mem_get_free()
        out["used"] = gpu.gpu_mem_get_used()
        out["count"] = gpu.count()
        out["backend"] = gpu.backend().name
        try:
            gpu.memory()
        except memprobe.UnavailableError as e:
            out["error"] = e.status.name
        """,
        backend="none",
    )
    assert out == {
        "get": [0, 0, 0],
        "all": [],
        "max": [None, 0],
        "free": 0,
        "used": 0,
        "count": 0,
        "backend": "NONE",
        "error": "UNAVAILABLE",
    }


def test_missing_nvml_is_unavailable(tmp_path):
    out = run_gpu(
        """
        out["get"] = list(gpu.gpu_mem_get(0))
        out["count"] = gpu.count()
        """,
        lib=tmp_path / "absent" / "libnvidia-ml.so.1",
        backend="auto",
    )
    assert out == {"get": [0, 0, 0], "count": 0}


def test_fastai_readings_in_mib(fake_nvml):
    lib = fake_nvml(
        f"""
        device 0 name Fake GPU A
        device 0 total {16 * GIB}
        device 0 used {2 * GIB}
        device 1 total {8 * GIB}
        device 1 used {1 * GIB}
        device 1 reserved {256 * MIB}
        """
    )
    out = run_gpu(
        """
        out["count"] = gpu.count()
        out["get0"] = list(gpu.gpu_mem_get(0))
        out["get1"] = list(gpu.gpu_mem_get(1))
        out["current"] = list(gpu.gpu_mem_get())
        out["bad"] = list(gpu.gpu_mem_get(7))
        out["all"] = [list(m) for m in gpu.gpu_mem_get_all()]
        out["max"] = list(gpu.gpu_with_max_free_mem())
        out["free"] = gpu.gpu_mem_get_free()
        out["used"] = gpu.gpu_mem_get_used()
        m = gpu.memory(1)
        out["bytes1"] = [m.total, m.free, m.used, m.reserved]
        out["info0"] = [gpu.info(0).name, gpu.info(0).uuid is not None, gpu.info(0).backend.name]
        try:
            gpu.memory(7)
        except memprobe.InvalidIdError as e:
            out["bad_error"] = e.status.name
        gpu.set_current_device(1)
        out["current1"] = gpu.current_device()
        out["free1"] = gpu.gpu_mem_get_free()
        with gpu.Device(0) as d:
            out["fast"] = gpu.gpu_mem_get_used_fast(d)
            out["dev_used"] = d.memory().used
            out["live"] = gpu.live_devices()
        out["live_after"] = gpu.live_devices()
        """,
        lib=lib,
    )
    assert out["count"] == 2
    assert out["get0"] == [16384, 14336, 2048]
    assert out["current"] == out["get0"]
    assert out["bad"] == [0, 0, 0] and out["bad_error"] == "INVALID_ID"
    assert out["get1"] == [8192, 8192 - 1024 - 256, 1024]
    assert out["all"] == [out["get0"], out["get1"]]
    assert out["max"] == [0, 14336]
    assert out["free"] == 14336 and out["used"] == 2048
    assert out["bytes1"] == [8 * GIB, 8 * GIB - GIB - 256 * MIB, GIB, 256 * MIB]
    assert out["info0"] == ["Fake GPU A", True, "NVML"]
    assert out["current1"] == 1 and out["free1"] == 8192 - 1024 - 256
    assert out["fast"] == 2048 and out["dev_used"] == 2 * GIB
    assert out["live"] == 1 and out["live_after"] == 0


def test_no_cache_readings_call_the_release(fake_nvml):
    lib = fake_nvml(f"device 0 total {16 * GIB}\ndevice 0 used {GIB}\n")
    out = run_gpu(
        """
        calls = []
        gpu.set_cache_release(lambda: calls.append(1))
        out["free"] = gpu.gpu_mem_get_free_no_cache()
        out["used"] = gpu.gpu_mem_get_used_no_cache()
        out["plain"] = gpu.gpu_mem_get_free()
        out["calls"] = len(calls)
        gpu.set_cache_release(None)
        gpu.gpu_mem_get_free_no_cache()
        out["calls_after"] = len(calls)
        def broken():
            raise RuntimeError("no")
        gpu.set_cache_release(broken)
        out["broken_fastai"] = gpu.gpu_mem_get_free_no_cache()
        try:
            gpu._bytes_reading(memprobe._ffi.C.memprobe_gpu_mem_get_free_no_cache)
        except memprobe.UnavailableError as e:
            out["broken_status"] = e.status.name
        gpu.set_cache_release(None)
        """,
        lib=lib,
    )
    assert out["free"] == 15 * 1024 and out["used"] == 1024 and out["plain"] == 15 * 1024
    assert out["calls"] == 2 and out["calls_after"] == 2
    assert out["broken_fastai"] == 0 and out["broken_status"] == "UNAVAILABLE"


def test_gpu_source_in_a_window_sees_a_spike(fake_nvml):
    lib = fake_nvml(
        f"""
        device 0 total {16 * GIB}
        device 0 timeline 0:{GIB} 20:{9 * GIB} 30:{GIB}
        device 0 period_ms 40
        device 0 procs self:{512 * MIB}
        """
    )
    # A 10 ms spike every 40 ms: the monitor (2 ms interval) catches one;
    # the loop waits for it up to a deadline instead of a fixed sleep.
    out = run_gpu(
        """
        import time
        memprobe.monitor.set_interval(0.002)
        src = memprobe.Source.gpu_device(0)
        proc = memprobe.Source.gpu_process(0)
        out["kinds"] = [src.kind.name, proc.kind.name, src.fidelity.name, src.name, proc.name]
        with memprobe.Window([src, proc]) as w:
            deadline = time.monotonic() + 20
            while w.peak(0) < (9 << 30) and time.monotonic() < deadline:
                time.sleep(0.005)
            out["peak"] = w.peak(0)
            out["proc"] = proc.read().used
        out["last_error"] = src.last_error()
        """,
        lib=lib,
    )
    assert out["kinds"] == ["GPU_DEVICE", "GPU_PROCESS", "SAMPLED", "gpu0", "gpu0.proc"]
    assert out["peak"] == 9 * GIB
    assert out["proc"] == 512 * MIB
    assert out["last_error"] is None


def test_lost_gpu(fake_nvml):
    lib = fake_nvml(f"device 0 total {16 * GIB}\ndevice 0 used {GIB}\ndevice 0 lost_at 3\n")
    out = run_gpu(
        """
        src = memprobe.Source.gpu_device(0)
        errors = []
        for _ in range(4):
            try:
                src.read()
            except memprobe.GpuLostError as e:
                errors.append(e.status.name)
        out["errors"] = errors
        err = src.last_error()
        out["last"] = [type(err).__name__, err.status.name]
        out["fastai"] = list(gpu.gpu_mem_get(0))
        """,
        lib=lib,
    )
    assert out["errors"] and set(out["errors"]) == {"GPU_LOST"}
    assert out["last"] == ["GpuLostError", "GPU_LOST"]
    assert out["fastai"] == [0, 0, 0]  # fastai answers zeros for any failure


def test_gpu_mem_trace_reports(fake_nvml):
    lib = fake_nvml(f"device 0 total {16 * GIB}\ndevice 0 used {GIB} {3 * GIB} {2 * GIB}\n")
    out = run_gpu(
        """
        import io, contextlib
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            @gpu.gpu_mem_trace
            def some_func():
                return 1
            out["ret"] = some_func()
            with gpu.GPUMemTrace(ctx="ctx") as t:
                pass
        out["lines"] = buf.getvalue().splitlines()
        """,
        lib=lib,
    )
    assert out["ret"] == 1
    assert out["lines"][0].startswith("△Used Peaked MB:") and out["lines"][0].endswith("(some_func: exit)")
    assert out["lines"][1].endswith("(ctx: exit)")


def test_configure_after_use_is_wrong_order(fake_nvml):
    lib = fake_nvml("devices 1\n")
    out = run_gpu(
        f"""
        gpu.configure("nvml", nvml_path={str(lib)!r})
        out["count"] = gpu.count()
        try:
            gpu.configure("none")
        except memprobe.WrongOrderError as e:
            out["again"] = e.status.name
        """,
        lib=None,
        backend="auto",
    )
    assert out == {"count": 1, "again": "WRONG_ORDER"}


def test_in_process_gpu_calls_never_raise_for_no_gpu():
    # In this test process the machine decides: either a real GPU or none.
    n = memprobe.gpu.count()
    m = memprobe.gpu.gpu_mem_get()
    if n == 0:
        assert m == memprobe.gpu.GPUMemory(0, 0, 0)
        assert memprobe.gpu.gpu_with_max_free_mem() == (None, 0)
    else:
        assert m.total > 0 and m.used <= m.total
        with memprobe.gpu.Device(0) as d:
            # NVML v2's used excludes the driver's reservation: an idle GPU
            # reads 0 (seen on an H100).
            assert 0 <= d.used_fast() <= memprobe.gpu.memory(0).total
        with memprobe.Source.gpu_device(0) as src:
            s = src.read()
            assert s.total == memprobe.gpu.memory(0).total and s.free is not None
