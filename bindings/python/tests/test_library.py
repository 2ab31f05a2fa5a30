"""Loading the library, versions, statuses and the binding's coverage."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import PKG, ROOT, run_python, SITE

import memprobe
from memprobe import _ffi, _loader
from memprobe.errors import ERRORS, MemprobeError, Status


def cargo_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def test_versions_agree_with_cargo_toml():
    v = cargo_version()
    assert memprobe.library_version() == v
    assert memprobe.__version__ == v
    major, minor = (int(x) for x in v.split(".")[:2])
    assert memprobe.ABI == (major, minor)
    assert memprobe.soname() == _loader.abi_soname()


def test_found_through_memprobe_library(library_path):
    assert memprobe.library_found_by() == "MEMPROBE_LIBRARY"
    assert Path(library_path).resolve() == Path(_ffi.lib._name).resolve()


def test_bad_memprobe_library_is_an_import_error_naming_it(tmp_path):
    bogus = tmp_path / "nope.so"
    r = run_python(
        "import memprobe",
        env={"MEMPROBE_LIBRARY": str(bogus), "PYTHONPATH": str(SITE)},
    )
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr
    assert str(bogus) in r.stderr and "MEMPROBE_LIBRARY" in r.stderr


def test_a_file_that_is_not_libmemprobe_is_refused(tmp_path):
    libc = "libc.so.6"
    r = run_python("import memprobe", env={"MEMPROBE_LIBRARY": libc, "PYTHONPATH": str(SITE)})
    assert r.returncode != 0
    assert "not libmemprobe" in r.stderr


def copy_package(dest: Path) -> Path:
    shutil.copytree(
        PKG / "memprobe",
        dest / "memprobe",
        ignore=shutil.ignore_patterns("__pycache__", "libmemprobe.so*"),
    )
    return dest


def test_bundled_copy_is_found_without_the_environment(tmp_path, library_path):
    pkg = copy_package(tmp_path)
    shutil.copy(library_path, pkg / "memprobe" / "_lib" / "libmemprobe.so")
    r = run_python(
        "import memprobe; print(memprobe.library_found_by()); print(memprobe.library_path())",
        env={"MEMPROBE_LIBRARY": None, "PYTHONPATH": str(pkg), "LD_LIBRARY_PATH": None},
    )
    assert r.returncode == 0, r.stderr
    how, path = r.stdout.strip().splitlines()
    assert how == "bundled"
    assert Path(path) == (pkg / "memprobe" / "_lib" / "libmemprobe.so").resolve()


def test_installed_library_is_found_by_soname(tmp_path, library_path):
    pkg = copy_package(tmp_path / "pkg")
    libdir = tmp_path / "prefix" / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(library_path, libdir / _loader.abi_soname())
    r = run_python(
        "import memprobe; print(memprobe.library_found_by()); print(memprobe.library_path())",
        env={"MEMPROBE_LIBRARY": None, "PYTHONPATH": str(pkg), "LD_LIBRARY_PATH": str(libdir)},
    )
    assert r.returncode == 0, r.stderr
    how, path = r.stdout.strip().splitlines()
    assert how == "loader search path"
    assert Path(path) == (libdir / _loader.abi_soname()).resolve()


def test_nothing_found_lists_what_was_tried(tmp_path):
    pkg = copy_package(tmp_path)
    r = run_python(
        "import memprobe; print(memprobe.library_found_by())",
        env={
            "MEMPROBE_LIBRARY": None,
            "PYTHONPATH": str(pkg),
            "LD_LIBRARY_PATH": None,
            "HOME": str(tmp_path),
        },
    )
    if r.returncode == 0:
        # Installed on this machine: then it must come from the system.
        assert r.stdout.strip() in ("loader search path", "find_library", "prefix")
        pytest.skip(f"libmemprobe is installed system-wide (found by {r.stdout.strip()})")
    assert "LibraryNotFoundError" in r.stderr
    # Every place searched, numbered, in the loader's order ...
    places = re.findall(r"^  (\d+)\. (.*) \(([^()]*)\): ", r.stderr, re.M)
    assert [int(n) for n, _, _ in places] == list(range(1, len(places) + 1))
    hows = [how for _, _, how in places]
    assert hows[:3] == ["bundled", "loader search path", "find_library"], hows
    assert set(hows[3:]) == {"prefix"}
    where = [place for _, place, _ in places]
    assert where[0] == str(pkg / "memprobe" / "_lib" / "libmemprobe*.so")
    assert where[1] == _loader.abi_soname()
    prefix_dirs = [str(Path(p).parent) for p in where[3:]]
    assert prefix_dirs == [str(d) for d in _loader._prefix_dirs_for(home=tmp_path)]
    # ... and the one command that fixes it.
    assert "Fix: from the root of the memprobe repository run `pip install --force-reinstall ./bindings/python`" in r.stderr
    assert "MEMPROBE_LIBRARY" in r.stderr


def test_every_status_has_a_name_and_an_exception():
    for status in Status:
        assert memprobe.status_name(status) != "unknown status"
        if status != Status.OK:
            cls = ERRORS[status]
            assert issubclass(cls, MemprobeError)
            e = cls(status, "why")
            assert e.status == status and e.message == "why"
            assert status.name.lower() in str(e)
    assert memprobe.status_name(9999) == "unknown status"
    assert memprobe.status_name(0) == "ok"


def test_unknown_status_keeps_its_number():
    from memprobe.errors import error_for

    e = error_for(4242, "new failure")
    assert type(e) is MemprobeError and e.status == 4242


def test_builtin_exception_families():
    assert issubclass(memprobe.InvalidArgumentError, ValueError)
    assert issubclass(memprobe.InvalidIdError, LookupError)


def header_functions():
    text = (ROOT / "include" / "memprobe.h").read_text()
    return sorted(set(re.findall(r"^[A-Za-z_][\w \*]*?\b(memprobe_\w+)\(", text, re.M)))


def unbound():
    path = PKG / "UNBOUND.txt"
    names = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(":")
                names[name.strip()] = reason.strip()
    return names


def test_every_header_function_is_declared():
    funcs = header_functions()
    assert "memprobe_version" in funcs and "memprobe_window_open" in funcs
    skipped = unbound()
    missing = [f for f in funcs if f not in _ffi.PROTOTYPES and f not in skipped]
    assert not missing, f"declare these in memprobe/_ffi.py or list them in UNBOUND.txt: {missing}"
    stale = [f for f in _ffi.PROTOTYPES if f not in funcs]
    assert not stale, f"declared but not in the header: {stale}"


def test_every_declared_function_is_in_the_library():
    for name in _ffi.PROTOTYPES:
        assert hasattr(_ffi.lib, name), name


def test_abi_parsing():
    assert _loader._abi_of("0.1.7") == (0, 1)
    assert _loader.abi_soname((0, 3)) == "libmemprobe.so.0.3"
    assert _loader.abi_soname((2, 5)) == "libmemprobe.so.2"


def test_live_handles_return_to_baseline():
    import gc

    gc.collect()
    base = memprobe.live_handles()
    s = memprobe.Source.process()
    w = memprobe.Window(s)
    t = memprobe.Trace(s, silent=True)
    assert memprobe.live_handles() == (base[0] + 1, base[1] + 1, base[2] + 1, base[3])
    del s, w, t
    gc.collect()
    assert memprobe.live_handles() == base
