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

MEMPROBE_DRY_RUN_NVML_EXTRA: lines added to the fake NVML's script (the
tests use it to make NVML read nothing).
"""
import argparse
import os
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["env", "interpose", "run", "torch", "cpp", "nvml", "oom"])
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
    return subprocess.run(cmd, env=env).returncode

if __name__ == "__main__":
    sys.exit(main())
