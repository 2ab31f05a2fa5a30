"""Finds and loads libmemprobe.so.

Lookup order (the error when nothing loads lists each, in this order):

1. ``MEMPROBE_LIBRARY``: the path of the library to load. When it is set,
   it is the only candidate, so a wrong path is an error rather than a
   silent fallback to another copy.
2. The copy built into the package by ``pip install``:
   ``memprobe/_lib/libmemprobe*.so*`` (``libmemprobe.abi3.so`` in a wheel).
3. The installed library: its SONAME through the dynamic loader's search
   path (``LD_LIBRARY_PATH``, ``ld.so.cache``), then
   ``ctypes.util.find_library("memprobe")``, then common prefixes
   (``sys.prefix``, ``~/.local``, ``/usr/local``, ``/usr``, ``/opt/memprobe``).

A library whose ABI (major.minor before 1.0, major after) differs from the
one this package speaks is skipped with the reason recorded. When nothing
loads, :class:`LibraryNotFoundError` (an ``ImportError``) lists every place
searched and why it failed, and the command that fixes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

from ._version import ABI

ENV = "MEMPROBE_LIBRARY"
BUNDLED_DIR = Path(__file__).resolve().parent / "_lib"
#: What fixes a missing library: build the package with it (from the root of
#: a memprobe clone; a wheel carries the library already).
FIX = "pip install --force-reinstall ./bindings/python"


def abi_soname(abi: Tuple[int, int] = ABI) -> str:
    """The SONAME of a library speaking ``abi``: libmemprobe.so.0.<minor> before 1.0."""
    major, minor = abi
    return f"libmemprobe.so.{major}.{minor}" if major == 0 else f"libmemprobe.so.{major}"


class LibraryNotFoundError(ImportError):
    """No usable libmemprobe.so was found; ``tried`` lists (place, reason) in
    the order searched."""

    def __init__(self, tried: List[Tuple[str, str]]):
        self.tried = tried
        lines = "\n".join(f"  {i}. {cand}: {why}" for i, (cand, why) in enumerate(tried, 1))
        super().__init__(
            f"memprobe: cannot load libmemprobe (ABI {ABI[0]}.{ABI[1]}, "
            f"{abi_soname()}). Searched, in order:\n{lines}\n"
            f"Fix: from the root of the memprobe repository run `{FIX}` "
            f"(it builds libmemprobe into the package), "
            f"or set {ENV}=/path/to/libmemprobe.so."
        )


def _prefix_dirs() -> List[Path]:
    return _prefix_dirs_for(Path.home())


def _prefix_dirs_for(home: Path) -> List[Path]:
    """The prefixes' library directories searched, in order."""
    dirs = [Path(sys.prefix) / "lib", Path(home) / ".local" / "lib"]
    for prefix in ("/usr/local", "/usr", "/opt/memprobe"):
        dirs += [Path(prefix) / "lib", Path(prefix) / "lib64"]
    dirs.append(Path("/usr/lib/x86_64-linux-gnu"))
    dirs.append(Path("/usr/lib/aarch64-linux-gnu"))
    seen: Set[Path] = set()
    out: List[Path] = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


#: The GPU driver-API interposer's file name stem (``LD_PRELOAD``-ed, never
#: loaded by this package).
INTERPOSER = "libmemprobe_interpose"


def bundled_interposer() -> Optional[Path]:
    """The interposer the package carries (``pip install`` builds it in)."""
    for name in (f"{INTERPOSER}.abi3.so", f"{INTERPOSER}.so"):
        p = BUNDLED_DIR / name
        if p.is_file():
            return p
    return None


def _bundled() -> Optional[Path]:
    if not BUNDLED_DIR.is_dir():
        return None
    # The wheel's name first, then the names a hand-placed copy may have.
    names = ["libmemprobe.abi3.so", "libmemprobe.so", abi_soname()]
    names += sorted(p.name for p in BUNDLED_DIR.glob("libmemprobe*.so*") if not p.name.startswith(INTERPOSER))
    for name in names:
        p = BUNDLED_DIR / name
        if p.is_file():
            return p
    return None


def candidates() -> Iterator[Tuple[str, str, Optional[str]]]:
    """Yields (how, place, why not) in lookup order: ``why not`` is None for
    a file to open, else why the place holds nothing (so that the error can
    name every place searched)."""
    env = os.environ.get(ENV)
    if env:
        yield (ENV, env, None)
        return
    bundled = _bundled()
    if bundled is not None:
        yield ("bundled", str(bundled), None)
    else:
        yield ("bundled", str(BUNDLED_DIR / "libmemprobe*.so"), "no such file")
    yield ("loader search path", abi_soname(), None)
    found = ctypes.util.find_library("memprobe")
    if found and found != abi_soname():
        yield ("find_library", found, None)
    else:
        yield ("find_library", '"memprobe"', "nothing found")
    for d in _prefix_dirs():
        hits = [d / name for name in (abi_soname(), "libmemprobe.so") if (d / name).exists()]
        for p in hits:
            yield ("prefix", str(p), None)
        if not hits:
            yield ("prefix", str(d / abi_soname()), "no such file")


def _version_of(lib: ctypes.CDLL) -> str:
    f = lib.memprobe_version
    f.restype = ctypes.c_char_p
    f.argtypes = []
    return str(f().decode())


def _abi_of(version: str) -> Tuple[int, int]:
    major, minor = (int(x) for x in version.split(".")[:2])
    return (major, minor)


def _path_of(lib: ctypes.CDLL, fallback: str) -> str:
    """The file the dynamic loader actually opened (via dladdr)."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        for libname in (None, "libdl.so.2"):
            try:
                dladdr = ctypes.CDLL(libname).dladdr
                break
            except (OSError, AttributeError):
                continue
        else:
            return fallback
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        dladdr.restype = ctypes.c_int
        info = DlInfo()
        addr = ctypes.cast(lib.memprobe_version, ctypes.c_void_p).value
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(bytes(info.dli_fname).decode())
    except Exception:  # noqa: BLE001 - best effort; the fallback is still right
        pass
    return fallback


def load() -> Tuple[ctypes.CDLL, str, str]:
    """Loads the library: returns (library, path, how it was found)."""
    tried: List[Tuple[str, str]] = []
    for how, cand, why_not in candidates():
        if why_not is not None:
            tried.append((f"{cand} ({how})", why_not))
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append((f"{cand} ({how})", str(e) or "cannot be loaded"))
            continue
        try:
            version = _version_of(lib)
        except AttributeError:
            tried.append((f"{cand} ({how})", "not libmemprobe (no memprobe_version)"))
            continue
        if _abi_of(version) != ABI:
            tried.append(
                (f"{cand} ({how})", f"version {version}, this package needs {ABI[0]}.{ABI[1]}.x")
            )
            continue
        return lib, _path_of(lib, cand), how
    if not tried:
        tried.append(("(none)", "no candidate"))
    raise LibraryNotFoundError(tried)


def bundled_library() -> Optional[Path]:
    """The bundled copy, if the package carries one."""
    return _bundled()
