"""Builds memprobe's Python package with libmemprobe and the `memprobe` command
inside it (setuptools-rust; docs/bindings.md says why this backend).

`pip install ./bindings/python` (or `pip wheel`, `make wheel`) runs cargo on
the Rust workspace two levels up (in a source distribution from ``make
sdist``: the copy in ``rust/``), in release mode:

- memprobe-ffi's cdylib, stripped, becomes ``memprobe/_lib/libmemprobe.abi3.so``
  (the ctypes binding loads it first: memprobe/_loader.py);
- the GPU driver-API interposer (memprobe-interpose/preload), stripped,
  becomes ``memprobe/_lib/libmemprobe_interpose.abi3.so``: ``memprobe run
  --gpu-exact`` finds it there from the environment's ``bin/memprobe``, and
  ``memprobe.interposer_library()`` names it for ``LD_PRELOAD``;
- memprobe-cli's ``memprobe`` binary, stripped, goes to the environment's
  ``bin/`` (the wheel's scripts).

The package calls no Python C API, so one wheel serves every CPython >= 3.10
(tag ``cp310-abi3``, a platform wheel: ``make wheel`` retags it manylinux).

Environment: ``MEMPROBE_WORKSPACE`` (the workspace root, when the package is
built from somewhere else), ``CARGO_TARGET_DIR`` (reuse an existing build),
``CARGO_BUILD_JOBS`` (default 2), ``CARGO`` (the cargo to run: ``make wheel``
gives packaging/wheel-cargo, which links against an older glibc),
``CARGO_BUILD_TARGET`` (a Rust target triple such as
``aarch64-unknown-linux-gnu``: the wheel is built for it and tagged
``linux_<arch>``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict

from setuptools import setup
from setuptools_rust import Binding, RustBin, RustExtension, Strip

HERE = Path(__file__).resolve().parent


#: Where the source distribution (``make sdist``) carries the workspace.
SDIST_WORKSPACE = HERE / "rust"


def workspace() -> Path:
    """The Rust workspace: MEMPROBE_WORKSPACE; else the copy inside a source
    distribution (``rust/``); else two levels above this file (pip builds a
    local directory in place, so the relative path holds)."""
    env = os.environ.get("MEMPROBE_WORKSPACE")
    if env:
        root = Path(env).resolve()
    elif (SDIST_WORKSPACE / "Cargo.toml").is_file():
        root = SDIST_WORKSPACE
    else:
        root = HERE.parent.parent
    manifest = root / "memprobe-ffi" / "Cargo.toml"
    if not manifest.is_file():
        sys.exit(
            f"memprobe: the Rust workspace is not at {root} (no {manifest}).\n"
            "The package is built from a clone of the memprobe repository "
            "(pip install ./bindings/python from its root) or from its source "
            "distribution (make sdist), or set MEMPROBE_WORKSPACE=/path/to/memprobe."
        )
    return root


ROOT = workspace()
# Two parallel rustc jobs unless the caller says otherwise: cargo reads it.
os.environ.setdefault("CARGO_BUILD_JOBS", "2")


def manifest(crate: str) -> str:
    # setuptools-rust wants a path; relative to this file when it can be.
    path = ROOT / crate / "Cargo.toml"
    try:
        return os.path.relpath(path, HERE)
    except ValueError:
        return str(path)


def wheel_platform() -> Dict[str, str]:
    """bdist_wheel's platform for a build for CARGO_BUILD_TARGET (setuptools-rust
    builds for it but would tag the wheel with this machine's architecture)."""
    target = os.environ.get("CARGO_BUILD_TARGET")
    if not target:
        return {}
    arch, _, rest = target.partition("-")
    if not rest.endswith("-linux-gnu"):
        sys.exit(f"memprobe: CARGO_BUILD_TARGET={target}: only glibc Linux targets (<arch>-unknown-linux-gnu) are built")
    return {"plat_name": f"linux_{arch}"}


def library(module: str, crate: str) -> RustExtension:
    """A cdylib of the workspace, stripped, as ``module`` (tagged abi3)."""
    return RustExtension(
        module,
        path=manifest(crate),
        binding=Binding.NoBinding,
        py_limited_api=True,
        strip=Strip.All,
        debug=False,
        cargo_manifest_args=["--locked"],
    )


setup(
    rust_extensions=[
        library("memprobe._lib.libmemprobe", "memprobe-ffi"),
        library("memprobe._lib.libmemprobe_interpose", "memprobe-interpose/preload"),
        RustBin(
            "memprobe",
            path=manifest("memprobe-cli"),
            strip=Strip.All,
            debug=False,
            cargo_manifest_args=["--locked"],
        ),
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310", **wheel_platform()}},
    zip_safe=False,
)
