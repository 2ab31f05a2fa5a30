#!/usr/bin/env python3
"""One part of scripts/gpu-validate-all.sh, run without a GPU over the test
suite's fakes (tests/fake-gpu: the driver, NVML), so that the validation
cannot rot between the times a GPU is available. `make test` runs it.

    gpu-validate-dry-run.py PART --bundle DIR --out PART.json

Every part runs its real checks, over the fakes:
  env        the same script as on a GPU (it records that there is none);
  torch      gpu-validate-torch.py --fake: the scripted device of
             tests/fake-gpu/fake_torch_device.py (the Python tests' fake
             torch.cuda, with the allocator's history) and the native NVML
             pollers on the fake NVML;
  cpp        gpu-validate-torch.py --cpp-only --fake: scripts/gpu-validate-cpp.cpp
             compiled and linked against this environment's torch, run with
             no device visible (it must refuse with its error line);
  interpose  the interposer's direct experiment (exact bytes per allocation,
             50 of 50 one-millisecond spikes) through the driver API of the
             fake driver, against the fake NVML's process bytes (which follow
             the fake driver's), and its three allocator modes over
             tests/fake-gpu/fake_torch_driver.py, with the same checks;
  run        `memprobe run --gpu-exact` over tests/fake-gpu/fake_train_phases.py
             (the training run's phases and its 2 GiB spike, on the fake
             driver), with the same checks;
  oom        gpu-validate-oom.py --fake: the observer's report over the fake
             torch.cuda, the driver's reports through the interposer over the
             fake driver;
  nvml       gpu-validate.py --fake: memprobe gpus against the fake
             nvidia-smi (tests/fake-gpu/nvidia-smi) over the same fake NVML.

  origins    gpu-validate-origins.py over tests/fake-gpu/fake_train_origins.py:
             stand-ins for torch's caching allocator, NCCL and cuBLAS built
             from tests/interpose/origin_lib.c (libc10_cuda.so, libnccl.so.2,
             libcublas.so.12) allocating through the fake driver, the fake
             NVML giving the trainer its bytes + 300 MiB (the context line);
  attribution
             gpu-validate-attribution.py --fake: the Python integration's
             records over the fake torch.cuda with history
             (tests/fake-gpu/fake_torch_device.py), and the C++ replay of
             tests/cpp/test_torch_attribution.cpp built and run.

MEMPROBE_DRY_RUN_NVML_EXTRA: lines added to the fake NVML's script (the
tests use it to make NVML read nothing). MEMPROBE_DRY_RUN_ARGS: arguments
added to the part's command (the tests use them to break a part).
"""
import argparse
import os
import shlex
import shutil
import subprocess
import sys
import json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FAKE = os.path.join(ROOT, "tests", "fake-gpu")
NVML_SCRIPT = ("device 0 name Fake GPU (dry run)\ndevice 0 total 17179869184\ndevice 0 reserved 536870912\n"
               "device 0 used 1073741824\ndevice 0 procs self:driver+314572800\n")


def build_fakes(where: str) -> dict:
    """The fake driver and NVML, compiled once per output folder."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        sys.exit("gpu-validate-dry-run: a C compiler is needed for the fake GPU libraries")
    drv, nvml = os.path.join(where, "driver"), os.path.join(where, "nvml")
    for d in (drv, nvml):
        os.makedirs(d, exist_ok=True)
    cuda = os.path.join(drv, "libcuda.so.1")
    if not os.path.exists(cuda):
        subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wl,-soname,libcuda.so.1",
                        "-Wl,-Bsymbolic", "-o", cuda, os.path.join(FAKE, "fake_cuda.c"), "-lpthread"], check=True)
    nv = os.path.join(nvml, "libnvidia-ml.so.1")
    if not os.path.exists(nv):
        subprocess.run([cc, "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", nv,
                        os.path.join(FAKE, "fake_nvml.c"), "-lpthread"], check=True)
        with open(os.path.join(nvml, "fake_nvml.script"), "w") as f:
            f.write(NVML_SCRIPT + os.environ.get("MEMPROBE_DRY_RUN_NVML_EXTRA", "").replace("\\n", "\n") + "\n")
    return {
        "LD_LIBRARY_PATH": os.pathsep.join([drv, nvml] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p]),
        "FAKE_CUDA_DEVICES": "1",
        "MEMPROBE_NVML_LIBRARY": nv,
        "MEMPROBE_GPU_BACKEND": "nvml",
    }


def build_origin_libs(where: str, driver: str) -> str:
    """The origins part's stand-ins for libc10_cuda, NCCL and cuBLAS (and
    the runtime they call through), over the fake driver."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    out = os.path.join(where, "origin-libs")
    os.makedirs(out, exist_ok=True)
    src = os.path.join(ROOT, "tests", "interpose")
    link = ["-L" + out, "-L" + driver]
    rt = os.path.join(out, "libcudart.so.12")
    if not os.path.exists(rt):
        subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", rt,
                        os.path.join(src, "origin_runtime.c")] + link + ["-l:libcuda.so.1"], check=True)
    for name, lib in (("libc10_cuda.so", "torch"), ("libnccl.so.2", "nccl"), ("libcublas.so.12", "cublas")):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            subprocess.run([cc, "-shared", "-fPIC", f"-DLIB={lib}", f"-Wl,-soname,{name}", "-o", path,
                            os.path.join(src, "origin_lib.c")] + link + ["-l:libcudart.so.12", "-l:libcuda.so.1"],
                           check=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["env", "interpose", "run", "torch", "cpp", "nvml", "oom", "origins",
                                     "attribution"])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    py = sys.executable
    if a.part == "env":
        subprocess.run([py, os.path.join(HERE, "gpu-validate-env.py"), "--out", a.out])
        return 0 if os.path.exists(a.out) else 1
    fakes = os.path.join(os.path.dirname(os.path.abspath(a.out)), "fakes")
    env = dict(os.environ)
    env.update(build_fakes(fakes))
    env.pop("MEMPROBE_GPU_EXACT", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("FAKE_NVML_SCRIPT", None)
    interposer = os.path.join(a.bundle, "lib", "libmemprobe_interpose.so")
    if a.part == "interpose":
        cmd = [py, os.path.join(HERE, "gpu-validate-interpose.py"), interposer,
               "--experiments", "direct,torch", "--driver-api", "--fake-torch", "--steps", "12", "--out", a.out]
    elif a.part == "run":
        cmd = [py, os.path.join(HERE, "gpu-validate-run.py"), os.path.join(a.bundle, "bin", "memprobe"),
               "--trainer", os.path.join(FAKE, "fake_train_phases.py"), "--out", a.out]
    elif a.part == "torch":
        cmd = [py, os.path.join(HERE, "gpu-validate-torch.py"), "--fake", "--no-cpp", "--tries", "10",
               "--cost-blocks", "5", "--cost-calls", "100", "--out", a.out]
    elif a.part == "cpp":
        cmd = [py, os.path.join(HERE, "gpu-validate-torch.py"), "--fake", "--cpp-only",
               "--memprobe-prefix", a.bundle, "--out", a.out]
    elif a.part == "origins":
        libs = build_origin_libs(fakes, os.path.join(fakes, "driver"))
        trainer = os.path.join(FAKE, "fake_train_origins.py")
        # NVML lists memprobe's child (the trainer) with what it holds at its
        # peak plus 300 MiB no driver call revealed: the context line.
        held = int(subprocess.run([py, trainer, "--print-total"], capture_output=True, text=True,
                                  check=True).stdout)
        script = os.path.join(fakes, "origins-nvml.script")
        with open(script, "w") as f:
            f.write("\n".join(line for line in NVML_SCRIPT.splitlines() if " procs " not in line) + "\n")
            f.write(f"device 0 procs children:{held + (300 << 20)}\n")
            f.write(os.environ.get("MEMPROBE_DRY_RUN_NVML_EXTRA", "").replace("\\n", "\n") + "\n")
        env["FAKE_NVML_SCRIPT"] = script
        env["FAKE_ORIGIN_LIBS"] = libs
        env["LD_LIBRARY_PATH"] = libs + os.pathsep + env["LD_LIBRARY_PATH"]
        cmd = [py, os.path.join(HERE, "gpu-validate-origins.py"), os.path.join(a.bundle, "bin", "memprobe"),
               "--trainer", trainer, "--out", a.out]
    elif a.part == "attribution":
        cmd = [py, os.path.join(HERE, "gpu-validate-attribution.py"), "--fake", "--cost-steps", "20",
               "--cost-rounds", "1", "--out", a.out]
    elif a.part == "oom":
        cmd = [py, os.path.join(HERE, "gpu-validate-oom.py"), interposer, "--fake", "--out", a.out]
    else:
        # A script of this part's own: the held tensor is a line it adds.
        script = os.path.join(fakes, "nvml-part.script")
        with open(os.path.join(fakes, "nvml", "fake_nvml.script")) as src, open(script, "w") as dst:
            dst.write(src.read())
        env["FAKE_NVML_SCRIPT"] = script
        env["PATH"] = FAKE + os.pathsep + env.get("PATH", "")
        cmd = [py, os.path.join(HERE, "gpu-validate.py"), os.path.join(a.bundle, "bin", "memprobe"),
               os.path.join(a.bundle, "bin", "nvml_latency"), "--fake", "--out", a.out]
    # Arguments a test adds to break a part on purpose.
    cmd += shlex.split(os.environ.get("MEMPROBE_DRY_RUN_ARGS", ""))
    return subprocess.run(cmd, env=env).returncode

if __name__ == "__main__":
    sys.exit(main())
