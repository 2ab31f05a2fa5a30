#!/usr/bin/env python3
"""One part of scripts/gpu-validate-all.sh, run without a GPU over the test
suite's fakes (tests/fake-gpu: the driver, NVML), so that the validation
cannot rot between the times a GPU is available. `make test` runs it.

    gpu-validate-dry-run.py PART --bundle DIR --out PART.json

What each part does here:
  env        the same script as on a GPU (it records that there is none);
  interpose  the interposer's direct experiment (exact bytes per allocation,
             50 of 50 one-millisecond spikes) through the driver API of the
             fake driver, with the same checks;
  run        `memprobe run --gpu-exact` over tests/fake-gpu/fake_train_phases.py
             (the training run's phases and its 2 GiB spike, on the fake
             driver), with the same checks;
  torch, cpp, nvml, oom
             need PyTorch on a real device or nvidia-smi: the scripts are
             compiled (a syntax error fails the dry run) and the part exits
             77, "skipped"; the OOM part's checks run over the fakes in
             bindings/python/tests/test_oom.py.
"""
import argparse
import os
import py_compile
import shutil
import subprocess
import sys
import json

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FAKE = os.path.join(ROOT, "tests", "fake-gpu")
SKIPPED = 77
NEEDS = {
    "torch": ("gpu-validate-torch.py", "needs PyTorch with a CUDA device"),
    "cpp": ("gpu-validate-torch.py", "needs libtorch with a CUDA device"),
    "nvml": ("gpu-validate.py", "needs nvidia-smi and PyTorch with a CUDA device"),
    "oom": ("gpu-validate-oom.py", "needs a real out-of-memory; its checks run over the fakes in "
                                   "bindings/python/tests/test_oom.py"),
}


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
            f.write("device 0 name Fake GPU (dry run)\ndevice 0 total 17179869184\n"
                    "device 0 used 1073741824\ndevice 0 procs self:536870912\n")
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
    if a.part in NEEDS:
        script, why = NEEDS[a.part]
        py_compile.compile(os.path.join(HERE, script), doraise=True)
        with open(a.out, "w") as f:
            json.dump({"skipped": f"dry run: {why}"}, f)
        print(f"skipped: {why} ({script} compiles)")
        return SKIPPED
    py = sys.executable
    if a.part == "env":
        subprocess.run([py, os.path.join(HERE, "gpu-validate-env.py"), "--out", a.out])
        return 0 if os.path.exists(a.out) else 1
    env = dict(os.environ)
    env.update(build_fakes(os.path.join(os.path.dirname(os.path.abspath(a.out)), "fakes")))
    env.pop("MEMPROBE_GPU_EXACT", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if a.part == "interpose":
        cmd = [py, os.path.join(HERE, "gpu-validate-interpose.py"),
               os.path.join(a.bundle, "lib", "libmemprobe_interpose.so"),
               "--experiments", "direct", "--driver-api", "--out", a.out]
    else:
        cmd = [py, os.path.join(HERE, "gpu-validate-run.py"), os.path.join(a.bundle, "bin", "memprobe"),
               "--trainer", os.path.join(FAKE, "fake_train_phases.py"), "--out", a.out]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
