"""Out-of-memory reports from Python: the tracker's API (destinations, one
report per arming, wrong orders), PyTorch's out-of-memory observer over a
scripted torch.cuda (no GPU in CI), the Lightning callback's ``oom_report``;
every report checked against docs/oom-report.schema.json."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess

import pytest
from conftest import PKG, ROOT, MiB, lightning, require, require_module, run_python, SITE
from fake_torch_cuda import FakeCuda
from schema_check import assert_valid, check, load

import memprobe
from memprobe import OomCache, Source, Tracker

GiB = 1 << 30
SCHEMA = "docs/oom-report.schema.json"


def read(path) -> dict:
    doc = json.loads(open(path).read())
    assert_valid(SCHEMA, doc)
    return doc


@pytest.fixture
def alloc():
    s = Source.pushed("alloc")
    yield s
    s.close()


def test_the_schema_checker_can_fail():
    schema = load(SCHEMA)
    assert check(schema, {"format": "memprobe-oom-report"})  # fields missing
    with pytest.raises(ValueError):
        check({"pattern": "x"}, "x")


def test_one_report_per_arming_to_every_destination(tmp_path, alloc):
    path = tmp_path / "oom.json"
    got = []
    fd = os.open(tmp_path / "summary.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with Tracker([alloc]) as t:
            with pytest.raises(memprobe.WrongOrderError):
                t.report_oom(0, GiB)
            with pytest.raises(memprobe.WrongOrderError):
                t.oom_status()
            t.set_oom_report(path, summary_fd=fd, callback=lambda j, s: got.append((j, s)), keep_ended=2)
            with pytest.raises(memprobe.WrongOrderError):
                t.set_oom_report(path)
            st = t.oom_status()
            assert st.armed and st.caller and not st.driver and st.reports_written == 0
            assert not path.exists()
            with t.epoch():
                for i in range(4):
                    with t.step():
                        alloc.push((i + 1) * GiB)
                        alloc.push(MiB)
                t.begin("step")
                alloc.push(9 * GiB)
                t.report_oom(0, 2 * GiB, "CUDA out of memory. Tried to allocate 2.00 GiB")
                for _ in range(30):
                    t.report_oom(0, 2 * GiB, "retry")
                t.end("step")
            st = t.oom_status()
            assert (st.armed, st.reports_written, st.triggers_seen, st.later_triggers) == (False, 1, 31, 30)
            assert st.last_write_status == memprobe.Status.OK
            assert len(got) == 1
            doc = read(path)
            assert json.loads(got[0][0]) == doc
            assert doc["failed_allocation"]["detail"].startswith("CUDA out of memory")
            open_phases = doc["open_phases"]["phases"]
            assert [p["kind"] for p in open_phases] == ["epoch", "step"]
            assert open_phases[1]["index"] == 4
            assert open_phases[1]["sources"][0]["peak"] == 9 * GiB
            ended = doc["ended_phases"]
            assert ended["kept"] == 2 and ended["ended_total"] == 4
            assert [r["sources"][0]["peak"] for r in ended["phases"]] == [3 * GiB, 4 * GiB]
            assert "step #4" in got[0][1]
            # Re-armed: the file is settled with the burst, then replaced.
            t.rearm_oom_report()
            assert read(path)["later_triggers"]["count"] == 30
            t.report_oom(
                1,
                3 * GiB,
                reported_by="torch",
                device_total=80 * GiB,
                device_free=GiB,
                caches=[OomCache(1, reserved=70 * GiB, allocated=60 * GiB, releasable=4 * GiB), OomCache(0)],
            )
            doc = read(path)
            assert doc["reports_before"] == 1
            assert doc["failed_allocation"]["device_free_bytes"] == GiB
            caches = {c["device"]: c for c in doc["caches"]}
            assert caches[1]["releasable_bytes"] == 4 * GiB and caches[1]["framework"] == "torch"
            assert caches[0]["releasable_bytes"] is None and caches[0]["reserved_bytes"] is None
            t.clear_oom_report()
            t.clear_oom_report()
            with pytest.raises(memprobe.WrongOrderError):
                t.rearm_oom_report()
        assert "memprobe: out-of-memory report" in open(tmp_path / "summary.txt").read()
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oom.json", "summary.txt"]


def test_bad_configurations_are_refused_and_change_nothing(tmp_path, alloc):
    with Tracker([alloc]) as t:
        with pytest.raises(memprobe.InvalidArgumentError, match="destination"):
            t.set_oom_report()
        with pytest.raises(memprobe.InvalidArgumentError, match="trigger"):
            t.set_oom_report(tmp_path / "x.json", caller=False)
        with pytest.raises(memprobe.InvalidArgumentError):
            t.set_oom_report(tmp_path, caller=True)
        with pytest.raises(memprobe.UnavailableError):
            t.set_oom_report(tmp_path / "missing" / "x.json")
        with pytest.raises(memprobe.InvalidArgumentError):
            t.set_oom_report(fd=99999)
        # No interposer in this process: the driver's trigger says how to load it.
        with pytest.raises(memprobe.UnavailableError, match="LD_PRELOAD"):
            t.set_oom_report(tmp_path / "x.json", driver=True)
        with pytest.raises(memprobe.WrongOrderError):
            t.oom_status()
        t.set_oom_report(callback=lambda j, s: None)
        with pytest.raises(memprobe.InvalidIdError):
            t.report_oom(-2)
        with pytest.raises(memprobe.InvalidArgumentError):
            t.report_oom(0, 1, reported_by="")
        assert t.oom_status().triggers_seen == 0
    with pytest.raises(memprobe.InvalidHandleError):
        t.report_oom(0, 1)  # closed


def test_callback_exceptions_are_kept(alloc):
    def boom(json_text, summary):
        raise ValueError("callback failed")

    with Tracker([alloc]) as t:
        t.set_oom_report(callback=boom)
        t.report_oom(0, GiB)
        assert isinstance(t.callback_errors[0], ValueError)


# --- PyTorch -------------------------------------------------------------------


@pytest.fixture
def cuda(monkeypatch):
    require_module("torch", "torch")
    fake = FakeCuda(devices=2)
    fake.install(monkeypatch)
    yield fake
    gc.collect()


def test_torch_observer_writes_the_report_before_the_error(cuda, tmp_path):
    import torch

    from memprobe.integrations.torch import allocator_sources, report_oom

    path = tmp_path / "oom.json"
    srcs = allocator_sources()
    seen_file_in_observer = []

    # An observer attached after memprobe's sees the file already written.
    def after(device, alloc, total, free):
        seen_file_in_observer.append(path.exists())

    t = Tracker(srcs)
    assert report_oom(t, path=path) is t
    if after not in FakeCuda.observers:
        FakeCuda.observers.append(after)
    try:
        cuda.alloc(10 * GiB, device=1)
        cuda.split[1] = 512 * MiB
        with t.epoch():
            with t.step():
                cuda.alloc(GiB, device=1)
                cuda.free(GiB, device=1)
            t.begin("step")
            cuda.alloc(3 * GiB, device=1)
            cuda.free(2 * GiB, device=1)
            with pytest.raises(torch.cuda.OutOfMemoryError):
                cuda.oom(8 * GiB, device=1)
            t.end("step")
        assert seen_file_in_observer == [True]
        doc = read(path)
        failed = doc["failed_allocation"]
        assert (failed["reported_by"], failed["device"], failed["requested_bytes"]) == ("torch", 1, 8 * GiB)
        assert failed["device_total_bytes"] == 16 * GiB
        assert failed["device_free_bytes"] == 16 * GiB - 13 * GiB
        assert "tried to allocate 8589934592 bytes on cuda:1" in failed["detail"]
        step = doc["open_phases"]["phases"][1]
        peaks = {s["name"]: s["peak"] for s in step["sources"]}
        assert peaks["torch_alloc:1"] == 13 * GiB  # exact, from torch's own mark
        ended = doc["ended_phases"]["phases"][0]
        assert {s["name"]: s["peak"] for s in ended["sources"]}["torch_alloc:1"] == 11 * GiB
        caches = {c["device"]: c for c in doc["caches"]}
        # reserved - active - inactive split: what empty_cache() could return.
        assert caches[1]["reserved_bytes"] == 13 * GiB and caches[1]["allocated_bytes"] == 11 * GiB
        assert caches[1]["releasable_bytes"] == 2 * GiB - 512 * MiB
        assert caches[0]["releasable_bytes"] == 0
        # Torch retrying and failing again: counted, not written.
        with pytest.raises(torch.cuda.OutOfMemoryError):
            cuda.oom(8 * GiB, device=1)
        assert t.oom_status().later_triggers == 1
    finally:
        FakeCuda.observers.remove(after)
        t.close()
        srcs.close()
    # The observer stays (torch cannot detach it) and feeds nothing now.
    with pytest.raises(torch.cuda.OutOfMemoryError):
        cuda.oom(GiB)
    from memprobe.integrations.torch import _on_torch_oom

    assert FakeCuda.observers.count(_on_torch_oom) == 1


def test_the_observer_is_attached_once_for_every_tracker(cuda, tmp_path, alloc):
    import torch

    from memprobe.integrations.torch import _on_torch_oom, report_oom

    a, b = Tracker([alloc]), Tracker([alloc])
    try:
        report_oom(a, path=tmp_path / "a.json")
        report_oom(b, path=tmp_path / "b.json", keep_ended=1)
        assert FakeCuda.observers.count(_on_torch_oom) == 1
        b.clear_oom_report()  # its report is off: the observer skips it
        with pytest.raises(torch.cuda.OutOfMemoryError):
            cuda.oom(GiB)
        assert read(tmp_path / "a.json")["failed_allocation"]["reported_by"] == "torch"
        assert not (tmp_path / "b.json").exists()
    finally:
        a.close()
        b.close()


def test_report_oom_never_initialises_cuda():
    require_module("torch", "torch")
    code = (
        "import sys, tempfile, os, memprobe\n"
        "import memprobe.integrations.torch as mt\n"
        "import torch\n"
        "t = memprobe.Tracker()\n"
        "p = os.path.join(tempfile.mkdtemp(), 'oom.json')\n"
        "mt.report_oom(t, path=p)\n"
        "print('initialised', torch.cuda.is_initialized())\n"
        "print('queued', mt._OOM_OBSERVER['queued'], 'attached', mt._OOM_OBSERVER['attached'])\n"
        "t.report_oom(0, 1 << 30, 'by hand')\n"
        "print('written', os.path.exists(p))\n"
        "t.close()\n"
    )
    r = run_python(code, env={"PYTHONPATH": str(SITE)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["initialised", "False", "queued", "True", "attached", "False", "written", "True"]


# --- Lightning -----------------------------------------------------------------


def _fit(pl, tmp_path, cb, fail):
    import torch

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            if self.current_epoch == 1 and batch_idx == 2:
                fail()
            return self.layer(x).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(20, 4)), batch_size=4)
    trainer = pl.Trainer(
        max_epochs=3,
        callbacks=[cb],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        accelerator="cpu",
    )
    trainer.fit(Model(), data, data)


def test_lightning_callback_reports_the_oom_of_epoch_1_step_2(cuda, tmp_path):
    pl = lightning()
    import torch

    from memprobe.integrations.lightning import MemprobeCallback

    path = tmp_path / "oom.json"
    cb = MemprobeCallback(oom_report=path)

    def fail():
        cuda.alloc(5 * GiB)
        cuda.oom(20 * GiB)

    with pytest.raises(torch.cuda.OutOfMemoryError):
        _fit(pl, tmp_path, cb, fail)
    doc = read(path)
    assert doc["failed_allocation"]["reported_by"] == "torch"
    opened = [(p["kind"], p["name"], p["index"]) for p in doc["open_phases"]["phases"]]
    # Epoch 1 (the second), its step 2 (the 8th step overall: 5 + 2 + 1).
    assert opened == [("epoch", "epoch", 1), ("step", "step", 7)]
    names = [s["name"] for s in doc["sources"]]
    assert names[0] == "rss" and "torch_alloc:0" in names
    peak = {s["name"]: s["peak"] for s in doc["open_phases"]["phases"][1]["sources"]}
    assert peak["torch_alloc:0"] == 5 * GiB
    kinds = [r["phase"]["name"] for r in doc["ended_phases"]["phases"]]
    assert kinds[-1] == "step" and "validation" in kinds and len(kinds) == 8
    assert cb.tracker is None or cb.tracker.closed  # torn down


def test_lightning_on_exception_reports_an_oom_torch_did_not_see(cuda, tmp_path):
    pl = lightning()
    from memprobe.integrations.lightning import MemprobeCallback

    path = tmp_path / "oom.json"
    cb = MemprobeCallback(oom_report={"path": path, "keep_ended": 3}, torch_sources=False)

    def fail():
        raise RuntimeError("CUDA out of memory (raised by a custom kernel)")

    with pytest.raises(RuntimeError, match="out of memory"):
        _fit(pl, tmp_path, cb, fail)
    doc = read(path)
    failed = doc["failed_allocation"]
    assert failed["reported_by"] == "lightning"
    assert failed["detail"] == "RuntimeError: CUDA out of memory (raised by a custom kernel)"
    assert [p["kind"] for p in doc["open_phases"]["phases"]] == ["epoch", "step"]
    assert doc["ended_phases"]["kept"] == 3


# --- scripts/gpu-validate-oom.py's checks, on the fakes ---------------------------
#
# The script provokes real out-of-memory errors on a GPU; here the same
# checks run on reports made the same way over the fakes: PyTorch's observer
# over the scripted torch.cuda, and the driver's trigger through the
# interposer over the fake libcuda (tests/fake-gpu/fake_cuda.c), each in a
# fresh interpreter with the fake NVML listing this process.

FAKE_GPU = ROOT / "tests" / "fake-gpu"
PROCESS_BYTES = 6 * GiB


def _validation_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_validate_oom", ROOT / "scripts" / "gpu-validate-oom.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cc(out, source, *flags):
    cc = shutil.which("cc") or shutil.which("gcc")
    require(cc is not None, "a C compiler is needed to build the fake GPU libraries")
    subprocess.run([cc, "-shared", "-fPIC", *flags, "-o", str(out), str(FAKE_GPU / source), "-lpthread"], check=True)


@pytest.fixture
def fake_gpu_env(tmp_path):
    nvml = tmp_path / "nvml" / "libnvidia-ml.so.1"
    nvml.parent.mkdir()
    _cc(nvml, "fake_nvml.c", "-Wall", "-Wextra", "-Werror")
    (nvml.parent / "fake_nvml.script").write_text(
        f"device 0 name Fake GPU\ndevice 0 total {16 * GiB}\ndevice 0 used {9 * GiB}\n"
        f"device 0 procs self:{PROCESS_BYTES} 4242:{GiB}\n"
    )
    return {
        "PYTHONPATH": os.pathsep.join([str(SITE), str(PKG / "tests")]),
        "MEMPROBE_NVML_LIBRARY": str(nvml),
        "MEMPROBE_GPU_BACKEND": "nvml",
        "CUDA_VISIBLE_DEVICES": None,
        "OOM_DIR": str(tmp_path),
    }


def _interposer():
    """libmemprobe_interpose.so: beside the library under test (an installed
    prefix), or in the cargo target directory."""
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    for cand in (
        os.environ.get("MEMPROBE_INTERPOSE_LIBRARY"),
        os.path.join(os.path.dirname(memprobe.library_path()), "libmemprobe_interpose.so"),
        os.path.join(target, "debug", "libmemprobe_interpose.so"),
        os.path.join(target, "release", "libmemprobe_interpose.so"),
    ):
        if cand and os.path.exists(cand):
            return cand
    require(False, "libmemprobe_interpose.so not found (cargo build -p memprobe-interpose-preload)")


OBSERVER_CHILD = """
import json, os, sys
from fake_torch_cuda import FakeCuda
import torch, memprobe
from memprobe.integrations.torch import allocator_sources, report_oom
GiB, MiB = 1 << 30, 1 << 20
cuda = FakeCuda(devices=1)
cuda.install()
path = os.path.join(os.environ["OOM_DIR"], "observer.json")
srcs = allocator_sources(0)
t = memprobe.Tracker([memprobe.Source.process()] + list(srcs))
report_oom(t, path=path)
seen = {}
torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.setdefault("file_at_observer", os.path.exists(path)))
r = {"kind": "observer"}
t.begin("epoch")
for _ in range(3):
    t.begin("step"); cuda.alloc(256 * MiB); cuda.free(256 * MiB); t.end("step")
t.begin("step")
cuda.alloc(GiB)
free = cuda.total - cuda.now[0]["reserved"]
r["ask"], r["free_before"] = free + 4 * GiB, free
try:
    cuda.oom(r["ask"])
    r["raised"] = False
except torch.cuda.OutOfMemoryError as e:
    r["raised"], r["message"] = True, str(e)
r["reserved_after"], r["allocated_after"] = cuda.now[0]["reserved"], cuda.now[0]["allocated"]
r["nvml_process_bytes"] = int(os.environ["PROCESS_BYTES"])
for _ in range(5):
    try:
        cuda.oom(r["ask"])
    except torch.cuda.OutOfMemoryError:
        pass
st = t.oom_status()
r["status"] = {"reports_written": st.reports_written, "triggers_seen": st.triggers_seen, "later_triggers": st.later_triggers}
t.end("step"); t.end("epoch")
r["seen"] = seen
t.close(); srcs.close()
r["doc"] = json.load(open(path))
print(json.dumps(r))
"""

DRIVER_CHILD = """
import ctypes, json, os
import memprobe
GiB, MiB = 1 << 30, 1 << 20
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
alloc, free_ = cu.cuMemAlloc_v2, cu.cuMemFree_v2
alloc.argtypes, free_.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t], [ctypes.c_uint64]
path = os.path.join(os.environ["OOM_DIR"], "driver.json")
# A framework's allocator, pushed as torch's would be: what it holds.
torch_alloc = memprobe.Source.pushed("torch_alloc:0")
t = memprobe.Tracker([memprobe.Source.process(), torch_alloc, memprobe.Source.gpu_exact(0)])
t.set_oom_report(path, driver=True)
r = {"kind": "driver", "seen": {}}
t.begin("epoch")
for _ in range(3):
    t.begin("step")
    p = ctypes.c_uint64()
    assert alloc(ctypes.byref(p), 256 * MiB) == 0
    torch_alloc.push(256 * MiB)
    assert free_(p) == 0
    torch_alloc.push(0)
    t.end("step")
t.begin("step")
hold = ctypes.c_uint64()
assert alloc(ctypes.byref(hold), GiB) == 0
torch_alloc.push(GiB)
r["free_before"] = 15 * GiB
r["ask"] = 20 * GiB
q = ctypes.c_uint64()
rc = alloc(ctypes.byref(q), r["ask"])
r["raised"], r["message"] = rc == 2, f"CUresult {rc}"
r["seen"]["file_at_observer"] = os.path.exists(path)  # when the error came back
r["reserved_before"] = r["reserved_after"] = GiB  # what this fake framework holds
r["nvml_process_bytes"] = int(os.environ["PROCESS_BYTES"])
for _ in range(5):
    assert alloc(ctypes.byref(q), r["ask"]) == 2
st = t.oom_status()
r["status"] = {"reports_written": st.reports_written, "triggers_seen": st.triggers_seen, "later_triggers": st.later_triggers}
t.end("step"); t.end("epoch")
t.close()
assert free_(hold) == 0
r["doc"] = json.load(open(path))
print(json.dumps(r))
"""


def _run_child(code, env):
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _all_pass(results):
    checks = _validation_script().check_report(results)
    failed = [c for c in checks if not c[1]]
    assert checks and not failed, failed
    return checks


def test_the_validation_checks_pass_on_the_observer_over_the_fakes(fake_gpu_env):
    require_module("torch", "torch")
    env = dict(fake_gpu_env, PROCESS_BYTES=str(PROCESS_BYTES))
    r = _run_child(OBSERVER_CHILD, env)
    checks = _all_pass(r)
    assert len(checks) >= 15
    # The checks can fail: a report that lost its open phases.
    r["doc"]["open_phases"] = {"available": False, "reason": "busy", "phases": []}
    assert any(not ok for _, ok, _ in _validation_script().check_report(r))


def test_the_validation_checks_pass_on_the_driver_trigger_through_the_interposer(fake_gpu_env, tmp_path):
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir()
    _cc(driver_dir / "libcuda.so.1", "fake_cuda.c", "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic")
    env = dict(
        fake_gpu_env,
        PROCESS_BYTES=str(PROCESS_BYTES),
        LD_PRELOAD=_interposer(),
        LD_LIBRARY_PATH=str(driver_dir),
        MEMPROBE_GPU_EXACT_DIR=str(tmp_path / "regions"),
        MEMPROBE_GPU_EXACT=None,
        FAKE_CUDA_DEVICES="1",
    )
    r = _run_child(DRIVER_CHILD, env)
    _all_pass(r)
    doc = r["doc"]
    assert doc["failed_allocation"]["reported_by"] == "cuMemAlloc_v2"
    exact = {s["name"]: s for s in doc["open_phases"]["phases"][1]["sources"]}["gpu_exact:0"]
    assert exact["peak"] == GiB and exact["fidelity"] == "exact"
    assert doc["later_triggers"]["count"] == 5
