"""fastai's helpers on a machine without a GPU follow fastai: zeros, no
exception, one note. fastai's own ``GPUMemTrace`` reads
``gpu_mem_get_used_no_cache()``, 0 on a CPU, and reports ``0 0``; its
``gpu_mem_get()`` returns ``GPUMemory(0, 0, 0)``.

Each scenario runs in a fresh interpreter with ``MEMPROBE_GPU_BACKEND=none``
(no GPU, whatever the machine has: the backend is chosen once per
process)."""

from __future__ import annotations

import json
import textwrap

from conftest import SITE, run_python

PROGRAM = textwrap.dedent(
    """
    import io, json, warnings
    import memprobe
    from memprobe.gpu import GPUMemTrace, NoGPUWarning, gpu_mem_get, gpu_mem_trace

    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf = io.StringIO()
        with GPUMemTrace(ctx="fit", file=buf) as t:
            held = bytearray(64 << 20)          # host memory: not the GPU's
        out["line"] = buf.getvalue()
        out["data"] = list(t.data())
        out["data_mb"] = list(t.data_mb())
        out["measure"] = [t.measure().used_start, t.measure().peak, t.measure().used_end]
        t.close()

        deco_buf = io.StringIO()

        @gpu_mem_trace
        def train_epoch():
            return "trained"

        import contextlib
        with contextlib.redirect_stdout(deco_buf):
            out["returned"] = train_epoch()
        out["deco_line"] = deco_buf.getvalue()
        out["mem"] = list(gpu_mem_get())
        out["notes"] = [str(w.message) for w in caught if issubclass(w.category, NoGPUWarning)]
        out["other_warnings"] = [str(w.message) for w in caught if not issubclass(w.category, NoGPUWarning)]
    print(json.dumps(out))
    """
)


def _run() -> dict:
    r = run_python(PROGRAM, env={"PYTHONPATH": str(SITE), "MEMPROBE_GPU_BACKEND": "none", "CUDA_VISIBLE_DEVICES": None})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_gpumemtrace_without_a_gpu_reports_zeros_as_fastai_does():
    out = _run()
    assert out["line"] == "△Used Peaked MB:      0      0 (fit: exit)\n"
    assert out["data"] == [0, 0]
    assert out["data_mb"] == [0, 0]
    assert out["measure"] == [0, 0, 0]
    assert out["mem"] == [0, 0, 0]


def test_the_decorator_runs_the_function_and_reports_zeros():
    out = _run()
    assert out["returned"] == "trained"
    assert out["deco_line"] == "△Used Peaked MB:      0      0 (train_epoch: exit)\n"


def test_one_note_per_process_naming_the_reason():
    out = _run()
    # Two traces made, one note: the reason, and what is reported instead.
    assert len(out["notes"]) == 1, out["notes"]
    assert "no GPU" in out["notes"][0] and "zeros" in out["notes"][0], out["notes"][0]
    assert out["other_warnings"] == []
